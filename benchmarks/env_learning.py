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
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# benchmarks/verifiers.py (the verifier-pool benchmark) would shadow the verifiers package: drop this folder
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))                                  # this checkout's posttrain
sys.path.insert(0, str(ROOT / "examples" / "envs"))

COMMON = ["rollout.prompts_per_step=8", "rollout.samples_per_prompt=8", "rollout.max_new_tokens=32", "algo.kl_coef=0.0", "eval.problems=64", "eval.samples=4", "eval.save_samples=4",
          "threads=1", "log_every=1", "verifier.timeout_s=120", "overwrite=true"]


def one_run(env: str, seed: int, steps: int, init: str, out: Path, openenv_url: str, lr: float) -> dict:
    from posttrain.config import RLConfig, load_config
    from posttrain.logging import read_metrics
    from posttrain.recipes import rl
    task = {"verifiers": [f"task.name=verifiers:{ROOT}/examples/envs/arith_verifiers.py",
                          "task.env_args={min_terms: 2, max_terms: 3, n: 4000, eval_n: 300}"],
            "openenv": ["task.name=openenv", f"task.url={openenv_url}", "task.observation_field=question",
                        "task.reset_args={max_terms: 3}"]}[env]
    cfg = load_config(RLConfig, None, [f"out={out}", f"init={init}", f"seed={seed}", f"steps={steps}",
                                       f"eval_every={steps}", f"optim.lr={lr}", *COMMON, *task])
    t0 = time.perf_counter()
    rl.run(cfg)
    wall = time.perf_counter() - t0
    m = read_metrics(out)
    curve = [r["reward/mean"] for r in m[1:]]
    k = max(1, len(curve) // 4)
    return {"env": env, "seed": seed, "steps": steps, "wall_s": wall, "reward_curve": curve,
            "reward_first_quarter": sum(curve[:k]) / k, "reward_last_quarter": sum(curve[-k:]) / k,
            "heldout_greedy_before": m[0]["eval/greedy_acc"], "heldout_greedy_after": m[-1]["eval/greedy_acc"],
            "heldout_pass@1_before": m[0].get("eval/pass@1"), "heldout_pass@1_after": m[-1].get("eval/pass@1"),
            "heldout_errors_before": m[0].get("eval/errors"), "heldout_errors_after": m[-1].get("eval/errors"),
            "heldout_timeouts_before": m[0].get("eval/timeouts"), "heldout_timeouts_after": m[-1].get("eval/timeouts"),
            "reward_errors": sum(r["reward/errors"] for r in m[1:]), "timeouts": sum(r["reward/timeouts"] for r in m[1:]),
            "mismatch_max": max(r["mismatch/logprob_abs"] for r in m[1:]),
            "episodes_per_step": m[1]["rollout/episodes"], "engine_calls_per_step": m[1]["rollout/engine_calls"]}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--init", required=True, help="the SFT checkpoint to start from (see the module docstring)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--envs", default="verifiers,openenv")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--work", default="runs/env_bench")
    p.add_argument("--out", default="benchmarks/results/env_learning.json")
    args = p.parse_args(argv)
    import arith_openenv

    from posttrain.serve.server import Server
    envserver = Server(arith_openenv.app).start()             # the OpenEnv environment, on 127.0.0.1
    rows, load = [], {"start": os.getloadavg()}
    try:
        for seed in [int(s) for s in args.seeds.split(",")]:
            for env in args.envs.split(","):                  # interleaved: both see the same machine
                row = one_run(env, seed, args.steps, args.init, Path(args.work, f"{env}_s{seed}"),
                              envserver.url[:-len("/v1")], args.lr)
                row["load_avg_1m"] = os.getloadavg()[0]
                rows.append(row)
                print(f"{env} seed {seed}: reward {row['reward_first_quarter']:.3f} -> {row['reward_last_quarter']:.3f}"
                      f"   held-out greedy {row['heldout_greedy_before']:.3f} -> {row['heldout_greedy_after']:.3f}"
                      f"   ({row['wall_s']:.0f} s)", flush=True)
    finally:
        envserver.close()
    load["end"] = os.getloadavg()
    summary = {}
    for env in args.envs.split(","):
        mine = [r for r in rows if r["env"] == env]
        summary[env] = {"reward_rises_every_seed": all(r["reward_last_quarter"] > r["reward_first_quarter"] for r in mine),
                        "reward_first_quarter_mean": sum(r["reward_first_quarter"] for r in mine) / len(mine),
                        "reward_last_quarter_mean": sum(r["reward_last_quarter"] for r in mine) / len(mine),
                        "heldout_greedy_before_mean": sum(r["heldout_greedy_before"] for r in mine) / len(mine),
                        "heldout_greedy_after_mean": sum(r["heldout_greedy_after"] for r in mine) / len(mine)}
    result = {"benchmark": "env_learning", "init": args.init, "config": [*COMMON, f"optim.lr={args.lr}"], "summary": summary, "runs": rows,
              "load_avg": load, "cpu_count": os.cpu_count(),
              "command": "python benchmarks/env_learning.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))
    return result


if __name__ == "__main__":
    main()
