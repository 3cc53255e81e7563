"""Benchmarks that write JSON (`posttrain bench rollout|train|step --out FILE.json`).

Shared helpers: the measured matmul peak and copy bandwidth every throughput number is compared
against (CPU or CUDA), peak memory over a window (CUDA's allocator, or the process's peak RSS), a
result's header (the machine and its load) and ending, the best of repeated timings, op time
grouped from a torch.profiler trace, a JSON writer that never leaves a half-written file, and
the loader the benchmarks/ scripts import each other with.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch

from posttrain import runtime


def matmul_peak_gflops(
    threads: int | None = None, n: int = 1024, dtype=torch.float32, repeats: int = 5, device: str = "cpu"
) -> float:
    """Measured dense matmul throughput, GFLOP/s: an [n, n] @ [n, n] product (2·n³ FLOPs),
    best of `repeats` timed runs after a warm-up, on `threads` threads (default: as set), on
    `device` (CUDA: synchronised around each timed run; an n of 8192 in bf16 nears the card's peak).

    This is the "FLOP limit" of the benchmarks: model FLOPs per second ÷ this number says
    how much of what the BLAS can do on this machine a workload achieves.
    """
    old = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        a = torch.randn(n, n, dtype=dtype, device=device)
        b = torch.randn(n, n, dtype=dtype, device=device)
        out = torch.empty(n, n, dtype=dtype, device=device)
        best = _best_rate(lambda: torch.mm(a, b, out=out), repeats, device)
        return 2 * n**3 / best / 1e9
    finally:
        torch.set_num_threads(old)


def copy_bandwidth_gbs(mib: int = 128, repeats: int = 5, device: str = "cpu") -> float:
    """Measured memory bandwidth, GB/s: a copy of `mib` MiB moves 2× that (read + write), best of
    `repeats`. The "memory-traffic limit" of a decode step, which reads every weight and the KV cache."""
    a = torch.ones(mib * 2**20 // 4, device=device)
    b = torch.empty_like(a)
    best = _best_rate(lambda: b.copy_(a), repeats, device)
    return 2 * a.numel() * 4 / best / 1e9


def _best_rate(op, repeats: int, device: str) -> float:
    """Seconds per call of `op`: each timed run repeats it to last ≳50 ms (timer noise stays
    small), the best of `repeats` runs after two warm-up calls (pages touched, kernels picked)."""
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    for _ in range(2):
        op()
    sync()
    t0 = time.perf_counter()
    op()
    sync()
    reps = max(1, int(0.05 / max(time.perf_counter() - t0, 1e-6)))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(reps):
            op()
        sync()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def reset_peak_memory(device: str) -> None:
    """Start a peak-memory window: CUDA's allocator counters (its cache emptied first, so the
    reserved peak counts only what this window holds), or on CPU the process's peak resident set
    (VmHWM, reset by writing 5 to /proc/self/clear_refs; Linux ≥ 4.0)."""
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:  # not Linux: the peak then counts from the process's start (ru_maxrss)
        pass


def peak_memory(device: str) -> dict:
    """The peak since `reset_peak_memory`, GiB: CUDA `max_memory_allocated` and `..._reserved`;
    on CPU the process's peak RSS (VmHWM, else ru_maxrss: the whole process's life)."""
    if str(device).startswith("cuda"):
        return {
            "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        }
    return {"peak_rss_gib": runtime.peak_memory_bytes("cpu") / 2**30}


def run_header(bench: str, threads: int, **extra) -> dict:
    """The first keys of a result: what ran, on how many threads and cores, under what load."""
    return {
        "bench": bench,
        **extra,
        "threads": threads,
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "load_avg_before": os.getloadavg(),
    }


def best_of(fn, repeats: int, warmup: bool = False) -> float:
    """The shortest wall time of `repeats` calls of `fn`, after one untimed call with `warmup`
    (pages touched, kernels picked)."""
    if warmup:
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def load_script(path: str | os.PathLike, name: str):
    """A benchmark script imported by its path under `name`, once. benchmarks/ is never put on
    sys.path: a file there named like a package (it had a verifiers.py) would shadow it."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def finish(result: dict, out: str | os.PathLike, load_key: str = "load_avg_after") -> dict:
    """Record the load average at the end, write the result (write_json) and say where."""
    result[load_key] = os.getloadavg()
    write_json(out, result)
    print(f"wrote {out}")
    return result


def op_seconds(prof, groups: dict[str, tuple[str, ...]], wall: float) -> dict[str, float]:
    """Self CPU seconds of a torch.profiler trace by group ({group: op names}); ops in no group
    go to "other_ops", and "python" is the profiled `wall` time not inside any op."""
    spent = {k: 0.0 for k in (*groups, "other_ops")}
    for ev in prof.key_averages():
        group = next((g for g, names in groups.items() if ev.key in names), "other_ops")
        spent[group] += ev.self_cpu_time_total / 1e6
    spent["python"] = max(wall - sum(spent.values()), 0.0)
    return spent


def write_json(path: str | os.PathLike, obj) -> None:
    """Write `obj` as indented JSON: to a temporary name first, then rename (docs/architecture.md §9)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


def update_json(path: str | os.PathLike, update) -> dict:
    """Read the JSON at `path` ({} when missing), apply `update(obj) -> obj`, write it back
    (write_json), all under an exclusive lock: drivers that run one seed per process merge
    their rows into one file without losing each other's."""
    import fcntl
    import hashlib
    import tempfile

    path = Path(path)
    key = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]  # hash() differs per process
    lock = Path(tempfile.gettempdir(), f"posttrain-{key}.lock")
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        obj = update(json.loads(path.read_text()) if path.exists() else {})
        write_json(path, obj)
    return obj


def transformers_version() -> str:
    import transformers

    return transformers.__version__
