"""The server's engine queue: concurrent HTTP requests become shared `Engine.generate` calls.

    batcher = Batcher(engine)
    future = batcher.submit(prompt_ids, Params(n=4, temperature=1.0, max_new_tokens=64))
    samples = future.result()          # the n samples of that prompt, behaviour logprobs included

One worker thread owns the engine. It takes every request queued since its last call, then waits
(at most a quarter of the last call's duration, and `max_wait_s`) until as many have come as were
in play at the end of the last call (its requests and those that queued meanwhile), and keeps
taking while they arrive less than `window_s` apart: clients released together by one call re-send within
milliseconds of each other, and a call that waits for that burst decodes it as one batch instead
of a small call followed by a large one (on a CPU a decode step costs about the same for 4 rows
as for 32). A lone request waits `window_s` at most. It then groups
those whose sampling parameters agree (`Params`: n, temperature, top-k/p, length cap, stop ids),
and runs each group as ONE `Engine.generate` call, so 32 clients asking at once cost one batched
decode loop, not 32. Requests that arrive while a call runs wait for the next one: batching is
across calls, and inside a call the engine's own continuous batching refills its slots.

Randomness: an unseeded group draws from (server seed, call number, position in the call), so
two calls never repeat each other's draws. A request with its own `seed` runs alone in its call
at (seed, step 0, prompt 0): the same request with the same seed gives the same tokens.

`lock` is held around every engine call; a training loop that shares the engine's weights can
hold it to keep sampling out of an update (recipes hand the server an idle engine anyway).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass

from posttrain.framework.rollout import SamplingParams


@dataclass(frozen=True)
class Params:
    """What must agree for requests to share one engine call."""

    n: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop_ids: tuple[int, ...] = ()
    seed: int | None = None  # a request's own seed: it runs alone, reproducibly
    ignore_eos: bool = False  # vLLM's switch: never stop, every completion is max_new_tokens long (benchmarks)


@dataclass
class _Job:
    prompt: list[int]
    params: Params
    future: Future


class Batcher:
    """A worker thread that turns queued requests into grouped `Engine.generate` calls."""

    def __init__(self, engine, seed: int = 0, window_s: float = 0.005, max_wait_s: float = 0.5):
        self.engine, self.seed, self.window_s, self.max_wait_s = engine, int(seed), float(window_s), float(max_wait_s)
        self._expect = 1  # requests in play at the last call's end: clients re-send
        self._last_call_s = 0.0
        self.lock = threading.Lock()
        self.calls = 0  # engine calls made (the draw counter)
        self.stats = {"serve/calls": 0, "serve/requests": 0, "serve/generated_tokens": 0, "serve/engine_s": 0.0}
        self._queue: queue.Queue = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="posttrain-batcher", daemon=True)
        self._thread.start()

    def submit(self, prompt: list[int], params: Params) -> Future:
        """Queue one prompt; the future resolves to its `params.n` samples (or the engine's error)."""
        if self._closed:
            raise RuntimeError("the batcher is closed")
        fut: Future = Future()
        self._queue.put(_Job(list(prompt), params, fut))
        return fut

    def close(self) -> None:
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=30)

    # -- the worker ------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            jobs = [first]
            cap = time.monotonic() + max(self.window_s, min(self.max_wait_s, 0.25 * self._last_call_s))
            while True:  # everything queued since the last call, then more:
                left = cap - time.monotonic()  # up to as many as the last call had, then while
                wait = left if len(jobs) < self._expect else min(self.window_s, left)  # they come < window apart
                try:
                    job = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._closed = True
                    break
                jobs.append(job)
            groups: dict = {}
            for i, job in enumerate(jobs):  # a seeded request is its own group
                key = job.params if job.params.seed is None else (job.params, i)
                groups.setdefault(key, []).append(job)
            t0 = time.monotonic()
            for group in groups.values():
                self._run(group)
            self._last_call_s = time.monotonic() - t0
            self._expect = len(jobs) + self._queue.qsize()  # the clients in play: these, and those that queued
            if self._closed:
                for job in self._drain():
                    _resolve(job.future, error=RuntimeError("the server is shutting down"))
                return

    def _drain(self) -> list[_Job]:
        out = []
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return out
            if job is not None:
                out.append(job)

    def _run(self, jobs: list[_Job]) -> None:
        p = jobs[0].params
        sampling = SamplingParams(
            temperature=p.temperature,
            top_k=p.top_k,
            top_p=p.top_p,
            max_new_tokens=p.max_new_tokens,
            stop_ids=p.stop_ids,
            ignore_eos=p.ignore_eos,
        )
        seed, step = (self.seed, self.calls) if p.seed is None else (p.seed, 0)
        try:
            with self.lock:
                self.calls += 1
                samples = self.engine.generate([j.prompt for j in jobs], p.n, sampling, seed=seed, step=step)
                stats = dict(self.engine.stats)
        except Exception as e:  # noqa: BLE001 - the engine's error belongs to every request of the call
            for j in jobs:
                _resolve(j.future, error=e)
            return
        self.stats["serve/calls"] += 1
        self.stats["serve/requests"] += len(jobs)
        self.stats["serve/generated_tokens"] += int(stats.get("rollout/generated_tokens", 0))
        self.stats["serve/engine_s"] += float(stats.get("rollout/time_s", 0.0))
        for g, j in enumerate(jobs):  # samples come back group-major
            _resolve(j.future, samples[g * p.n : (g + 1) * p.n])


def _resolve(fut: Future, result=None, error: BaseException | None = None) -> None:
    """Settle a request's future unless its client already left (a cancelled future)."""
    try:
        fut.set_exception(error) if error is not None else fut.set_result(result)
    except InvalidStateError:
        pass
