"""Issue #20's before/after table: the public benchmarks of two checkouts, run alternately in one run.

    python benchmarks/before_after.py [--before 6688aed] [--what rollout,trl,pipeline] [--threads 2]
                                      [--out benchmarks/results/before_after.json]

`--before` is extracted with `git archive` into a temporary directory; "after" is this checkout.
Each side runs its own CLI in a subprocess (`posttrain bench rollout`, `posttrain bench trl`,
`posttrain pipeline`), so the two need not share an API. The order alternates per benchmark
(before first, then after first, ...) and the load average is recorded around every run: read a
row only where the load stayed low. 6688aed is main just before the speed work of issue #20.

    rollout    `bench rollout --batches 1,8,64,256 --repeats 3`: our engine vs transformers
               `generate` on the same weights, per side (the HF column is a noise check: it is
               the same code on both sides)
    trl        `bench trl --shapes 64x16,8x16`: a GRPO step vs TRL's GRPOTrainer, per side
    pipeline   `posttrain pipeline` into a fresh directory: each stage's wall time, the whole
               command's wall time, and the final table (the same numbers within noise)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = "import sys; sys.path.insert(0, {src!r}); import posttrain.cli as c; assert c.__file__.startswith({src!r}); sys.exit(c.main())"


BENCH_ARGS = {"rollout": ["--batches", "1,8,64,256", "--repeats", "3"], "trl": ["--shapes", "64x16,8x16"]}


def cli(src: Path, args: list[str], threads: int) -> tuple[float, str]:
    """Run `posttrain ARGS` from checkout `src`; (wall s, output). Raises on a non-zero exit."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONHASHSEED": "0"}
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-c", RUN.format(src=str(src)), *args], cwd=src, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(
            f"{src}: posttrain {' '.join(args)} exited {p.returncode}:\n{p.stdout[-2000:]}{p.stderr[-3000:]}"
        )
    return wall, p.stdout + p.stderr


def measure(what: str, src: Path, tmp: Path, threads: int) -> dict:
    out = tmp / f"{what}-{src.name}.json"
    load0 = os.getloadavg()
    if what in BENCH_ARGS:
        wall, _ = cli(src, ["bench", what, *BENCH_ARGS[what], "--threads", str(threads), "--out", str(out)], threads)
        res = json.loads(out.read_text())
    else:
        run = tmp / f"pipeline-{src.name}"
        wall, text = cli(src, ["pipeline", f"out={run}", f"threads={threads}"], threads)
        res = {"summary": json.loads((run / "summary.json").read_text()), "tail": text.strip().splitlines()[-8:]}
    return {"wall_s": round(wall, 1), "load_avg_before": load0, "load_avg_after": os.getloadavg(), "result": res}


def _pairs(rows: dict, cells, gain) -> list[str]:
    """One line per key of rows["after"]: `cells(row)` of each side, then `gain(before, after)`."""
    return [
        f"  {k:>5}: before {cells(rows['before'][k])}   after {cells(y)}   {gain(rows['before'][k], y)}"
        for k, y in rows["after"].items()
    ]


def table(result: dict) -> str:
    """The before/after rows of a result, as text."""
    runs, out = result["runs"], []
    sides = ("before", "after")
    if "rollout" in runs:
        out.append("rollout, micro preset, 64 new tokens, by batch (tokens/s: ours | HF generate | ratio):")
        out += _pairs(
            {s: {r["batch"]: r for r in runs["rollout"][s]["result"]["rows"]} for s in sides},
            lambda r: f"{r['ours_tokens_per_s']:7.0f} | {r['hf_tokens_per_s']:7.0f} | {r['ratio']:.2f}x",
            lambda x, y: (
                f"ours {y['ours_tokens_per_s'] / x['ours_tokens_per_s']:.2f}x, "
                f"FLOP share {x['ours_flop_frac']:.1%} -> {y['ours_flop_frac']:.1%}"
            ),
        )
    if "trl" in runs:
        out.append("GRPO step vs TRL GRPOTrainer (s/step: posttrain | TRL | TRL/posttrain):")
        out += _pairs(
            {s: runs["trl"][s]["result"]["shapes"] for s in sides},
            lambda r: f"{r['posttrain']['step_s']:.3f} | {r['trl']['step_s']:.3f} | {r['speedup']:.2f}x",
            lambda x, y: f"ours {x['posttrain']['step_s'] / y['posttrain']['step_s']:.2f}x",
        )
    if "pipeline" in runs:
        out.append("posttrain pipeline (stage wall s; greedy, pass@1, pass@8):")
        for s in sides:
            r = runs["pipeline"][s]
            stages = "  ".join(f"{x['stage']} {x['wall_s']:.0f}" for x in r["result"]["summary"])
            last = r["result"]["summary"][-1]
            out.append(
                f"  {s:>6}: whole {r['wall_s']:.0f} s ({stages}); {last['stage']} row "
                f"{last['greedy']:.3f} {last['pass@1']:.3f} {last['pass@8']:.3f}"
            )
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="6688aed")
    ap.add_argument("--what", default="rollout,trl,pipeline")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "before_after.json"))
    a = ap.parse_args(argv)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "posttrain"], capture_output=True, text=True
    )
    result = {
        "before": a.before,
        "after": head.stdout.strip() + ("+changes" if dirty.stdout.strip() else ""),
        "threads": a.threads,
        "cpu_count": os.cpu_count(),
        "load_avg_start": os.getloadavg(),
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        before = tmp / "before"
        before.mkdir()
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", a.before], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=tar, check=True)
        sides = {"before": before, "after": ROOT}
        for i, what in enumerate(a.what.split(",")):
            order = list(sides) if i % 2 == 0 else list(sides)[::-1]
            result["runs"][what] = {}
            for side in order:
                print(f"{what}: {side} ...", flush=True)
                result["runs"][what][side] = measure(what, sides[side], tmp, a.threads)
                print(f"  {result['runs'][what][side]['wall_s']} s, load {os.getloadavg()[0]:.2f}", flush=True)
    result["load_avg_end"] = os.getloadavg()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(table(result))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
