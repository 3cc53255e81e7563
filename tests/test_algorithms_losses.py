"""The algorithm zoo, part 2: the losses (GSPO, CISPO, DPPO, REINFORCE, REINFORCE++), SEED_SPEC Part C
rows 33–34, equivalences between algorithms, and the invariances every loss must keep
(micro-batches, masks). Pure tensors, float64, CPU."""

import math
import statistics

import pytest
import torch

from posttrain import UsageError
from posttrain.algorithms import cispo, core, dapo, dppo, dr_grpo, grpo, gspo, reinforce, reinforce_pp
from posttrain.framework.batch import RolloutBatch

from zoo_util import ALL, F64, ZOO, _batch, _grad, _random_batch, assert_masked_positions_inert, cfg_of, t

# ============================================================================= GSPO


def test_gspo_worked_values():
    # §15.3: token log-ratios [0.1, −0.2, 0.4] → s = e^0.1; ε = 3e-4/4e-4
    lp, old, mask = t([[0.1, -0.2, 0.4]]), torch.zeros(1, 3, dtype=F64), torch.ones(1, 3, dtype=F64)
    norm = core.batch_norm(mask)
    s = math.exp(0.1)
    for variant in gspo.VARIANTS:
        cfg = gspo.Config(variant=variant)
        loss, m, g = _grad(gspo, cfg, lp, _batch(old, t([1.0]), mask), norm)
        assert loss.item() == pytest.approx(-1.0004, abs=1e-12) and m["ratio/mean"].item() == pytest.approx(
            1.105171, abs=1e-6
        )
        assert g.abs().sum() == 0 and m["clip/frac"].item() == 1.0  # A > 0 and s > 1 + ε: clipped
        loss, m, g = _grad(gspo, cfg, lp, _batch(old, t([-1.0]), mask), norm)
        assert loss.item() == pytest.approx(1.105171, abs=1e-6) and m["clip/frac"].item() == 0.0
        assert g[0].tolist() == pytest.approx([s / 3] * 3, rel=1e-12)  # ∂s/∂lp_t = s/|y|


def test_gspo_token_variant_takes_per_token_advantages():
    lp, mask = torch.zeros(1, 3, dtype=F64), torch.ones(1, 3, dtype=F64)
    A = t([[1.0, -1.0, 2.0]])
    norm = core.batch_norm(mask)
    _, _, g_tok = _grad(gspo, gspo.Config(variant="token"), lp, _batch(lp.clone(), A, mask), norm)
    assert g_tok[0].tolist() == pytest.approx([-1 / 3, 1 / 3, -2 / 3])  # −s·A_t/(N|y|)
    _, _, g_seq = _grad(gspo, gspo.Config(), lp, _batch(lp.clone(), A, mask), norm)
    assert g_seq[0].tolist() == pytest.approx([-2 / 9] * 3)  # −Σ_t A_t/|y| spread over tokens


def test_gspo_variants_agree_on_outcome_advantages():
    lp, old, ref, A, ent, mask = _random_batch(5, B=8)
    norm = core.batch_norm(mask, 16)
    for eps in (3e-4, 0.05):  # the paper's band (most rows clipped), and wider
        seq = _grad(gspo, gspo.Config(eps_low=eps, eps_high=eps), lp, _batch(old, A, mask, ref), norm)
        tok = _grad(gspo, gspo.Config(eps_low=eps, eps_high=eps, variant="token"), lp, _batch(old, A, mask, ref), norm)
        assert tok[0].item() == pytest.approx(seq[0].item(), rel=1e-12)
        assert torch.allclose(tok[2], seq[2], rtol=1e-10, atol=1e-15)


def test_gspo_on_one_token_responses_is_token_level_grpo():
    g = torch.Generator().manual_seed(6)
    B, T = 6, 3
    mask = torch.zeros(B, T, dtype=F64)
    mask[:, 1] = 1  # one response token per row
    old = -torch.rand(B, T, dtype=F64, generator=g) * 2
    lp = old + 0.4 * torch.randn(B, T, dtype=F64, generator=g)
    A = core.broadcast(torch.randn(B, dtype=F64, generator=g), mask)
    norm = core.batch_norm(mask)
    for variant in gspo.VARIANTS:
        cfg = gspo.Config(eps_low=0.2, eps_high=0.28, variant=variant, dual_clip=3.0)
        ref_cfg = grpo.Config(eps_low=0.2, eps_high=0.28, kl_coef=0.0, dual_clip=3.0)
        a = _grad(gspo, cfg, lp, _batch(old, A, mask), norm)
        b = _grad(grpo, ref_cfg, lp, _batch(old, A, mask), norm)
        assert a[0].item() == pytest.approx(b[0].item(), rel=1e-12) and torch.allclose(a[2], b[2], rtol=1e-12, atol=0)
        assert a[1]["clip/frac"].item() == b[1]["clip/frac"].item() > 0


# ============================================================================= CISPO and DPPO, one token


def _one_token(p_old, p, A):
    lp = t([[math.log(p)]])
    return lp, _batch(t([[math.log(p_old)]]), t([[A]]), torch.ones(1, 1, dtype=F64)), core.batch_norm(torch.ones(1, 1))


def test_cispo_weight_worked_values():
    # §15.3: p_old = 0.3 → p = 0.5, r = 1.6667: verl example cap 1.2; ScaleRL/TRL cap 5 keeps 1.6667
    lp, b, norm = _one_token(0.3, 0.5, 1.0)
    loss, m, g = _grad(cispo, cispo.Config(eps_high=0.2), lp, b, norm)
    assert loss.item() == pytest.approx(-1.2 * math.log(0.5)) and g.item() == pytest.approx(-1.2)
    assert m["clip/frac"].item() == 1.0  # weight clipped, gradient NOT zero
    loss, m, g = _grad(cispo, cispo.Config(), lp, b, norm)
    assert g.item() == pytest.approx(-5 / 3) and m["clip/frac"].item() == 0.0
    assert _grad(grpo, grpo.Config(kl_coef=0.0), lp, b, norm)[2].item() == 0.0  # PPO drops this token
    # floor: r = 0.5 with A < 0: no floor by default (weight 0.5), eps_low = 0.2 lifts it to 0.8
    lp, b, norm = _one_token(0.3, 0.15, -1.0)
    assert _grad(cispo, cispo.Config(), lp, b, norm)[2].item() == pytest.approx(0.5)
    assert _grad(cispo, cispo.Config(eps_low=0.2), lp, b, norm)[2].item() == pytest.approx(0.8)


@pytest.mark.parametrize("divergence", ["tv", "kl"])
def test_dppo_trust_region_worked_values(divergence):
    # §15.3: p_old = 0.3 → p = 0.5: TV 0.2 > 0.15, binary KL 0.082283 > 0.05: drop if A > 0, keep if A < 0
    cfg = dppo.Config(divergence=divergence)
    lp, b, norm = _one_token(0.3, 0.5, 1.0)
    _, m, g = _grad(dppo, cfg, lp, b, norm)
    assert g.item() == 0.0 and m["clip/frac"].item() == 1.0
    lp, b, norm = _one_token(0.3, 0.5, -1.0)
    loss, m, g = _grad(dppo, cfg, lp, b, norm)
    assert g.item() == pytest.approx(5 / 3) and m["clip/frac"].item() == 0.0  # −A·min(r, C)
    assert loss.item() == pytest.approx(5 / 3 * math.log(0.5))
    assert _grad(dppo, dppo.Config(divergence=divergence, ratio_cap=1.2), lp, b, norm)[2].item() == pytest.approx(1.2)
    # p_old = 0.5 → p = 0.3 (TV −0.2, KL 0.087177): kept for A > 0 (moving against it), dropped for A < 0
    lp, b, norm = _one_token(0.5, 0.3, 1.0)
    assert _grad(dppo, cfg, lp, b, norm)[2].item() == pytest.approx(-0.6)
    lp, b, norm = _one_token(0.5, 0.3, -1.0)
    assert _grad(dppo, cfg, lp, b, norm)[2].item() == 0.0
    # inside the region both ways: 0.3 → 0.33 (TV 0.03, KL 0.0021)
    for A in (1.0, -1.0):
        lp, b, norm = _one_token(0.3, 0.33, A)
        assert _grad(dppo, cfg, lp, b, norm)[2].item() == pytest.approx(-A * 1.1)
    # a wider δ keeps the first token
    lp, b, norm = _one_token(0.3, 0.5, 1.0)
    assert _grad(dppo, dppo.Config(divergence=divergence, delta_high=0.25), lp, b, norm)[2].item() == pytest.approx(
        -5 / 3
    )


# ============================================================================= REINFORCE and REINFORCE++


def test_reinforce_loss_hand_computed():
    lp = t([[math.log(0.5), math.log(0.25), 0.0], [math.log(0.8), 0.0, 0.0]])
    old = t([[math.log(0.25), math.log(0.25), 0.0], [math.log(0.8), 0.0, 0.0]])  # ratio 2 on one token
    ref = t([[math.log(0.4), math.log(0.25), 0.0], [math.log(0.5), 0.0, 0.0]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    norm = core.batch_norm(mask, 3)
    b = _batch(old, t([2.0, -1.0]), mask, ref)
    loss, m = reinforce.loss(lp, b, reinforce.Config(), norm)
    expected = (-2 * (math.log(0.5) + math.log(0.25)) + math.log(0.8)) / 2  # −Σ_i A_i Σ_t log π / N
    assert loss.item() == pytest.approx(expected)
    assert m["ratio/max"].item() == pytest.approx(2.0) and m["clip/frac"].item() == 0.0  # a diagnostic only
    assert m["ratio/mean"].item() == pytest.approx(4 / 3)
    d = [math.log(0.5) - math.log(0.4), 0.0, math.log(0.8) - math.log(0.5)]  # log π_θ − log π_ref
    kls = {"k1": d, "k2": [0.5 * x * x for x in d], "k3": [math.expm1(-x) + x for x in d]}
    for est, k in kls.items():
        loss, m = reinforce.loss(lp, b, reinforce.Config(kl_coef=0.1, kl_estimator=est), norm)
        assert loss.item() == pytest.approx(expected + 0.1 * sum(k) / 2)
        assert m["kl/ref"].item() == pytest.approx(sum(k) / 3)


def test_reinforce_pp_returns_verl_cases():
    # verl test_trailing_padding_stays_zero and test_gamma_discount_across_observation_span
    out = reinforce_pp.returns(t([[0, 0, 1, 0, 0]]), t([[1, 1, 1, 0, 0]]))
    assert out.tolist() == [[1, 1, 1, 0, 0]]
    out = reinforce_pp.returns(t([[0, 0, 0, 0, 2]]), t([[1, 1, 0, 0, 1]]), gamma=0.5)
    assert out.tolist() == [[0.5, 1.0, 0.0, 0.0, 2.0]]
    r = reinforce_pp.token_rewards(t([3.0, 5.0]), t([[0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0]]))
    assert r.tolist() == [[0, 0, 0, 0, 3, 0], [0] * 6]  # on the last loss token; empty row: nothing


def test_reinforce_pp_advantages_hand_computed():
    mask = t([[1, 1, 0], [1, 0, 0]])
    old = t([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    ref = t([[-1.5, -1.8, 0.0], [-0.5, 0.0, 0.0]])  # k1 = old − ref = [0.5, −0.2], [0]
    batch = RolloutBatch(loss_mask=mask, old_logprobs=old, ref_logprobs=ref)
    r, gi = t([1.0, 0.0]), torch.tensor([0, 0])

    def whiten(vals):
        mu, sd = statistics.fmean(vals), statistics.stdev(vals)
        return [(v - mu) / math.sqrt(sd * sd + 1e-8) for v in vals]

    # β = 0: returns [1, 1], [0]
    a = reinforce_pp.advantages(r, gi, reinforce_pp.Config(reward_kl_coef=0.0), batch=batch)
    assert [a[0, 0].item(), a[0, 1].item(), a[1, 0].item()] == pytest.approx([0.577350, 0.577350, -1.154700], abs=1e-6)
    assert a[0, 2].item() == 0.0 and a[1, 1:].abs().sum() == 0
    # β = 0.1 (default 0.01 overridden): token rewards [−0.05, 1.02], [0] → returns [0.97, 1.02], [0]
    a = reinforce_pp.advantages(r, gi, reinforce_pp.Config(reward_kl_coef=0.1), batch=batch)
    got = [a[0, 0].item(), a[0, 1].item(), a[1, 0].item()]
    assert got == pytest.approx(whiten([0.97, 1.02, 0.0]), abs=1e-9)
    assert statistics.fmean(got) == pytest.approx(0.0, abs=1e-12) and statistics.stdev(got) == pytest.approx(
        1.0, abs=1e-6
    )
    # -baseline: rows of lengths 2, 1, 1; groups [0, 0, 1]; R = [1, 0, 1] → centred [.5, .5], [−.5], [0]
    mask3 = t([[1, 1, 0], [1, 0, 0], [0, 1, 0]])
    b3 = RolloutBatch(loss_mask=mask3, old_logprobs=-mask3, ref_logprobs=-mask3)
    a = reinforce_pp.advantages(
        t([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]), reinforce_pp.Config(baseline=True), batch=b3
    )
    got = [a[0, 0].item(), a[0, 1].item(), a[1, 0].item(), a[2, 1].item()]
    assert got == pytest.approx(whiten([0.5, 0.5, -0.5, 0.0]), abs=1e-9)
    assert got == pytest.approx([0.783349, 0.783349, -1.305582, -0.261116], abs=1e-6)
    with pytest.raises(UsageError, match="batch"):
        reinforce_pp.advantages(r, gi, reinforce_pp.Config())
    with pytest.raises(UsageError, match="ref_logprobs"):
        reinforce_pp.advantages(r, gi, reinforce_pp.Config(), batch=RolloutBatch(loss_mask=mask, old_logprobs=old))


# ============================================================================= rows 33, 34: per-token signal by length


def _length_batch(lengths, A, T):
    mask = torch.zeros(len(lengths), T, dtype=F64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    old = -mask
    return old, _batch(old, core.broadcast(t(A), mask), mask), mask


def test_row33_per_token_gradient_under_three_aggregations():
    # A = 0.5, K = 2, |y| = 10 and 200; L_max = 200 (the generation cap)
    lp, b, mask = _length_batch([10, 200], [0.5, 0.5], 200)
    norm = core.batch_norm(mask, 200)
    K = 2
    g = _grad(grpo, grpo.Config(kl_coef=0.0), lp, b, norm)[2]  # seq-mean-token-mean: A/(K·|y_i|)
    short, long = -K * g[0, 0].item(), -K * g[1, 0].item()
    assert (short, long) == pytest.approx((0.05, 0.0025)) and long / short == pytest.approx(0.05)
    g = _grad(dapo, dapo.Config(), lp, b, norm)[2]  # token-mean: A/Σ|y|
    assert (-g[0, 0].item(), -g[1, 0].item()) == pytest.approx((0.002381, 0.002381), abs=1e-6)
    g = _grad(dr_grpo, dr_grpo.Config(), lp, b, norm)[2]  # Σ/(K·L_max): A/K per token, ÷ L_max
    assert (-200 * g[0, 0].item(), -200 * g[1, 199].item()) == pytest.approx((0.25, 0.25))
    g = _grad(dr_grpo, dr_grpo.Config(aggregation="seq-mean-token-sum"), lp, b, norm)[2]  # the lesson's "sum / K"
    assert (-g[0, 0].item(), -g[1, 0].item()) == pytest.approx((0.25, 0.25))
    assert (g[mask == 0] == 0).all()


def test_row34_grpo_per_token_signal():
    # |y| = 10 → 0.05 per token; |y| = 100 → 0.005 (10× less), A = 0.5, one response
    for n, expected in ((10, 0.05), (100, 0.005)):
        lp, b, mask = _length_batch([n], [0.5], 100)
        g = _grad(grpo, grpo.Config(kl_coef=0.0), lp, b, core.batch_norm(mask, 100))[2]
        assert (-g[0, :n]).tolist() == pytest.approx([expected] * n)


# ============================================================================= equivalences


def test_dr_grpo_is_grpo_with_two_switches():
    g = torch.Generator().manual_seed(7)
    r, gi = torch.rand(12, dtype=F64, generator=g), torch.arange(3).repeat_interleave(4)
    off = grpo.Config(scale_by_std=False, aggregation="seq-mean-token-sum-norm", kl_coef=0.0)
    assert torch.equal(dr_grpo.advantages(r, gi, dr_grpo.Config()), grpo.advantages(r, gi, off))
    assert torch.equal(dr_grpo.advantages(r, gi, dr_grpo.Config()), r - core.group_stats(r, gi)[0])
    lp, old, ref, A, ent, mask = _random_batch(8)
    norm = core.batch_norm(mask, 16)
    a = _grad(dr_grpo, dr_grpo.Config(), lp, _batch(old, A, mask, ref), norm)
    b = _grad(grpo, off, lp, _batch(old, A, mask, ref), norm)
    assert a[0].item() == b[0].item() and torch.equal(a[2], b[2])
    pg, _ = core.ppo_clip_loss(lp, old, A, 0.2, 0.2)  # by hand: Σ ℓ / (N · L_max)
    assert a[0].item() == pytest.approx(float((pg * mask).sum()) / (5 * 16), rel=1e-12)


def _on_policy_cases():
    for name in sorted(ALL):
        for mode in core.AGGREGATIONS:
            yield name, mode, None
    yield "gspo", "seq-mean-token-mean", "token"
    yield "gspo", "token-mean", "token"


@pytest.mark.parametrize("name, mode, variant", list(_on_policy_cases()))
def test_on_policy_gradient_is_reinforce(name, mode, variant):
    # ratio 1: every algorithm's gradient is REINFORCE's with the same advantages and aggregation
    mod = ALL[name]
    _, old, _, A, _, mask = _random_batch(9)
    kw = {"aggregation": mode, "kl_coef": 0.0}
    if variant:
        kw["variant"] = variant
    norm = core.batch_norm(mask, 16)
    loss, m, g = _grad(mod, mod.Config(**kw), old, _batch(old, A, mask), norm)
    _, _, g_ref = _grad(reinforce, reinforce.Config(aggregation=mode), old, _batch(old, A, mask), norm)
    assert torch.allclose(g, g_ref, rtol=1e-12, atol=1e-15)
    assert m["ratio/mean"].item() == pytest.approx(1.0, abs=1e-15) and m["clip/frac"].item() == 0.0


def _loss_cases():
    for name in sorted(ZOO):
        yield name, {}
    yield "dapo", {"mask_truncated": True}
    yield "gspo", {"variant": "token"}
    yield "dppo", {"divergence": "kl"}
    yield "reinforce", {"kl_coef": 0.05, "entropy_coef": 0.01}
    yield "cispo", {"eps_high": 0.2, "eps_low": 0.2, "kl_coef": 0.05, "kl_estimator": "k1"}


@pytest.mark.parametrize("name, kw", list(_loss_cases()))
def test_micro_batches_sum_to_the_full_batch(name, kw):
    mod = ZOO[name]
    lp, old, ref, A, ent, mask = _random_batch(10, B=8)
    trunc = torch.tensor([False, True, False, False, False, True, False, False])
    cfg = mod.Config(**kw)
    norm = core.batch_norm(mask, 16)
    full, m_full, g_full = _grad(mod, cfg, lp, _batch(old, A, mask, ref, truncated=trunc), norm, ent)
    lp = lp.clone().requires_grad_(True)
    total, policy = 0.0, 0.0
    for s in (slice(0, 3), slice(3, 4), slice(4, 8)):
        loss, m = mod.loss(lp[s], _batch(old[s], A[s], mask[s], ref[s], truncated=trunc[s]), cfg, norm, ent[s])
        total = total + loss
        policy += float(mask[s].sum()) / norm["tokens"] * float(m["loss/policy"])  # the trainer's weighting
    (g_parts,) = torch.autograd.grad(total, lp)
    assert total.item() == pytest.approx(full.item(), rel=1e-12)
    assert torch.allclose(g_parts, g_full, rtol=1e-10, atol=1e-15)
    assert policy == pytest.approx(float(m_full["loss/policy"]), rel=1e-12, abs=1e-15)
    assert g_full.abs().sum() > 0


@pytest.mark.parametrize("name", sorted(ZOO))
def test_masked_positions_change_nothing(name):
    mod = ZOO[name]
    lp, old, ref, A, ent, mask = _random_batch(11)
    cfg = cfg_of(mod, entropy_coef=0.01, kl_coef=0.02)
    norm = core.batch_norm(mask, 16)

    def run(lp, old, ref, A, ent):
        loss, m, g = _grad(mod, cfg, lp, _batch(old, A, mask, ref), norm, ent)
        return loss, {k: float(v) for k, v in m.items()}, g

    assert_masked_positions_inert(run, lp, old, ref, A, ent, mask)


def test_advantages_accept_the_controller_call():
    # the controller calls advantages(rewards, group_index, cfg, batch=batch) for every algorithm
    lp, old, ref, _, _, mask = _random_batch(12)
    r, gi = t([1, 0, 1, 1, 0, 0]), torch.tensor([0, 0, 0, 1, 1, 1])
    batch = RolloutBatch(
        loss_mask=mask,
        old_logprobs=old,
        ref_logprobs=ref,
        input_ids=torch.zeros_like(mask).long(),
        rewards=r,
        group_index=gi,
    )
    for name, mod in ALL.items():
        a = mod.advantages(batch.rewards, batch.group_index, mod.Config(), batch=batch)
        assert a.shape in ((6,), (6, 7)) and torch.isfinite(a).all(), name
    a = reinforce_pp.advantages(r, gi, reinforce_pp.Config(), batch=batch)
    assert (a[mask == 0] == 0).all() and a[mask != 0].abs().sum() > 0
