"""PPO's math: GAE and the clipped value loss against hand-computed values (docs/algorithms.md §21), the clip
table of SEED_SPEC row 20 and dual clip, the KL in the reward, whitening, micro-batch
additivity, the config. The critic on a nano GPTMini through the Trainer, and a tiny `rl.run`: test_ppo_critic.py."""

import dataclasses
import math

import pytest
import torch

from posttrain import UsageError, algorithms
from posttrain.algorithms import core, ppo, reinforce_pp
from posttrain.config import build
from posttrain.framework.batch import RolloutBatch

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def cfg(**kw):
    return ppo.Config(**{"kl_coef": 0.0, **kw})


def gae_batch(values, mask, **extra):
    return RolloutBatch(loss_mask=t(mask), values=t(values), **extra)


# ============================================================================= GAE


def test_gae_worked_example_15_3():
    # rewards [0, 0, 1] (R on the last token), V = [0.5, 0.6, 0.7], γ = 1, λ = 0.95; a prompt column first
    b = gae_batch([[9.0, 0.5, 0.6, 0.7, 9.0]], [[0, 1, 1, 1, 0]])
    a = ppo.advantages(t([1.0]), torch.zeros(1, dtype=torch.long), cfg(whiten_advantages=False), batch=b)
    returns = ppo.value_targets(t([1.0]), b, cfg(whiten_advantages=False))
    assert a[0].tolist() == pytest.approx([0, 0.46575, 0.385, 0.3, 0], abs=1e-12)
    assert returns[0].tolist() == pytest.approx([0, 0.96575, 0.985, 1.0, 0], abs=1e-12)
    b = gae_batch([[9.0, 0.5, 0.6, 0.7, 9.0]], [[0, 1, 1, 1, 0]])
    a = ppo.advantages(t([1.0]), torch.zeros(1, dtype=torch.long), cfg(), batch=b)  # whitened (unbiased)
    returns = ppo.value_targets(t([1.0]), b, cfg())
    assert a[0].tolist() == pytest.approx([0, 0.991344, 0.017092, -1.008436, 0], abs=1e-5)
    assert returns[0].tolist() == pytest.approx([0, 0.96575, 0.985, 1.0, 0], abs=1e-12)  # raw A + V


def test_gae_lambda_one_gives_reward_to_go_returns():
    # γ = λ = 1: G_t = Σ_{s ≥ t} r_s whatever V is, and A = G − V
    r = t([[0.0, 0.2, 0.0, 1.0], [0.5, -1.0, 0.0, 0.0]])
    v = t([[0.3, -0.7, 2.0, 0.1], [1.0, 0.4, 5.0, 5.0]])
    m = t([[1, 1, 1, 1], [1, 1, 0, 0]])
    a, g = ppo.gae(r, v, m, gamma=1.0, lam=1.0)
    assert torch.allclose(g, t([[1.2, 1.2, 1.0, 1.0], [-0.5, -1.0, 0, 0]]), atol=1e-12)
    assert torch.allclose(a, t([[0.9, 1.9, -1.0, 0.9], [-1.5, -1.4, 0, 0]]), atol=1e-12)
    assert torch.allclose(g, reinforce_pp.returns(r, m, 1.0), atol=1e-12)


def test_gae_lambda_zero_gives_td_residual():
    # λ = 0: A_t = δ_t = r_t + γ V_{t+1} − V_t, γ = 0.9, V after the last token = 0
    r, v, m = t([[0.0, 0.0, 1.0]]), t([[0.5, 0.6, 0.7]]), t([[1, 1, 1]])
    a, g = ppo.gae(r, v, m, gamma=0.9, lam=0.0)
    assert a[0].tolist() == pytest.approx([0.9 * 0.6 - 0.5, 0.9 * 0.7 - 0.6, 1.0 - 0.7], abs=1e-12)  # .04 .03 .3
    assert g[0].tolist() == pytest.approx([0.54, 0.63, 1.0], abs=1e-12)  # r + γ V_next


def test_gae_skips_observation_tokens_and_ignores_their_values():
    # verl multi-turn: tool tokens (mask 0) count no discount step and their values are never read
    r, m = t([[0.0, 0.0, 0.0, 0.0, 2.0]]), t([[1, 1, 0, 0, 1]])
    for junk in (0.0, 1e6, float("nan")):
        v = t([[0.1, 0.2, junk, junk, 0.4]])
        a, g = ppo.gae(r, v, m, gamma=0.5, lam=0.5)
        # compressed row: r [0, 0, 2], V [.1, .2, .4]: δ = [.5·.2 − .1, .5·.4 − .2, 2 − .4] = [0, 0, 1.6]
        assert a[0].tolist() == pytest.approx([0.25 * 0.25 * 1.6, 0.25 * 1.6, 0, 0, 1.6], abs=1e-12)
        assert g[0].tolist() == pytest.approx([0.1 + 0.1, 0.2 + 0.4, 0, 0, 2.0], abs=1e-12)


def test_zero_critic_and_lambda_one_is_reinforce_pp():
    # the lineage: REINFORCE++ = PPO without the critic (V ≡ 0, λ = 1, same k1 KL in the reward)
    g = torch.Generator().manual_seed(3)
    mask = (torch.rand(5, 6, generator=g) < 0.7).to(F64)
    old = -torch.rand(5, 6, dtype=F64, generator=g) * mask
    ref = -torch.rand(5, 6, dtype=F64, generator=g) * mask
    r, gi = torch.rand(5, dtype=F64, generator=g), torch.arange(5)
    b = RolloutBatch(loss_mask=mask, old_logprobs=old, ref_logprobs=ref, values=torch.zeros_like(mask))
    a = ppo.advantages(r, gi, ppo.Config(lam=1.0, kl_coef=0.03), batch=b)
    expect = reinforce_pp.advantages(r, gi, reinforce_pp.Config(reward_kl_coef=0.03), batch=b)
    assert torch.allclose(a, expect, atol=1e-12) and a.abs().sum() > 0


def test_kl_in_reward_adds_minus_beta_k1_per_token():
    # k1 = old − ref = [0.5, −1.0, 0]; β = 0.1 → token rewards [−0.05, +0.1, 1 + 0]; V = 0, γ = λ = 1
    mask = t([[0, 1, 1, 1]])
    old, ref = t([[0, -1.0, -2.0, -0.5]]), t([[0, -1.5, -1.0, -0.5]])
    b = RolloutBatch(loss_mask=mask, old_logprobs=old, ref_logprobs=ref, values=torch.zeros_like(mask))
    in_reward_cfg = ppo.Config(kl_coef=0.1, lam=1.0, whiten_advantages=False)
    a = ppo.advantages(t([1.0]), torch.zeros(1, dtype=torch.long), in_reward_cfg, batch=b)
    assert ppo.value_targets(t([1.0]), b, in_reward_cfg)[0].tolist() == pytest.approx([0, 1.05, 1.1, 1.0], abs=1e-12)
    assert a[0].tolist() == pytest.approx([0, 1.05, 1.1, 1.0], abs=1e-12)
    # kl_in="loss": the reward is the task's alone ...
    in_loss_cfg = ppo.Config(kl_coef=0.1, kl_in="loss", lam=1.0, whiten_advantages=False)
    ppo.advantages(t([1.0]), torch.zeros(1, dtype=torch.long), in_loss_cfg, batch=b)
    assert ppo.value_targets(t([1.0]), b, in_loss_cfg)[0].tolist() == pytest.approx([0, 1.0, 1.0, 1.0], abs=1e-12)
    # ... and the loss carries +β·Agg(KL(π_θ, π_ref)) instead; with the KL in the reward it is only measured
    lp = t([[0, -0.8, -1.9, -0.6]])
    lb = dataclasses.replace(
        b, advantages=torch.zeros_like(mask), returns=torch.zeros_like(mask), new_values=torch.zeros_like(mask)
    )
    norm = core.batch_norm(mask)
    base, _ = ppo.loss(lp, lb, ppo.Config(kl_coef=0.0), norm)
    in_reward, m_r = ppo.loss(lp, lb, ppo.Config(kl_coef=0.1), norm)
    in_loss, m_l = ppo.loss(lp, lb, ppo.Config(kl_coef=0.1, kl_in="loss"), norm)
    k1 = [-0.8 + 1.5, -1.9 + 1.0, -0.6 + 0.5]
    assert in_reward.item() == base.item()
    assert in_loss.item() == pytest.approx(base.item() + 0.1 * sum(k1) / 3, abs=1e-12)
    assert m_r["kl/ref"].item() == m_l["kl/ref"].item() == pytest.approx(sum(k1) / 3, abs=1e-12)
    with pytest.raises(UsageError, match="ref_logprobs"):
        ppo.advantages(
            t([1.0]),
            torch.zeros(1, dtype=torch.long),
            ppo.Config(kl_coef=0.1),
            batch=RolloutBatch(loss_mask=mask, old_logprobs=old, values=torch.zeros_like(mask)),
        )


def test_whitening_is_over_the_batch_tokens_and_leaves_returns_raw():
    g = torch.Generator().manual_seed(4)
    mask = (torch.rand(4, 7, generator=g) < 0.6).to(F64)
    vals = torch.randn(4, 7, dtype=F64, generator=g) * mask
    r, gi = torch.randn(4, dtype=F64, generator=g), torch.arange(4)
    raw_b, w_b = RolloutBatch(loss_mask=mask, values=vals), RolloutBatch(loss_mask=mask, values=vals)
    raw = ppo.advantages(r, gi, cfg(whiten_advantages=False), batch=raw_b)
    w = ppo.advantages(r, gi, cfg(), batch=w_b)
    assert torch.equal(w, core.masked_whiten(raw, mask))
    on = w[mask != 0]
    assert on.mean().item() == pytest.approx(0.0, abs=1e-12) and on.std().item() == pytest.approx(1.0, abs=1e-6)
    raw_ret = ppo.value_targets(r, raw_b, cfg(whiten_advantages=False))
    assert (w[mask == 0] == 0).all() and torch.equal(raw_ret, ppo.value_targets(r, w_b, cfg()))
    with pytest.raises(UsageError, match="values"):
        ppo.advantages(r, gi, cfg(), batch=RolloutBatch(loss_mask=mask))


# ============================================================================= clipped value loss


def test_value_loss_worked_values_and_gradients():
    # §15.3: V = 1.2, V_old = 0.5, G = 1.0, ε_v = 0.5 → ½·max(0.04, 0) = 0.02; the unclipped branch: ∂/∂V = V − G
    v = t([1.2, 1.5]).requires_grad_(True)
    old, g = t([0.5, 1.0]), t([1.0, 2.0])
    loss, clipped = ppo.value_loss(v, old, g, 0.5)
    assert loss[0].item() == pytest.approx(0.02, abs=1e-12) and not clipped[0]
    # V = 1.5, V_old = 1.0, ε_v = 0.5 → clip(V) = 1.5 = V: both branches equal, not clipped
    assert loss[1].item() == pytest.approx(0.125, abs=1e-12) and not clipped[1]
    (grad,) = torch.autograd.grad(loss.sum(), v)
    assert grad.tolist() == pytest.approx([0.2, -0.5], abs=1e-12)
    # ε_v = 0.2, V = 1.5 moved past V_old + ε_v = 1.2 away from G = 2: ½·max(0.25, 0.64) = 0.32, gradient 0
    v = t([1.5]).requires_grad_(True)
    loss, clipped = ppo.value_loss(v, t([1.0]), t([2.0]), 0.2)
    assert loss.item() == pytest.approx(0.32, abs=1e-12) and clipped.item()
    (grad,) = torch.autograd.grad(loss.sum(), v)
    assert grad.item() == 0.0
    # value_clip=None: plain ½(V − G)²
    loss, clipped = ppo.value_loss(t([1.5]), t([1.0]), t([2.0]), None)
    assert loss.item() == pytest.approx(0.125) and not clipped.any()


def _loss_batch(lp_old, adv, mask, **extra):
    z = torch.zeros_like(mask)
    fields = {"values": z, "returns": z, "new_values": z, **extra}
    return RolloutBatch(loss_mask=mask, old_logprobs=lp_old, advantages=adv, **fields)


def test_row20_clip_table():
    # SEED_SPEC row 20 (ε = 0.2): ρ ∈ {0.7, 1.0, 1.4} × A = ±1; loss −min(ρA, clip(ρ)A), ∂/∂logπ = −ρA where it flows
    ratios = [0.7, 0.7, 1.0, 1.0, 1.4, 1.4]
    A = t([[1, -1, 1, -1, 1, -1]])
    mask = torch.ones(1, 6, dtype=F64)
    old = torch.zeros(1, 6, dtype=F64)
    lp = t([[math.log(r) for r in ratios]]).requires_grad_(True)
    loss, m = ppo.loss(lp, _loss_batch(old, A, mask), cfg(vf_coef=0.0), core.batch_norm(mask))
    per_tok = [-0.70, 0.80, -1.0, 1.0, -1.20, 1.40]  # lo-pos flows, lo-neg killed, hi-pos killed, hi-neg flows
    assert loss.item() == pytest.approx(sum(per_tok) / 6, abs=1e-12)
    (g,) = torch.autograd.grad(loss, lp)
    assert (g[0] * 6).tolist() == pytest.approx([-0.7, 0.0, -1.0, 1.0, 0.0, 1.4], abs=1e-12)
    assert m["clip/frac"].item() == pytest.approx(2 / 6)


def test_dual_clip_worked_values():
    # §15.3 (verl vanilla), ε = 0.2, c = 3, ratios [0.5, 0.9, 1.1, 1.5, 4.0]
    ratios = [0.5, 0.9, 1.1, 1.5, 4.0]
    mask, old = torch.ones(1, 5, dtype=F64), torch.zeros(1, 5, dtype=F64)
    for a, per_tok, flows in (
        (1.0, [-0.5, -0.9, -1.1, -1.2, -1.2], [1, 1, 1, 0, 0]),
        (-1.0, [0.8, 0.9, 1.1, 1.5, 3.0], [0, 1, 1, 1, 0]),
    ):
        lp = t([[math.log(r) for r in ratios]]).requires_grad_(True)
        loss, m = ppo.loss(
            lp, _loss_batch(old, torch.full_like(mask, a), mask), cfg(dual_clip=3.0, vf_coef=0.0), core.batch_norm(mask)
        )
        assert loss.item() == pytest.approx(sum(per_tok) / 5, abs=1e-12)
        (g,) = torch.autograd.grad(loss, lp)
        assert (g[0] * 5).tolist() == pytest.approx([-r * a * f for r, f in zip(ratios, flows)], abs=1e-12)
        assert m["clip/frac"].item() == pytest.approx(2 / 5)


def _random(seed, B=8, T=7):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, T, generator=g) < 0.7).to(F64)
    mask[:, 0] = 0.0
    mask[2] = 0.0  # a fully masked row
    old = -torch.rand(B, T, dtype=F64, generator=g) * 3 * mask - 0.05 * mask
    lp = (old + 0.3 * torch.randn(B, T, dtype=F64, generator=g)) * mask
    ref = (old + 0.2 * torch.randn(B, T, dtype=F64, generator=g)) * mask
    vals = torch.randn(B, T, dtype=F64, generator=g) * mask
    new_v = vals + 0.4 * torch.randn(B, T, dtype=F64, generator=g) * mask
    ret = torch.randn(B, T, dtype=F64, generator=g) * mask
    A = torch.randn(B, T, dtype=F64, generator=g) * mask
    ent = torch.rand(B, T, dtype=F64, generator=g) * mask
    return lp, new_v, _loss_batch(old, A, mask, values=vals, returns=ret, ref_logprobs=ref), ent


def _grads(c, lp, new_v, batch, norm, ent):
    lp, new_v = lp.clone().requires_grad_(True), new_v.clone().requires_grad_(True)
    loss, m = ppo.loss(lp, dataclasses.replace(batch, new_values=new_v), c, norm, ent)
    g_lp, g_v = torch.autograd.grad(loss, (lp, new_v))
    return loss.detach(), m, g_lp, g_v


@pytest.mark.parametrize("mode", sorted(core.AGGREGATIONS))
def test_loss_micro_batches_sum_to_the_full_batch(mode):
    lp, new_v, batch, ent = _random(5)
    c = cfg(aggregation=mode, kl_coef=0.05, kl_in="loss", entropy_coef=0.01, dual_clip=3.0, vf_coef=0.5)
    norm = core.batch_norm(batch.loss_mask, 16)
    full, m_full, g_lp, g_v = _grads(c, lp, new_v, batch, norm, ent)
    lp_p, v_p = lp.clone().requires_grad_(True), new_v.clone().requires_grad_(True)
    total, weighted = 0.0, {"loss/policy": 0.0, "loss/value": 0.0, "value/mean": 0.0, "value/clip_frac": 0.0}
    for s in (slice(0, 3), slice(3, 4), slice(4, 8)):
        part = batch.map(lambda v, s=s: v[s])
        loss, m = ppo.loss(lp_p[s], dataclasses.replace(part, new_values=v_p[s]), c, norm, ent[s])
        total = total + loss
        share = float(part.loss_mask.sum()) / norm["tokens"]  # the trainer's token weighting
        for k in weighted:
            weighted[k] += share * float(m[k])
    parts_lp, parts_v = torch.autograd.grad(total, (lp_p, v_p))
    assert total.item() == pytest.approx(full.item(), rel=1e-12)
    assert torch.allclose(parts_lp, g_lp, rtol=1e-10, atol=1e-15) and torch.allclose(
        parts_v, g_v, rtol=1e-10, atol=1e-15
    )
    for k, v in weighted.items():
        assert v == pytest.approx(float(m_full[k]), rel=1e-10, abs=1e-15), k
    assert g_v.abs().sum() > 0 and m_full["value/clip_frac"] > 0


def test_loss_is_policy_plus_weighted_value_and_masks_hold():
    lp, new_v, batch, ent = _random(6)
    norm = core.batch_norm(batch.loss_mask)
    loss, m, _, _ = _grads(cfg(vf_coef=0.3), lp, new_v, batch, norm, None)
    vf, _ = ppo.value_loss(new_v, batch.values, batch.returns, 0.2)
    value = core.aggregate(vf, batch.loss_mask, "token-mean", norm)
    assert loss.item() == pytest.approx(float(m["loss/policy"]) + 0.3 * value.item(), rel=1e-12)
    assert float(m["loss/value"]) == pytest.approx(value.item(), rel=1e-12)
    assert float(m["value/mean"]) == pytest.approx(float(core.masked_mean(new_v, batch.loss_mask)), rel=1e-12)
    # junk off the mask changes nothing, in value or gradient
    off = batch.loss_mask == 0
    junk = dataclasses.replace(
        batch.map(lambda v: torch.where(off, torch.full_like(v, 1e6), v)), loss_mask=batch.loss_mask
    )
    a = _grads(cfg(), lp, new_v, batch, norm, ent)
    b = _grads(cfg(), torch.where(off, 30.0, lp), torch.where(off, -7e5, new_v), junk, norm, ent)
    assert a[0].item() == b[0].item() and torch.equal(a[2], b[2]) and torch.equal(a[3], b[3])
    assert {k: float(v) for k, v in a[1].items()} == {k: float(v) for k, v in b[1].items()}
    with pytest.raises(UsageError, match="new_values"):
        ppo.loss(lp, dataclasses.replace(batch, new_values=None), cfg(), norm)


@pytest.mark.parametrize("mode", sorted(core.AGGREGATIONS))
def test_on_policy_policy_gradient_is_reinforce(mode):
    # ratio 1 and no value term: PPO's policy gradient is REINFORCE's with the same A and aggregation
    from posttrain.algorithms import reinforce

    _, new_v, batch, _ = _random(7)
    old = batch.old_logprobs
    norm = core.batch_norm(batch.loss_mask, 16)
    loss, m, g, _ = _grads(cfg(aggregation=mode, vf_coef=0.0), old, new_v, batch, norm, None)
    lp = old.clone().requires_grad_(True)
    ref_loss, _ = reinforce.loss(lp, batch, reinforce.Config(aggregation=mode), norm)
    (g_ref,) = torch.autograd.grad(ref_loss, lp)
    assert torch.allclose(g, g_ref, rtol=1e-12, atol=1e-15) and g.abs().sum() > 0
    assert m["ratio/mean"].item() == pytest.approx(1.0, abs=1e-15) and m["clip/frac"].item() == 0.0


def test_explained_variance():
    mask = t([[1, 1, 1, 0]])
    g = t([[1.0, 2.0, 3.0, 50.0]])
    assert ppo.explained_variance(g, g, mask).item() == 1.0
    assert ppo.explained_variance(torch.full_like(g, 2.0), g, mask).item() == pytest.approx(0.0)
    assert ppo.explained_variance(t([[3.0, 2.0, 1.0, 0.0]]), g, mask).item() == pytest.approx(-3.0)  # 1 − (8/3)/(2/3)
    assert ppo.explained_variance(g, torch.ones_like(g), mask).item() == 0.0  # constant returns


# ============================================================================= config and registry


def test_config_defaults_validation_and_registry():
    c = ppo.Config()
    assert (c.eps_low, c.eps_high, c.dual_clip, c.gamma, c.lam, c.vf_coef, c.value_clip) == (
        0.2,
        0.2,
        None,
        1.0,
        0.95,
        0.1,
        0.2,
    )
    assert (c.kl_in, c.kl_estimator, c.critic, c.aggregation, c.whiten_advantages) == (
        "reward",
        "k1",
        "shared",
        "token-mean",
        True,
    )
    assert ppo.needs_reference(c) and not ppo.needs_reference(ppo.Config(kl_coef=0.0)) and ppo.needs_critic(c)
    for bad in (
        {"kl_in": "both"},
        {"critic": "twin"},
        {"lam": 1.5},
        {"gamma": -0.1},
        {"value_clip": 0.0},
        {"vf_coef": -1.0},
        {"dual_clip": 1.0},
        {"aggregation": "mean"},
        {"kl_estimator": "k4"},
        {"eps_low": 1.0},
    ):
        with pytest.raises(UsageError):
            ppo.Config(**bad)
    assert build(ppo.Config, {"value_clip": None, "critic": "separate", "dual_clip": 3.0}).critic == "separate"
    assert algorithms.get("ppo") is ppo and "Deviations from the paper" in ppo.__doc__
    with pytest.raises(UsageError, match="did you mean 'ppo'"):
        algorithms.get("pop")


# ============================================================================= the critic on a nano GPTMini
