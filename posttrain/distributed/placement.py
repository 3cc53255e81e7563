"""Where the rollout role runs, from config: the same preset in every placement.

    placement   async   sampler                                  weight sync (❽)
    in-process  false   Engine on the trainer's module or a copy   WeightSync (colocated | separate)
                        rollout.backend=vllm: vLLM's engine         the whole state, pushed
    in-process  true    Engine on its own copy, producer thread    publish → loaded between requests
    ray         false   RayRollout: `rollout_workers` actors       publish → every worker, then go on
    ray         true    RayRollout fed by the producer thread      publish → loaded between requests

The trainer stays in the driver process; with `placement: ray` the reference (when a KL
needs one) is an actor of its own (ray_rollout.RayReference), elsewhere a frozen copy in-process.
"""

from __future__ import annotations

import dataclasses

from posttrain.algorithms.core import OFF_POLICY_CORRECTIONS
from posttrain.distributed import launch
from posttrain.distributed.async_rollout import AsyncRollout
from posttrain.distributed.ranks import check_rank_config
from posttrain.distributed.ray_rollout import RayReference, RayRollout
from posttrain.errors import UsageError
from posttrain.framework.backends import backend_of, make_engine, make_sync
from posttrain.framework.compiled import resolve
from posttrain.framework.reference import Reference
from posttrain.framework.roles import ReferenceScorer, RolloutEngine, WeightSyncer, close_all
from posttrain.framework.weight_sync import PushSync, WeightPublisher, WeightSync, switch_weights
from posttrain.precision import sampler_runtime  # rollout.precision: a bf16/fp16 sampler, emulated

PLACEMENTS = ("in-process", "ray")


@dataclasses.dataclass
class Placement:
    engine: RolloutEngine  # what Controller.collect generates with
    sync: WeightSyncer | None  # .sync() after every update (async: the producer, set by `asynchronous`)
    eval_engine: RolloutEngine  # held-out evaluation: the trainer's current weights, in the driver
    publisher: WeightPublisher | None = None
    ref: ReferenceScorer | None = None  # the reference, once `reference()` has placed it

    @property
    def version(self) -> int:
        return self.publisher.version if self.publisher is not None else self.engine.policy_version

    def set_version(self, v: int, older: dict | None = None) -> None:
        """After a resume (weights already loaded): the sampler catches up to version v; `older`
        ({version: buckets}, from `older_versions` at the save) restores what async samples from next."""
        if isinstance(self.sync, WeightSync):  # a sampler with its own copy (separate, vLLM) reloads the weights
            self.sync.load(v)
            return
        if self.publisher is None:
            self.engine.policy_version = v
            return
        self.publisher.reset(v, older)
        switch_weights(self.engine, *self.publisher.latest())

    def older_versions(self) -> dict:
        """{version: buckets} the publisher keeps below the current version (async: the last
        max_staleness), for the checkpoint; {} when nothing samples from old weights."""
        if self.publisher is None:
            return {}
        return {v: b for v, b in self.publisher.kept.items() if v < self.publisher.version}

    def reference(self, cfg, policy, runtime=None):
        """The frozen reference, placed with the rollout workers' placement (in-process: held and
        scored in the runtime's compute dtype, framework/reference.py)."""
        if cfg.scale.placement == "ray":
            self.ref = RayReference(policy, cfg.rollout.temperature, max(cfg.threads, 1))
        else:
            o = cfg.optim
            on = resolve(o.compile, next(policy.parameters()).device, o.compile_scope)  # as the trainer
            self.ref = Reference(policy, cfg.rollout.temperature, runtime, o.packing, o.packing_width, compile=on)
        return self.ref

    def asynchronous(self, cfg, collect):
        """Turn this placement async: a producer thread runs `collect` ahead of the trainer."""
        self.sync = AsyncRollout(
            collect,
            self.engine,
            self.publisher,
            cfg.scale.max_staleness,
            cfg.scale.stale,
            partial=cfg.scale.partial_rollouts,
        )
        return self.sync

    def close(self) -> None:
        close_all(self.sync, self.engine, self.ref)  # producer first: it uses the engine


def place(cfg, model, tokenizer, runtime=None) -> Placement:
    check_scale_config(cfg)
    if cfg.scale.placement == "in-process" and not cfg.scale.async_:
        engine = make_engine(
            model,
            tokenizer,
            cfg.rollout,
            max_slots=cfg.rollout.max_slots,
            runtime=sampler_runtime(cfg.rollout.precision, runtime),
            copy=cfg.scale.weight_sync == "separate",
        )  # LoRA: the sampler gets merged W + (α/r)·B·A
        return Placement(engine, make_sync(model, engine, cfg.rollout, cfg.scale.weight_sync), engine)
    eval_engine = make_engine(model, tokenizer, cfg.rollout, max_slots=cfg.rollout.max_slots, runtime=runtime)
    # async (pace, fixed) keeps the last K + 1 versions: fixed samples from old ones, and a checkpoint
    # carries the K older ones so the batches after a resume come from the same weights as without it
    keep = cfg.scale.max_staleness + 1 if cfg.scale.async_ and cfg.scale.stale in ("pace", "fixed") else 1
    publisher = WeightPublisher(model, bucket_mb=cfg.scale.sync_bucket_mb, history=keep)
    if cfg.scale.placement == "ray":
        engine = RayRollout(
            model,
            tokenizer,
            workers=cfg.scale.rollout_workers,
            max_slots=cfg.rollout.max_slots,
            threads=max(cfg.threads, 1),
            transport=cfg.scale.sync_transport,
        )
        return Placement(engine, PushSync(publisher, engine), eval_engine, publisher)
    # in-process async: the sampler needs its own copy (the optimizer writes the trainer's), sampled in the
    # runtime's compute dtype as the synchronous one is (bf16 autocast and caches on CUDA, not fp32)
    rt = sampler_runtime(cfg.rollout.precision, runtime)
    engine = make_engine(model, tokenizer, cfg.rollout, max_slots=cfg.rollout.max_slots, runtime=rt, copy=True)
    return Placement(engine, None, eval_engine, publisher)


def check_scale_config(cfg) -> None:
    """Reject bad scale-out keys before any work (one line naming the key and the fix)."""
    if cfg.scale.placement not in PLACEMENTS:
        raise UsageError(f"scale.placement={cfg.scale.placement!r} is unknown; use {' or '.join(PLACEMENTS)}")
    if backend_of(cfg.rollout) == "vllm" and (cfg.scale.placement != "in-process" or cfg.scale.async_):
        raise UsageError(
            "rollout.backend=vllm runs in-process and synchronous only (one vLLM engine beside the trainer); "
            "use scale.placement=in-process with async off, or rollout.backend=posttrain"
        )
    if cfg.scale.off_policy_correction not in (*OFF_POLICY_CORRECTIONS, "auto"):
        raise UsageError(
            f"scale.off_policy_correction={cfg.scale.off_policy_correction!r} is unknown; "
            f"use auto, {', '.join(OFF_POLICY_CORRECTIONS)}"
        )
    if cfg.scale.off_policy_cap <= 1.0:
        raise UsageError(f"scale.off_policy_cap must be > 1 (got {cfg.scale.off_policy_cap}); 2 is verl's default")
    if cfg.scale.sync_transport not in ("object_store", "broadcast"):
        raise UsageError(f"scale.sync_transport={cfg.scale.sync_transport!r} is unknown; use object_store or broadcast")
    if cfg.scale.stale not in ("pace", "drop", "fixed"):
        raise UsageError(f"scale.stale={cfg.scale.stale!r} is unknown; use pace (producers wait), drop or fixed")
    if cfg.scale.max_staleness < 0:
        raise UsageError(f"scale.max_staleness must be ≥ 0 (got {cfg.scale.max_staleness})")
    if cfg.lora.r > 0 and (cfg.scale.async_ or cfg.scale.placement != "in-process"):
        raise UsageError(
            "lora.r > 0 runs with placement=in-process and async=false only (the sampler's merged "
            "weights are synced in-process); drop lora or use the in-process sync placement"
        )
    if cfg.scale.partial_rollouts and not (
        cfg.scale.async_ and cfg.scale.placement == "in-process" and cfg.scale.stale != "fixed"
    ):
        raise UsageError(
            "partial_rollouts needs async=true, placement=in-process and stale=pace or drop (weights "
            "land mid-sample in the producer's engine); drop partial_rollouts or change those keys"
        )

    check_rank_config(cfg, launch.env_world())  # before any work: torchrun's environment says how many ranks
    if cfg.rollout.overprovision < 0:
        raise UsageError(
            f"rollout.overprovision must be ≥ 0 (got {cfg.rollout.overprovision}); it is extra samples per prompt"
        )
