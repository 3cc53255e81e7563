"""Sync vs async RL on the same sample budget (issue 7; lessons 06, 22a, 22c).

    POSTTRAIN_CACHE=/work/cache python benchmarks/async_vs_sync.py [--steps 30] [--seeds 0,1,2] [--set K=V ...]
        [--init CKPT] [--out benchmarks/results/async_vs_sync.json]

Every run starts from the same SFT(CoT) checkpoint with the grpo_arith preset and the same
prompts and samples per step for the same number of steps, so each sees the same number
of samples. Runs:

    sync          in-process, strictly on-policy                                    (every seed)
    async_tis     async, max_staleness=1 (paced), token-level truncated IS          (every seed)
    fixed4_none   async, stale=fixed: every batch exactly 4 versions old, no correction:
                  the PPO ratio is taken against the behaviour policy μ             (first seed)
    fixed4_tis    the same with the correction (ratio against π_prox, weight π_prox/μ)  (first seed)

Reported per run: held-out pass@1 before and after, samples/s, trainer idle fraction, mean
staleness, and the diagnostics that show off-policy damage (clip/frac, ratio/max,
offpolicy/log_ratio_abs). Wall times depend on the machine's load; learning numbers do not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from posttrain.config import RLConfig, load_config  # noqa: E402
from posttrain.logging import read_metrics  # noqa: E402
from posttrain.recipes import rl  # noqa: E402

RUNS = {
    "sync": [],
    "async_tis": ["async=true", "max_staleness=1", "off_policy_correction=tis"],
    "fixed4_none": ["async=true", "max_staleness=4", "stale=fixed", "off_policy_correction=none"],
    "fixed4_tis": ["async=true", "max_staleness=4", "stale=fixed", "off_policy_correction=tis"],
}
EVERY_SEED = ("sync", "async_tis")
MEANS = (
    "staleness/mean",
    "clip/frac",
    "ratio/mean",
    "ratio/max",
    "offpolicy/log_ratio_abs",
    "offpolicy/capped_frac",
    "reward/mean",
    "time/trainer_idle_s",
    "time/step_s",
)


def one(name: str, seed: int, args) -> dict:
    out = Path(args.runs) / f"{name}_s{seed}"
    overrides = [
        f"out={out}",
        "overwrite=true",
        f"seed={seed}",
        f"steps={args.steps}",
        "eval_every=0",
        f"prompts_per_step={args.prompts}",
        f"eval_problems={args.eval_problems}",
        "eval_samples=4",
        "threads=1",
        "save_every=0",
        *([f"init={args.init}"] if args.init else []),
        *RUNS[name],
        *args.set,
    ]
    rl.run(load_config(RLConfig, "grpo_arith", overrides))
    rows = read_metrics(out)
    steps = [r for r in rows if r.get("step", 0) > 0]
    mean = {k: statistics.fmean(r[k] for r in steps if k in r) for k in MEANS if any(k in r for r in steps)}
    tp = json.loads((out / "throughput.json").read_text())
    return {
        "run": name,
        "seed": seed,
        "steps": args.steps,
        "samples_per_step": args.prompts * 8,
        "eval_problems": args.eval_problems,
        "pass@1_before": rows[0]["eval/pass@1"],
        "pass@1_after": rows[-1]["eval/pass@1"],
        "samples_per_s": tp["samples_per_s"],
        "trainer_idle_frac": tp["trainer_idle_frac"],
        "bottleneck": tp["bottleneck"],
        "roles_s": tp["roles_s"],
        **{f"mean {k}": v for k, v in mean.items()},
    }


def report(results: list[dict], steps: int, samples_per_step: int, out: str, overrides: list[str] = ()) -> dict:
    names = list(dict.fromkeys(r["run"] for r in results))
    summary = {}
    for n in names:
        rs = [r for r in results if r["run"] == n]
        gains = [r["pass@1_after"] - r["pass@1_before"] for r in rs]
        summary[n] = {
            "seeds": len(rs),
            "pass@1_after_mean": statistics.fmean(r["pass@1_after"] for r in rs),
            "pass@1_gain_mean": statistics.fmean(gains),
            "pass@1_gain_sd": statistics.stdev(gains) if len(gains) > 1 else 0.0,
            "samples_per_s_mean": statistics.fmean(r["samples_per_s"] for r in rs),
            "trainer_idle_frac_mean": statistics.fmean(r["trainer_idle_frac"] for r in rs),
        }
    rep = {
        "steps": steps,
        "samples_per_step": samples_per_step,
        "overrides": list(overrides),
        "summary": summary,
        "runs": results,
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(rep, indent=2))
    print(f"{'run':12} {'seeds':>5} {'pass@1 gain':>14} {'samples/s':>10} {'trainer idle':>13}")
    for n, s in summary.items():
        print(
            f"{n:12} {s['seeds']:>5} {s['pass@1_gain_mean']:+8.3f} ±{s['pass@1_gain_sd']:.3f} "
            f"{s['samples_per_s_mean']:>10.1f} {100 * s['trainer_idle_frac_mean']:>12.0f}%"
        )
    for r in results:
        print(
            f"{r['run']:12} seed {r['seed']}  pass@1 {r['pass@1_before']:.3f} → {r['pass@1_after']:.3f}  "
            f"staleness {r.get('mean staleness/mean', 0):.2f}  clip/frac {r['mean clip/frac']:.4f}  "
            f"ratio/max {r['mean ratio/max']:.2f}  |log π_prox/μ| {r.get('mean offpolicy/log_ratio_abs', 0):.3f}"
        )
    return rep


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--prompts", type=int, default=16, help="prompts per step (8 samples each)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--set", nargs="*", default=[], help="more key=value overrides for every run (e.g. optim.lr=3e-5)")
    p.add_argument("--eval-problems", type=int, default=200)
    p.add_argument("--init", default="", help="SFT checkpoint (default: the cached SFT(CoT) one)")
    p.add_argument("--only", default="", help="comma-separated run names (default: all)")
    p.add_argument("--runs", default="runs/bench_async")
    p.add_argument("--out", default="benchmarks/results/async_vs_sync.json")
    p.add_argument(
        "--merge",
        nargs="*",
        default=None,
        help="combine the JSON files of runs split over processes (e.g. one per seed) into --out",
    )
    args = p.parse_args(argv)
    if args.merge:
        parts = [json.loads(Path(f).read_text()) for f in args.merge]
        results = sorted(
            (r for part in parts for r in part["runs"]), key=lambda r: (list(RUNS).index(r["run"]), r["seed"])
        )
        return report(results, parts[0]["steps"], parts[0]["samples_per_step"], args.out, parts[0].get("overrides", []))
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.only.split(",") if args.only else list(RUNS)
    results = [one(n, s, args) for s in seeds for n in names if s == seeds[0] or n in EVERY_SEED]
    return report(results, args.steps, args.prompts * 8, args.out, args.set)


if __name__ == "__main__":
    main()
