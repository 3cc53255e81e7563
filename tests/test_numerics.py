"""Numerics the loss comparisons against TRL and verl do not reach: NaN at masked positions,
integer reward tensors, and KTO's reference point under gradient accumulation."""

import math

import pytest
import torch

from posttrain.algorithms import core, ppo
from posttrain.framework.batch import RolloutBatch

from zoo_util import ALL, F64, _batch, _random_batch, cfg_of


def _nan_off_mask(x, mask):
    return torch.where(mask == 0, torch.full_like(x, float("nan")), x)


@pytest.mark.parametrize("kl_estimator", core.KL_ESTIMATORS)
@pytest.mark.parametrize("name", sorted(ALL))
def test_nan_logprobs_at_masked_positions_leave_the_gradient_as_clean(name, kl_estimator):
    """NaN in the policy, behaviour and reference logprobs where loss_mask is 0 (padding, tool
    output): the loss, and the gradient at every position, equal the clean batch's."""
    mod = ALL[name]
    lp, old, ref, A, ent, mask = _random_batch(5)
    cfg = cfg_of(mod, kl_coef=0.05, kl_estimator=kl_estimator, entropy_coef=0.01)
    norm = core.batch_norm(mask, 16)

    def run(lp, old, ref):
        lp = lp.clone().requires_grad_(True)
        loss, _ = mod.loss(lp, _batch(old, A, mask, ref), cfg, norm, ent)
        (g,) = torch.autograd.grad(loss, lp)
        return loss.detach(), g

    clean, dirty = run(lp, old, ref), run(*(_nan_off_mask(x, mask) for x in (lp, old, ref)))
    assert torch.isfinite(dirty[1]).all()
    assert dirty[0].item() == clean[0].item() and torch.equal(dirty[1], clean[1])
    assert (clean[1][mask == 0] == 0).all() and clean[1].abs().sum() > 0


def test_nan_values_at_masked_positions_leave_the_value_gradient_as_clean():
    """PPO's value loss: NaN in V (with gradient), V_old and the returns off the mask."""
    lp, old, _, A, _, mask = _random_batch(6)
    g = torch.Generator().manual_seed(6)
    values, v_old, returns = (torch.randn(mask.shape, dtype=F64, generator=g) for _ in range(3))
    norm = core.batch_norm(mask, 16)
    cfg = ppo.Config(kl_coef=0.0)

    def run(v, v_old, returns):
        v = v.clone().requires_grad_(True)
        batch = _batch(old, A, mask, None, values=v_old, returns=returns, new_values=v)
        loss, _ = ppo.loss(lp.clone(), batch, cfg, norm)
        (gv,) = torch.autograd.grad(loss, v)
        return loss.detach(), gv

    clean, dirty = run(values, v_old, returns), run(*(_nan_off_mask(x, mask) for x in (values, v_old, returns)))
    assert torch.isfinite(dirty[1]).all()
    assert dirty[0].item() == clean[0].item() and torch.equal(dirty[1], clean[1])
    assert clean[1].abs().sum() > 0


# ---- integer rewards: the advantages of 0/1 ints are those of 0.0/1.0 floats ----------------------

INT_REWARD_ALGOS = ["grpo", "maxrl", "mgpo", "dapo", "dr_grpo", "rloo", "reinforce", "reinforce_pp"]


@pytest.mark.parametrize("name", INT_REWARD_ALGOS)
def test_integer_rewards_give_the_float_advantages(name):
    mod = ALL[name]
    rewards = torch.tensor([1, 0, 0, 1, 1, 0, 2, 0])  # int64, as a user's verifier returns them
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    mask = torch.ones(8, 3)
    batch = RolloutBatch(loss_mask=mask, old_logprobs=-mask, ref_logprobs=-mask)
    cfg = cfg_of(mod, **({"baseline": "mean"} if name == "reinforce" else {}))
    want = mod.advantages(rewards.float(), groups, cfg, batch=batch)
    got = mod.advantages(rewards, groups, cfg, batch=batch)
    assert got.is_floating_point() and torch.allclose(got, want, atol=1e-6)
    assert want.abs().sum() > 0


def test_group_of_one_third_is_not_truncated():
    """The worked case: one of three right gives GRPO A = (1 − 1/3)/σ, not (1 − 0)/σ."""
    from posttrain.algorithms import grpo

    a = grpo.advantages(torch.tensor([1, 0, 0]), torch.tensor([0, 0, 0]), grpo.Config(adv_eps=0.0))
    sd = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)  # unbiased std of (1, 0, 0)
    assert a.tolist() == pytest.approx([(2 / 3) / sd, -(1 / 3) / sd, -(1 / 3) / sd], rel=1e-6)


# ---- KTO: the reference point is the whole batch's ---------------------------------------------------


def test_kto_gradient_does_not_depend_on_the_micro_batch_size(sft_ckpt):
    from posttrain import checkpoint
    from posttrain.framework.batch import split_micro_batches
    from posttrain.framework.reference import score_logprobs
    from posttrain.preference.data import Pair, collate_pairs, encode_pairs
    from posttrain.recipes.dpo import DPOConfig, dpo_loss_fn, loss_config, with_kto_reference_point

    model, tok, _ = checkpoint.load_model(sft_ckpt)
    pairs = [
        Pair(f"{a}+{b}", str(a + b), str(a + b + 1)) for a, b in [(1, 2), (3, 4), (12, 30), (7, 7), (40, 2), (9, 9)]
    ]
    batch = collate_pairs(encode_pairs(tok, pairs), range(6), tok.pad_id)
    with torch.no_grad():
        sums = score_logprobs(model, batch).sum(-1)  # [12]
    batch["ref_logps"] = sums - torch.linspace(0.5, 4.0, 12)  # ρ > 0, unequal: z0 > 0 matters
    batch = with_kto_reference_point(model, batch)
    loss_fn = dpo_loss_fn(loss_config(DPOConfig(loss_type="kto", beta=0.5)))
    grads, parts = [], []
    for max_tokens in (10_000, 30):
        model.zero_grad()
        norm = core.batch_norm(batch["loss_mask"])
        micro = split_micro_batches(batch, max_tokens, unit=2)
        for mb in micro:
            loss_fn(model, mb, norm)[0].backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        parts.append(len(micro))
    assert parts[0] == 1 and parts[1] > 2
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7)
    assert float(batch["kto_z0"][0]) == pytest.approx(float(torch.linspace(0.5, 4.0, 12).mean()), rel=1e-5)
