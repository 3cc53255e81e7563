"""Every RL algorithm on the built-in task with the same sample budget, from the same SFT
checkpoint: held-out pass@1 / pass@8 before and after, mean length of correct and of wrong
answers, entropy, clip fraction, KL, wall time. Writes JSON and prints one table.

    posttrain bench algorithms --init runs/pipeline/sft --steps 50 --seeds 0 \
        --out benchmarks/results/algorithms.json      (or python benchmarks/algorithms.py ...)

Each run is `posttrain rl configs/grpo_arith.yaml algorithm=NAME prompts_per_step=16
optim.lr=3e-5` (16 prompts × 8 samples a step) with the algorithm's own defaults; only the KL coefficient of the preset
(0.01) is shared, where the algorithm has one. PPO adds its value head on the policy trunk.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

from posttrain import UsageError, algorithms
from posttrain.config import RLConfig, load_config
from posttrain.logging import read_metrics
from posttrain.recipes import rl

BUDGET = ["prompts_per_step=16", "optim.lr=3e-5"]   # on top of configs/grpo_arith.yaml
ORDER = ["reinforce", "rloo", "grpo", "dr_grpo", "dapo", "gspo", "cispo", "reinforce_pp", "maxrl",
              "dppo", "mgpo", "ppo"]


def _mean(ms, key):
    vals = [m[key] for m in ms if key in m]
    return statistics.fmean(vals) if vals else None


def one_run(name: str, init: str, steps: int, seed: int, out: Path, overrides=(), algo: dict | None = None) -> dict:
    """One `posttrain rl` run of `name` with the shared budget (plus `overrides`, and `algo`
    keys on top of the shared KL coefficient); returns its row of the table."""
    algo_fields = {f.name for f in dataclasses.fields(algorithms.get(name).Config)}
    algo = {**({"kl_coef": 0.01} if "kl_coef" in algo_fields else {}), **(algo or {})}
    cfg = load_config(RLConfig, "grpo_arith", [f"init={init}", f"out={out}", "overwrite=true", f"steps={steps}",
                                               f"seed={seed}", f"eval_every={steps}", f"algorithm={name}",
                                               *BUDGET, *overrides])
    cfg = dataclasses.replace(cfg, algo=algo)
    t0 = time.time()
    rl.run(cfg)
    ms = read_metrics(out)
    train = [m for m in ms[1:] if "reward/mean" in m]
    return {"algorithm": name, "seed": seed, "steps": steps, "wall_s": round(time.time() - t0, 1),
            "pass@1_start": ms[0]["eval/pass@1"], "pass@1_end": ms[-1]["eval/pass@1"],
            "pass@8_start": ms[0]["eval/pass@8"], "pass@8_end": ms[-1]["eval/pass@8"],
            "length_correct": _mean(train, "length/correct_mean"), "length_wrong": _mean(train, "length/wrong_mean"),
            "entropy": _mean(train, "entropy"), "clip_frac": _mean(train, "clip/frac"), "kl_ref": _mean(train, "kl/ref"),
            "reward_first10": statistics.fmean(m["reward/mean"] for m in train[:10]),
            "reward_last10": statistics.fmean(m["reward/mean"] for m in train[-10:]),
            "curves": {k: [round(m.get(k, float("nan")), 4) for m in train]
                       for k in ("reward/mean", "entropy", "length/wrong_mean", "length/correct_mean",
                                 "clip/frac", "group/degenerate_frac")}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="posttrain bench algorithms")
    p.add_argument("--init", default="", help="SFT run directory or checkpoint (default: the cached SFT(CoT))")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--seeds", default="0", help="comma-separated seeds")
    p.add_argument("--algorithms", default=",".join(ORDER))
    p.add_argument("--runs", default="runs/algorithms")
    p.add_argument("--out", default="benchmarks/results/algorithms.json")
    args = p.parse_args(argv)
    unknown = set(args.algorithms.split(",")) - set(algorithms.ALGORITHMS)
    if unknown:
        raise UsageError(f"--algorithms: unknown {sorted(unknown)}; choose from {', '.join(algorithms.ALGORITHMS)}")
    init = args.init or rl.default_init()
    rows = []
    for name in args.algorithms.split(","):
        for seed in map(int, args.seeds.split(",")):
            rows.append(one_run(name, init, args.steps, seed, Path(args.runs, f"{name}_s{seed}")))
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(rows, indent=1))
    print(format_table(rows))


def format_table(rows) -> str:
    head = f"{'algorithm':13} {'seed':>4} {'pass@1':>13} {'pass@8':>13} {'len ok':>7} {'len bad':>7} " \
           f"{'entropy':>7} {'clip':>6} {'kl':>6} {'wall s':>6}"
    f = lambda v, w=7, d=2: f"{v:{w}.{d}f}" if v is not None else f"{'-':>{w}}"
    lines = [head]
    for r in rows:
        lines.append(f"{r['algorithm']:13} {r['seed']:>4} {r['pass@1_start']:.3f}→{r['pass@1_end']:.3f}  "
                     f"{r['pass@8_start']:.3f}→{r['pass@8_end']:.3f} {f(r['length_correct'])} {f(r['length_wrong'])} "
                     f"{f(r['entropy'], 7, 3)} {f(r['clip_frac'], 6, 3)} {f(r['kl_ref'], 6, 3)} {r['wall_s']:6.0f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
