"""Training-step throughput: gpt_mini against a Hugging Face Llama of the same shape.

    posttrain bench train [--preset micro] [--batch 32] [--seq-len 96] [--steps 10] [--threads 2] [--out FILE.json]
    posttrain bench train --no-hf       # gpt_mini alone: no `hf` extra needed

One step is what the trainer does for one micro-batch, with plain next-token cross-entropy
as the loss: forward, cross-entropy, backward, clip the gradient norm to 1, AdamW (betas
0.9/0.95, foreach, as framework/trainer.py). A seeded gpt_mini is exported in memory to a
`LlamaForCausalLM` with the same weights (models/export.py; `use_cache=False`, as in HF
training). Both train on the same random batch, their steps interleaved so that load from
other processes falls on both alike. Same weights, data and optimizer: their losses agree
step for step, a check that both did the same work.

FLOPs are counted as 6·N per token (N = all parameters: 2 per parameter forward, 4
backward). `with_attn` adds 12·L·T·d per token for the attention scores and weighted values
(the PaLM convention: the full T×T product, no discount for the causal mask). Each rate is
divided by the fp32 matmul peak measured in the same run on the same threads (the best of
a measurement before and after the steps). Times are the best of `steps` timed steps after
`warmup`; the median is reported too. On a shared machine both are noisy.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import torch
import torch.nn.functional as F

from posttrain import UsageError
from posttrain.bench import matmul_peak_gflops, transformers_version, write_json
from posttrain.models.export import to_hf_model
from posttrain.models.gpt_mini import ModelConfig, build_model
from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer


def step_flops(params: int, tokens: int, n_layers: int = 0, seq_len: int = 0, d_model: int = 0) -> int:
    """FLOPs of one training step on `tokens` tokens: 6·N·tokens, plus 12·L·T·d·tokens for
    attention when the shape (layers, sequence length, width) is given."""
    return tokens * (6 * params + 12 * n_layers * seq_len * d_model)


def train_step(logits_fn, params: list, optimizer, input_ids: torch.Tensor) -> float:
    """One step on `input_ids` [B, T+1]: predict tokens 1..T from 0..T-1. Returns the loss."""
    logits = logits_fn(input_ids[:, :-1])  # [B, T, V]
    loss = F.cross_entropy(logits.flatten(0, 1), input_ids[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    return loss.item()


def run(
    out: str | None = None,
    preset: str = "micro",
    batch: int = 32,
    seq_len: int = 96,
    steps: int = 10,
    warmup: int = 3,
    threads: int = 2,
    hf: bool = True,
    seed: int = 0,
) -> dict:
    if hf and importlib.util.find_spec("transformers") is None:  # before any work: one line naming the extra
        raise UsageError(
            "posttrain bench train times gpt_mini beside transformers' LlamaForCausalLM: pip install "
            "'posttrain[hf]', or pass --no-hf to time gpt_mini alone"
        )
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        tok = CharTokenizer(BASE_CHARS)  # the built-in task's vocabulary (as its checkpoints)
        torch.manual_seed(seed)
        model = build_model(ModelConfig(preset=preset, max_seq_len=seq_len), tok.vocab_size).train()
        c = model.config
        params = model.num_params()
        modules, logits_fns = {"ours": model}, {"ours": model}
        if hf:
            modules["hf"] = hf_model = to_hf_model(model, tok).train()
            logits_fns["hf"] = lambda x: hf_model(input_ids=x, use_cache=False).logits
        optimizers = {
            k: torch.optim.AdamW(m.parameters(), lr=3e-4, betas=(0.9, 0.95), foreach=True) for k, m in modules.items()
        }
        # no padding tokens: HF's embedding has padding_idx = pad_id, a row that never trains
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, tok.vocab_size - 1, (batch, seq_len + 1), generator=g)
        ids += ids >= tok.pad_id  # [B, T+1], skips pad_id

        peak = matmul_peak_gflops(threads)
        times = {k: [] for k in modules}
        losses = {k: [] for k in modules}
        for i in range(warmup + steps):
            for k, m in modules.items():  # interleaved: A B A B ...
                t0 = time.perf_counter()
                losses[k].append(train_step(logits_fns[k], list(m.parameters()), optimizers[k], ids))
                if i >= warmup:
                    times[k].append(time.perf_counter() - t0)
        peak = max(peak, matmul_peak_gflops(threads))
    finally:
        torch.set_num_threads(old_threads)

    tokens = batch * seq_len
    flops = step_flops(params, tokens)
    flops_attn = step_flops(params, tokens, c.n_layers, seq_len, c.d_model)
    result = {
        "bench": "train",
        "preset": preset,
        "params": params,
        "n_layers": c.n_layers,
        "d_model": c.d_model,
        "batch": batch,
        "seq_len": seq_len,
        "tokens_per_step": tokens,
        "steps": steps,
        "warmup": warmup,
        "threads": threads,
        "matmul_peak_gflops": peak,
        "flops_per_step": flops,
        "flops_per_step_with_attn": flops_attn,
        "torch": torch.__version__,
        "transformers": transformers_version() if hf else None,
    }
    for k in modules:
        best, median = min(times[k]), statistics.median(times[k])
        result[k] = {
            "step_s": best,
            "step_s_median": median,
            "tokens_per_s": tokens / best,
            "gflops": flops / best / 1e9,
            "peak_frac": flops / best / 1e9 / peak,
            "gflops_with_attn": flops_attn / best / 1e9,
            "peak_frac_with_attn": flops_attn / best / 1e9 / peak,
            "peak_frac_median": flops / median / 1e9 / peak,
            "losses": losses[k],
        }
    if hf:
        result["speed_ratio"] = result["hf"]["step_s"] / result["ours"]["step_s"]
    _print(result)
    if out:
        write_json(out, result)
        print(f"wrote {out}")
    return result


def _print(r: dict) -> None:
    print(
        f"preset={r['preset']} params={r['params']:,} batch={r['batch']}×{r['seq_len']} tokens "
        f"threads={r['threads']} matmul peak {r['matmul_peak_gflops']:.1f} GFLOP/s torch {r['torch']}"
    )
    print(
        f"{'':9} {'step s':>7} {'median':>7} {'tok/s':>7} {'GFLOP/s':>8} {'%peak':>6} "
        f"{'+attn GFLOP/s':>14} {'%peak':>6} {'last loss':>10}"
    )
    for k, name in (("ours", "gpt_mini"), ("hf", "HF Llama")):
        if k in r:
            s = r[k]
            print(
                f"{name:9} {s['step_s']:>7.3f} {s['step_s_median']:>7.3f} {s['tokens_per_s']:>7.0f} "
                f"{s['gflops']:>8.1f} {100 * s['peak_frac']:>5.1f}% {s['gflops_with_attn']:>14.1f} "
                f"{100 * s['peak_frac_with_attn']:>5.1f}% {s['losses'][-1]:>10.5f}"
            )
    if "speed_ratio" in r:
        print(
            f"gpt_mini is {r['speed_ratio']:.2f}× HF's speed (best step times; FLOPs = 6·N·tokens, "
            f"+attn adds 12·L·T·d per token)"
        )


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="posttrain bench train", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the results as JSON")
    p.add_argument("--preset", default="micro")
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=96, help="tokens per sequence")
    p.add_argument("--steps", type=int, default=10, help="timed steps; the best counts, the median is shown")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-hf", action="store_true", help="time gpt_mini only")
    a = p.parse_args(argv)
    return run(a.out, a.preset, a.batch, a.seq_len, a.steps, a.warmup, a.threads, hf=not a.no_hf)


if __name__ == "__main__":
    main()
