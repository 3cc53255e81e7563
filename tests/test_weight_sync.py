"""Weight sync (framework/weight_sync/): after `sync()` the sampler's weights equal the trainer's,
for every kind that runs in one process. LoRA's merged sync is checked in test_lora.py, the Ray
object store and the broadcast transport in test_ray.py."""

import copy

import pytest
import torch

from posttrain import UsageError
from posttrain.framework.backends import make_engine
from posttrain.framework.roles import RemoteSampler, WeightSyncer
from posttrain.framework.rollout import Engine
from posttrain.framework.weight_sync import (
    LoraSync,
    PushSync,
    WeightPublisher,
    WeightSync,
    load_buckets,
    state_buckets,
    switch_weights,
)


def _train(model: torch.nn.Module, seed: int) -> None:
    """Play the trainer: move every parameter, so a missed tensor cannot go unnoticed."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))


def _equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sb = b.state_dict()
    return all(torch.equal(t, sb[k]) for k, t in a.state_dict().items())


class ProcessSampler:
    """A sampler that owns its weights and loads published versions itself, as RayRollout's
    workers do: what PushSync talks to, without Ray."""

    def __init__(self, model: torch.nn.Module, tok):
        self.engine = Engine(copy.deepcopy(model).eval().requires_grad_(False), tok)

    def load_weights(self, version: int, buckets: list[dict]) -> dict:
        copied = load_buckets(self.engine.model, buckets)
        self.engine.policy_version = version
        return {"sync/loaded_bytes": float(copied)}


def test_colocated_shares_the_module_and_bumps_the_version(nano, tok):
    engine = Engine(nano, tok)
    sync = WeightSync(nano, engine, "colocated")
    _train(nano, 1)
    out = sync.sync()
    assert engine.model is nano and out["sync/bytes"] == 0.0
    assert engine.policy_version == 1 and out["sync/policy_version"] == 1.0
    assert isinstance(sync, WeightSyncer)


def test_separate_copies_every_parameter_in_place(nano, tok):
    engine = make_engine(nano, tok, copy=True)  # what the placement builds for weight_sync=separate
    sync = WeightSync(nano, engine, "separate")
    assert engine.model is not nano
    held = [p for p in engine.model.parameters()]  # the engine's tensors stay the same objects
    _train(nano, 2)
    assert not _equal(engine.model, nano)
    out = sync.sync()
    assert _equal(engine.model, nano)
    assert all(a is b for a, b in zip(held, engine.model.parameters()))
    assert out["sync/bytes"] == 4.0 * sum(p.numel() for p in nano.parameters())  # fp32: 4 bytes a weight
    assert engine.policy_version == 1


def test_an_unknown_mode_is_one_usage_error(nano, tok):
    with pytest.raises(UsageError, match="weight_sync='shared' is unknown"):
        WeightSync(nano, Engine(nano, tok), "shared")


def test_lora_sync_without_adapters_is_the_plain_sync(nano, tok):
    engine = Engine(nano, tok)
    sync = LoraSync(nano, engine, "colocated")
    _train(nano, 3)
    assert sync.sync()["sync/policy_version"] == 1.0 and engine.model is nano


def test_push_sync_publishes_and_the_sampler_loads_the_same_weights(nano, tok):
    sampler = ProcessSampler(nano, tok)
    assert isinstance(sampler, RemoteSampler)
    sync = PushSync(WeightPublisher(nano, bucket_mb=0.05), sampler)  # small buckets: several of them
    for v in (1, 2):
        _train(nano, 10 + v)
        out = sync.sync()
        assert _equal(sampler.engine.model, nano) and sampler.engine.policy_version == v
        assert out["sync/policy_version"] == float(v) and out["sync/buckets"] > 1
        assert out["sync/loaded_bytes"] == out["sync/bytes"]


def test_switch_weights_loads_a_kept_version_into_a_local_engine(nano, tok):
    """The async producer's side: between two requests it loads the version it may use."""
    engine = Engine(copy.deepcopy(nano).eval().requires_grad_(False), tok)
    publisher = WeightPublisher(nano, history=2)
    v0 = copy.deepcopy(nano)
    _train(nano, 20)
    publisher.publish()
    switch_weights(engine, *publisher.latest(at_most=0))  # a staleness bound of one version
    assert engine.policy_version == 0 and _equal(engine.model, v0)
    switch_weights(engine, *publisher.latest())
    assert engine.policy_version == 1 and _equal(engine.model, nano)


def test_buckets_split_in_order_and_cover_every_tensor(nano):
    buckets = state_buckets(nano, bucket_mb=0.05)
    names = [k for b in buckets for k in b]
    assert names == list(nano.state_dict()) and len(buckets) > 1
    assert all(t.device.type == "cpu" for b in buckets for t in b.values())
