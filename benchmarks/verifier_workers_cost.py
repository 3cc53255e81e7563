"""What scoring in worker processes costs an RL step: `verifier.workers=2` against `verifier.workers=0`
(in-process), on the built-in countdown task and on the same task as JSONL rows scored by the
user's reward functions (examples/countdown_jsonl), same model and budget (128 samples a step).

    python benchmarks/verifier_workers_cost.py [--steps 8] [--reps 3] [--out benchmarks/results/verifier_workers_cost.json]

The four arms alternate within each repetition so they see the same machine; a run's number is
the median of its steps after the first (`time/step_s`, and `time/reward_s`, the scoring alone).
The load average is recorded before and after. A fresh gpt_mini with the countdown vocabulary
samples (step time depends on lengths, not on the weights' quality: every arm samples the same).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from generic_path import countdown_arms

import posttrain

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/verifier_workers_cost.json"))
    args = p.parse_args(argv)
    return run(args, Path(tempfile.mkdtemp(prefix="workers_cost_")))


def run(args, tmp: Path) -> dict:
    load_before = os.getloadavg()
    common, tasks = countdown_arms(tmp, args.threads, args.steps)
    arms = [(t, w) for t in tasks for w in (0, args.workers)]
    step: dict = {f"{t}_w{w}": [] for t, w in arms}
    reward: dict = {k: [] for k in step}
    rewards_seen: dict = {k: [] for k in step}
    for rep in range(args.reps):
        for t, w in arms:
            name = f"{t}_w{w}"
            r = posttrain.rl(
                out=str(tmp / f"{name}_{rep}"),
                overwrite=True,
                seed=rep,
                task=tasks[t],
                verifier={"workers": w},
                **common,
            )
            steps = [m for m in r.metrics if "time/step_s" in m][1:]
            step[name].append(statistics.median(m["time/step_s"] for m in steps))
            reward[name].append(statistics.median(m["time/reward_s"] for m in steps))
            rewards_seen[name].append([round(m["reward/mean"], 6) for m in steps])
    result: dict = {
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "steps": args.steps,
        "reps": args.reps,
        "threads": args.threads,
        "workers": args.workers,
        "samples_per_step": 128,
        "step_s": {k: {"median": statistics.median(v), "runs": [round(x, 4) for x in v]} for k, v in step.items()},
        "reward_s": {k: {"median": statistics.median(v), "runs": [round(x, 5) for x in v]} for k, v in reward.items()},
    }
    for t in tasks:
        w0, wn = f"{t}_w0", f"{t}_w{args.workers}"
        extra = result["reward_s"][wn]["median"] - result["reward_s"][w0]["median"]
        result[f"{t}_workers_extra_reward_s"] = extra
        result[f"{t}_workers_extra_frac_of_step"] = extra / result["step_s"][w0]["median"]
        result[f"{t}_same_rewards"] = rewards_seen[w0] == rewards_seen[wn]  # workers change no reward
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
