"""What periodic checkpoints (`save_minutes`) cost, and proof that they change no number: the RL stage
run twice from the same init, with only the final checkpoint (save_minutes=0) and with a checkpoint
every --minutes, each save timed.

    python benchmarks/periodic_save_cost.py --init runs/cache/sft_cot/sft [--steps 40] [--minutes 0.1]

Reports seconds per save (model.safetensors + trainer.pt with AdamW's state + fsync + rename), the
number of saves, their share of the run's wall time, and whether the two runs' metrics (timings
aside) and final weights are identical. The cost under the default (10 minutes) follows: one save
per 10 minutes of run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

import posttrain
from posttrain import checkpoint

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--init", required=True, help="an SFT run of the built-in task (the RL stage's start)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--minutes", type=float, default=0.1, help="save_minutes of the saving run")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/periodic_save_cost.json"))
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="save_cost_"))
    real_save, times = checkpoint.save, []

    def timed_save(*a, **k):
        t0 = time.perf_counter()
        path = real_save(*a, **k)
        times.append(time.perf_counter() - t0)
        return path

    checkpoint.save = timed_save
    load_before, runs = os.getloadavg(), {}
    for name, minutes in (("final_only", 0.0), ("periodic", args.minutes)):
        times.clear()
        t0 = time.perf_counter()
        run = posttrain.rl(
            init=args.init,
            out=str(tmp / name),
            steps=args.steps,
            save_minutes=minutes,
            threads=args.threads,
            tensorboard=False,
            eval_every=0,
        )
        wall = time.perf_counter() - t0
        metrics = [
            {k: v for k, v in m.items() if not k.startswith(("time/", "rollout/", "train/"))} for m in run.metrics
        ]
        runs[name] = {"wall_s": wall, "saves": len(times), "save_s": list(times), "metrics": metrics, "path": run.path}
    checkpoint.save = real_save
    a, b = (load_file(str(checkpoint.latest(runs[n]["path"]) / "model.safetensors")) for n in runs)
    periodic = runs["periodic"]
    per_save = statistics.median(periodic["save_s"])
    result = {
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "steps": args.steps,
        "save_minutes": args.minutes,
        "checkpoint_mb": sum(f.stat().st_size for f in checkpoint.latest(periodic["path"]).rglob("*")) / 2**20,
        "seconds_per_save": {"median": per_save, "max": max(periodic["save_s"])},
        "saves": {n: r["saves"] for n, r in runs.items()},
        "wall_s": {n: r["wall_s"] for n, r in runs.items()},
        "periodic_share_of_wall": sum(periodic["save_s"][:-1]) / periodic["wall_s"],
        "default_share_estimate": per_save / 600.0,  # one save per 10 minutes
        "same_metrics": runs["final_only"]["metrics"] == periodic["metrics"],
        "same_weights": a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a),
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
