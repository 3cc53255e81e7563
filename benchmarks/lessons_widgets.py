"""How long each lessons widget takes to answer a knob setting it has not computed before: the
server computes on demand, and issue 17 asks for ≤ 1 s on a 2-core machine (or a precomputed grid).

    python benchmarks/lessons_widgets.py --out benchmarks/results/lessons_widgets.json [--threads 2]

Per widget, in one process: the default setting first (cold: it also pays the widget's one-time
set-up, e.g. loading recorded runs), then --random other settings drawn from its knob grid, each
computed by calling the widget's function directly (the registry's cache is bypassed). A widget is
listed as slow when any setting took more than --limit seconds. The machine's load average is
recorded next to the numbers: on a shared machine they are upper bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path

import torch

from posttrain.lessons import registry


def time_widget(w: registry.Widget, n_random: int, rng: random.Random) -> dict:
    settings = list(w.grid())
    picks = rng.sample(settings, min(n_random, len(settings)))
    t0 = time.perf_counter()
    w.fn(**w.defaults())
    cold = time.perf_counter() - t0
    times = []
    for knobs in picks:
        t0 = time.perf_counter()
        w.fn(**knobs)
        times.append(time.perf_counter() - t0)
    worst = max(range(len(times)), key=times.__getitem__) if times else None
    return {
        "grid": len(settings),
        "default_cold_s": round(cold, 4),
        "random_median_s": round(statistics.median(times), 4) if times else None,
        "random_max_s": round(max(times), 4) if times else None,
        "slowest_setting": w.key(picks[worst]) if times else None,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results/lessons_widgets.json")
    p.add_argument("--random", type=int, default=5, help="random settings per widget besides the default")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the target machine has 2 cores)")
    p.add_argument("--limit", type=float, default=1.0, help="seconds a setting may take")
    p.add_argument("--only", default="", help="comma-separated widget names (default: all)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    widgets = registry.load_all()
    names = [n for n in args.only.split(",") if n] or sorted(widgets)
    load_before = os.getloadavg()
    results = {}
    for name in names:
        try:
            results[name] = r = time_widget(widgets[name], args.random, rng)
        except Exception as e:  # noqa: BLE001 — a broken widget is reported, the rest still timed
            results[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"{name:16} error: {results[name]['error']}", flush=True)
            continue
        print(
            f"{name:16} grid {r['grid']:4}  default (cold) {r['default_cold_s']:7.3f} s  "
            f"random median {r['random_median_s'] or 0:6.3f} s  max {r['random_max_s'] or 0:6.3f} s",
            flush=True,
        )
    slow = sorted(
        n
        for n, r in results.items()
        if "error" not in r and max(r["default_cold_s"], r["random_max_s"] or 0) > args.limit
    )
    broken = sorted(n for n, r in results.items() if "error" in r)
    out = {
        "threads": args.threads,
        "limit_s": args.limit,
        "random_per_widget": args.random,
        "seed": args.seed,
        "cpu_count": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "slow": slow,
        "errors": broken,
        "widgets": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"slow (> {args.limit} s): {', '.join(slow) or 'none'}; errors: {', '.join(broken) or 'none'}  → {args.out}")


if __name__ == "__main__":
    main()
