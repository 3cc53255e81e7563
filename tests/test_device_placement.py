"""Every stage on a second device: no tensor left on the CPU while the model sits elsewhere.

The H100 run of issue 31 crashed in DPO's reference scoring, pairs on the CPU against a model
on cuda:0; on a CPU-only machine every tensor is on the CPU and nothing could see it.
tests/fakegpu.py gives CI a second device with CUDA's rule (an op refuses a CPU tensor next to
a device tensor, 0-dim scalars aside) whose kernels are the CPU's: each stage below runs on it
and must finish with the CPU run's numbers, bit for bit (the device boundary moves tensors,
it never changes a value).
"""

import json

import pytest
import torch

from posttrain.config import load_config
from posttrain.logging import read_metrics
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from posttrain.tasks.base import RewardResult

from fakegpu import FakeGPUTensor, install
from test_recipes import _pairs_file

TINY = ["task.max_terms=3", "threads=1", "tensorboard=false"]


@pytest.fixture(scope="module")
def fake():
    return install()


def _numbers(run_dir) -> list[dict]:
    """metrics.jsonl without the clocks and the memory gauges (the only values a device may change)."""
    return [
        {
            k: v
            for k, v in m.items()
            if not k.startswith(("time/", "rollout/", "train/tokens_per_s", "throughput", "memory/"))
        }
        for m in read_metrics(run_dir)
    ]


def _pairs(path):
    return _pairs_file(path, 16)  # verifier-style pairs: the rejected answer is one off


def _on_both(tmp_path, run, args) -> tuple[list, list]:
    """Run a stage on the CPU and on fakegpu; their metrics without clocks."""
    out = {}
    for device in ("cpu", "fakegpu"):
        run([f"out={tmp_path}/{device}", f"device={device}", *args])
        out[device] = _numbers(tmp_path / device)
    return out["cpu"], out["fakegpu"]


# ---------------------------------------------------------------------- the device itself


def test_fakegpu_refuses_a_cpu_tensor_next_to_a_device_tensor_as_cuda_does(fake):
    w = torch.nn.Embedding(5, 3).to(fake)
    ids = torch.tensor([[1, 4]])
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        w(ids)
    out = w(ids.to(fake))  # [1, 2, 3]
    assert isinstance(out, FakeGPUTensor) and out.device == fake
    assert torch.equal(out.cpu(), w.weight.cpu()[[1, 4]][None])  # the CPU's values
    x = torch.ones(2, 3, device=fake)
    assert (x * torch.tensor(2.0)).sum().item() == 12.0  # a 0-dim CPU tensor is a scalar: allowed
    with pytest.raises(RuntimeError, match="same device"):
        x + torch.ones(2, 3)
    assert x[torch.tensor([1])].shape == (1, 3)  # CPU indices are allowed (CUDA moves them)
    with pytest.raises(TypeError, match="numpy"):
        x.numpy()
    loss = w(ids.to(fake)).square().sum()
    loss.backward()  # autograd runs on it
    assert w.weight.grad.device == fake and float(w.weight.grad.cpu().abs().sum()) > 0


# ---------------------------------------------------------------------- the stages


def _stage(module_name: str, config_class: str):
    import importlib

    module = importlib.import_module(f"posttrain.recipes.{module_name}")
    cls = getattr(module, config_class, None) or getattr(importlib.import_module("posttrain.config"), config_class)
    return lambda args, **kw: module.run(load_config(cls, None, args), **kw)


@pytest.mark.slow
def test_pretrain_and_sft(fake, sft_ckpt, tmp_path):
    pre = ["steps=2", "batch_size=4", "seq_len=32", "corpus_chars=4000", "eval_every=1", *TINY]
    cpu, dev = _on_both(tmp_path / "pt", _stage("pretrain", "PretrainConfig"), pre)
    assert cpu == dev and "eval/val_loss" in dev[-1]
    sft = [f"init={sft_ckpt.parent / 'pt'}", "steps=2", "batch_size=4", "num_problems=40", "eval_problems=4", *TINY]
    cpu, dev = _on_both(tmp_path / "sft", _stage("sft", "SFTConfig"), sft)
    assert cpu == dev and "loss" in dev[-1]


LOSSES = [
    "dpo",
    *(
        pytest.param(x, marks=pytest.mark.slow)
        for x in ["cdpo", "robust", "hinge", "ipo", "simpo", "orpo", "kto", "dpo_nll"]
    ),
]


@pytest.mark.parametrize("loss_type", LOSSES)
def test_dpo_every_loss(fake, sft_ckpt, tmp_path, loss_type):
    args = [
        f"init={sft_ckpt}",
        f"pairs={_pairs(tmp_path / 'pairs.jsonl')}",
        f"loss_type={loss_type}",
        "batch_size=4",
        "steps=2",
        "optim.micro_batch_tokens=40",
        f"eval_problems={2 if loss_type == 'dpo' else 0}",
        "eval_samples=2",
        *TINY,
    ]
    cpu, dev = _on_both(tmp_path, _stage("dpo", "DPOConfig"), args)
    assert cpu == dev and "pref/margin" in dev[-1]


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["bt", "orm"])
def test_reward_model(fake, sft_ckpt, tmp_path, objective):
    pairs = _pairs(tmp_path / "pairs.jsonl")
    args = [
        f"init={sft_ckpt}",
        f"pairs={pairs}",
        f"eval_pairs={pairs}",
        f"objective={objective}",
        "steps=2",
        "eval_every=1",
        "batch_size=4",
        *TINY,
    ]
    cpu, dev = _on_both(tmp_path, _stage("rm", "RMConfig"), args)
    assert cpu == dev and "loss" in dev[-1]


RL = ["prompts_per_step=2", "samples_per_prompt=2", "eval_problems=2", "eval_samples=2", "steps=2", *TINY]
ALGORITHMS = [
    "reinforce",
    "ppo",
    "grpo",
    "rloo",
    "dapo",
    "dr_grpo",
    "gspo",
    "cispo",
    "reinforce_pp",
    "maxrl",
    "mgpo",
    "dppo",
]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_rl_every_algorithm(fake, sft_ckpt, tmp_path, algorithm):
    cpu, dev = _on_both(tmp_path, _stage("rl", "RLConfig"), [f"init={sft_ckpt}", f"algorithm={algorithm}", *RL])
    assert cpu == dev and "reward/mean" in dev[-1], _diff(cpu, dev)


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [
        ["algo.critic=separate", "algorithm=ppo", "epochs=2", "minibatches=2"],
        ["weight_sync=separate"],
        ["async=true", "max_staleness=1"],
        ["algo.kl_coef=0.1", "rollout.precision=bf16"],
    ],
    ids=["ppo-separate-critic", "separate-sync", "async", "kl-bf16-sampler"],
)
def test_rl_placements(fake, sft_ckpt, tmp_path, extra):
    cpu, dev = _on_both(tmp_path, _stage("rl", "RLConfig"), [f"init={sft_ckpt}", *extra, *RL])
    assert cpu == dev and "reward/mean" in dev[-1], _diff(cpu, dev)


@pytest.mark.slow
def test_rl_lora_on_a_hf_model(fake, tmp_path):
    pytest.importorskip("peft")
    from posttrain.models.hf import write_tiny

    hf = write_tiny(tmp_path / "llama", "llama", seed=1)
    args = [f"init={hf}", "lora.r=4", "weight_sync=separate", "max_new_tokens=8", "task.max_value=9", *RL]
    cpu, dev = _on_both(tmp_path, _stage("rl", "RLConfig"), args)
    assert cpu == dev and "reward/mean" in dev[-1], _diff(cpu, dev)


@pytest.mark.slow
def test_distill(fake, sft_ckpt, tmp_path):
    args = [
        f"init={sft_ckpt.parent / 'pt'}",
        f"teacher={sft_ckpt}",
        "prompts_per_step=2",
        "samples_per_prompt=2",
        "eval_problems=2",
        "eval_samples=2",
        "steps=2",
        *TINY,
    ]
    cpu, dev = _on_both(tmp_path, _stage("distill", "DistillConfig"), args)
    assert cpu == dev and "distill/reverse_kl" in dev[-1]


def _diff(a: list[dict], b: list[dict]) -> dict:
    return {
        (i, k): (x.get(k), y.get(k))
        for i, (x, y) in enumerate(zip(a, b))
        for k in x.keys() | y.keys()
        if x.get(k) != y.get(k)
    }


class Lenient(ArithmeticTask):
    """Every response verified: the nearly untrained test model then has samples for data=rejection."""

    def reward(self, item, response):
        return RewardResult(1.0, {"correct": 1.0})


@pytest.mark.slow
def test_sft_on_rejection_samples(fake, sft_ckpt, tmp_path):
    args = [
        f"init={sft_ckpt}",
        "data=rejection",
        "rejection_prompts=8",
        "rejection_samples=2",
        "steps=2",
        "batch_size=4",
        "num_problems=40",
        "eval_problems=2",
        *TINY,
    ]
    cpu, dev = _on_both(
        tmp_path, lambda a: _stage("sft", "SFTConfig")(a, task=Lenient(ArithmeticConfig(max_terms=3))), args
    )
    assert cpu == dev and "loss" in dev[-1]
    assert (tmp_path / "fakegpu" / "rejection_stats.json").read_text() == (
        tmp_path / "cpu" / "rejection_stats.json"
    ).read_text()


@pytest.mark.slow
def test_eval_command(fake, sft_ckpt, tmp_path):
    from posttrain.cli import main

    out = {}
    for device in ("cpu", "fakegpu"):
        path = tmp_path / f"{device}.json"
        assert (
            main(["eval", str(sft_ckpt), "--device", device, "--problems", "4", "--k", "1,2", "--out", str(path)]) == 0
        )
        out[device] = json.loads(path.read_text())
    assert out["cpu"] == out["fakegpu"] and "pass@1" in json.dumps(out["cpu"])


@pytest.mark.slow
def test_serve_engine(fake, sft_ckpt):
    from posttrain.serve.batcher import Batcher, Params
    from posttrain.serve.server import load_engine

    got = {}
    for device in ("cpu", "fakegpu"):
        engine, tok = load_engine(str(sft_ckpt), device, threads=1)
        batcher = Batcher(engine, seed=0)
        try:
            s = batcher.submit(tok.encode(tok.chat_prompt("2+3")), Params(max_new_tokens=12, seed=1)).result(
                timeout=60
            )[0]
        finally:
            batcher.close()
        got[device] = (s.response_ids, s.response_logprobs)
    assert got["cpu"] == got["fakegpu"] and len(got["cpu"][0]) > 0


@pytest.mark.slow
def test_pipeline(fake, tmp_path):
    from posttrain.recipes import pipeline

    pairs = _pairs(tmp_path / "pairs.jsonl")
    over = [
        "report=false",
        "eval_problems=2",
        "eval_samples=2",
        "task.max_terms=3",
        "threads=1",
        "pretrain.steps=2",
        "pretrain.batch_size=4",
        "pretrain.seq_len=32",
        "pretrain.corpus_chars=4000",
        "sft.steps=2",
        "sft.batch_size=4",
        "sft.num_problems=40",
        "sft.eval_problems=2",
        "dpo.steps=2",
        f"dpo.pairs={pairs}",
        "dpo.batch_size=4",
        "dpo.eval_problems=2",
        "dpo.eval_samples=2",
        "rl.steps=2",
        "rl.prompts_per_step=2",
        "rl.samples_per_prompt=2",
        "rl.eval_problems=2",
        "rl.eval_samples=2",
    ]
    rows = {}
    for device in ("cpu", "fakegpu"):
        cfg = load_config(pipeline.PipelineConfig, None, [f"out={tmp_path}/{device}", f"device={device}", *over])
        rows[device] = [{k: v for k, v in r.items() if k != "wall_s"} for r in pipeline.run(cfg)["rows"]]
    assert rows["cpu"] == rows["fakegpu"] and [r["stage"] for r in rows["cpu"]] == ["pretrain", "sft", "dpo", "rl"]
