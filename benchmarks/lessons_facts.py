"""How long each lesson fact takes: every page render recomputes the facts it quotes
(posttrain/lessons/facts.py says "well under a second"), so this is what a reader waits for.

    python benchmarks/lessons_facts.py --out benchmarks/results/lessons_facts.json [--threads 2] [--limit 1.0]

In one process, after the imports every render already has (torch, the widget registry, the
recorded runs), each fact of facts_a, facts_b and facts_c is called once, directly (not through
`facts.value`'s cache). Facts over --limit seconds are listed as slow. The machine's load average
is recorded next to the numbers: on a shared machine they are upper bounds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from posttrain.bench import finish, run_header  # noqa: E402
from posttrain.lessons import facts, registry  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=float, default=1.0)
    ap.add_argument("--out", default="benchmarks/results/lessons_facts.json")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    result = run_header("lessons_facts", a.threads, limit_s=a.limit)
    registry.load_all()  # what the server has loaded before its first render
    seconds = {}
    for name, fn in facts.load_all().items():
        t0 = time.perf_counter()
        fn()
        seconds[name] = round(time.perf_counter() - t0, 4)
    ordered = sorted(seconds.values())
    result.update(
        facts=len(seconds),
        median_s=ordered[len(ordered) // 2],
        max_s=ordered[-1],
        slowest=dict(sorted(seconds.items(), key=lambda kv: -kv[1])[:10]),
        slow=[k for k, v in seconds.items() if v > a.limit],
        seconds=seconds,
    )
    print(
        f"{len(seconds)} facts: median {result['median_s'] * 1000:.0f} ms, max {result['max_s']:.2f} s; "
        f"over {a.limit} s: {', '.join(result['slow']) or 'none'}",
        flush=True,
    )
    return finish(result, a.out)


if __name__ == "__main__":
    main()
