"""Every RL algorithm on the built-in task with the same sample budget, from the same SFT
checkpoint: held-out pass@1 / pass@8 before and after, mean length of correct and of wrong
answers, entropy, clip fraction, KL, wall time. Writes JSON and prints one table.

    posttrain bench algorithms --init runs/pipeline/sft --steps 50 --seeds 0 \
        --out benchmarks/results/algorithms.json      (or python benchmarks/algorithms.py ...)

Each run is `posttrain rl configs/grpo_arith.yaml algo.name=NAME rollout.prompts_per_step=16
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

from posttrain import algorithms
from posttrain.config import RLConfig, build, load_config
from posttrain.errors import UsageError
from posttrain.logging import read_metrics
from posttrain.recipes import rl
from posttrain.recipes.warm_start import default_init

BUDGET = ["rollout.prompts_per_step=16", "optim.lr=3e-5"]  # on top of configs/grpo_arith.yaml
ORDER = [
    "reinforce",
    "rloo",
    "grpo",
    "dr_grpo",
    "dapo",
    "gspo",
    "cispo",
    "reinforce_pp",
    "maxrl",
    "dppo",
    "mgpo",
    "ppo",
]


def _mean(ms, key):
    vals = [m[key] for m in ms if key in m]
    return statistics.fmean(vals) if vals else None


def one_run(name: str, init: str, steps: int, seed: int, out: Path, overrides=(), algo: dict | None = None) -> dict:
    """One `posttrain rl` run of `name` with the shared budget (plus `overrides`, and `algo`
    keys on top of the shared KL coefficient); returns its row of the table."""
    algo_fields = {f.name for f in dataclasses.fields(algorithms.get(name).Config)}
    algo = {**({"kl_coef": 0.01} if "kl_coef" in algo_fields else {}), **(algo or {})}
    cfg = load_config(
        RLConfig,
        "grpo_arith",
        [
            f"init={init}",
            f"out={out}",
            "overwrite=true",
            f"steps={steps}",
            f"seed={seed}",
            f"eval_every={steps}",
            *BUDGET,
            *overrides,
        ],
    )
    cfg = dataclasses.replace(cfg, algo=build(algorithms.get(name).Config, {"name": name, **algo}, "algo."))
    t0 = time.time()
    rl.run(cfg)
    ms = read_metrics(out)
    train = [m for m in ms[1:] if "reward/mean" in m]
    return {
        "algorithm": name,
        "seed": seed,
        "init": init,  # the checkpoint every seed of a table should share
        "steps": steps,
        "wall_s": round(time.time() - t0, 1),
        "pass@1_start": ms[0]["eval/pass@1"],
        "pass@1_end": ms[-1]["eval/pass@1"],
        "pass@8_start": ms[0]["eval/pass@8"],
        "pass@8_end": ms[-1]["eval/pass@8"],
        "length_correct": _mean(train, "length/correct_mean"),
        "length_wrong": _mean(train, "length/wrong_mean"),
        "entropy": _mean(train, "entropy"),
        "clip_frac": _mean(train, "clip/frac"),
        "kl_ref": _mean(train, "kl/ref"),
        "reward_first10": statistics.fmean(m["reward/mean"] for m in train[:10]),
        "reward_last10": statistics.fmean(m["reward/mean"] for m in train[-10:]),
        "curves": {
            k: [round(m.get(k, float("nan")), 4) for m in train]
            for k in (
                "reward/mean",
                "entropy",
                "length/wrong_mean",
                "length/correct_mean",
                "clip/frac",
                "group/degenerate_frac",
            )
        },
    }


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
    init = args.init or default_init()
    out = Path(args.out)
    rows = json.loads(out.read_text()) if out.exists() else []  # earlier seeds stay; a re-run replaces its row
    for name in args.algorithms.split(","):
        for seed in map(int, args.seeds.split(",")):
            row = one_run(name, init, args.steps, seed, Path(args.runs, f"{name}_s{seed}"))
            rows = [r for r in rows if (r["algorithm"], r["seed"]) != (name, seed)] + [row]
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(rows, indent=1))
    print(format_table(rows))
    print(format_summary(rows))


def summarize(rows) -> list[dict]:
    """Per algorithm (in ORDER): mean and sample std over seeds of pass@1 / pass@8 at the end,
    the mean pass@1 gain over the start, and how many seeds improved pass@1."""
    out = []
    for name in [n for n in ORDER if any(r["algorithm"] == n for r in rows)]:
        rs = [r for r in rows if r["algorithm"] == name]
        p1, p8 = [r["pass@1_end"] for r in rs], [r["pass@8_end"] for r in rs]
        sd = lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0
        out.append(
            {
                "algorithm": name,
                "seeds": len(rs),
                "pass@1_start": rs[0]["pass@1_start"],
                "pass@1_end_mean": statistics.fmean(p1),
                "pass@1_end_std": sd(p1),
                "pass@1_gain_mean": statistics.fmean(r["pass@1_end"] - r["pass@1_start"] for r in rs),
                "improved_seeds": sum(r["pass@1_end"] > r["pass@1_start"] for r in rs),
                "pass@8_start": rs[0]["pass@8_start"],
                "pass@8_end_mean": statistics.fmean(p8),
                "pass@8_end_std": sd(p8),
                "entropy_mean": statistics.fmean(r["entropy"] for r in rs if r["entropy"] is not None),
                "wall_s_mean": statistics.fmean(r["wall_s"] for r in rs),
            }
        )
    return out


def format_summary(rows) -> str:
    """summarize() as a Markdown table (docs/results.md's)."""
    lines = [
        "| algorithm | seeds | pass@1 start → end (mean ± std) | gain | improved | pass@8 start → end | entropy |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summarize(rows):
        lines.append(
            f"| {s['algorithm']} | {s['seeds']} | {s['pass@1_start']:.3f} → {s['pass@1_end_mean']:.3f} ± "
            f"{s['pass@1_end_std']:.3f} | {s['pass@1_gain_mean']:+.3f} | {s['improved_seeds']}/{s['seeds']} | "
            f"{s['pass@8_start']:.3f} → {s['pass@8_end_mean']:.3f} ± {s['pass@8_end_std']:.3f} | "
            f"{s['entropy_mean']:.3f} |"
        )
    return "\n".join(lines)


def format_table(rows) -> str:
    head = (
        f"{'algorithm':13} {'seed':>4} {'pass@1':>13} {'pass@8':>13} {'len ok':>7} {'len bad':>7} "
        f"{'entropy':>7} {'clip':>6} {'kl':>6} {'wall s':>6}"
    )
    f = lambda v, w=7, d=2: f"{v:{w}.{d}f}" if v is not None else f"{'-':>{w}}"
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['algorithm']:13} {r['seed']:>4} {r['pass@1_start']:.3f}→{r['pass@1_end']:.3f}  "
            f"{r['pass@8_start']:.3f}→{r['pass@8_end']:.3f} {f(r['length_correct'])} {f(r['length_wrong'])} "
            f"{f(r['entropy'], 7, 3)} {f(r['clip_frac'], 6, 3)} {f(r['kl_ref'], 6, 3)} {r['wall_s']:6.0f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
