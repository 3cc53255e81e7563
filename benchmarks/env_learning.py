"""A `verifiers` environment and an OpenEnv environment, each trained through the server path: does reward rise?

    python -m posttrain.cli pipeline out=runs/env_bench/chain stages=pretrain,sft task.max_terms=3 \
        sft.target_acc=0.5 threads=1 report=false eval_problems=100          # the start (~10 min on 2 cores)
    python benchmarks/env_learning.py --init runs/env_bench/chain/sft [--seeds 0,1,2] [--steps 16]
        [--envs verifiers,openenv] [--lr 5e-5] [--out benchmarks/results/env_learning.json]

Both environments pose the same small task the char-level gpt_mini can learn (sums of 2–3
integers up to 19, reward 1 when the last number of the reply is the sum) but are written with
the outside libraries alone: examples/envs/arith_verifiers.py (verifiers SingleTurnEnv + Rubric)
and examples/envs/arith_openenv.py (an OpenEnv Environment served by openenv's create_app, started
here on 127.0.0.1). GRPO runs with the policy behind `posttrain serve`; every episode reaches it
over HTTP. The JSON holds, per environment and seed, the training reward curve, the held-out
greedy accuracy before and after, and the load average.

A step draws only 8 sums, and a 3-term sum is solved about half as often as a 2-term one, so with
sums of 2-3 terms the share of 3-term sums per quarter moves the curve as much as learning does
(each run records it: train_terms_*). `--min-terms 3 --steps 40` fixes the difficulty for both
arms (benchmarks/results/env_learning_3terms.json). The two arms' held-out sets differ with 2-3
terms: verifiers' eval rows drop every sum seen in training, which leaves only 3-term sums.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's posttrain
sys.path.insert(0, str(ROOT / "examples" / "envs"))

COMMON = [
    "rollout.prompts_per_step=8",
    "rollout.samples_per_prompt=8",
    "rollout.max_new_tokens=32",
    "algo.kl_coef=0.0",
    "eval.problems=64",
    "eval.samples=4",
    "eval.save_samples=4",
    "threads=1",
    "log_every=1",
    "verifier.timeout_s=120",
    "overwrite=true",
]


def terms_per_step(cfg, steps: int) -> list[float]:
    """The mean number of terms of each step's training sums, rebuilt from the run's seeds (the items
    of a step depend on (seed, step) alone): a 3-term sum is solved about half as often as a 2-term
    one, so a quarter that drew more of them lowers the reward curve without any change in the policy."""
    import arith_openenv

    from posttrain import tasks

    task, env, out = tasks.make(cfg.task), arith_openenv.SumEnvironment(), []
    for step in range(1, steps + 1):
        items = task.items(cfg.rollout.prompts_per_step, "train", seed=f"{cfg.seed}/{step}/0")
        sums = [
            it["question"] if "question" in it else env.reset(seed=it["seed"], **cfg.task.reset_args).question
            for it in items
        ]
        out.append(sum(q.count("+") + 1 for q in sums) / len(sums))
    return out


def one_run(
    env: str, seed: int, steps: int, init: str, out: Path, openenv_url: str, lr: float, min_terms: int = 2
) -> dict:
    from posttrain.config import RLConfig, load_config
    from posttrain.logging import read_metrics
    from posttrain.recipes import rl

    task = {
        "verifiers": [
            f"task.name=verifiers:{ROOT}/examples/envs/arith_verifiers.py",
            f"task.env_args={{min_terms: {min_terms}, max_terms: 3, n: 4000, eval_n: 300}}",
        ],
        "openenv": [
            "task.name=openenv",
            f"task.url={openenv_url}",
            "task.observation_field=question",
            f"task.reset_args={{min_terms: {min_terms}, max_terms: 3}}",
        ],
    }[env]
    cfg = load_config(
        RLConfig,
        None,
        [
            f"out={out}",
            f"init={init}",
            f"seed={seed}",
            f"steps={steps}",
            f"eval_every={steps}",
            f"optim.lr={lr}",
            *COMMON,
            *task,
        ],
    )
    t0 = time.perf_counter()
    rl.run(cfg)
    wall = time.perf_counter() - t0
    m = read_metrics(out)
    curve = [r["reward/mean"] for r in m[1:]]
    k = max(1, len(curve) // 4)
    terms = terms_per_step(cfg, len(curve))
    return {
        "env": env,
        "seed": seed,
        "steps": steps,
        "wall_s": wall,
        "reward_curve": curve,
        "reward_first_quarter": sum(curve[:k]) / k,
        "reward_last_quarter": sum(curve[-k:]) / k,
        "train_terms_per_step": terms,
        "train_terms_first_quarter": sum(terms[:k]) / k,
        "train_terms_last_quarter": sum(terms[-k:]) / k,
        "heldout_greedy_before": m[0]["eval/greedy_acc"],
        "heldout_greedy_after": m[-1]["eval/greedy_acc"],
        "heldout_pass@1_before": m[0].get("eval/pass@1"),
        "heldout_pass@1_after": m[-1].get("eval/pass@1"),
        "heldout_errors_before": m[0].get("eval/errors"),
        "heldout_errors_after": m[-1].get("eval/errors"),
        "heldout_timeouts_before": m[0].get("eval/timeouts"),
        "heldout_timeouts_after": m[-1].get("eval/timeouts"),
        "reward_errors": sum(r["reward/errors"] for r in m[1:]),
        "timeouts": sum(r["reward/timeouts"] for r in m[1:]),
        "mismatch_max": max(r["mismatch/logprob_abs"] for r in m[1:]),
        "episodes_per_step": m[1]["rollout/episodes"],
        "engine_calls_per_step": m[1]["rollout/engine_calls"],
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--init", required=True, help="the SFT checkpoint to start from (see the module docstring)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--envs", default="verifiers,openenv")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument(
        "--min-terms",
        type=int,
        default=2,
        help="3: every sum has 3 terms (both arms), so the mix of easy and hard sums cannot move the reward curve",
    )
    p.add_argument("--work", default="runs/env_bench")
    p.add_argument("--out", default="benchmarks/results/env_learning.json")
    args = p.parse_args(argv)
    import arith_openenv

    from posttrain.serve.server import Server

    envserver = Server(arith_openenv.app).start()  # the OpenEnv environment, on 127.0.0.1
    rows, load = [], {"start": os.getloadavg()}
    try:
        for seed in [int(s) for s in args.seeds.split(",")]:
            for env in args.envs.split(","):  # interleaved: both see the same machine
                row = one_run(
                    env,
                    seed,
                    args.steps,
                    args.init,
                    Path(args.work, f"{env}_s{seed}"),
                    envserver.url[: -len("/v1")],
                    args.lr,
                    args.min_terms,
                )
                row["load_avg_1m"] = os.getloadavg()[0]
                rows.append(row)
                print(
                    f"{env} seed {seed}: reward {row['reward_first_quarter']:.3f} -> {row['reward_last_quarter']:.3f}"
                    f" (terms per sum {row['train_terms_first_quarter']:.2f} -> {row['train_terms_last_quarter']:.2f})"
                    f"   held-out greedy {row['heldout_greedy_before']:.3f} -> {row['heldout_greedy_after']:.3f}"
                    f"   ({row['wall_s']:.0f} s)",
                    flush=True,
                )
    finally:
        envserver.close()
    load["end"] = os.getloadavg()
    summary = {}
    for env in args.envs.split(","):
        mine = [r for r in rows if r["env"] == env]
        summary[env] = {
            "reward_rises_every_seed": all(r["reward_last_quarter"] > r["reward_first_quarter"] for r in mine),
            "reward_first_quarter_mean": sum(r["reward_first_quarter"] for r in mine) / len(mine),
            "reward_last_quarter_mean": sum(r["reward_last_quarter"] for r in mine) / len(mine),
            "train_terms_first_quarter_mean": sum(r["train_terms_first_quarter"] for r in mine) / len(mine),
            "train_terms_last_quarter_mean": sum(r["train_terms_last_quarter"] for r in mine) / len(mine),
            "heldout_greedy_before_mean": sum(r["heldout_greedy_before"] for r in mine) / len(mine),
            "heldout_greedy_after_mean": sum(r["heldout_greedy_after"] for r in mine) / len(mine),
        }
    result = {
        "benchmark": "env_learning",
        "init": args.init,
        "config": [*COMMON, f"optim.lr={args.lr}", f"min_terms={args.min_terms}"],
        "summary": summary,
        "runs": rows,
        "load_avg": load,
        "cpu_count": os.cpu_count(),
        "command": "python benchmarks/env_learning.py " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))
    return result


if __name__ == "__main__":
    main()
