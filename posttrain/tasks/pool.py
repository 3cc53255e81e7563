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

  leaks memory               past `memory_mb` (4096 by default) an allocation fails (RLIMIT_AS):
                              reward 0, "MemoryError" (or ENOMEM), the worker retired and replaced
  leaks anything else        with `max_calls`, a worker is replaced after that many calls

`stats` holds the counts and the per-call latency percentiles (dispatch → result, seconds);
`replaced` counts every replacement, whatever the cause (reward/workers_replaced).
Workers are forked (Linux): the task object is inherited, never pickled; items and
responses travel over a pipe per worker. A task with `reward_batch` (a dataset's reward
functions) sends its whole batch to one worker (`score_batch`), scored by the same function
as in-process, so functions that look at the batch, log metrics or read the step give the
same numbers in both places. With `workers=0` nobody uses this file: `score_samples` calls
the verifier in-process (no timeout possible there, and a crash there ends the run).

`verifier.workers=-1`, the default, gives your code workers and the built-in verifiers none
(resolve_workers). The price, measured on 2 cores (benchmarks/verifier_workers_cost.py): 128
responses scored one by one take +0.055 s a step in 2 workers (2.6% of a 2.1 s step), a
dataset's batch in one worker nothing measurable; what it buys: a segfault, os._exit, hang or
leak in your code costs the responses it was scoring, not the run (benchmarks/verifier_faults.py:
46/46 fault cells counted in workers, 30/46 in-process).

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
import inspect
import multiprocessing as mp
import os
import resource
import signal
import time
import weakref
from collections import deque
from contextlib import contextmanager
from multiprocessing.connection import wait

import numpy as np

from posttrain.errors import UsageError
from posttrain.tasks.base import RewardResult, safe_reward, score_in_process
from posttrain.tasks.sandbox import descendants

PR_SET_PDEATHSIG = 1  # linux/prctl.h
OUT_OF_MEMORY = ("MemoryError", f"OSError: [Errno {errno.ENOMEM}]")  # a failed allocation, as the errors word it


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
    """Worker loop: (index, kind, *args) in, (index, answer, retire) out, until EOF. Kind "one" is one
    response's `tasks.base.verifier_args`: a RewardResult; "batch" is (a list of those, step) scored
    as in the trainer's process (base.score_in_process): (results, the task's logged metrics). `retire` asks
    the pool to replace this worker (its memory ran out: what leaked stays)."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if memory_mb > 0:  # on top of the trainer's pages it inherits
        limit = int((_address_space_mb() + memory_mb) * 2**20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    while True:
        try:
            idx, kind, *args = conn.recv()
        except (EOFError, OSError):
            return
        if kind == "batch":
            results = score_in_process(task, *args)
            answer: object = (results, dict(getattr(task, "logged", {})))
        else:
            results = [safe_reward(task, *args)]
            answer = results[0]
        retire = any(oom in (r.error or "") for r in results for oom in OUT_OF_MEMORY)
        try:
            conn.send((idx, answer, retire))
        except Exception as e:  # e.g. components that do not pickle
            why = RewardResult(0.0, error=f"verifier result cannot be sent back: {type(e).__name__}: {e}")
            conn.send((idx, why if kind != "batch" else ([why] * len(results), {}), retire))


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
        """Score every response (its `tasks.base.verifier_args`) in its own call; results in input
        order, and the counts."""
        replaced_before = self.replaced
        results, failed, latency = self._run([("one", *p) for p in pairs])
        timeouts = failed.count("timeout")
        stats = {
            "errors": sum(r.error is not None for r in results) - timeouts,
            "timeouts": timeouts,
            "replaced": self.replaced - replaced_before,
        }
        if len(pairs):
            stats.update(
                latency_p50_s=float(np.percentile(latency, 50)), latency_p99_s=float(np.percentile(latency, 99))
            )
        return results, stats

    def score_batch(self, args: list[tuple], step=None) -> tuple[list[RewardResult], dict]:
        """A task with `reward_batch` (a dataset's reward functions, which may look at the whole batch,
        log metrics, read the step): the batch in one worker call, scored exactly as in-process, the
        task's `logged` metrics brought back. The call has the deadline of one call; if it times out
        or its worker dies, every response is scored alone (`score`), so only the responses at fault
        fail and are counted."""
        replaced_before = self.replaced
        answers, failed, _ = self._run([("batch", args, step)])
        if failed[0] is None:
            results, self.task.logged = answers[0]
            stats = {"errors": sum(r.error is not None for r in results), "timeouts": 0}
        else:  # nothing the batch logged came back: no stale metrics from an earlier batch either
            if hasattr(self.task, "logged"):
                self.task.logged = {}
            results, stats = self.score(args)
        return results, {**stats, "replaced": self.replaced - replaced_before}

    def _run(self, jobs: list[tuple]) -> tuple[list, list[str | None], np.ndarray]:
        """Each job on an idle worker under the deadline: per job the worker's answer (or a RewardResult
        saying why there is none), how it failed (None, "timeout", "died", "unsent") and its latency."""
        answers: list = [None] * len(jobs)
        failed: list[str | None] = [None] * len(jobs)
        latency = np.zeros(len(jobs))
        todo = deque(range(len(jobs)))
        while todo or any(w.job for w in self.workers):
            for k, w in enumerate(self.workers):  # hand out work to idle workers
                while w.job is None and todo:
                    i = todo.popleft()
                    try:
                        w.conn.send((i, *jobs[i]))
                    except (BrokenPipeError, ConnectionResetError):  # died while idle (killed from outside)
                        self._replace(w)
                        w = self.workers[k]
                        w.conn.send((i, *jobs[i]))
                    except Exception as e:  # the item does not pickle: that job only
                        answers[i] = RewardResult(0.0, error=f"cannot send the item to a verifier worker: {e}")
                        failed[i] = "unsent"
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
                got, retire = False, False
                if w.conn in ready:
                    try:
                        _, answers[i], retire = w.conn.recv()
                        got = True
                    except (EOFError, OSError):  # died while answering
                        pass
                if not got and (w.conn in ready or w.proc.sentinel in ready):
                    w.proc.join(1)
                    answers[i] = RewardResult(0.0, error=f"verifier worker died (exit code {w.proc.exitcode})")
                    failed[i] = "died"
                    self._replace(w)
                elif not got and now - t0 >= self.timeout_s:
                    answers[i] = RewardResult(0.0, error=f"verifier timed out after {self.timeout_s:g}s")
                    failed[i] = "timeout"
                    self._replace(w)
                elif not got:
                    continue
                w.job = None
                latency[i] = now - t0
                w.calls += 1
                if got and (retire or (self.max_calls and w.calls >= self.max_calls)):
                    self._replace(w)  # out of memory, or recycled
        return answers, failed, latency


AUTO_WORKERS = 2  # verifier.workers=-1 for a task that scores with your code (issue 30: +0.055 s a step of 128)
MEMORY_MB = 4096  # verifier.memory_mb's default: generous for a scorer, a wall for a leak


def runs_user_code(task) -> bool:
    """Does scoring call code posttrain did not ship: a task class from outside the package
    (task.name=FILE.py:Class, module:Class, an entry point), or a dataset's reward or correctness
    functions (DatasetTask.user_code)? Asked of the object that scores, never of a task it wraps:
    a judge over your dataset scores with the judge."""
    own = inspect.getattr_static(task, "user_code", None)  # not through a wrapper's __getattr__
    return bool(own) if own is not None else not type(task).__module__.startswith("posttrain.")


def resolve_workers(task, workers: int) -> int:
    """verifier.workers as a run uses it: -1 (the default) = AUTO_WORKERS when the task scores each
    response with your code (runs_user_code; not episodes, whose environment runs in the rollout,
    nor a task driven from outside), else 0 (in-process: the built-in verifiers)."""
    if workers < -1:
        raise UsageError(f"verifier.workers={workers}: use -1 (auto), 0 (score in the training process) or N > 0")
    if workers >= 0:
        return workers
    per_response = not hasattr(task, "make_env") and not getattr(task, "external", False)
    return AUTO_WORKERS if per_response and runs_user_code(task) else 0


def verifier_args(cfg) -> tuple:
    """make_pool's arguments from a config's `verifier` section (an RLConfig, or a run's config.yaml
    as a dict): workers, timeout_s, memory_mb, max_calls."""
    v = (cfg.get("verifier") or {}) if isinstance(cfg, dict) else vars(cfg.verifier)
    keys = {"workers": -1, "timeout_s": 30.0, "memory_mb": MEMORY_MB, "max_calls": 0}
    return tuple(v.get(k, default) for k, default in keys.items())


@contextmanager
def pool_for(task, cfg):
    """make_pool(task, *verifier_args(cfg)) for a `with` block (an evaluation outside a run), closed after."""
    pool = make_pool(task, *verifier_args(cfg))
    try:
        yield pool
    finally:
        if pool is not None:
            pool.close()


def make_pool(
    task, workers: int = -1, timeout_s: float = 30.0, memory_mb: int = MEMORY_MB, max_calls: int = 0
) -> VerifierPool | None:
    """The pool for config `verifier.workers` (resolve_workers; 0 = none: score in-process),
    `verifier.timeout_s`, `verifier.memory_mb` and `verifier.max_calls`."""
    workers = resolve_workers(task, workers)
    return VerifierPool(task, workers, timeout_s, memory_mb=memory_mb, max_calls=max_calls) if workers else None
