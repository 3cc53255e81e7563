"""`placement: ray`: rollout workers as Ray actors, each an Engine with its own model copy.

    rollout = RayRollout(model, tokenizer, workers=2)      # needs ray.init() (or starts a local one)
    samples = rollout.generate(prompts, n, sampling, seed=0, step=3)   # the Engine interface
    rollout.load_weights(version, state_buckets(model))     # versioned, bucketed, all workers

What a reader should study:

1. **Same samples as one engine.** A call's prompts are split into contiguous shards of
   groups, one per worker, and each shard is generated with `group_offset` = its first group,
   so every sample draws its randomness from the same (seed, step, prompt, sample) key as in
   a single in-process Engine: placement does not change what is sampled.
2. **Weight sync through the object store.** `load_weights` puts each bucket once
   (`ray.put`) and every worker loads all of them inside one actor call. An actor runs one
   call at a time, so a worker switches versions between two `generate` requests, never
   inside one; the call returns when every worker has switched (sync mode waits on it).
   With `transport="broadcast"` the bytes go through a process group of the driver and the
   workers instead, one broadcast per bucket (framework/weight_sync/broadcast.py); the actor
   call only carries the layouts, and the switch stays between requests the same way.
3. **Fault isolation.** A worker that dies (its process killed, `os._exit`, a lost node)
   makes its `generate` raise RayActorError: it is replaced by a fresh actor that loads
   the newest weights, its shard is resubmitted, and the call returns normally
   (`rollout/worker_restarts` counts it). Errors raised by the engine itself are bugs and
   propagate.
"""

from __future__ import annotations

import copy
import os
import time

import torch

from posttrain.errors import UsageError
from posttrain.framework.backends import make_engine
from posttrain.framework.batch import Batch, view
from posttrain.framework.reference import Reference
from posttrain.framework.weight_sync.broadcast import SyncGroup, free_port, layout

MAX_TRIES = 3  # attempts per shard before a call gives up


class RolloutWorker:
    """The actor body: an Engine and a model copy in a process of its own."""

    def __init__(self, model, tokenizer, max_slots: int, threads: int):
        torch.set_num_threads(max(threads, 1))
        self.engine = make_engine(model.eval().requires_grad_(False), tokenizer, max_slots=max_slots)

    def load_weights(self, version: int, *buckets) -> int:
        self.engine.update_weights((kv for b in buckets for kv in b.items()), version)
        return version

    def join_group(self, host: str, port: int, rank: int, world: int, generation: int) -> int:
        self.group = SyncGroup(host, port, rank, world, generation)
        return rank

    def receive_weights(self, version: int, layouts: list) -> int:
        return self.load_weights(version, *self.group.receive(layouts))

    def generate(self, prompts, n, sampling, seed, step, items, group_offset, keep=None):
        samples = self.engine.generate(
            prompts, n, sampling, seed=seed, step=step, items=items, group_offset=group_offset, keep=keep
        )
        return samples, self.engine.stats

    def pid(self) -> int:
        return os.getpid()


class RayRollout:
    """The RolloutEngine interface (framework/roles.py) over `workers` Ray actors."""

    def __init__(
        self,
        model,
        tokenizer,
        workers: int = 2,
        max_slots: int = 256,
        threads: int = 1,
        cpus_per_worker: float = 1.0,
        transport: str = "object_store",
    ):
        import ray

        if workers < 1:
            raise UsageError(f"rollout_workers must be ≥ 1 (got {workers})")
        if not ray.is_initialized():
            ray.init(include_dashboard=False)  # a local cluster; `ray start --head` + RAY_ADDRESS for many machines
        self.ray, self.tokenizer = ray, tokenizer
        free = ray.cluster_resources().get("CPU", 0.0)
        if free < workers * cpus_per_worker:  # actors would wait for CPUs forever, silently
            raise UsageError(
                f"rollout_workers={workers} need {workers * cpus_per_worker:g} CPUs in the Ray "
                f"cluster, which has {free:g} in all; lower rollout_workers or add nodes (ray start --address)"
            )
        self.actor_cls = ray.remote(num_cpus=cpus_per_worker, max_restarts=0)(RolloutWorker)
        cpu_model = copy.deepcopy(model).to("cpu")
        self.model_ref = ray.put(cpu_model)
        self.args = (tokenizer, max_slots, threads)
        self.policy_version = 0
        self.max_len = int(model.config.max_seq_len)
        self.bucket_refs: list = []  # the newest version, for restarted workers
        self.restarts = 0
        self.stats: dict = {}
        self.transport, self.group, self.generation = transport, None, 0  # broadcast: formed at first sync
        self.store, self.last_buckets = None, []
        self.workers = [self._spawn() for _ in range(workers)]

    def _spawn(self):
        worker = self.actor_cls.remote(self.model_ref, *self.args)
        if not self.bucket_refs and self.last_buckets:  # broadcast transport: nothing in the store yet
            self.bucket_refs = [self.ray.put(b) for b in self.last_buckets]
        if self.bucket_refs:
            self.ray.get(worker.load_weights.remote(self.policy_version, *self.bucket_refs))
        return worker

    def _restart(self, i: int) -> None:
        try:
            self.ray.kill(self.workers[i], no_restart=True)
        except Exception:  # already gone
            pass
        self.restarts += 1
        self.workers[i] = self._spawn()
        self.group = None  # a group cannot take a new member: form a fresh one next sync

    def load_weights(self, version: int, buckets: list[dict]) -> dict:
        """Publish `buckets` as `version` to every worker; returns when all have switched."""
        if self.transport == "broadcast":
            return self._broadcast_weights(version, buckets)
        from ray.exceptions import RayActorError

        t0 = time.perf_counter()
        self.bucket_refs = [self.ray.put(b) for b in buckets]  # one put per bucket, shared by all workers
        self.policy_version = version
        for i, w in enumerate(self.workers):
            try:
                self.ray.get(w.load_weights.remote(version, *self.bucket_refs))
            except RayActorError:
                self._restart(i)  # the new worker loads this version
        return {"time/sync_s": time.perf_counter() - t0, "sync/buckets": float(len(buckets))}

    def update_weights(self, weights, version: int | None = None) -> int:
        """The RolloutEngine form of `load_weights`: (name, tensor) pairs as one bucket, to every worker."""
        bucket = {k: v.detach().to("cpu") for k, v in weights}
        self.load_weights(self.policy_version if version is None else version, [bucket])
        return sum(t.numel() * t.element_size() for t in bucket.values())

    def _form_group(self) -> None:
        """Driver = rank 0 (hosts the rendezvous store), worker k = rank k + 1; all join at once."""
        self.generation += 1
        world = len(self.workers) + 1
        if self.store is None:
            self.store_addr = (self.ray.util.get_node_ip_address(), free_port())
        joins = [
            w.join_group.remote(*self.store_addr, k + 1, world, self.generation) for k, w in enumerate(self.workers)
        ]
        self.group = SyncGroup(*self.store_addr, 0, world, self.generation, store=self.store)
        self.store = self.group.store
        self.ray.get(joins)

    def _broadcast_weights(self, version: int, buckets: list[dict]) -> dict:
        from ray.exceptions import RayActorError

        t0 = time.perf_counter()
        self.policy_version = version
        self.bucket_refs = []  # put lazily, only for a worker restarted mid-way
        self.last_buckets = buckets
        if self.group is None:
            self._form_group()
        layouts = [layout(b) for b in buckets]
        done = [w.receive_weights.remote(version, layouts) for w in self.workers]
        try:
            sent = self.group.send(buckets)
            self.ray.get(done)
        except (RayActorError, RuntimeError):  # a member died mid-sync: replace it, bring all up to date
            sent = 0
            self.bucket_refs = [self.ray.put(b) for b in buckets]
            for i, w in enumerate(self.workers):
                try:
                    self.ray.get(w.load_weights.remote(version, *self.bucket_refs))
                except RayActorError:
                    self._restart(i)
            self.group = None
        return {
            "time/sync_s": time.perf_counter() - t0,
            "sync/buckets": float(len(buckets)),
            "sync/broadcast_mb": sent / 2**20,
        }

    def generate(
        self,
        prompts,
        n,
        sampling,
        seed: int = 0,
        step: int = 0,
        items=None,
        group_offset: int = 0,
        keep: int | None = None,
    ):
        from ray.exceptions import RayActorError

        t0 = time.perf_counter()
        W = len(self.workers)
        bounds = [round(i * len(prompts) / W) for i in range(W + 1)]
        shards = [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]

        def submit(k, i):
            a, b = shards[k]
            return self.workers[i].generate.remote(
                prompts[a:b], n, sampling, seed, step, None if items is None else items[a:b], group_offset + a, keep
            )

        pending = {submit(k, k % W): (k, k % W, 1) for k in range(len(shards))}
        results: dict[int, tuple] = {}
        restarts0 = self.restarts
        while pending:
            ready, _ = self.ray.wait(list(pending), num_returns=1)
            k, i, tries = pending.pop(ready[0])
            try:
                results[k] = self.ray.get(ready[0])
            except RayActorError:
                if tries >= MAX_TRIES:
                    raise
                self._restart(i)  # in-flight prompts are re-queued
                pending[submit(k, i)] = (k, i, tries + 1)
        samples = []
        for k in range(len(shards)):
            part, _ = results[k]
            for s in part:
                s.group += shards[k][0]  # index within this call, as Engine
            samples.extend(part)
        dt = time.perf_counter() - t0
        gen = sum(r[1]["rollout/generated_tokens"] for r in results.values())
        cancelled = sum(r[1]["rollout/cancelled"] for r in results.values())
        self.stats = {
            "rollout/samples": len(samples),
            "rollout/generated_tokens": gen,
            "rollout/time_s": dt,
            "rollout/tokens_per_s": gen / max(dt, 1e-9),
            "rollout/workers": W,
            "rollout/cancelled": cancelled,
            "rollout/worker_restarts": float(self.restarts - restarts0),
            "rollout/worker_restarts_total": float(self.restarts),
        }
        return samples

    def close(self) -> None:
        for w in self.workers:
            try:
                self.ray.kill(w, no_restart=True)
            except Exception:
                pass
        self.workers = []


class ReferenceWorker:
    """The actor body of the reference: a frozen copy scoring batches in its own process."""

    def __init__(self, policy, temperature: float, threads: int):
        torch.set_num_threads(max(threads, 1))
        self.reference = Reference(policy, temperature)

    def score(self, batch: dict, micro_batch_tokens: int) -> torch.Tensor:
        return self.reference.score(batch, micro_batch_tokens)


class RayReference:
    """The Reference interface (`score`) over one Ray actor. It reserves no CPU of its own: in
    a sync step it runs while the rollout workers wait, and on GPUs it would take a fraction
    of one (`num_gpus`). The frozen copy is made from the policy at construction, as Reference."""

    def __init__(self, policy, temperature: float = 1.0, threads: int = 1):
        import ray

        self.ray = ray
        actor = ray.remote(num_cpus=0)(ReferenceWorker)
        self.actor = actor.remote(ray.put(copy.deepcopy(policy).to("cpu")), temperature, threads)

    def score(self, batch: Batch, micro_batch_tokens: int = 16384) -> torch.Tensor:
        fields = view(batch)
        device = fields["input_ids"].device
        keys = ("input_ids", "attention_mask", "loss_mask")  # all the reference reads
        cpu = {k: fields[k].to("cpu") for k in keys}
        return self.ray.get(self.actor.score.remote(cpu, micro_batch_tokens)).to(device)

    def close(self) -> None:
        self.ray.kill(self.actor, no_restart=True)
