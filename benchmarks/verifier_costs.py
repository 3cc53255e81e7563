"""Verifier costs: one sandbox run, and the code task scored in-process vs through the
verifier pool. Writes JSON and prints it. Wall times depend on the machine's load.

    python benchmarks/verifier_costs.py --out benchmarks/results/verifier_costs.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from posttrain.tasks import sandbox
from posttrain.tasks.base import safe_reward
from posttrain.tasks.code import CodeTask
from posttrain.tasks.pool import VerifierPool


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results/verifier_costs.json")
    p.add_argument("--runs", type=int, default=30, help="sandbox runs of a trivial program")
    p.add_argument("--workers", default="1,2,4", help="pool sizes to time on the code task")
    args = p.parse_args(argv)
    info = sandbox.isolation()
    walls = [sandbox.run_python("print(1)").wall_s for _ in range(args.runs)]
    task = CodeTask()
    pairs = [(pr, task.target(pr)) for pr in task.problems]  # every reference solution: reward 1
    t0 = time.perf_counter()
    assert all(safe_reward(task, it, r).reward == 1.0 for it, r in pairs)
    serial = time.perf_counter() - t0
    pooled = {}
    for w in map(int, args.workers.split(",")):
        with VerifierPool(task, workers=w, timeout_s=30.0) as pool:
            t0 = time.perf_counter()
            results, stats = pool.score(pairs)
            pooled[w] = {
                "wall_s": time.perf_counter() - t0,
                "latency_p50_s": stats["latency_p50_s"],
                "latency_p99_s": stats["latency_p99_s"],
                "all_pass": all(r.reward == 1.0 for r in results),
            }
    result = {
        "isolation": info,
        "sandbox_run_p50_s": float(np.percentile(walls, 50)),
        "sandbox_run_p99_s": float(np.percentile(walls, 99)),
        "code_problems": len(pairs),
        "code_in_process_s": serial,
        "code_pool": pooled,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
