"""Asynchronous mode: rollouts run ahead of the trainer, at most `max_staleness` versions behind.

    producer thread                                   trainer (the controller's step)
    ───────────────                                   ───────────────────────────────
    for s = start, start+1, …:                        step s:
      pace: wait until the trainer has begun            samples = source.get(s)   ← queue
            step s − K (K = max_staleness)               … reference, advantages, train …
      load the newest published weights                 source.sync()  → publish version v+1
        (between requests: one version per batch)
      samples = collect(s)   (generate + score)
      queue.put(s, samples)

Why pacing bounds staleness: the batch of step s is generated with weights published at the
end of step s − K − 1 or later, and the trainer makes at most one update a step, so when it
trains on that batch at step s it is at most K versions ahead. With K = 0 the producer starts
step s only when the trainer asks for it: exactly the synchronous loop, sample for sample.
`stale: drop` lets the producer run free instead (bounded only by the queue) and the trainer
throws away batches more than K versions old (counted in `staleness/dropped_batches`).
`stale: fixed` paces like `pace` but samples every batch with weights exactly K versions
old (the publisher keeps K + 1 versions): staleness K by construction, whatever the speeds
of the two sides, for experiments on what staleness does to learning.

Resume is exact (pace with K = 1, and fixed): the first K batches after a start sample with
versions v0 − K … v0 − 1, which the checkpoint carries (Placement.older_versions), as the
uninterrupted run did; without them a resumed run's first batch would be fresher (staleness 0).
With K ≥ 2, `pace` itself depends on the two sides' speeds, and `drop` always does.

The sampler holds its own model copy (a thread must never read weights the optimizer is
writing). By default weights switch between `collect` calls, so a sample's `policy_version`
is the version of every one of its tokens. `partial_rollouts: true` also lets a newer version
land between two decode steps (Engine.on_decode_step → `_catch_up`): a sample in flight goes
on with the new weights (its KV cache, computed by the old ones, is kept: PipelineRL's
in-flight update), and every token carries the version that produced it (`Sample.
token_versions`; `policy_version` stays the first, oldest). Nothing downstream needs to know:
the behaviour logprobs were recorded token by token under exactly the weights that sampled
each token, so the off-policy correction (token-level IS against π_prox) weights each token
by its own μ. Staleness is counted per policy token (`token_staleness`): `staleness/mean` is
the token-weighted mean age, `staleness/max` the oldest token (= the oldest sample), and
`staleness/partial_frac` the fraction of samples that span an update.
"""

from __future__ import annotations

import queue
import threading
import time

from posttrain.framework.card import OutOfMemory
from posttrain.framework.weight_sync.snapshots import WeightPublisher, switch_weights


class AsyncRollout:
    """The controller's `source` (get) and `sync` (sync) in async mode.

    collect: step -> (samples, metrics), run on the producer thread (Controller.collect).
    engine: the sampler `collect` uses; never the trainer's module.
    """

    def __init__(
        self,
        collect,
        engine,
        publisher: WeightPublisher,
        max_staleness: int,
        stale: str = "pace",
        partial: bool = False,
    ):
        # keys validated by placement.check_scale_config
        self.collect, self.engine, self.publisher = collect, engine, publisher
        self.K, self.stale = max_staleness, stale
        self.queue: queue.Queue = queue.Queue(maxsize=max_staleness + 1 if stale != "drop" else max(max_staleness, 1))
        self.asked = 0  # last step the trainer asked for (pacing)
        self.cond = threading.Condition()
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.rollout_idle = 0.0  # producer time spent waiting, since the last get()
        self.rollout_sync = 0.0  # producer time spent loading weights, since the last get()
        self.dropped = 0
        if partial:  # placement.check_scale_config: a local Engine
            engine.on_decode_step = self._catch_up

    # -- trainer side ----------------------------------------------------------------------

    def get(self, step: int) -> tuple[list, dict]:
        if self.thread is None:
            self.thread = threading.Thread(target=self._produce, args=(step,), daemon=True, name="rollout-producer")
            self.thread.start()
        with self.cond:
            self.asked = step
            self.cond.notify_all()
        t0 = time.perf_counter()
        while True:
            item = self._take()
            version = self.publisher.version  # the trainer's weights right now
            stale = [version - s.policy_version for s in item[1]]
            if self.stale != "drop" or not stale or max(stale) <= self.K:
                break
            self.dropped += 1  # drop mode: too old, take the next one
        _, samples, metrics = item
        ages, spans = token_staleness(samples, version)
        idle = time.perf_counter() - t0
        with self.cond:
            rollout_idle, rollout_sync, self.rollout_idle, self.rollout_sync = (
                self.rollout_idle,
                self.rollout_sync,
                0.0,
                0.0,
            )
        metrics = {
            **metrics,
            "staleness/mean": sum(ages) / max(len(ages), 1),
            "staleness/max": float(max(ages, default=0)),
            "staleness/partial_frac": spans / max(len(samples), 1),
            "staleness/dropped_batches": float(self.dropped),
            "queue/size": float(self.queue.qsize()),
            "time/trainer_idle_s": idle,
            "time/rollout_idle_s": rollout_idle,
            "time/rollout_sync_s": rollout_sync,
        }
        return samples, metrics

    def sync(self) -> dict:
        """❽ in async mode: publish the trainer's weights as the next version."""
        return self.publisher.publish()

    def close(self) -> None:
        self.stop.set()
        with self.cond:
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=60)

    def _take(self):
        while True:
            if isinstance(self.error, OutOfMemory):  # already one line naming its phase (framework/card.py)
                raise self.error
            if self.error is not None:
                raise RuntimeError(f"rollout producer failed: {self.error!r}") from self.error
            try:
                return self.queue.get(timeout=0.1)
            except queue.Empty:
                continue

    # -- producer side ---------------------------------------------------------------------

    def _catch_up(self) -> None:
        """Partial rollouts, between two decode steps (producer thread): load a newer version."""
        if self.publisher.version != self.engine.policy_version:
            t0 = time.perf_counter()
            switch_weights(self.engine, *self.publisher.latest())
            with self.cond:
                self.rollout_sync += time.perf_counter() - t0

    def _version_for(self, j: int, v0: int) -> int | None:
        """The newest version batch `start + j` may sample with (None = the latest), v0 being the
        version when the producer started. fixed: always v0 − K + j, K versions behind. pace: the
        same for the first K batches (their weights were published before `start`: at a fresh start
        that is version 0, after a resume the older versions the checkpoint kept, as the
        uninterrupted run sampled them), then whatever is latest when pacing lets the batch start."""
        if self.stale == "fixed" or (self.stale == "pace" and j < self.K):
            return max(0, v0 - self.K + j)  # below the oldest kept version: publisher.latest gives the oldest
        return None

    def _produce(self, step: int) -> None:
        start, v0 = step, self.publisher.version
        try:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                if self.stale != "drop":
                    with self.cond:  # step s may start once step s − K is asked for
                        while self.asked < step - self.K and not self.stop.is_set():
                            self.cond.wait(timeout=0.1)
                t1 = time.perf_counter()
                version, buckets = self.publisher.latest(at_most=self._version_for(step - start, v0))
                if version != self.engine.policy_version:  # between requests: atomic switch
                    switch_weights(self.engine, version, buckets)
                t2 = time.perf_counter()
                samples, metrics = self.collect(step)
                t3 = time.perf_counter()
                while not self.stop.is_set():
                    try:
                        self.queue.put((step, samples, metrics), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                with self.cond:
                    self.rollout_idle += (t1 - t0) + (time.perf_counter() - t3)
                    self.rollout_sync += t2 - t1
                step += 1
        except BaseException as e:  # surfaced on the trainer thread by get()
            self.error = e


def token_staleness(samples, version: int) -> tuple[list[int], int]:
    """(age of every policy-generated token, in versions behind `version`; the number of samples
    whose tokens span more than one version). A sample without `token_versions` is one version."""
    ages, spans = [], 0
    for s in samples:
        vers = getattr(s, "token_versions", None) or [s.policy_version] * len(s.response_ids)
        vers = [v for v, m in zip(vers, s.response_mask) if m]
        ages.extend(version - v for v in vers)
        spans += len(set(vers)) > 1
    return ages, spans
