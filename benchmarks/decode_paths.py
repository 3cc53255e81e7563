"""The rollout's two decode paths on CPU: models/decode.py (fast) against `model.forward` (the slow
path every architecture outside models/decode_weights.FAMILIES takes), on the same HF model.

    python benchmarks/decode_paths.py [--label after] [--batches 8,64] [--repeats 5] [--threads 1]
        [--out benchmarks/results/decode_paths.json]

A randomly initialised HF model of the `micro` shape (d 256, 6 layers, 8 heads, 2 KV heads, MLP 688,
the arithmetic task's character vocabulary), once as a `LlamaForCausalLM` and once as a
`Qwen2ForCausalLM` (q/k/v biases). Each batch samples one response per arithmetic prompt,
exactly `--new-tokens` tokens (ignore_eos), temperature 1, through one Engine; the runs alternate
fast, slow, fast, slow… (`engine.fast_decode = False` forces the slow path) and each keeps its
best time, so both see the same machine. `slow_over_fast` is the ratio of the two. Timings on a
shared machine move with its load (recorded); `ops_per_decode_step`, the aten ops that compute
in one decode step of the engine (views excluded: about one kernel launch each on a GPU), does not.

The script uses only APIs that 7de35f4 already had, so `--label before` with PYTHONPATH on a
checkout of that commit measures the code before this change into the same JSON (under its
label); there a Qwen2 never takes the fast path, and the row says so (`fast_path: false`).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from posttrain.bench import best_of, update_json
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.models.hf import load_hf, write_tiny
from posttrain.tasks.arithmetic import ArithmeticTask

MICRO = dict(d_model=256, n_layers=6, n_heads=8, n_kv_heads=2, d_ff=688, max_len=512)


class _CountOps(TorchDispatchMode):
    """Counts the aten ops that compute (views excluded): on a GPU each is about one kernel launch,
    the cost that dominates decoding small batches there. Independent of the machine's load."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += not func.is_view
        return func(*args, **(kwargs or {}))


def ops_per_step(engine: Engine, prompts, fast: bool) -> float:
    """Ops per decode step of the whole engine (sampling included): generate 17 tokens minus
    generate 1 (no decode forward), over the 16 decode steps between."""
    engine.fast_decode = fast
    counts = []
    for M in (1, 17):
        with _CountOps() as c:
            engine.generate(prompts, 1, SamplingParams(temperature=1.0, max_new_tokens=M, ignore_eos=True))
        counts.append(c.n)
    return (counts[1] - counts[0]) / 16


def measure(arch: str, batches, new_tokens: int, repeats: int, tmp: Path) -> dict:
    model, tok = load_hf(write_tiny(tmp / arch, arch, **MICRO))
    task = ArithmeticTask()
    sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True)
    engine = Engine(model, tok, max_slots=max(batches))
    row: dict = {"class": type(model.hf).__name__, "params": sum(p.numel() for p in model.parameters())}
    row["fast_path"] = engine.decoder() is not None
    for B in batches:
        prompts = [tok.encode(tok.chat_prompt(task.prompt(i))) for i in task.items(B, seed=0)]

        def run(fast: bool, prompts=prompts) -> None:
            engine.fast_decode = fast
            engine.generate(prompts, 1, sampling, seed=1)

        best = {True: float("inf"), False: float("inf")}
        for fast in (True, False):
            run(fast)  # warm-up of each path
        for _ in range(repeats):
            for fast in (True, False):
                best[fast] = min(best[fast], best_of(lambda f=fast: run(f), 1))
        tokens = B * new_tokens
        ops = {"fast": ops_per_step(engine, prompts, True), "slow": ops_per_step(engine, prompts, False)}
        row[f"batch_{B}"] = {
            "ops_per_decode_step": ops,
            "fast_s": best[True],
            "slow_s": best[False],
            "fast_tokens_per_s": tokens / best[True],
            "slow_tokens_per_s": tokens / best[False],
            "slow_over_fast": best[False] / best[True],
        }
        print(
            f"{row['class']} batch {B}: fast {tokens / best[True]:.0f} tok/s, slow {tokens / best[False]:.0f} "
            f"tok/s, slow/fast {best[False] / best[True]:.2f}; ops a decode step {ops['fast']:.0f} / {ops['slow']:.0f}"
            + ("" if row["fast_path"] else " (no fast path)"),
            flush=True,
        )
    engine.fast_decode = True
    return row


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--label", default="after")
    p.add_argument("--batches", default="8,64")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "benchmarks/results/decode_paths.json"))
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    batches = [int(b) for b in a.batches.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="decode_paths_"))
    result = {
        "threads": a.threads,
        "torch": torch.__version__,
        "load_avg_before": os.getloadavg(),
        "shape": MICRO,
        "new_tokens": a.new_tokens,
        "repeats": a.repeats,
    }
    for arch in ("llama", "qwen2"):
        result[arch] = measure(arch, batches, a.new_tokens, a.repeats, tmp)
    result["load_avg_after"] = os.getloadavg()
    update_json(a.out, lambda obj: {**obj, a.label: result})
    print(f"wrote {a.out} [{a.label}]")
    return result


if __name__ == "__main__":
    main()
