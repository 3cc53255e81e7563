"""The graph-ready decode loop (issue 33) on CPU, before → after in one run: `posttrain bench rollout`
of both checkouts, and the engine with k decode steps between read-backs on ragged answers.

    python benchmarks/decode_loop.py [--before 929387e] [--batches 8,64] [--windows 1,4] [--threads 1]
                                     [--repeats 3] [--rounds 3] [--out benchmarks/results/decode_loop.json]

`--before` is extracted with `git archive` into a temporary directory; "after" is this checkout.
Every measurement runs in a subprocess of its side (this file, `--child`, with the side first on
sys.path; it uses only APIs the before side has), in `--rounds` rounds that alternate which side
goes first, each keeping its best; the load average goes into the JSON (a shared machine: read rows
only where it stayed low).

    bench_rollout  `posttrain bench rollout --no-hf`: every answer exactly 64 tokens (ignore_eos)
    ragged         a randomly initialised micro gpt_mini, stop ids on (answers of 1 to 64 tokens,
                   slots refilled as they end), 2 samples a prompt: tokens per wall and per CPU
                   second (the process's own time, which load does not inflate; the best round is
                   the least CPU) and `ops_per_decode_step` (aten ops that compute, views excluded:
                   about one kernel launch each on a GPU), at each window k (after only: the
                   before side has none; its k=1 is the same loop). `samples_digest` equal on
                   both sides: the same tokens
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
CLI = "import sys, posttrain.cli as c; sys.exit(c.main())"  # the side's own CLI (PYTHONPATH = the side)


def child(batch: int, window: int, repeats: int, threads: int) -> dict:
    """Time generate() on ragged answers and count its ops per decode step (runs on either side)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from posttrain.framework.rollout import Engine, SamplingParams
    from posttrain.models.gpt_mini import ModelConfig, build_model
    from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
    from posttrain.tasks.arithmetic import ArithmeticTask

    class CountOps(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += not func.is_view
            return func(*args, **(kwargs or {}))

    torch.set_num_threads(threads)
    tok = CharTokenizer(BASE_CHARS)
    torch.manual_seed(0)
    model = build_model(ModelConfig(preset="micro"), tok.vocab_size).eval()
    task = ArithmeticTask()
    prompts = [tok.encode(tok.chat_prompt(task.prompt(i))) for i in task.items(batch, seed=0)]
    engine = Engine(model, tok, max_slots=batch)
    engine.decode_window = window  # the before side has no such knob: it reads back every step
    sp = SamplingParams(temperature=1.0, max_new_tokens=64, stop_ids=tuple(tok.encode("0")))
    samples = engine.generate(prompts, 2, sp, seed=1)
    tokens = sum(len(s.response_ids) for s in samples)
    best = cpu = float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        engine.generate(prompts, 2, sp, seed=1)
        best, cpu = min(best, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    with CountOps() as c:
        engine.generate(prompts, 2, sp, seed=1)
    steps = engine.stats["rollout/decode_steps"]
    return {
        "tokens": tokens,
        "best_s": best,
        "tokens_per_s": tokens / best,
        "cpu_s": cpu,  # the process's CPU time: what a loaded machine's descheduling does not inflate
        "tokens_per_cpu_s": tokens / cpu,
        "decode_steps": steps,
        "ops_per_decode_step": c.n / steps,
        "samples_digest": hash(tuple(tuple(s.response_ids) for s in samples)),
    }


def run_side(src: Path, args: list[str], threads: int) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONHASHSEED": "0", "PYTHONPATH": str(src)}
    p = subprocess.run([sys.executable, *args], cwd=src, env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{src}: {' '.join(args)} exited {p.returncode}:\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
    return p.stdout


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", default="929387e")
    p.add_argument("--batches", default="8,64")
    p.add_argument("--windows", default="1,4")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per measurement; the best counts")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of every measurement; the best counts")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/decode_loop.json"))
    p.add_argument("--child", nargs=3, type=int, metavar=("BATCH", "WINDOW", "REPEATS"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(*a.child, a.threads)))
        return {}
    tmp = Path(tempfile.mkdtemp(prefix="decode_loop_"))
    before = tmp / "before"
    before.mkdir()
    subprocess.run(f"git archive {a.before} | tar -x -C {before}", shell=True, cwd=ROOT, check=True)
    me = str(Path(__file__).resolve())
    sides = {"before": before, "after": ROOT}
    windows = [int(w) for w in a.windows.split(",")]
    result: dict = {"before": a.before, "threads": a.threads, "rounds": a.rounds, "load_avg_before": os.getloadavg()}
    for B in (int(b) for b in a.batches.split(",")):
        rows: dict = {}
        for r in range(a.rounds):  # before first, then after first, ...: a burst of load hits both alike
            for name in list(sides)[:: 1 if r % 2 == 0 else -1]:
                src, out = sides[name], tmp / f"{name}-{B}.json"
                cmd = ["-c", CLI, "bench", "rollout", "--no-hf", "--batches", str(B), "--threads", str(a.threads)]
                run_side(src, [*cmd, "--repeats", str(a.repeats), "--out", str(out)], a.threads)
                tps = json.loads(out.read_text())["rows"][0]["ours_tokens_per_s"]
                rows[f"bench_rollout_{name}"] = max(rows.get(f"bench_rollout_{name}", 0.0), tps)
                for k in windows if name == "after" else [1]:
                    args = [me, "--child", str(B), str(k), str(a.repeats), "--threads", str(a.threads)]
                    got, key = json.loads(run_side(src, args, a.threads)), f"ragged_{name}_k{k}"
                    if key not in rows or got["cpu_s"] < rows[key]["cpu_s"]:
                        rows[key] = got
                    print(B, r, name, k, got, flush=True)
        rows["bench_rollout_after_over_before"] = rows["bench_rollout_after"] / rows["bench_rollout_before"]
        for k in windows:
            after, before_ = rows[f"ragged_after_k{k}"], rows["ragged_before_k1"]
            rows[f"ragged_after_k{k}_over_before_cpu"] = after["tokens_per_cpu_s"] / before_["tokens_per_cpu_s"]
            rows[f"ragged_after_k{k}_over_before_wall"] = after["tokens_per_s"] / before_["tokens_per_s"]
        rows["load_avg"] = os.getloadavg()
        result[f"batch_{B}"] = rows
        print(f"batch {B}: bench rollout {rows['bench_rollout_before']:.0f} → {rows['bench_rollout_after']:.0f} tok/s")
    result["load_avg_after"] = os.getloadavg()
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.out}")
    return result


if __name__ == "__main__":
    main()
