"""Device, precision, threads and seeds: resolved once per run, from the common config keys."""

from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass

import numpy as np
import torch

from posttrain.errors import UsageError

# torch's thread count before any run changed it: what `threads: 0` means (a stage run earlier
# in the same process with threads=1 must not leave the next one on one thread)
DEFAULT_THREADS = torch.get_num_threads()


@dataclass(frozen=True)
class MicroBatches:
    """The micro-batch budgets of a run's forwards, in computed tokens (framework/batch.py splits by
    them): what `optim.micro_batch_tokens=auto` resolves to on the run's device, once its memory is
    predicted (recipes/common.predict_memory; sizing/run_memory.auto_budgets). The defaults are the
    numbers from before auto, which the CPU keeps."""

    train: int = 8192  # the trainer's forward and backward
    score: int = 8192  # the trainer's model without gradient: PPO's V_old, the off-policy correction's
    reference: int = 16384  # the reference's scores (RL's KL term, DPO's reference pass)


@dataclass
class Runtime:
    device: torch.device
    param_dtype: torch.dtype  # master weights: always fp32
    compute_dtype: torch.dtype  # autocast dtype: bf16 on CUDA by default, fp32 on CPU unless dtype=bfloat16
    micro_batches: MicroBatches | None = None  # optim.micro_batch_tokens=auto, resolved (None: not yet)

    @property
    def autocast_on(self) -> bool:
        return self.compute_dtype != self.param_dtype

    def autocast(self):
        """bf16 autocast over fp32 master weights (CUDA by default; CPU only when asked for)."""
        if self.autocast_on:
            return torch.autocast(self.device.type, dtype=self.compute_dtype)
        return contextlib.nullcontext()


def resolve(device: str = "auto", dtype: str = "auto", threads: int = 0) -> Runtime:
    """`threads`: torch CPU threads for this run (0 = the process's starting count)."""
    if threads <= 0:
        busy_machine_hint()
    torch.set_num_threads(threads if threads > 0 else DEFAULT_THREADS)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UsageError(f"device={device!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device={device} but no CUDA GPU is visible; use device=cpu (or auto)")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UsageError(f"device={device} but only {torch.cuda.device_count()} CUDA GPU(s) are visible; use cuda:0")
    names = {
        "auto": None,
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
    }
    if dtype not in names:
        raise UsageError(f"dtype={dtype!r} is unknown; use auto, float32 or bfloat16")
    compute = names[dtype] or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    # No bf16 on CPU by default: without bf16 hardware it is ~170x slower than fp32 here. An
    # explicit dtype=bfloat16 on CPU runs the CUDA path's autocast on the CPU (tests use it).
    return Runtime(dev, torch.float32, compute)


_HINTED: list[float] = []  # the load average at the first look (one look per process)


def busy_machine_hint() -> str:
    """Once per process, at its first stage: when the load average is above the cores, other jobs share
    the machine, and torch's default of a thread per core makes every job several times slower (threads
    wait on each other); one thread per job is the fix. Only the first look counts: later in the same
    process (the pipeline's next stage) the load includes our own threads. Returns the line printed."""
    if _HINTED:
        return ""
    try:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
    except OSError:
        return ""
    _HINTED.append(load)
    if load <= cores:
        return ""
    line = (
        f"note: the load average ({load:.1f}) is above this machine's {cores} cores: other jobs share it, and with "
        f"a thread per core each job runs several times slower; pass threads=1 (its sums run in another "
        f"order, so the numbers differ from a default run's, the README's pipeline table among them)"
    )
    print(line, flush=True)
    return line


def peak_memory_bytes(device: torch.device | str = "cpu") -> int:
    """The peak memory of this process so far, what `memory/peak_gib` logs (issue 31): on CUDA the
    caching allocator's peak of allocated tensor bytes on `device` (torch.cuda.max_memory_allocated:
    the CUDA context and the allocator's reserve are not in it), on the CPU the peak resident set size
    (tensors plus the interpreter, torch and everything else the process holds): Linux's VmHWM, the
    peak of this process's own memory. Not ru_maxrss there: a process started by vfork + exec (Python's
    subprocess) inherits its parent's peak in it, so a run launched from a large process would read
    its launcher's peak. Elsewhere (macOS) ru_maxrss."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.max_memory_allocated(dev))
    try:
        with open("/proc/self/status") as f:
            return int(next(x for x in f if x.startswith("VmHWM:")).split()[1]) * 1024
    except (OSError, StopIteration):
        import resource
        import sys

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux


def current_memory_bytes(device: torch.device | str = "cpu") -> int:
    """What this process holds now: allocated CUDA tensor bytes, or the resident set size on the CPU
    (the baseline a run's predicted peak adds to its tensors there)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.memory_allocated(dev))
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # no /proc (macOS): the peak so far is the closest bound
        return peak_memory_bytes(dev)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
