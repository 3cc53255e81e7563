"""placement: ray: rollout workers as Ray actors on a local CPU cluster (distributed/ray_rollout.py)."""

import os
import signal
import threading

import pytest
import torch

ray = pytest.importorskip("ray")

from posttrain.config import RLConfig, load_config
from posttrain.distributed.ray_rollout import RayRollout
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.framework.weight_sync.snapshots import state_buckets
from posttrain.logging import read_metrics
from posttrain.recipes import rl

from conftest import TINY_TASK


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14], [15, 16]]
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=12)


def _tokens(samples):
    return [(s.group, s.index, s.response_ids, s.policy_version) for s in samples]


def _expected(model, tok, step=3, version=0):
    engine = Engine(model, tok)
    engine.policy_version = version
    return _tokens(engine.generate(PROMPTS, 3, SAMPLING, seed=7, step=step))


COMMON = [
    "prompts_per_step=2",
    "samples_per_prompt=4",
    "eval_problems=4",
    "eval_samples=2",
    "eval_every=0",
    "steps=2",
    "threads=1",
    "device=cpu",  # every placement to 1e-6: the CPU's fp32 in the driver and in the workers
    *TINY_TASK,
]


@pytest.mark.slow
def test_same_preset_in_process_ray_sync_and_ray_async(cluster, sft_ckpt, tmp_path):
    # first in the file: it needs both CPUs of the test cluster for its own 2 workers
    runs = {
        "local": [],
        "ray": ["placement=ray", "rollout_workers=2", "sync_transport=broadcast"],
        "ray_async": ["placement=ray", "rollout_workers=2", "async=true", "max_staleness=1"],
    }
    for name, extra in runs.items():
        rl.run(load_config(RLConfig, None, [f"out={tmp_path}/{name}", f"init={sft_ckpt}", *COMMON, *extra]))
    local, ray_sync, ray_async = (read_metrics(tmp_path / n)[1:] for n in runs)
    for a, b in zip(local, ray_sync):  # same samples, same update
        for k in ("reward/mean", "length/mean", "loss", "kl/ref"):  # kl/ref: the reference actor
            assert a[k] == pytest.approx(b[k], abs=1e-6), k
    assert all(r["rollout/workers"] == 2 and r["time/sync_s"] > 0 for r in ray_sync)
    assert [r["step"] for r in ray_async] == [1, 2] and all(r["staleness/max"] <= 1 for r in ray_async)


@pytest.fixture(scope="module")
def rollout(cluster):
    from posttrain.models.gpt_mini import GPTMini, ModelConfig
    from posttrain.models.tokenizer import CharTokenizer

    tok = CharTokenizer()
    torch.manual_seed(0)
    model = GPTMini(ModelConfig(preset="nano").resolved(tok.vocab_size))
    r = RayRollout(model, tok, workers=2)
    yield r, model, tok
    r.close()


@pytest.mark.slow
def test_workers_sample_what_one_engine_samples_and_switch_weights_together(rollout):
    rollout, nano, tok = rollout
    assert _tokens(rollout.generate(PROMPTS, 3, SAMPLING, seed=7, step=3)) == _expected(nano, tok)
    with torch.no_grad():  # a "training step", then sync version 1
        for p in nano.parameters():
            p.add_(0.05 * torch.randn_like(p))
    m = rollout.load_weights(1, state_buckets(nano, bucket_mb=0.5))
    assert m["sync/buckets"] > 1  # the state dict travelled in several buckets
    got = rollout.generate(PROMPTS, 3, SAMPLING, seed=7, step=3)
    assert _tokens(got) == _expected(nano, tok, version=1)
    assert rollout.stats["rollout/workers"] == 2 and rollout.stats["rollout/worker_restarts"] == 0


@pytest.mark.slow
def test_a_dead_worker_is_restarted_and_its_prompts_requeued(rollout):
    rollout, nano, tok = rollout
    rollout.load_weights(4, state_buckets(nano))
    ray.kill(rollout.workers[0], no_restart=True)  # dies between requests
    assert _tokens(rollout.generate(PROMPTS, 3, SAMPLING, seed=7, step=3)) == _expected(nano, tok, version=4)
    assert rollout.stats["rollout/worker_restarts"] == 1
    # killed mid-request: SIGKILL to the worker process while it generates a long batch
    pid = ray.get(rollout.workers[1].pid.remote())
    long = SamplingParams(temperature=1.0, max_new_tokens=12, ignore_eos=True)
    killer = threading.Timer(0.5, os.kill, (pid, signal.SIGKILL))
    killer.start()
    samples = rollout.generate(PROMPTS * 8, 8, long, seed=1, step=0)
    killer.join()
    if rollout.restarts == 1:  # the request beat the kill: the next one meets it
        samples = rollout.generate(PROMPTS * 8, 8, long, seed=1, step=0)
    assert len(samples) == len(PROMPTS) * 8 * 8 and all(len(s.response_ids) == 12 for s in samples)
    assert all(s.policy_version == 4 for s in samples)  # the new worker loaded the newest weights
    assert rollout.restarts == 2


def test_pack_unpack_round_trips_a_mixed_dtype_bucket():
    from posttrain.framework.weight_sync.broadcast import layout, pack, unpack

    bucket = {
        "w": torch.randn(3, 4),
        "b": torch.arange(5, dtype=torch.int64),
        "h": torch.randn(2).half(),
        "t": torch.randn(4, 3).t(),
    }  # non-contiguous: packed as its contiguous copy
    flat = pack(bucket)
    assert flat.dtype == torch.uint8 and flat.numel() == 48 + 40 + 4 + 48
    back = unpack(flat.clone(), layout(bucket))
    assert list(back) == list(bucket)
    assert all(torch.equal(back[k], bucket[k]) and back[k].dtype == bucket[k].dtype for k in bucket)


@pytest.mark.slow
def test_broadcast_transport_switches_weights_like_the_object_store(cluster):
    from posttrain.models.gpt_mini import GPTMini, ModelConfig
    from posttrain.models.tokenizer import CharTokenizer

    tok = CharTokenizer()
    torch.manual_seed(1)
    nano = GPTMini(ModelConfig(preset="nano").resolved(tok.vocab_size))
    # cpus_per_worker=0: the module's other RayRollout holds both CPUs of the test cluster
    r = RayRollout(nano, tok, workers=2, cpus_per_worker=0, transport="broadcast")
    try:
        for version in (1, 2):
            with torch.no_grad():
                for p in nano.parameters():
                    p.add_(0.05 * torch.randn_like(p))
            buckets = state_buckets(nano, bucket_mb=0.5)
            m = r.load_weights(version, buckets)
            nbytes = sum(t.numel() * t.element_size() for b in buckets for t in b.values())
            assert m["sync/buckets"] > 1 and m["sync/broadcast_mb"] == pytest.approx(nbytes / 2**20)
            assert _tokens(r.generate(PROMPTS, 3, SAMPLING, seed=7, step=3)) == _expected(nano, tok, version=version)
            if version == 1:  # a worker dies: replaced with the newest weights,
                ray.kill(r.workers[0], no_restart=True)  # and the next sync forms a fresh group
                assert _tokens(r.generate(PROMPTS, 3, SAMPLING, seed=7, step=3)) == _expected(nano, tok, version=1)
        assert r.restarts == 1 and r.generation == 2
    finally:
        r.close()
