"""Versioned weight snapshots for a sampler that does not share the trainer's module.

The trainer `publish()`es its weights after each update: `policy_version` += 1 and a detached
copy of the state dict, split into buckets of about `bucket_mb` (a bucket is what one transfer
moves: one object-store put for Ray, one broadcast for NCCL). A sampler loads the newest
snapshot *between* requests, never during one, so every sample is produced by exactly one
version, and all tensors of a version switch together (no torn weights).

`switch_weights` is the sampler's side of that handoff, `PushSync` the synchronous sync of a
sampler in another process (publish, every worker loads, then the step goes on); the async
producer (distributed/async_rollout.py) loads the newest version between two requests instead.
"""

from __future__ import annotations

import threading
import time

import torch

from posttrain.framework.roles import RemoteSampler


def state_buckets(model: torch.nn.Module, bucket_mb: float = 64.0) -> list[dict[str, torch.Tensor]]:
    """The model's parameters and buffers as CPU copies, grouped in order into buckets of at
    most `bucket_mb` MB (a tensor bigger than a bucket gets a bucket of its own)."""
    limit = bucket_mb * 2**20
    buckets: list[dict[str, torch.Tensor]] = []
    current: dict[str, torch.Tensor] = {}
    size = 0
    for name, t in model.state_dict().items():
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > limit:
            buckets.append(current)
            current, size = {}, 0
        current[name] = t.detach().to("cpu", copy=True)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


@torch.no_grad()
def load_buckets(model: torch.nn.Module, buckets: list[dict[str, torch.Tensor]]) -> int:
    """Copy every bucket into `model` in place (parameter identity stays, so the engine's
    references remain valid); returns the bytes copied. Every key must be known."""
    own = model.state_dict()
    copied = 0
    for bucket in buckets:
        for name, t in bucket.items():
            own[name].copy_(t)
            copied += t.numel() * t.element_size()
    return copied


class WeightPublisher:
    """Trainer side of the versioned handoff: `publish(model)` makes version v+1 available;
    samplers read `latest()` when they are between requests. Thread-safe; `wait_for(v)`
    blocks until version ≥ v (the async producer's pacing)."""

    def __init__(self, model: torch.nn.Module, version: int = 0, bucket_mb: float = 64.0, history: int = 1):
        self.model, self.bucket_mb, self.history = model, bucket_mb, history
        self.version = version
        self.buckets = state_buckets(model, bucket_mb)
        self.kept = {version: self.buckets}  # the last `history` versions (async reads old ones)
        self._cond = threading.Condition()

    def publish(self) -> dict:
        t0 = time.perf_counter()
        buckets = state_buckets(self.model, self.bucket_mb)
        with self._cond:
            self.version += 1
            self.buckets = self.kept[self.version] = buckets
            self.kept.pop(self.version - self.history, None)
            self._cond.notify_all()
        return {
            "time/sync_s": time.perf_counter() - t0,
            "sync/buckets": float(len(buckets)),
            "sync/bytes": float(sum(t.numel() * t.element_size() for b in buckets for t in b.values())),
            "sync/policy_version": float(self.version),
        }

    def latest(self, at_most: int | None = None) -> tuple[int, list[dict]]:
        """The newest version, or the newest kept one ≤ `at_most`."""
        with self._cond:
            if at_most is None or at_most >= self.version:
                return self.version, self.buckets
            v = max(k for k in self.kept if k <= at_most) if any(k <= at_most for k in self.kept) else min(self.kept)
            return v, self.kept[v]

    def wait_for(self, version: int, stop: threading.Event | None = None) -> bool:
        """Block until the published version is ≥ `version`; False if `stop` was set first."""
        with self._cond:
            while self.version < version:
                if stop is not None and stop.is_set():
                    return False
                self._cond.wait(timeout=0.1)
            return True

    def reset(self, version: int, older: dict | None = None) -> None:
        """After a resume: the loaded weights are version `version`, and `older` ({version:
        buckets} saved with the checkpoint) the versions before it that samplers may still read."""
        with self._cond:
            self.version = version
            self.buckets = state_buckets(self.model, self.bucket_mb)
            keep = {v: b for v, b in (older or {}).items() if version - self.history < v < version}
            self.kept = {**keep, version: self.buckets}


def switch_weights(engine, version: int, buckets: list[dict]) -> None:
    """Load a published version into a sampler: its own `load_weights` (Ray workers) or the
    engine's `update_weights` (an in-place copy into a local Engine's model)."""
    if isinstance(engine, RemoteSampler):
        engine.load_weights(version, buckets)
    else:
        engine.update_weights((kv for b in buckets for kv in b.items()), version)


class PushSync:
    """Synchronous weight sync to a sampler in another process: publish, load, wait."""

    def __init__(self, publisher: WeightPublisher, engine: RemoteSampler):
        self.publisher, self.engine = publisher, engine

    def sync(self) -> dict:
        metrics = self.publisher.publish()
        version, buckets = self.publisher.latest()
        metrics.update(self.engine.load_weights(version, buckets))  # sync/... and the full time/sync_s
        return metrics
