"""Rollout throughput: our Engine against Hugging Face `generate` on the same weights.

    posttrain bench rollout [--preset micro] [--batches 1,8,64,256] [--threads 2] [--out FILE.json]
    posttrain bench rollout --invariance [--init RUN] [--out FILE.json]   (batch invariance, below)
    ... [--decode-window K]   k decode steps between read-backs (framework/decode_loop.py)

A randomly initialised (seeded) gpt_mini is exported in memory to a `LlamaForCausalLM`
with the same weights (models/export.py). Both sample at temperature 1 from the same
arithmetic prompts, one sample per prompt, exactly `new_tokens` tokens each: HF with
`min_new_tokens = max_new_tokens` (end-of-turn suppressed), ours with `ignore_eos`
(end-of-turn may be sampled but does not stop). HF left-pads the batch; ours does not pad.

Reported per batch size: tokens/s for both, their ratio, and each one's fraction of the
FLOP limit, 2·params·tokens/s ÷ the measured fp32 matmul peak on the same threads (the
attention FLOPs are left out, so the fraction slightly understates the work done). Times
are the best of `repeats` interleaved runs after a warm-up. Measure on a quiet machine: the
load average goes into the JSON, because with more runnable threads than cores every
OpenMP barrier can wait for a descheduled thread, and HF's step, with more small ops than
ours, suffers far more; ratios taken under load overstate our lead.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from posttrain import checkpoint
from posttrain.bench import matmul_peak_gflops, transformers_version, write_json
from posttrain.eval import response_budget
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.models.export import to_hf_model
from posttrain.models.gpt_mini import ModelConfig, build_model
from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
from posttrain.recipes.warm_start import default_init
from posttrain.tasks.arithmetic import ArithmeticTask


def _time(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def hf_generate(hf_model, prompts: list[list[int]], new_tokens: int, pad_id: int, eot_id: int) -> torch.Tensor:
    """transformers `generate` sampling exactly `new_tokens` tokens for every prompt at
    temperature 1 (no top-k/top-p; end-of-turn suppressed by `min_new_tokens`), the batch
    left-padded as HF expects. Returns the ids [B, P + new_tokens]."""
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding
        ids[i, P - len(p) :] = torch.tensor(p)
        mask[i, P - len(p) :] = 1
    dev = next(hf_model.parameters()).device
    with torch.inference_mode():
        gen = hf_model.generate(
            ids.to(dev),
            attention_mask=mask.to(dev),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=pad_id,
            eos_token_id=eot_id,
        )
    assert gen.shape[1] == P + new_tokens
    return gen


def run(
    out: str | None = None,
    preset: str = "micro",
    batches=(1, 8, 64, 256),
    new_tokens: int = 64,
    threads: int = 2,
    repeats: int = 2,
    hf: bool = True,
    seed: int = 0,
    window: int | None = None,
) -> dict:
    torch.set_num_threads(threads)
    tok = CharTokenizer(BASE_CHARS)  # the built-in task's vocabulary (as its checkpoints)
    torch.manual_seed(seed)
    model = build_model(ModelConfig(preset=preset), tok.vocab_size).eval()
    params = model.num_params()
    hf_model = None
    if hf:
        hf_model = to_hf_model(model, tok)
    peak = matmul_peak_gflops(threads)
    task = ArithmeticTask()
    sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True)
    engine = Engine(model, tok, max_slots=max(batches))
    engine.decode_window = window

    def ours(prompts):
        samples = engine.generate(prompts, 1, sampling, seed=seed)
        assert all(len(s.response_ids) == new_tokens for s in samples)

    def theirs(prompts):
        hf_generate(hf_model, prompts, new_tokens, tok.pad_id, tok.eot_id)

    warm = [tok.encode(tok.chat_prompt(task.prompt(i))) for i in task.items(2, seed=seed + 1)]
    ours(warm)
    if hf_model is not None:
        theirs(warm)

    load_before = os.getloadavg()
    rows = []
    for B in batches:
        prompts = [tok.encode(tok.chat_prompt(task.prompt(i))) for i in task.items(B, seed=seed)]
        tokens = B * new_tokens
        row = {"batch": B, "tokens": tokens}
        t_ours = t_hf = float("inf")
        for _ in range(repeats):  # interleaved, so a burst of load hits both alike
            t_ours = min(t_ours, _time(ours, prompts))
            if hf_model is not None:
                t_hf = min(t_hf, _time(theirs, prompts))
        row["ours_tokens_per_s"] = tokens / t_ours
        row["ours_flop_frac"] = 2 * params * tokens / t_ours / (peak * 1e9)
        row["ours_slot_occupancy"] = engine.stats["rollout/slot_occupancy"]
        if hf_model is not None:
            row["hf_tokens_per_s"] = tokens / t_hf
            row["hf_flop_frac"] = 2 * params * tokens / t_hf / (peak * 1e9)
            row["ratio"] = row["ours_tokens_per_s"] / row["hf_tokens_per_s"]
        rows.append(row)
        _print_row(row)

    result = {
        "bench": "rollout",
        "preset": preset,
        "params": params,
        "new_tokens": new_tokens,
        "threads": threads,
        "matmul_peak_gflops": peak,
        "torch": torch.__version__,
        "transformers": transformers_version() if hf else None,
        "repeats": repeats,
        "cpu_count": os.cpu_count(),
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "rows": rows,
    }
    print(
        f"preset={preset} params={params:,} threads={threads} matmul peak {peak:.1f} GFLOP/s "
        f"torch {torch.__version__}; load average {load_before[0]:.1f} → {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs (a loaded machine slows HF's many small ops most)"
    )
    if out:
        write_json(out, result)
        print(f"wrote {out}")
    return result


def _engine(model, tok, slots: int, window: int | None) -> Engine:
    e = Engine(model, tok, max_slots=slots)
    e.decode_window = window  # None: the device's default (framework/decode_loop.py)
    return e


def invariance(
    init: str = "", prompts: int = 128, n: int = 8, seed: int = 0, out: str | None = None, window: int | None = None
) -> dict:
    """Batch invariance on a trained checkpoint: the same (seed, prompt, sample) keys run with
    every group in one batch (256 slots), 16 slots, and one group at a time. Reports the share
    of samples whose tokens differ from the one-batch run, the share of tokens from the first
    divergence on, and the largest logprob difference over the tokens that agree."""
    model, tok, path = checkpoint.load_model(init or default_init())
    task = ArithmeticTask()
    items = task.items(prompts, "train", seed)
    ids = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    sp = SamplingParams(temperature=1.0, max_new_tokens=response_budget(task, items))
    base = _engine(model.eval(), tok, 256, window).generate(ids, n, sp, seed=seed)
    runs = {
        "slots_16": _engine(model, tok, 16, window).generate(ids, n, sp, seed=seed),
        "one_group_at_a_time": [
            s
            for g, p in enumerate(ids)
            for s in _engine(model, tok, n, window).generate([p], n, sp, seed=seed, group_offset=g)
        ],
    }
    result = {
        "bench": "batch_invariance",
        "checkpoint": str(path),
        "prompts": prompts,
        "samples_per_prompt": n,
        "tokens": sum(len(s.response_ids) for s in base),
        "decode_window": window,
    }
    for name, other in runs.items():
        diff_samples = diff_tokens = 0
        max_lp = 0.0
        for a, b in zip(base, other):
            m = next(
                (i for i, (x, y) in enumerate(zip(a.response_ids, b.response_ids)) if x != y),
                min(len(a.response_ids), len(b.response_ids)),
            )
            if a.response_ids != b.response_ids:
                diff_samples += 1
                diff_tokens += len(a.response_ids) - m
            max_lp = max([max_lp] + [abs(x - y) for x, y in zip(a.response_logprobs[:m], b.response_logprobs[:m])])
        result[name] = {
            "differing_samples_frac": diff_samples / len(base),
            "differing_tokens_frac": diff_tokens / result["tokens"],
            "max_logprob_abs_diff": max_lp,
        }
        print(
            f"{name:22s} differing samples {diff_samples}/{len(base)}  tokens from the first divergence "
            f"{diff_tokens}/{result['tokens']}  max |Δ logprob| on agreeing tokens {max_lp:.2e}"
        )
    if out:
        write_json(out, result)
        print(f"wrote {out}")
    return result


def _print_row(r: dict) -> None:
    if not hasattr(_print_row, "done"):
        print(f"{'batch':>6} {'ours tok/s':>11} {'HF tok/s':>10} {'ratio':>6} {'ours %peak':>10} {'HF %peak':>9}")
        _print_row.done = True
    hf = f"{r['hf_tokens_per_s']:>10.0f} {r['ratio']:>6.2f}" if "ratio" in r else f"{'-':>10} {'-':>6}"
    hfp = f"{100 * r['hf_flop_frac']:>8.1f}%" if "ratio" in r else f"{'-':>9}"
    print(f"{r['batch']:>6} {r['ours_tokens_per_s']:>11.0f} {hf} {100 * r['ours_flop_frac']:>9.1f}% {hfp}")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="posttrain bench rollout", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the results as JSON")
    p.add_argument("--preset", default="micro")
    p.add_argument("--batches", default="1,8,64,256", help="comma-separated batch sizes (prompts)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="timed runs per setting; the best counts")
    p.add_argument("--no-hf", action="store_true", help="time our engine only")
    p.add_argument(
        "--invariance",
        action="store_true",
        help="instead of timing: batch invariance of a trained checkpoint (--init) across batch shapes",
    )
    p.add_argument(
        "--decode-window", type=int, default=None, help="decode steps between read-backs (default: 1 on CPU, 8 on CUDA)"
    )
    p.add_argument("--init", default="", help="with --invariance: checkpoint or run dir (default: the cached SFT(CoT))")
    a = p.parse_args(argv)
    if a.invariance:
        torch.set_num_threads(a.threads)
        return invariance(a.init, out=a.out, window=a.decode_window)
    batches = tuple(int(b) for b in a.batches.split(","))
    return run(a.out, a.preset, batches, a.new_tokens, a.threads, a.repeats, hf=not a.no_hf, window=a.decode_window)


if __name__ == "__main__":
    main()
