"""Curate the RL prompts of the shared arithmetic task for an SFT checkpoint: pass-rate probe
(K samples per prompt), difficulty buckets, dedup, decontamination against the held-out
prompts, learnable-band filter. Writes JSON and prints the metrics.

    python benchmarks/curation.py --init /work/cache/sft_cot/sft --out benchmarks/results/curation.json

`frac_groups_with_signal` is the share of prompts whose K rewards are not all equal: the
share of GRPO groups with a non-zero advantage. Curation should raise it to ~1.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from posttrain import checkpoint
from posttrain.data.curate import curate, probe
from posttrain.eval import response_budget
from posttrain.framework.rollout import Engine
from posttrain.tasks.arithmetic import ArithmeticTask


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--init", required=True, help="SFT run directory or checkpoint")
    p.add_argument("--out", default="benchmarks/results/curation.json")
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--band", default="0.125,0.875", help="learnable band lo,hi of the pass rate")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    lo, hi = map(float, args.band.split(","))
    model, tok, path = checkpoint.load_model(args.init, "cpu")
    task = ArithmeticTask()
    items = task.items(args.prompts, "train", seed=args.seed)
    evals = [task.prompt(it) for it in task.items(200, "test", seed=args.seed)]
    t0 = time.perf_counter()
    rates, signal = probe(
        Engine(model, tok, max_slots=256),
        tok,
        task,
        items,
        k=args.k,
        max_new_tokens=response_budget(task, items),
        seed=args.seed,
    )
    kept, metrics = curate(items, [task.prompt(it) for it in items], rates, signal, evals, band=(lo, hi))
    by_k = {}
    for it, r in zip(items, rates):
        by_k.setdefault(it.k, []).append(float(r))
    result = {
        "init": str(path),
        "prompts": args.prompts,
        "k": args.k,
        "band": [lo, hi],
        **metrics,
        "mean_pass_rate": float(rates.mean()),
        "pass_rate_by_terms": {k: sum(v) / len(v) for k, v in sorted(by_k.items())},
        "kept_terms": sorted({it.k for it in kept}),
        "wall_s": time.perf_counter() - t0,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
