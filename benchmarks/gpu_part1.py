"""Issue 31's measurements on a GPU, in one run of under ~8 minutes: what a session with a GPU runs once.

    PYTHONPATH=$PWD python benchmarks/gpu_part1.py [--out DIR]      # GPU machine, repo root; DIR = $OUT or .
    PYTHONPATH=$PWD python benchmarks/gpu_part1.py --tiny --device cpu --out /tmp/g   # a check of the script

Parts, each in its own subprocess with its own timeout (a crash or a timeout loses that part only);
DIR/gpu_part1.json is rewritten after every part, its logs are DIR/gpu_part1_<part>.log:
  bench_qwen2  `posttrain bench step --shape qwen2.5-0.5b` (Qwen2ForCausalLM), 32 prompts × 8 samples ×
               256 new tokens, 3 steps (the first a warm-up), rollout vs transformers `generate` at 64 and
               256 rows: step time and split, peak allocated / reserved, the run's predicted peak
               (RUN_DIR/memory.json, sizing/run_memory; what it counts in `predicted_note`), the
               floor's fractions; the whole bench JSON beside it (DIR/bench_step_<arch>.json)
  bench_llama  the same dimensions as a LlamaForCausalLM (`--arch llama`), the same measurements
  pipeline     `posttrain pipeline report=false` on the device: its final table (summary.json) and wall time
  quick_lane   `python -m pytest -q -m "not slow" -n 16 -p no:cacheprovider` (+ `-rfE --tb=line
               --continue-on-collection-errors` for the names): passed/failed/skipped/error counts and
               the names of the failures and errors (extras that machine lacks error in one line each)
The two benchmarks run first, alone on the machine; the pipeline and the quick lane then run side by
side (the lane's 16 workers share the CPUs with the pipeline, whose wall time is then an upper bound;
`--serial` runs them one after the other). A part's timeout is the smaller of its own and the budget
left (`--budget`, 480 s). `acceptance` compares the two archs' step times and the peaks with issue 31's
goals (≤ 20 GiB; Qwen2 within 10% of Llama).

--tiny: tiny shapes (2 × 4 × 12 tokens), a pipeline of a few steps without DPO, the quick lane cut to
tests/test_bench_step.py without xdist: every part's plumbing in a few minutes on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "posttrain.cli"]
TIMEOUTS = {"bench_qwen2": 170, "bench_llama": 150, "pipeline": 300, "quick_lane": 200}
TINY_PIPELINE = (
    "pretrain.steps=4 pretrain.eval_every=0 pretrain.corpus_chars=20000 sft.steps=4 sft.eval_every=0 "
    "sft.target_acc=0 sft.num_problems=200 sft.eval_problems=8 rl.steps=2 rl.eval.problems=4 rl.eval.samples=2 "
    "rl.rollout.prompts_per_step=2 "
    "eval_problems=8 eval_samples=2 stages=pretrain,sft,rl"
).split()


def bench_args(arch: str, a) -> list[str]:
    if a.tiny:
        size = ["--shape", "tiny-qwen2", "--prompts", "2", "--samples", "4", "--new-tokens", "12"]
        size += ["--steps", "2", "--rows", "2,4", "--prompt-len", "16", "--threads", "1"]
    else:
        size = ["--shape", "qwen2.5-0.5b", "--prompts", "32", "--samples", "8", "--new-tokens", "256"]
        size += ["--steps", "3", "--rows", "64,256", "--prompt-len", "64"]
    return [*CLI, "bench", "step", *size, "--arch", arch, "--device", a.device]


def run_part(
    name: str, cmd: list[str], a, timeout: float, env: dict | None = None, script: str = "gpu_part1"
) -> tuple[subprocess.Popen, dict]:
    """Start `cmd` in its own process group, its output to DIR/<script>_<name>.log."""
    log = open(Path(a.out, f"{script}_{name}.log"), "w")
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return p, {"cmd": " ".join(cmd), "timeout_s": round(timeout), "t0": time.perf_counter(), "log": log}


def wait_part(p: subprocess.Popen, info: dict) -> tuple[dict, str]:
    """Wait for the part to end or time out (then its whole process group is killed)."""
    left = info["timeout_s"] - (time.perf_counter() - info["t0"])
    try:
        rc = p.wait(timeout=max(left, 0.1))
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the part's own group: pytest's workers, the pipeline
        rc, timed_out = p.wait(), True
    info["log"].close()
    text = Path(info["log"].name).read_text(errors="replace")
    return {
        "cmd": info["cmd"],
        "rc": rc,
        "timed_out": timed_out,
        "timeout_s": info["timeout_s"],
        "wall_s": round(time.perf_counter() - info["t0"], 1),
        "tail": text.strip().splitlines()[-25:],
    }, text


def bench_summary(path: Path) -> dict:
    """The headline numbers of a `bench step` JSON (written after each of its parts: partial on a crash)."""
    if not path.exists():
        return {"json": None}
    r = json.loads(path.read_text())
    out = {"json": path.name, "model": r.get("model"), "peak": r.get("peak")}
    if "grpo" in r:
        g, f = r["grpo"], r["floor"]
        out["step_s"] = g["timed"]["time/step_s"]
        out["split_s"] = {k: v for k, v in g["timed"].items() if k.startswith("time/") and k != "time/step_s"}
        out["memory"] = g["memory"]
        out["predicted_peak_gib"], out["predicted_note"] = g["predicted_peak_gib"], g["predicted_note"]
        out["floor_s"], out["fraction"] = f["floor_s"], f["fraction"]
        out["throughput"] = g["throughput"]
        out["mismatch_logprob_abs"] = g["timed"].get("mismatch/logprob_abs")
        out["computed_over_real"] = g.get("computed_over_real")  # absent from a JSON older than issue 33's knobs
    if "rollout_vs_generate" in r:
        out["rollout_vs_generate"] = r["rollout_vs_generate"]
    return out


def pytest_summary(text: str) -> dict:
    """Counts from pytest's last line ("21 failed, 1708 passed, 51 skipped, 20 errors in 70.48s")
    and the names from its short summary (`FAILED path::name - why`, `ERROR path::name - why`)."""
    counts = {}
    for line in reversed(text.strip().splitlines()):
        found = re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed|warnings?)", line)
        if found and " in " in line:
            counts = {("errors" if k.startswith("error") else k): int(n) for n, k in found}
            break
    names = {"failed": [], "errors": []}
    for line in text.splitlines():
        m = re.match(r"(FAILED|ERROR) (\S+)(?: - (.*))?", line)
        if m:
            names["failed" if m[1] == "FAILED" else "errors"].append(f"{m[2]} - {(m[3] or '')[:160]}".rstrip(" -"))
    return {"counts": counts, **names}


def pipeline_cmd(a, run_dir: Path) -> list[str]:
    extra = [*TINY_PIPELINE, "threads=1"] if a.tiny else []  # tiny: no DPO (a 4-step SFT gives no pairs)
    return [*CLI, "pipeline", "report=false", f"out={run_dir}", f"device={a.device}", *extra]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder of the JSON and logs (default $OUT)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny shapes and runs: a check of this script on a CPU")
    p.add_argument("--parts", default="bench_qwen2,bench_llama,pipeline,quick_lane")
    p.add_argument("--budget", type=float, default=480, help="seconds for all parts together")
    p.add_argument("--serial", action="store_true", help="run the pipeline and the quick lane one after the other")
    a = p.parse_args(argv)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    parts = a.parts.split(",")
    t_start = time.perf_counter()
    res: dict = {"script": "benchmarks/gpu_part1.py", "tiny": a.tiny, "device": a.device, "machine": machine()}
    out = Path(a.out, "gpu_part1.json")

    def save():
        res["wall_s"] = round(time.perf_counter() - t_start, 1)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(res, indent=1) + "\n")
        tmp.replace(out)

    def timeout(name):
        return max(min(TIMEOUTS[name], a.budget - (time.perf_counter() - t_start)), 1)

    for name, arch in (("bench_qwen2", "native"), ("bench_llama", "llama")):
        if name in parts:
            path = Path(a.out, f"bench_step_{arch}.json")
            proc, info = run_part(name, [*bench_args(arch, a), "--out", str(path)], a, timeout(name))
            res[name], _ = wait_part(proc, info)
            res[name].update(bench_summary(path))
            save()
    with tempfile.TemporaryDirectory(prefix="gpu-part1-") as tmp:
        run_dir = Path(tmp, "pipeline")
        started = {}
        for name in ("pipeline", "quick_lane"):
            if name not in parts:
                continue
            if name == "pipeline":
                started[name] = run_part(name, pipeline_cmd(a, run_dir), a, timeout(name))
            else:
                lane = ["-m", "not slow", "-n", "16"] if not a.tiny else ["tests/test_bench_step.py", "-m", "not slow"]
                cmd = [sys.executable, "-m", "pytest", "-q", *lane, "-p", "no:cacheprovider", "-rfE", "--tb=line"]
                cmd.append("--continue-on-collection-errors")
                started[name] = run_part(name, cmd, a, timeout(name), {"OMP_NUM_THREADS": "1"})
            if a.serial:
                finish_part(name, *started.pop(name), res, run_dir, save)
        while started:  # side by side: each is finished (its wall time taken) as soon as it ends
            for name, (proc, info) in list(started.items()):
                if proc.poll() is not None or time.perf_counter() - info["t0"] > info["timeout_s"]:
                    finish_part(name, *started.pop(name), res, run_dir, save)
            time.sleep(0.5)
        res["pipeline_beside_quick_lane"] = not a.serial and {"pipeline", "quick_lane"} <= set(parts)
    res["acceptance"] = acceptance(res)
    save()
    print(json.dumps({k: v for k, v in res.items() if k in ("acceptance", "wall_s")}, indent=1))
    print(f"wrote {out}")
    return res


def finish_part(name, proc, info, res, run_dir: Path, save) -> None:
    res[name], text = wait_part(proc, info)
    if name == "pipeline":
        summary = run_dir / "summary.json"
        res[name]["table"] = json.loads(summary.read_text()) if summary.exists() else None
    else:
        res[name].update(pytest_summary(text))
    save()


def acceptance(res: dict) -> dict:
    """Issue 31's GPU goals against what was measured (None where a part is missing)."""
    q, ll = res.get("bench_qwen2", {}), res.get("bench_llama", {})
    step = q.get("step_s"), ll.get("step_s")
    peaks = {k: r.get("memory", {}).get("peak_allocated_gib") for k, r in (("qwen2", q), ("llama", ll))}
    return {
        "qwen2_over_llama_step": step[0] / step[1] if all(step) else None,
        "qwen2_within_10pct_of_llama": step[0] <= 1.1 * step[1] if all(step) else None,
        "peak_allocated_gib": peaks,
        "peak_le_20_gib": {k: v <= 20 if v is not None else None for k, v in peaks.items()},
        "pipeline_finished": res.get("pipeline", {}).get("table") is not None if "pipeline" in res else None,
        "quick_lane_failed_or_errors": (
            len(res["quick_lane"]["failed"]) + len(res["quick_lane"]["errors"]) if "quick_lane" in res else None
        ),
    }


def script_parser(doc: str, parts: tuple, budget: float) -> argparse.ArgumentParser:
    """The options every part-by-part GPU script takes (gpu_part2, gpu_part3)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder of the JSON and logs (default $OUT)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny shapes and runs: a check of this script on a CPU")
    p.add_argument("--parts", default=",".join(parts), help="a comma list, run in the script's order")
    p.add_argument("--budget", type=float, default=budget, help="seconds for all parts together")
    return p


def parse_parts(p: argparse.ArgumentParser, argv, parts: tuple):
    """script_parser's arguments, a part not in `parts` refused, DIR made."""
    a = p.parse_args(argv)
    unknown = set(a.parts.split(",")) - set(parts)
    if unknown:
        p.error(f"--parts: unknown {sorted(unknown)}; use some of {','.join(parts)}")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    return a


def drive(a, parts: tuple, res: dict, acceptance, run_one, timeouts: dict, min_start: float, name: str) -> dict:
    """The parts of a GPU script chosen by `a.parts`, in `parts`' order, within `a.budget` seconds: each
    `run_one(part, timeout) -> dict` under the smaller of its own timeout and what is left, one with less
    than `min_start` s left skipped and said so; DIR/<name>.json (`res`, its wall time and
    `acceptance(res)`) rewritten after each, so a crash keeps what ran. Returns `res`."""
    t_start = time.perf_counter()
    out = Path(a.out, f"{name}.json")

    def save():
        res["wall_s"] = round(time.perf_counter() - t_start, 1)
        res["acceptance"] = acceptance(res)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(res, indent=1) + "\n")
        tmp.replace(out)

    for part in (n for n in parts if n in a.parts.split(",")):
        left = a.budget - (time.perf_counter() - t_start)
        if left < min_start:
            res[part] = {"skipped": f"budget: {left:.0f} s left of {a.budget:.0f}, under {min_start}"}
        else:
            res[part] = run_one(part, min(timeouts[part], left))
        save()
    print(json.dumps({k: res[k] for k in ("acceptance", "wall_s")}, indent=1))
    print(f"wrote {out}")
    return res


def machine() -> dict:
    """The machine as the parts will see it (torch, transformers, the GPU), from a subprocess."""
    code = (
        "import json, torch, transformers; c = torch.cuda.is_available(); "
        "print(json.dumps({'torch': torch.__version__, 'transformers': transformers.__version__, 'cuda': c, "
        "'gpu': torch.cuda.get_device_name() if c else None, "
        "'gpu_gib': torch.cuda.get_device_properties(0).total_memory / 2**30 if c else None}))"
    )
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        return {**json.loads(r.stdout.strip().splitlines()[-1]), "cpus": os.cpu_count()}
    except (subprocess.SubprocessError, ValueError, IndexError) as e:
        return {"error": f"{type(e).__name__}: {e}"[:300], "cpus": os.cpu_count()}


if __name__ == "__main__":
    main()
