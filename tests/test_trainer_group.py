"""`trainer_ranks: 2` (distributed/trainer_group.py): `posttrain rl` with its trainer data-parallel
over two local gloo processes reproduces the 1-rank run."""

import pytest
import torch

from posttrain import UsageError
from posttrain.config import RLConfig, load_config
from posttrain.logging import read_metrics
from posttrain.recipes import rl

from conftest import TINY_TASK

# 5 samples a step: shards of 3 and 2 rows (an uneven split). The tiny model earns no reward, so an
# entropy bonus gives every step a real gradient: Adam would turn a rounding-level one (~1e-9, the
# only gradient of an all-zero-advantage step) into a full lr-sized step and amplify ulp differences.
COMMON = [
    "prompts_per_step=1",
    "samples_per_prompt=5",
    "eval_problems=4",
    "eval_samples=2",
    "eval_every=0",
    "steps=2",
    "threads=1",
    "optim.lr=3e-4",
    "algo.entropy_coef=0.01",
    "device=cpu",  # two ranks reproduce one to 1e-5: the CPU's fp32 (the group is gloo)
    *TINY_TASK,
]


def _weights(run_dir):
    from safetensors.torch import load_file

    from posttrain import checkpoint

    return load_file(checkpoint.latest(run_dir) / "model.safetensors")


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.slow
def test_two_trainer_ranks_reproduce_one(sft_ckpt, tmp_path):
    """replicate (DDP-style) and fsdp (FSDP2 shards) over 2 gloo ranks against the 1-rank trainer."""
    runs = {}
    for name, keys in [
        ("one", []),
        ("replicate", ["trainer_ranks=2"]),
        ("fsdp", ["trainer_ranks=2", "trainer_shard=fsdp"]),
    ]:
        rl.run(load_config(RLConfig, None, [f"out={tmp_path / name}", f"init={sft_ckpt}", *keys, *COMMON]))
        runs[name] = read_metrics(tmp_path / name)[1:]
    w1, w0 = _weights(tmp_path / "one"), _weights(sft_ckpt)
    assert _max_diff(w1, w0) > 1e-4  # the weights did move
    for name in ("replicate", "fsdp"):
        one, two = runs["one"], runs[name]
        assert [r["step"] for r in two] == [1, 2] and one[0].keys() == two[0].keys()  # same metrics format
        for a, b in zip(one, two):
            assert a["reward/mean"] == b["reward/mean"]  # same rollouts: step 1's update agreed
            for k in ("loss", "grad/norm", "clip/frac", "kl/ref"):
                assert b[k] == pytest.approx(a[k], abs=1e-5), (name, k)
        assert _max_diff(w1, _weights(tmp_path / name)) <= 1e-5, name


def test_bad_trainer_keys_are_usage_errors(tmp_path):
    for bad, match in [("trainer_ranks=0", "trainer_ranks"), ("trainer_shard=zero3", "trainer_shard")]:
        with pytest.raises(UsageError, match=match):
            rl.run(load_config(RLConfig, None, [f"out={tmp_path}/x", "init=nowhere", bad]))


# ---------------------------------------------------------------------- FSDP2 at the step level


def _fsdp_rank(rank, world, port, out):
    import os

    import torch.distributed as dist

    from posttrain.distributed.fsdp import FSDPShard, shard_module

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        grads, params, metrics, state = _fsdp_step(shard_module(_model()), FSDPShard())
        if rank == 0:
            torch.save((grads, params, metrics, state), out)
    finally:
        dist.destroy_process_group()


def _fsdp_step(model, dp=None):
    from test_distributed import _batch

    from posttrain import algorithms
    from posttrain.config import OptimConfig
    from posttrain.distributed.fsdp import full_state
    from posttrain.framework.trainer import Trainer, policy_loss_fn

    algo = algorithms.get("grpo")
    # micro_batch_tokens=24: rank 0's rows make 3 micro-batches, rank 1's 2 (even_out pads one)
    trainer = Trainer(model, OptimConfig(lr=1e-2, grad_clip=0.05, micro_batch_tokens=24), 10)
    trainer.dp = dp
    metrics = trainer.step(_batch(), policy_loss_fn(algo, algo.Config(kl_coef=0.0), 1.0))
    full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t  # noqa: E731
    grads = {n: full(p.grad).clone() for n, p in model.named_parameters()}
    params = {n: full(p.detach()).clone() for n, p in model.named_parameters()}
    return grads, params, metrics, full_state(trainer) if dp is not None else trainer.state_dict()


def _model():
    from test_distributed import _model

    return _model()


@pytest.mark.slow
def test_fsdp2_on_two_gloo_ranks_gives_the_step_of_one(tmp_path):
    import torch.multiprocessing as mp
    from test_distributed import _free_port

    out = tmp_path / "rank0.pt"
    mp.spawn(_fsdp_rank, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    grads, params, metrics, state = torch.load(out, weights_only=False)
    grads1, params1, metrics1, state1 = _fsdp_step(_model())
    dg = max(float((grads[n] - g).abs().max()) for n, g in grads1.items())
    # Adam's first step moves each element by ~lr·g/(|g| + 1e-8): where g is at the rounding level
    # (<1e-7 here), the ulp differences of micro-batches grouped differently (the trainer groups rows
    # by length: 1 rank sees all 5, each FSDP rank its own) become visible, so those elements only
    # have to stay within lr·1e-2 of each other
    live = {n: g.abs() > 1e-7 for n, g in grads1.items()}
    dp = max(float((params[n] - p).abs()[live[n]].max()) for n, p in params1.items() if live[n].any())
    dp_all = max(float((params[n] - p).abs().max()) for n, p in params1.items())
    print(f"fsdp2 vs 1 rank: grad max|d| {dg:.2e}, param max|d| {dp:.2e} ({dp_all:.2e} with rounding-level grads)")
    assert dg <= 1e-6 and max(float(g.abs().max()) for g in grads1.values()) > 1e-3  # summed once
    assert dp <= 1e-6 and dp_all <= 1e-4
    assert metrics["loss"] == pytest.approx(metrics1["loss"], abs=1e-6)
    assert (
        metrics["grad/norm"] == pytest.approx(metrics1["grad/norm"], abs=1e-6) and metrics1["grad/norm"] > 0.05
    )  # clipped
    s, s1 = state["optimizer"]["state"], state1["optimizer"]["state"]  # the gathered state: 1-rank format
    assert s.keys() == s1.keys() and all(torch.allclose(s[i]["exp_avg"], s1[i]["exp_avg"], atol=1e-7) for i in s)
