"""The generic path's cost: an RL step on the built-in countdown task vs the same task written out as
JSONL and scored by the user's reward functions (examples/countdown_jsonl), same model and budget.

    python benchmarks/generic_path.py [--init RUN] [--steps 8] [--reps 3] [--out benchmarks/results/generic_path.json]

Runs alternate (built-in, dataset, built-in, …) so both see the same machine; the step time of a run
is the median `time/step_s` after its first step (evaluations are outside the step). Without --init
a fresh gpt_mini with the countdown vocabulary is used (step time does not depend on the weights'
quality, only on lengths: the same model samples both).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import posttrain

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--init", default="")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/generic_path.json"))
    args = p.parse_args(argv)
    return run(args, Path(tempfile.mkdtemp(prefix="generic_path_")))


def countdown_arms(tmp: Path, threads: int, steps: int, init: str = "") -> tuple[dict, dict]:
    """The RL budget both arms share (from `init`, else a fresh gpt_mini with the countdown vocabulary)
    and the two task sections: the built-in countdown and its rows (examples/countdown_jsonl) in tmp/data."""
    import runpy

    runpy.run_path(str(ROOT / "examples/countdown_jsonl/export.py"), run_name="not_main")["main"](
        ["--out", str(tmp / "data"), "--train", "4000", "--test", "50"]
    )
    if not init:  # a fresh model, countdown vocabulary
        posttrain.pretrain(
            task={"name": "countdown"},
            steps=1,
            out=str(tmp / "init"),
            threads=threads,
            tensorboard=False,
            corpus_chars=5000,
            batch_size=2,
        )
        init = str(tmp / "init")
    rewards = str(ROOT / "examples/countdown_jsonl/rewards.py")
    common = dict(
        init=init,
        steps=steps,
        eval_every=0,
        threads=threads,
        tensorboard=False,
        rollout={"prompts_per_step": 16, "samples_per_prompt": 8, "max_new_tokens": 24},
        eval={"problems": 1, "samples": 1},
        algo={"name": "grpo", "kl_coef": 0.01},
    )
    tasks = {
        "builtin": {"name": "countdown", "min_numbers": 2, "max_numbers": 3},
        "dataset": {
            "name": "dataset",
            "train": str(tmp / "data/train.jsonl"),
            "test": str(tmp / "data/test.jsonl"),
            "reward": f"{rewards}:correct,{rewards}:fmt",
            "reward_weights": [1.0, 0.1],
            "correct": f"{rewards}:correct",
        },
    }
    return common, tasks


def run(args, tmp: Path) -> dict:
    common, tasks = countdown_arms(tmp, args.threads, args.steps, args.init)
    paths = {name: dict(task=section) for name, section in tasks.items()}
    times: dict = {k: [] for k in paths}
    for rep in range(args.reps):
        for name, keys in paths.items():
            run = posttrain.rl(out=str(tmp / f"{name}_{rep}"), overwrite=True, seed=rep, **common, **keys)
            steps = [m for m in run.metrics if "time/step_s" in m][1:]
            times[name].append(statistics.median(m["time/step_s"] for m in steps))
    result = {
        "load_avg": os.getloadavg(),
        "steps": args.steps,
        "reps": args.reps,
        "threads": args.threads,
        "samples_per_step": 128,
        **{f"{k}_step_s": {"median": statistics.median(v), "runs": [round(x, 4) for x in v]} for k, v in times.items()},
    }
    result["dataset_over_builtin"] = result["dataset_step_s"]["median"] / result["builtin_step_s"]["median"]
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
