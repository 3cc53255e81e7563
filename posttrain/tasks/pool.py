"""Verifier pool: `task.reward` in worker processes, in parallel, each call under a deadline.

    with VerifierPool(task, workers=4, timeout_s=10) as pool:
        results, stats = pool.score([(item, response), ...])

A verifier is code we did not necessarily write (a reasoning-gym scorer, a sandbox
launcher, a regex with catastrophic backtracking). Whatever it does, the step goes on:

  raises                      reward 0, error "ValueError: ..."          counted in errors
  returns garbage / NaN       reward 0, error (same checks as safe_reward) counted in errors
  crashes (os._exit, SIGSEGV) reward 0, error "verifier worker died ..."  counted in errors;
                              the worker is replaced
  hangs past timeout_s        reward 0, error "verifier timed out ..."   counted in timeouts;
                              the worker and its process tree are killed and replaced

  leaks memory               with `memory_mb`, an allocation past the limit fails (RLIMIT_AS):
                              reward 0, "MemoryError" (or ENOMEM), the worker retired and replaced
  leaks anything else        with `max_calls`, a worker is replaced after that many calls

`stats` holds the counts and the per-call latency percentiles (dispatch → result, seconds);
`replaced` counts every replacement, whatever the cause (reward/workers_replaced).
Workers are forked (Linux): the task object is inherited, never pickled; items and
responses travel over a pipe per worker. With `workers=0` nobody uses this file:
`score_samples` calls the verifier in-process, as before (no timeout possible there).

Workers never outlive the trainer, as in `multiprocessing.Pool` and bubblewrap's
`--die-with-parent`: each asks the kernel for SIGKILL when its parent dies
(PR_SET_PDEATHSIG), which holds even when the trainer is SIGKILLed and no Python cleanup
runs; `close()` (also run at garbage collection and at exit) kills workers and their
process trees the ordinary way. The death signal follows the thread that forked the worker:
a pool used from a thread (async rollouts) keeps its replacements only while that thread lives.
"""

from __future__ import annotations

import ctypes
import errno
import multiprocessing as mp
import os
import resource
import signal
import time
import weakref
from collections import deque
from multiprocessing.connection import wait

import numpy as np

from posttrain import UsageError
from posttrain.tasks.base import RewardResult, safe_reward
from posttrain.tasks.sandbox import descendants

PR_SET_PDEATHSIG = 1  # linux/prctl.h
OUT_OF_MEMORY = ("MemoryError", f"OSError: [Errno {errno.ENOMEM}]")  # a failed allocation, as safe_reward words it


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies, even by SIGKILL (no cleanup of ours runs then)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _address_space_mb() -> float:
    """This process's virtual size now (what a forked worker inherits), in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _serve(task, conn, parent: int, memory_mb: int) -> None:
    """Worker loop: (index, item, response[, ids]) in, (index, RewardResult, retire) out, until EOF.
    `retire` asks the pool to replace this worker (its memory ran out: what leaked stays)."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if memory_mb > 0:  # on top of the trainer's pages it inherits
        limit = int((_address_space_mb() + memory_mb) * 2**20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    while True:
        try:
            idx, *job = conn.recv()  # (index, *tasks.base.verifier_args(task, sample))
        except (EOFError, OSError):
            return
        res = safe_reward(task, *job)
        retire = (res.error or "").startswith(OUT_OF_MEMORY)
        try:
            conn.send((idx, res, retire))
        except Exception as e:  # e.g. components that do not pickle
            conn.send(
                (idx, RewardResult(0.0, error=f"verifier result cannot be sent back: {type(e).__name__}: {e}"), retire)
            )


class _Worker:
    def __init__(self, ctx, task, memory_mb: int = 0):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(task, child, os.getpid(), memory_mb), daemon=True)
        self.proc.start()
        child.close()
        self.job: tuple[int, float] | None = None  # (sample index, dispatch time)
        self.calls = 0  # answered calls (recycling)

    def kill(self) -> None:
        """SIGKILL the worker and everything it started (a sandboxed program, say)."""
        for pid in [self.proc.pid, *descendants(self.proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.join(5)
        self.conn.close()


def _shutdown(workers: list) -> None:
    for w in workers:
        w.kill()


class VerifierPool:
    """`workers` processes scoring under `timeout_s` each; `memory_mb` > 0 caps the address space
    a worker may add to what it inherits (RLIMIT_AS); `max_calls` > 0 replaces a worker after
    that many calls (as `multiprocessing.Pool(maxtasksperchild=...)`)."""

    def __init__(
        self,
        task,
        workers: int,
        timeout_s: float = 30.0,
        start_method: str | None = None,
        memory_mb: int = 0,
        max_calls: int = 0,
    ):
        if workers < 1 or timeout_s <= 0 or memory_mb < 0 or max_calls < 0:
            raise UsageError(
                f"verifier pool: need workers >= 1, timeout_s > 0, memory_mb >= 0 and max_calls >= 0 "
                f"(got {workers}, {timeout_s}, {memory_mb}, {max_calls})"
            )
        self.task, self.timeout_s, self.memory_mb, self.max_calls = task, timeout_s, memory_mb, max_calls
        self.ctx = mp.get_context(start_method or ("fork" if "fork" in mp.get_all_start_methods() else "spawn"))
        self.workers = [_Worker(self.ctx, task, memory_mb) for _ in range(workers)]
        self.replaced = 0
        self._finalizer = weakref.finalize(self, _shutdown, self.workers)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _replace(self, w: _Worker) -> None:
        w.kill()
        self.workers[self.workers.index(w)] = _Worker(self.ctx, self.task, self.memory_mb)
        self.replaced += 1

    def score(self, pairs: list) -> tuple[list[RewardResult], dict]:
        """Score every (item, response); results in input order, and the step's counts."""
        results: list[RewardResult | None] = [None] * len(pairs)
        latency = np.zeros(len(pairs))
        errors = timeouts = 0
        replaced_before = self.replaced
        todo = deque(range(len(pairs)))
        while todo or any(w.job for w in self.workers):
            for k, w in enumerate(self.workers):  # hand out work to idle workers
                while w.job is None and todo:
                    i = todo.popleft()
                    try:
                        w.conn.send((i, *pairs[i]))
                    except (BrokenPipeError, ConnectionResetError):  # died while idle (killed from outside)
                        self._replace(w)
                        w = self.workers[k]
                        w.conn.send((i, *pairs[i]))
                    except Exception as e:  # the item does not pickle: that sample only
                        results[i] = RewardResult(0.0, error=f"cannot send the item to a verifier worker: {e}")
                        errors += 1
                        continue
                    w.job = (i, time.monotonic())
            if not any(w.job for w in self.workers):
                break
            busy = [w for w in self.workers if w.job]
            first_deadline = min(t for _, t in (w.job for w in busy)) + self.timeout_s
            ready = set(
                wait(
                    [w.conn for w in busy] + [w.proc.sentinel for w in busy],
                    timeout=max(0.0, first_deadline - time.monotonic()),
                )
            )
            now = time.monotonic()
            for w in busy:
                i, t0 = w.job
                res, retire = None, False
                if w.conn in ready:
                    try:
                        _, res, retire = w.conn.recv()
                    except (EOFError, OSError):  # died while answering
                        pass
                if res is None and (w.conn in ready or w.proc.sentinel in ready):
                    w.proc.join(1)
                    res = RewardResult(0.0, error=f"verifier worker died (exit code {w.proc.exitcode})")
                    self._replace(w)
                elif res is None and now - t0 >= self.timeout_s:
                    res = RewardResult(0.0, error=f"verifier timed out after {self.timeout_s:g}s")
                    timeouts += 1
                    errors -= 1  # counted as a timeout, not an error
                    self._replace(w)
                if res is None:
                    continue
                w.job = None
                results[i], latency[i] = res, now - t0
                errors += res.error is not None
                w.calls += 1
                if retire or (self.max_calls and w.calls >= self.max_calls):
                    self._replace(w)  # out of memory, or recycled
        stats = {"errors": errors, "timeouts": timeouts, "replaced": self.replaced - replaced_before}
        if len(pairs):
            stats.update(
                latency_p50_s=float(np.percentile(latency, 50)), latency_p99_s=float(np.percentile(latency, 99))
            )
        return results, stats


def make_pool(task, workers: int, timeout_s: float, memory_mb: int = 0, max_calls: int = 0) -> VerifierPool | None:
    """The pool for config `verifier_workers` (0 = none: score in-process), `verifier_timeout_s`,
    `verifier_memory_mb` and `verifier_max_calls`."""
    if workers < 0:
        raise UsageError(f"verifier_workers={workers} must be >= 0 (0 = score in the training process)")
    return VerifierPool(task, workers, timeout_s, memory_mb=memory_mb, max_calls=max_calls) if workers else None
