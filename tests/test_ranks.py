"""N ranks (distributed/launch.py, ranks.py, framework/world.py): `torchrun --nproc-per-node 2 -m posttrain`
on gloo reproduces the 1-rank run, every rank sampling its own prompt groups: the same samples (token ids),
rewards, loss, grad norm and weights, with the policy sharded (FSDP2) or replicated; the other stages data
parallel; a rank killed mid-run stops them all and `--resume` reaches the uninterrupted numbers."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from posttrain import UsageError
from posttrain.config import RLConfig, load_config
from posttrain.framework.world import World
from posttrain.logging import read_metrics
from posttrain.recipes import rl

from conftest import TINY_TASK

ROOT = Path(__file__).resolve().parent.parent
# 3 groups of 4 a step over 2 ranks: blocks of 2 and 1 groups (an uneven split). The tiny model earns no
# reward, so an entropy bonus gives every step a real gradient: Adam would turn a rounding-level one
# (~1e-9, the only gradient of an all-zero-advantage step) into a full lr-sized step and amplify ulp
# differences. eval every step with every sample audited: samples.jsonl holds every sample's token ids.
COMMON = [
    "prompts_per_step=3",
    "samples_per_prompt=4",
    "eval_problems=4",
    "eval_samples=2",
    "eval_every=1",
    "eval.save_samples=12",
    "steps=3",
    "threads=1",
    "optim.lr=3e-4",
    "algo.entropy_coef=0.01",
    "device=cpu",
    *TINY_TASK,
]


def _run(stage: str, out: Path, keys: list[str], ranks: int = 1, resume: bool = False, wait: bool = True, fake=False):
    """`posttrain STAGE` in a subprocess: plain (1 rank) or through torchrun on `ranks` gloo ranks (`fake`:
    each on its own fake GPU, tests/fakegpu_rank.py)."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    entry = [str(ROOT / "tests" / "fakegpu_rank.py")] if fake else ["-m", "posttrain"]
    cmd = [*(launch if ranks > 1 else [sys.executable]), *entry, stage, f"out={out}", *keys]
    cmd += ["--resume", str(out)] if resume else []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "POSTTRAIN_TIMEOUT_S": "60"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if not wait:
        return proc
    log = proc.communicate(timeout=900)[0]
    assert proc.returncode == 0, log[-3000:]
    return log


def _weights(run_dir):
    from safetensors.torch import load_file

    from posttrain import checkpoint

    return load_file(checkpoint.latest(run_dir) / "model.safetensors")


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _samples(run_dir):
    return [(r["step"], r["response_ids"], r["reward"]) for r in map(json.loads, open(Path(run_dir, "samples.jsonl")))]


@pytest.mark.slow
def test_two_ranks_sample_and_train_as_one(sft_ckpt, tmp_path):
    """FSDP2 shards and replicas over 2 gloo ranks, each sampling its own groups, against one rank."""
    keys = [f"init={sft_ckpt}", *COMMON]
    _run("rl", tmp_path / "one", keys)
    _run("rl", tmp_path / "fsdp", keys, ranks=2)
    _run("rl", tmp_path / "replicate", [*keys, "scale.trainer_shard=replicate"], ranks=2)
    one, w1 = read_metrics(tmp_path / "one")[1:], _weights(tmp_path / "one")
    assert _max_diff(w1, _weights(sft_ckpt)) > 1e-4  # the weights did move
    assert len(_samples(tmp_path / "one")) == 3 * 12
    for name in ("fsdp", "replicate"):
        two = read_metrics(tmp_path / name)[1:]
        assert [r["step"] for r in two] == [1, 2, 3] and one[0].keys() == two[0].keys()  # the same metrics
        assert _samples(tmp_path / name) == _samples(tmp_path / "one")  # the same token ids, every step
        for a, b in zip(one, two):
            assert a["reward/mean"] == b["reward/mean"] and a["train/tokens"] == b["train/tokens"]
            for k in ("loss", "grad/norm", "kl/ref", "mismatch/logprob_abs", "entropy"):
                assert b[k] == pytest.approx(a[k], abs=1e-5), (name, k)
        assert _max_diff(w1, _weights(tmp_path / name)) <= 1e-5, name


@pytest.mark.slow
def test_sft_and_dpo_are_data_parallel_over_two_ranks(sft_ckpt, tmp_path):
    pt = sft_ckpt.parent / "pt"
    sft = [f"init={pt}", "steps=3", "batch_size=7", "num_problems=200", "eval_problems=10", "device=cpu", *TINY_TASK]
    dpo = [f"init={sft_ckpt}", "steps=2", "batch_size=5", "pair_prompts=60", "samples_per_prompt=4"]
    dpo += ["eval_problems=4", "eval_samples=2", "device=cpu", *TINY_TASK]
    for stage, keys in (("sft", sft), ("dpo", dpo)):
        _run(stage, tmp_path / f"{stage}1", [*keys, "threads=1"])
        _run(stage, tmp_path / f"{stage}2", [*keys, "threads=1"], ranks=2)
        a, b = read_metrics(tmp_path / f"{stage}1"), read_metrics(tmp_path / f"{stage}2")
        assert [m["step"] for m in a] == [m["step"] for m in b]
        for x, y in zip(a, b):
            for k in ("loss", "grad/norm"):
                if k in x:
                    assert y[k] == pytest.approx(x[k], abs=1e-5), (stage, k)
        assert _max_diff(_weights(tmp_path / f"{stage}1"), _weights(tmp_path / f"{stage}2")) <= 1e-5, stage


@pytest.mark.slow
def test_each_rank_keeps_its_tensors_on_its_own_device(sft_ckpt, tmp_path):
    """2 ranks on fakegpu:0 and fakegpu:1 (an op meeting two devices is refused, as CUDA refuses it)
    give the numbers of 2 ranks on the CPU: no tensor crossed to the other rank's device."""
    keys = [f"init={sft_ckpt}", *COMMON, "scale.trainer_shard=replicate", "eval_every=0", "eval.save_samples=0"]
    _run("rl", tmp_path / "cpu", keys, ranks=2)
    _run("rl", tmp_path / "fake", [*keys, "device=fakegpu"], ranks=2, fake=True)
    cpu, fake = read_metrics(tmp_path / "cpu"), read_metrics(tmp_path / "fake")
    for a, b in zip(cpu[1:], fake[1:]):
        for k in ("reward/mean", "loss", "grad/norm", "kl/ref", "train/tokens"):
            assert b[k] == pytest.approx(a[k], abs=1e-6), k
    assert _max_diff(_weights(tmp_path / "cpu"), _weights(tmp_path / "fake")) <= 1e-6


def test_a_tensor_on_another_ranks_device_is_refused_as_cuda_refuses_it():
    from fakegpu import install

    install(devices=2)
    model = torch.nn.Linear(3, 2).to("fakegpu:0")  # rank 0's policy
    with pytest.raises(RuntimeError, match="two devices, fakegpu:0 and fakegpu:1"):
        model(torch.ones(1, 3, device="fakegpu:1"))  # a batch on rank 1's card
    assert model(torch.ones(1, 3, device="fakegpu:0")).device == torch.device("fakegpu", 0)


def _rank_pids(proc) -> dict[int, int]:
    """{RANK: pid} of torchrun's worker processes."""
    out = {}
    for child in subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True, text=True
    ).stdout.split():
        env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        rank = [e for e in env if e.startswith(b"RANK=")]
        if rank:
            out[int(rank[0][5:])] = int(child)
    return out


@pytest.mark.slow
def test_a_killed_rank_stops_every_rank_and_resume_reaches_the_uninterrupted_run(sft_ckpt, tmp_path):
    keys = [f"init={sft_ckpt}", *COMMON, "steps=4", "save_every=2", "eval_every=0", "eval.save_samples=0"]
    proc = _run("rl", tmp_path / "cut", keys, ranks=2, wait=False)
    deadline = time.time() + 600
    while not (tmp_path / "cut" / "checkpoints" / "step_000002").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.2)
    os.kill(_rank_pids(proc)[1], signal.SIGKILL)  # rank 1 dies mid-run, after the step-2 checkpoint
    log = proc.communicate(timeout=120)[0]  # every rank stops: no hang
    assert proc.returncode != 0 and "exitcode  : -9" in log, log[-3000:]
    assert not (tmp_path / "cut" / "checkpoints" / "step_000004").exists()
    _run("rl", tmp_path / "cut", keys, ranks=2, resume=True)
    _run("rl", tmp_path / "whole", keys, ranks=2)
    cut, whole = read_metrics(tmp_path / "cut"), read_metrics(tmp_path / "whole")
    assert [m["step"] for m in cut if m["step"] > 2] == [3, 4]
    for a, b in zip([m for m in whole if m["step"] > 2], [m for m in cut if m["step"] > 2][-2:]):
        for k in ("reward/mean", "loss", "grad/norm", "kl/ref"):
            assert b[k] == pytest.approx(a[k], abs=1e-6), k
    assert _max_diff(_weights(tmp_path / "cut"), _weights(tmp_path / "whole")) <= 1e-6


@pytest.mark.slow
def test_under_bf16_the_sampler_copy_is_bf16_and_a_checkpoint_keeps_the_fp32_master_weights(sft_ckpt, tmp_path):
    """FSDP under bf16 autocast: each rank's plain copy (its sampler's) holds bf16 weights; a checkpoint
    still writes the fp32 master weights gathered from the shards, so a resume continues exactly."""
    import shutil

    from posttrain import checkpoint

    keys = [f"init={sft_ckpt}", *COMMON, "steps=4", "save_every=2", "eval_every=0", "eval.save_samples=0"]
    keys.append("dtype=bfloat16")
    _run("rl", tmp_path / "whole", keys, ranks=2)
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    shutil.rmtree(tmp_path / "cut" / "checkpoints" / "step_000004")  # as if it had stopped after step 2
    _run("rl", tmp_path / "cut", keys, ranks=2, resume=True)
    whole, cut = _weights(tmp_path / "whole"), _weights(tmp_path / "cut")
    assert {str(v.dtype) for v in whole.values()} == {"torch.float32"}
    assert _max_diff(whole, cut) == 0.0
    step2 = checkpoint.step_dirs(tmp_path / "whole")[0]
    from safetensors.torch import load_file

    moved = _max_diff(whole, load_file(step2 / "model.safetensors"))
    assert moved > 1e-5 and any(w.float().ne(w.bfloat16().float()).any() for w in whole.values())  # not bf16 values


def test_scale_gpus_names_the_rank_that_died_in_one_line():
    from posttrain.distributed.launch import dead_rank

    summary = (
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-28_10:32:09\n  host      : localhost\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 23052)\n"
    )
    assert dead_rank(summary, 2) == (
        "rank 1 of 2 was killed by signal 9; every other rank was stopped; --resume RUN_DIR continues from its "
        "last checkpoint"
    )
    assert dead_rank(summary.replace("-9 (pid", "2 (pid"), 2) is None  # a usage error said its own line


def test_a_rank_takes_whole_groups_in_order():
    """Blocks differ by at most one group, lower ranks first: concatenated they are the 1-rank order."""
    assert [list(World(r, 2).span(3)) for r in range(2)] == [[0], [1, 2]]
    assert [list(World(r, 4).span(10)) for r in range(4)] == [[0, 1], [2, 3, 4], [5, 6], [7, 8, 9]]
    assert list(World().span(5)) == [0, 1, 2, 3, 4]


def test_whitening_over_two_ranks_equals_the_whole_batch():
    """core.masked_whiten under `across(ranks)`: each rank's rows, the statistics of every rank's."""
    from posttrain.algorithms import core

    g = torch.Generator().manual_seed(0)
    x, mask = torch.randn(6, 5, generator=g), (torch.rand(6, 5, generator=g) > 0.3).float()
    halves = [(x[:4], mask[:4]), (x[4:], mask[4:])]
    vals = [h.double()[m != 0] for h, m in halves]

    class Ranks:  # the sums two ranks would exchange, for one of them
        size = 2

        def __init__(self):
            self.calls = 0

        def sum(self, values):
            self.calls += 1
            if self.calls == 1:  # count and Σx
                return [sum(v.numel() for v in vals), sum(float(v.sum()) for v in vals)]
            mean = sum(float(v.sum()) for v in vals) / sum(v.numel() for v in vals)
            return [sum(float((v - mean).pow(2).sum()) for v in vals)]  # Σ(x − mean)²

        def max(self, values):
            return [max(float(v.max()) for v in vals), -min(float(v.min()) for v in vals)]

    parts = []
    for h, m in halves:
        with core.across(Ranks()):
            parts.append(core.masked_whiten(h, m))
    assert torch.allclose(torch.cat(parts), core.masked_whiten(x, mask), atol=1e-6)


@pytest.mark.parametrize(
    "env, keys, match",
    [
        ({}, ["scale.trainer_ranks=2"], "scale.gpus=2"),
        ({"RANK": "0", "WORLD_SIZE": "4"}, ["rollout.prompts_per_step=2"], "prompts_per_step >= 4"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, ["algo.name=ppo"], "trainer_shard=replicate"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, ["scale.async=true"], "in-process and synchronously"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, ["scale.gpus=4"], "scale.gpus=4 under torchrun with 2 ranks"),
    ],
)
def test_what_several_ranks_cannot_honour_is_one_line_before_any_work(tmp_path, monkeypatch, env, keys, match):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(UsageError, match=match):
        rl.run(load_config(RLConfig, None, [f"out={tmp_path}/x", "init=nowhere", *keys]))


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
        dist.barrier()  # no rank closes its gloo pairs while another still talks over them
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
    return grads, params, metrics, full_state(trainer.state_dict()) if dp is not None else trainer.state_dict()


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
