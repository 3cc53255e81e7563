"""GRPO: advantages against the worked values (docs/algorithms.md §21, SEED_SPEC Part C), the loss
against hand-computed values, and its invariances (mask, micro-batches, on-policy ratio 1)."""

import dataclasses
import math

import pytest
import torch

from posttrain import UsageError, algorithms
from posttrain.algorithms import core, grpo
from posttrain.framework.batch import RolloutBatch

from zoo_util import assert_masked_positions_inert

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def adv(rewards, groups=None, **cfg):
    r = t(rewards)
    gi = torch.zeros(len(rewards), dtype=torch.long) if groups is None else torch.tensor(groups)
    return grpo.advantages(r, gi, grpo.Config(**cfg)).tolist()


# ----------------------------------------------------------------------------- advantages


def test_advantages_worked_example_unbiased():
    # §15.3: r = [1, 0, 0, 0], μ = 0.25, unbiased σ = 0.5
    assert adv([1, 0, 0, 0]) == pytest.approx([1.499997, -0.499999, -0.499999, -0.499999], abs=1e-6)
    assert adv([1, 0, 0, 0], adv_eps=1e-4) == pytest.approx([1.4997, -0.4999, -0.4999, -0.4999], abs=1e-4)
    assert adv([1, 0, 0, 0], scale_by_std=False) == pytest.approx([0.75, -0.25, -0.25, -0.25])  # Dr. GRPO
    # r = [1, 1, 0, 1]: [0.5, 0.5, −1.5, 0.5]·(1 − 2e-6)
    assert adv([1, 1, 0, 1]) == pytest.approx([x * (1 - 2e-6) for x in [0.5, 0.5, -1.5, 0.5]], abs=1e-9)


def test_advantages_row10_three_rollouts_population():
    # SEED_SPEC row 10: r = (0, 0, 1), population std → GRPO (−.71, −.71, +1.41)
    a = adv([0, 0, 1], std="population")
    assert a == pytest.approx([-0.707106, -0.707106, 1.414212], abs=1e-5)
    assert [round(x, 2) for x in a] == [-0.71, -0.71, 1.41]
    assert adv([0, 0, 1], std="population", scale_by_std=False) == pytest.approx([-1 / 3, -1 / 3, 2 / 3])


def test_advantages_row15_controller_widget():
    # SEED_SPEC row 15: r = [1, 0, 0] → A = (+1.41, −.71, −.71); batch shape (3, 12)
    a = grpo.advantages(t([1.0, 0.0, 0.0]), torch.zeros(3, dtype=torch.long), grpo.Config(std="population"))
    assert [round(x, 2) for x in a.tolist()] == [1.41, -0.71, -0.71]
    mask = torch.zeros(3, 12, dtype=F64)
    mask[:, 5:] = 1
    tok = core.broadcast(a, mask)
    assert tok.shape == (3, 12)
    assert tok[0, 5:].tolist() == pytest.approx([1.414212] * 7, abs=1e-5) and tok[:, :5].abs().sum() == 0


def test_advantages_row23_outlier_group():
    # SEED_SPEC row 23: [1, 0, 0, 0], population → (+1.73, −.58, −.58, −.58)
    a = adv([1, 0, 0, 0], std="population")
    assert a == pytest.approx([1.732047, -0.577349, -0.577349, -0.577349], abs=1e-6)
    assert [round(x, 2) for x in a] == [1.73, -0.58, -0.58, -0.58]


def test_advantages_row24_std_convention():
    # SEED_SPEC row 24: [1, 0, 1, 0]: population → ±1.00, torch's unbiased → ±0.866
    assert adv([1, 0, 1, 0], std="population") == pytest.approx([0.999998, -0.999998] * 2, abs=1e-6)
    assert adv([1, 0, 1, 0], std="unbiased") == pytest.approx([0.866024, -0.866024] * 2, abs=1e-6)
    assert adv([1, 0, 1, 0]) == adv([1, 0, 1, 0], std="unbiased")  # the default


def test_advantages_row32_two_prompts_in_one_batch():
    # SEED_SPEC row 32: X = [1, 0, 1, 0] → mean .5, std .5, A ±1; Y = [1, 1, 1, 0] → mean .75,
    # std .433, A (.58, .58, .58, −1.73). Interleaved in one batch.
    r = [1, 1, 0, 1, 1, 1, 0, 0]
    g = [0, 1, 0, 1, 0, 1, 0, 1]
    a = adv(r, g, std="population")
    x, y = a[0::2], a[1::2]
    assert x == pytest.approx([1, -1, 1, -1], abs=1e-5)
    assert y == pytest.approx([0.57735, 0.57735, 0.57735, -1.732051], abs=1e-5)
    assert [round(v, 2) for v in y] == [0.58, 0.58, 0.58, -1.73]


@pytest.mark.parametrize("std", ["unbiased", "population"])
@pytest.mark.parametrize("adv_eps", [1e-6, 0.0])
def test_degenerate_groups_give_exactly_zero(std, adv_eps):
    rewards = [0.1, 0.1, 0.1, 1.0, 1.0, 0.0, 0.0, 0.3, 1.0, 0.0]
    groups = [0, 0, 0, 1, 1, 2, 2, 3, 4, 4]  # 0: all 0.1, 1: all 1, 2: all 0, 3: singleton
    a = adv(rewards, groups, std=std, adv_eps=adv_eps)
    assert a[:8] == [0.0] * 8  # exactly, not approximately
    assert all(math.isfinite(v) for v in a)
    assert a[8] > 0 > a[9]  # the live group is unaffected
    assert adv([0.1] * 4, std=std, adv_eps=adv_eps, scale_by_std=False) == [0.0] * 4


# ----------------------------------------------------------------------------- loss


def _batch(logp, old, adv_tok, mask, ref=None):
    return RolloutBatch(loss_mask=mask, old_logprobs=old, advantages=adv_tok, ref_logprobs=ref)


def test_loss_with_k3_hand_computed():
    # ratio 1; row 0: A = +1 on 2 tokens, row 1: A = −1 on 1 token; β = 0.04
    # k3: row0 tok0 π_θ .3 vs π_ref .5 → 0.155841; row0 tok1 equal → 0; row1 tok0 π_θ .5 vs .3 → 0.110826
    lp = t([[math.log(0.3), -1.0, 0.0], [math.log(0.5), 0.0, 0.0]])
    ref = t([[math.log(0.5), -1.0, 0.0], [math.log(0.3), 0.0, 0.0]])
    mask = t([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    A = core.broadcast(t([1.0, -1.0]), mask)
    cfg = grpo.Config()
    norm = core.batch_norm(mask, 3)
    loss, m = grpo.loss(lp, _batch(lp, lp.clone(), A, mask, ref), cfg, norm)
    # row 0: (−1 + .04·.155841 − 1)/2 = −0.996883; row 1: 1 + .04·.110826 = 1.004433; mean 0.003775
    assert loss.item() == pytest.approx(0.0037749229, abs=1e-9)
    assert m["kl/ref"].item() == pytest.approx((0.155841 + 0.110826) / 3, abs=1e-6)
    assert m["loss/policy"].item() == pytest.approx(0.0)  # (−1 + 1)/2
    assert m["ratio/mean"].item() == 1.0 and m["ratio/max"].item() == 1.0
    assert m["clip/frac"].item() == 0.0
    assert "entropy" not in m
    # the same batch with A as [B]: broadcast inside the loss
    loss_b, _ = grpo.loss(lp, _batch(lp, lp.clone(), t([1.0, -1.0]), mask, ref), cfg, norm)
    assert loss_b.item() == pytest.approx(loss.item(), abs=1e-12)


def test_loss_entropy_bonus_and_clip_frac():
    lp = t([[math.log(1.5), 0.0], [0.0, 0.0]])
    mask = t([[1.0, 1.0], [1.0, 0.0]])
    A = t([[1.0, 1.0], [0.0, 0.0]])
    ent = t([[1.0, 2.0], [3.0, 100.0]])
    cfg = grpo.Config(kl_coef=0.0, entropy_coef=0.1, aggregation="token-mean")
    loss, m = grpo.loss(lp, _batch(lp, torch.zeros_like(lp), A, mask), cfg, core.batch_norm(mask), entropy=ent)
    # per token: [−1.2 − .1, −1 − .2], [0 − .3]; token-mean = −2.8/3
    assert loss.item() == pytest.approx(-2.8 / 3)
    assert m["entropy"].item() == pytest.approx(2.0)
    assert m["clip/frac"].item() == pytest.approx(1 / 3)  # ratio 1.5 with A > 0
    assert m["ratio/max"].item() == pytest.approx(1.5)
    assert m["loss/policy"].item() == pytest.approx(-2.2 / 3)
    assert "kl/ref" not in m
    with pytest.raises(UsageError, match="entropy"):
        grpo.loss(lp, _batch(lp, torch.zeros_like(lp), A, mask), cfg, core.batch_norm(mask))


def test_kl_needs_reference():
    assert grpo.needs_reference(grpo.Config()) is True
    assert grpo.needs_reference(grpo.Config(kl_coef=0.0)) is False
    lp = torch.zeros(1, 2, dtype=F64)
    mask = torch.ones(1, 2, dtype=F64)
    with pytest.raises(UsageError, match="ref_logprobs"):
        grpo.loss(lp, _batch(lp, lp, lp, mask), grpo.Config(), core.batch_norm(mask))


def _random_batch(seed, B=6, T=7):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, T, generator=g) < 0.7).to(F64)
    mask[:, 0] = 0.0  # prompt position
    mask[2] = 0.0  # a fully masked row
    old = -torch.rand(B, T, dtype=F64, generator=g) * 3 * mask
    lp = (old + 0.3 * torch.randn(B, T, dtype=F64, generator=g)) * mask
    ref = (old + 0.2 * torch.randn(B, T, dtype=F64, generator=g)) * mask
    A = core.broadcast(torch.randn(B, dtype=F64, generator=g), mask)
    ent = torch.rand(B, T, dtype=F64, generator=g) * 2 * mask
    return lp, old, ref, A, ent, mask


@pytest.mark.parametrize("aggregation", core.AGGREGATIONS)
def test_masked_positions_change_nothing(aggregation):
    lp, old, ref, A, ent, mask = _random_batch(0)
    cfg = grpo.Config(aggregation=aggregation, entropy_coef=0.01, dual_clip=3.0)
    norm = core.batch_norm(mask, 16)

    def run(lp, old, ref, A, ent):
        lp = lp.clone().requires_grad_(True)
        loss, m = grpo.loss(lp, _batch(lp, old, A, mask, ref), cfg, norm, entropy=ent)
        (g,) = torch.autograd.grad(loss, lp)
        return loss, {k: float(v) for k, v in m.items()}, g

    assert_masked_positions_inert(run, lp, old, ref, A, ent, mask)


@pytest.mark.parametrize("aggregation", core.AGGREGATIONS)
def test_loss_micro_batches_sum_to_the_full_batch(aggregation):
    lp, old, ref, A, ent, mask = _random_batch(1, B=8)
    cfg = grpo.Config(aggregation=aggregation, entropy_coef=0.01)
    norm = core.batch_norm(mask, 16)
    lp = lp.requires_grad_(True)
    full, m_full = grpo.loss(lp, _batch(lp, old, A, mask, ref), cfg, norm, entropy=ent)
    (g_full,) = torch.autograd.grad(full, lp)
    total, policy = 0.0, 0.0
    for s in (slice(0, 3), slice(3, 4), slice(4, 8)):
        loss, m = grpo.loss(lp[s], _batch(None, old[s], A[s], mask[s], ref[s]), cfg, norm, entropy=ent[s])
        total = total + loss
        policy += float(mask[s].sum()) / norm["tokens"] * float(m["loss/policy"])  # trainer's weighting
    (g_parts,) = torch.autograd.grad(total, lp)
    assert total.item() == pytest.approx(full.item(), rel=1e-12)
    assert torch.allclose(g_parts, g_full, rtol=1e-10, atol=1e-15)
    assert policy == pytest.approx(float(m_full["loss/policy"]), rel=1e-12)


@pytest.mark.parametrize("aggregation", core.AGGREGATIONS)
def test_on_policy_gradient_is_reinforce(aggregation):
    # ratio 1 (logprobs == old_logprobs): ∇ loss = ∇ Agg(−A · log π)  (docs/algorithms.md §7)
    _, old, _, A, _, mask = _random_batch(2)
    cfg = grpo.Config(aggregation=aggregation, kl_coef=0.0)
    norm = core.batch_norm(mask, 16)
    lp = old.clone().requires_grad_(True)
    loss, m = grpo.loss(lp, _batch(lp, old, A, mask), cfg, norm)
    (g,) = torch.autograd.grad(loss, lp)
    lp2 = old.clone().requires_grad_(True)
    (g_ref,) = torch.autograd.grad(core.aggregate(-A * lp2, mask, aggregation, norm), lp2)
    assert torch.allclose(g, g_ref, rtol=1e-12, atol=1e-15)
    assert m["ratio/mean"].item() == 1.0 and m["clip/frac"].item() == 0.0
    if aggregation == "seq-mean-token-mean":  # by hand: −A_i m_it / (|y_i| · N)
        lengths = mask.sum(-1, keepdim=True).clamp_min(1)
        assert torch.allclose(g, -A * mask / lengths / norm["seqs"], rtol=1e-12, atol=1e-15)


# ----------------------------------------------------------------------------- config and registry


def test_config_defaults_and_validation():
    cfg = grpo.Config()
    assert (cfg.eps_low, cfg.eps_high, cfg.kl_coef, cfg.kl_estimator) == (0.2, 0.2, 0.04, "k3")
    assert (cfg.std, cfg.scale_by_std, cfg.adv_eps) == ("unbiased", True, 1e-6)
    assert (cfg.aggregation, cfg.entropy_coef, cfg.dual_clip) == ("seq-mean-token-mean", 0.0, None)
    for bad in (
        {"aggregation": "token_mean"},
        {"kl_estimator": "k4"},
        {"std": "sample"},
        {"dual_clip": 1.0},
        {"eps_low": -0.1},
        {"kl_coef": -1.0},
    ):
        with pytest.raises(UsageError):
            grpo.Config(**bad)
    with pytest.raises(UsageError):  # dataclasses.replace re-validates
        dataclasses.replace(cfg, aggregation="mean")


def test_registry():
    assert algorithms.get("grpo") is grpo
    assert algorithms.ALGORITHMS["grpo"] is grpo
    with pytest.raises(UsageError, match=r"did you mean 'grpo'.*valid: .*grpo"):
        algorithms.get("gpro")
    with pytest.raises(UsageError, match="valid"):
        algorithms.get("zzzzzz")
