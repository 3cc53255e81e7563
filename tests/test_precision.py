"""The emulated low-precision sampler (posttrain/precision.py) and its RL hook (rollout.precision)."""

import pytest
import torch
import torch.nn.functional as F

from posttrain import UsageError
from posttrain.framework.logprobs import sequence_logprobs
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.precision import LowPrecision, SamplerRuntime, round_to, sampler_runtime


def test_round_to_is_the_formats_round_to_nearest_even():
    x = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-9, 65520.0, 1 + 2**-11, 1 + 3 * 2**-11])
    # bf16 keeps 7 mantissa bits: 1 + 2^-8 is a tie → 1 (even); 1 + 3·2^-8 is a tie → 1 + 2^-6 (even)
    assert round_to(x[:3], torch.bfloat16).tolist() == [1.0, 1 + 2**-6, 1.0]
    # fp16 keeps 10: 65520 rounds past the largest finite (65504) to inf; ties to even as above
    assert round_to(x[3:], torch.float16).tolist() == [float("inf"), 1.0, 1 + 2**-9]
    assert round_to(x, None) is x and round_to(x, torch.bfloat16).dtype == torch.float32


def test_a_linear_layer_is_a_bf16_gemm_with_fp32_accumulation():
    torch.manual_seed(0)
    x, w, b = torch.randn(5, 64), torch.randn(16, 64), torch.randn(16)
    with LowPrecision("bf16"):
        y = F.linear(x, w, b)
        z = x @ w.T  # a bare matmul: inputs rounded, fp32 out
    bf = lambda t: t.bfloat16().float()
    assert torch.equal(y, bf(bf(x) @ bf(w).T + bf(b)))
    assert torch.equal(z, bf(x) @ bf(w).T)
    assert not torch.equal(y, F.linear(x, w, b))  # the mode really changed the result
    assert torch.equal(F.linear(x, w, b), x @ w.T + b)  # and is gone outside the block


def test_fp16_is_closer_to_fp32_than_bf16_on_the_same_tokens(nano, tok):
    ids = torch.randint(3, tok.vocab_size, (4, 24))
    with torch.no_grad():
        ref, _ = sequence_logprobs(nano, ids)
        errs = {}
        for fmt in ("bf16", "fp16"):
            with LowPrecision(fmt):
                lp, _ = sequence_logprobs(nano, ids)
            errs[fmt] = float((lp - ref)[:, 1:].abs().mean())
    assert 0 < errs["fp16"] < errs["bf16"] / 4  # 3 more mantissa bits: ~8× finer


def test_batch_invariant_matmuls_give_a_row_the_same_logits_in_any_batch(nano, tok):
    torch.manual_seed(1)
    ids = torch.randint(3, tok.vocab_size, (48, 20))
    with torch.no_grad(), LowPrecision("bf16", batch_invariant=True):
        alone = torch.cat([nano(ids[i : i + 1]) for i in (0, 17, 47)])
        batched = nano(ids)[[0, 17, 47]]
    assert torch.equal(alone, batched)


def test_sampler_runtime_leaves_fp32_alone_and_refuses_unknown_formats():
    base = object()
    assert sampler_runtime("fp32", base) is base and sampler_runtime("fp32") is None
    assert isinstance(sampler_runtime("bf16", None), SamplerRuntime)
    with pytest.raises(UsageError, match="bf8"):
        sampler_runtime("bf8")


def test_an_emulated_bf16_sampler_records_logprobs_the_fp32_trainer_does_not_reproduce(nano, tok):
    prompts = [tok.encode(tok.chat_prompt(p)) for p in ("3+4", "12+5+1", "7+7+7+7")]
    sp = SamplingParams(temperature=1.0, max_new_tokens=12)
    gaps = {}
    for fmt in ("fp32", "bf16"):
        samples = Engine(nano, tok, runtime=sampler_runtime(fmt)).generate(prompts, 2, sp, seed=0)
        d = []
        with torch.no_grad():
            for s in samples:
                lp, _ = sequence_logprobs(nano, torch.tensor([s.prompt_ids + s.response_ids]))
                d += (lp[0, len(s.prompt_ids) :] - torch.tensor(s.response_logprobs)).abs().tolist()
        gaps[fmt] = max(d)
    assert gaps["fp32"] < 1e-4 and 1e-4 < gaps["bf16"] < 0.5


def test_the_mismatch_is_the_sampler_s_gap_with_the_correction_on_or_off(nano, tok):
    """`mismatch/logprob_abs` (the trainer's policy loss) reads the sampler's logprobs against the
    trainer's on every backend: with the off-policy correction on, the sampler's are the batch's
    `behaviour_logprobs` (its old_logprobs are the trainer's own: the gap to them was 0, what a vLLM
    run logged every step, issue 43). The same number as without the correction, and as the
    correction's own measure of it (offpolicy/log_ratio_abs); an fp32 sampler's is float noise."""
    from posttrain import algorithms
    from posttrain.algorithms.core import batch_norm
    from posttrain.framework.batch import collate_samples, with_fields
    from posttrain.framework.off_policy import correct_off_policy
    from posttrain.framework.trainer import policy_loss_fn

    torch.set_num_threads(1)
    algo = algorithms.get("grpo")
    loss_fn = policy_loss_fn(algo, algo.Config(kl_coef=0.0), 1.0)
    prompts = [tok.encode(tok.chat_prompt(p)) for p in ("3+4", "12+5+1", "7+7+7+7")]
    gap = {}
    for fmt in ("fp32", "bf16"):
        samples = Engine(nano, tok, runtime=sampler_runtime(fmt)).generate(
            prompts, 2, SamplingParams(temperature=1.0, max_new_tokens=12), seed=0
        )
        batch = collate_samples(samples, tok.pad_id)
        batch = with_fields(batch, advantages=torch.linspace(-1, 1, len(samples))[:, None] * batch.loss_mask)
        corrected, off = correct_off_policy(nano, batch, "tis", 2.0, 1.0)
        assert torch.equal(corrected.behaviour_logprobs, batch.old_logprobs)
        norm = batch_norm(batch.loss_mask)
        with torch.no_grad():
            plain, on = (float(loss_fn(nano, b, norm)[1]["mismatch/logprob_abs"]) for b in (batch, corrected))
        assert on == plain and abs(on - off["offpolicy/log_ratio_abs"]) <= 1e-9
        gap[fmt] = on
    assert gap["fp32"] < 1e-6 and gap["bf16"] > 1e-4


@pytest.mark.slow
def test_rl_with_a_bf16_sampler_logs_the_mismatch_and_corrects_it(sft_ckpt, tmp_path):
    from posttrain.config import RLConfig, load_config
    from posttrain.logging import read_metrics
    from posttrain.recipes import rl

    common = [
        f"init={sft_ckpt}",
        "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=4",
        "eval.problems=2",
        "eval.samples=2",
        "steps=2",
        "task.max_terms=3",
        "device=cpu",  # an fp32 trainer against an emulated bf16 sampler: the fp32 side is the CPU's
    ]
    runs = {}
    for name, extra in (
        ("fp32", []),
        ("bf16", ["rollout.precision=bf16"]),
        ("tis", ["rollout.precision=bf16", "scale.off_policy_correction=tis"]),
    ):
        rl.run(load_config(RLConfig, None, [*common, f"out={tmp_path / name}", *extra]))
        runs[name] = read_metrics(tmp_path / name)[1:]
    assert all(m["mismatch/logprob_abs"] < 1e-5 for m in runs["fp32"])
    assert all(m["mismatch/logprob_abs"] > 1e-5 for m in runs["bf16"])
    # TIS scores the batch with the fp32 trainer first: the PPO ratio is then taken against it and the
    # precision gap moves into the IS weights; mismatch/logprob_abs still reads the sampler's gap, the
    # uncorrected run's number at step 1 (same samples, same weights)
    assert all(m["mismatch/logprob_abs"] > 1e-5 and m["offpolicy/log_ratio_abs"] > 1e-5 for m in runs["tis"])
    assert runs["tis"][0]["mismatch/logprob_abs"] == runs["bf16"][0]["mismatch/logprob_abs"]
    with pytest.raises(UsageError, match="in-process only"):
        rl.run(
            load_config(
                RLConfig, None, [*common, f"out={tmp_path / 'bad'}", "rollout.precision=bf16", "scale.async=true"]
            )
        )
