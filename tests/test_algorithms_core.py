"""algorithms/core.py against hand-computed values (docs/algorithms.md §21, SEED_SPEC Part C)."""

import math

import pytest
import torch

from posttrain import UsageError
from posttrain.algorithms import core

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


# ----------------------------------------------------------------------------- masked reductions


def test_masked_mean_values_and_empty_masks():
    x = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = t([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert core.masked_mean(x, m).item() == pytest.approx(1.5)
    assert core.masked_sum(x, m).item() == pytest.approx(3.0)
    rows = core.masked_mean(x, m, dim=-1)
    assert rows.tolist() == pytest.approx([1.5, 0.0])  # empty row → 0, not NaN
    assert core.masked_mean(x, torch.zeros_like(m)).item() == 0.0
    assert not torch.isnan(core.masked_mean(x, torch.zeros_like(m), dim=0)).any()


def test_masked_sum_ignores_nan_and_inf_at_masked_positions_in_value_and_gradient():
    x = t([[1.0, float("nan"), float("inf")]]).requires_grad_(True)
    m = t([[1.0, 0.0, 0.0]])
    s = core.masked_sum(x * 2.0, m)
    s.backward()
    assert s.item() == 2.0
    assert x.grad.tolist() == [[2.0, 0.0, 0.0]]


def test_broadcast_controller_shape_row15():
    # SEED_SPEC row 15: a batch of 3 responses padded to 12 positions
    adv = t([1.41, -0.71, -0.71])
    mask = torch.zeros(3, 12, dtype=F64)
    mask[0, 4:9] = 1
    mask[1, 4:6] = 1
    mask[2, 4:12] = 1
    out = core.broadcast(adv, mask)
    assert out.shape == (3, 12)
    assert out[0, 4].item() == 1.41 and out[0, 3].item() == 0.0 and out[0, 9].item() == 0.0
    assert out[1].sum().item() == pytest.approx(-1.42)
    assert out[2, 11].item() == -0.71


# ----------------------------------------------------------------------------- aggregation


def _example():
    # docs/algorithms.md §21: loss [[1, 2, 3, ·], [4, ·, ·, ·]]; masked slots hold junk on purpose
    loss = t([[1.0, 2.0, 3.0, 99.0], [4.0, -7.0, 5.0, 8.0]])
    mask = t([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    return loss, mask


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", 2.5),  # 10 / 4
        ("seq-mean-token-sum", 5.0),  # (6 + 4) / 2
        ("seq-mean-token-mean", 3.0),  # (6/3 + 4/1) / 2
        ("seq-mean-token-sum-norm", 1.25),  # 10 / (2 · 4), the Aug-2026 verl / TRL dr_grpo value
    ],
)
def test_aggregation_worked_example(mode, expected):
    loss, mask = _example()
    norm = core.batch_norm(mask, max_len=4)
    assert norm == {"tokens": 4.0, "seqs": 2.0, "max_len": 4.0}
    assert core.aggregate(loss, mask, mode, norm).item() == pytest.approx(expected)


def test_batch_norm_skips_empty_rows_and_defaults_max_len_to_width():
    mask = t([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    assert core.batch_norm(mask) == {"tokens": 3.0, "seqs": 2.0, "max_len": 3.0}
    # an all-empty batch gives a 0 loss, not NaN
    z = torch.zeros(2, 3, dtype=F64)
    for mode in core.AGGREGATIONS:
        assert core.aggregate(torch.ones(2, 3, dtype=F64), z, mode, core.batch_norm(z)).item() == 0.0


def test_unknown_aggregation_is_a_usage_error():
    loss, mask = _example()
    with pytest.raises(UsageError, match="token-mean"):
        core.aggregate(loss, mask, "token_mean", core.batch_norm(mask))


@pytest.mark.parametrize("mode", core.AGGREGATIONS)
def test_aggregation_micro_batches_sum_to_the_full_batch(mode):
    g = torch.Generator().manual_seed(0)
    B, T = 7, 6
    x = torch.randn(B, T, dtype=F64, generator=g).requires_grad_(True)
    mask = (torch.rand(B, T, generator=g) < 0.6).to(F64)
    mask[3] = 0.0  # a fully masked row
    norm = core.batch_norm(mask, max_len=10)
    full = core.aggregate(x * x, mask, mode, norm)  # nonlinear in x: gradients differ per token
    (g_full,) = torch.autograd.grad(full, x)
    parts = [slice(0, 2), slice(2, 5), slice(5, 7)]
    total = sum(core.aggregate(x[s] * x[s], mask[s], mode, norm) for s in parts)
    (g_parts,) = torch.autograd.grad(total, x)
    assert total.item() == pytest.approx(full.item(), rel=1e-12)
    assert torch.allclose(g_parts, g_full, rtol=1e-12, atol=0)
    # and it is not trivially so: the micro-batches' own normalisers would give another value
    local = sum(core.aggregate(x[s] * x[s], mask[s], mode, core.batch_norm(mask[s], 10)) for s in parts)
    assert local.item() != pytest.approx(full.item(), rel=1e-6)


def test_as_token_weighted_makes_the_trainer_mean_exact():
    loss, mask = _example()
    norm = core.batch_norm(mask, max_len=4)
    full = core.aggregate(loss, mask, "seq-mean-token-mean", norm).item()  # 3.0
    parts = [slice(0, 1), slice(1, 2)]
    weighted = 0.0
    for s in parts:
        v = core.as_token_weighted(core.aggregate(loss[s], mask[s], "seq-mean-token-mean", norm), mask[s], norm)
        weighted += float(mask[s].sum()) / norm["tokens"] * float(v)  # the trainer's token weighting
    assert weighted == pytest.approx(full)


# ----------------------------------------------------------------------------- KL estimators


def test_kl_worked_values():
    # docs/algorithms.md §21: π_θ = 0.3, π_ref = 0.5
    lp, ref = t([math.log(0.3)]), t([math.log(0.5)])
    assert core.kl(lp, ref, "k1").item() == pytest.approx(-0.510826, abs=1e-6)
    assert core.kl(lp, ref, "k2").item() == pytest.approx(0.130471, abs=1e-6)
    assert core.kl(lp, ref, "k3").item() == pytest.approx(0.155841, abs=1e-6)


def test_kl_argument_order_is_pinned():
    lp, ref = t([math.log(0.3)]), t([math.log(0.5)])
    # swapped: π_θ = 0.5, π_ref = 0.3 → k1 = +0.510826, k3 = 0.6 − 1 + 0.510826 = 0.110826
    assert core.kl(ref, lp, "k1").item() == pytest.approx(0.510826, abs=1e-6)
    assert core.kl(ref, lp, "k3").item() == pytest.approx(0.110826, abs=1e-6)
    assert core.kl(ref, lp, "k3").item() != pytest.approx(core.kl(lp, ref, "k3").item(), abs=1e-3)


def test_k3_identity_row91_and_nonnegative():
    # SEED_SPEC row 91: r = logπ_θ − logπ_ref: k3 = e^{−r} + r − 1
    r = torch.linspace(-5, 5, 41, dtype=F64)
    lp = torch.full_like(r, -1.0)
    k3 = core.kl(lp, lp - r, "k3")
    assert torch.allclose(k3, (torch.exp(-r) + r - 1).clamp(max=10.0), rtol=1e-12, atol=1e-12)  # capped as verl
    wide = torch.tensor([-1e4, -50.0, -1e-7, 0.0, 1e-7, 50.0, 1e4], dtype=torch.float32)
    k3w = core.kl(torch.zeros_like(wide), wide, "k3")
    assert torch.isfinite(k3w).all() and (k3w >= 0).all()
    assert core.kl(t([0.0]), t([0.0]), "k3").item() == 0.0


def test_k3_is_capped_at_10_as_verl_low_var_kl():
    """verl's low_var_kl: d clamped to ±20, then the value to 10. Below the cap k3 and its gradient
    are the formula's; above it the value is 10 and the token's gradient 0."""
    lp = t([-1.0, -1.0, -1.0]).requires_grad_(True)
    ref = t([-1.0 + 2.0, -1.0 + 3.0, -1.0 + 30.0])  # d = 2 (k3 4.389), 3 (16.09), 30 (clamped to 20)
    k3 = core.kl(lp, ref, "k3")
    assert k3.tolist() == pytest.approx([math.exp(2) - 3, 10.0, 10.0], abs=1e-12)
    (g,) = torch.autograd.grad(k3.sum(), lp)
    assert g.tolist() == pytest.approx([-(math.exp(2) - 1), 0.0, 0.0], abs=1e-12)  # ∂k3/∂lp = −(e^d − 1)


def test_k3_is_accurate_near_zero():
    # expm1 form: e^d − 1 − d for d = 1e-4 is d²/2 + d³/6 + d⁴/24 to 1e-12 relative
    d = 1e-4
    exact = d * d / 2 + d**3 / 6 + d**4 / 24
    k3 = core.kl(t([0.0]), t([d]), "k3").item()
    assert k3 == pytest.approx(exact, rel=1e-10)


def test_k3_and_k1_monte_carlo_estimate_kl_row7():
    # SEED_SPEC row 7: on y ~ π_θ, E[k3] = KL(π_θ‖π_ref) and k3 ≥ 0 per token
    p = t([0.1, 0.2, 0.3, 0.4])
    q = t([0.25, 0.25, 0.25, 0.25])
    exact = float((p * (p / q).log()).sum())  # 0.106440
    assert exact == pytest.approx(0.106440, abs=1e-6)
    g = torch.Generator().manual_seed(1234)
    y = torch.multinomial(p, 200_000, replacement=True, generator=g)
    k3 = core.kl(p.log()[y], q.log()[y], "k3")
    k1 = core.kl(p.log()[y], q.log()[y], "k1")
    assert (k3 >= 0).all()
    se3 = float(k3.std()) / math.sqrt(len(y))
    se1 = float(k1.std()) / math.sqrt(len(y))
    assert abs(float(k3.mean()) - exact) < 4 * se3
    assert abs(float(k1.mean()) - exact) < 4 * se1
    assert se3 < se1  # k3's lower variance, the reason GRPO uses it


def test_unknown_kl_is_a_usage_error():
    with pytest.raises(UsageError, match="k3"):
        core.kl(t([0.0]), t([0.0]), "low_var")


# ----------------------------------------------------------------------------- entropy


def test_entropy_from_logits():
    logits = t(
        [
            [
                [0.0, 0.0, 0.0, 0.0],  # uniform → log 4
                [math.log(0.5), math.log(0.25), math.log(0.25), -math.inf],
            ]
        ]
    )  # [1, 2, 4]
    logits.requires_grad_(True)
    h = core.entropy_from_logits(logits)
    assert h.shape == (1, 2)
    assert h[0, 0].item() == pytest.approx(math.log(4))
    assert h[0, 1].item() == pytest.approx(1.5 * math.log(2))  # 1.039721
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()
    one_hot = t([[[0.0, -math.inf, -math.inf]]])
    assert core.entropy_from_logits(one_hot).item() == 0.0
    bf = core.entropy_from_logits(torch.zeros(1, 1, 8, dtype=torch.bfloat16))
    assert bf.dtype == torch.float32 and bf.item() == pytest.approx(math.log(8), rel=1e-6)


# ----------------------------------------------------------------------------- group statistics


def test_group_stats_both_conventions():
    r = t([1.0, 0.0, 0.0, 0.0])
    gi = torch.zeros(4, dtype=torch.long)
    mean, sd, size = core.group_stats(r, gi, "unbiased")
    assert mean.tolist() == [0.25] * 4 and size.tolist() == [4.0] * 4
    assert sd.tolist() == pytest.approx([0.5] * 4)  # √(0.75/3)
    _, sd_pop, _ = core.group_stats(r, gi, "population")
    assert sd_pop.tolist() == pytest.approx([math.sqrt(3) / 4] * 4)  # 0.433013


def test_group_stats_row10_noncontiguous_groups_and_singletons():
    # row 10: r = (0, 0, 1) population → mean .333, std .471; interleaved with another group
    r = t([0.0, 5.0, 0.0, 7.0, 1.0, 2.0])
    gi = torch.tensor([10, 3, 10, 3, 10, 99])
    mean, sd, size = core.group_stats(r, gi, "population")
    assert mean[[0, 2, 4]].tolist() == pytest.approx([1 / 3] * 3)
    assert sd[[0, 2, 4]].tolist() == pytest.approx([0.471405] * 3, abs=1e-6)
    assert mean[[1, 3]].tolist() == [6.0, 6.0] and sd[[1, 3]].tolist() == [1.0, 1.0]
    assert size.tolist() == [3.0, 2.0, 3.0, 2.0, 3.0, 1.0]
    for conv in core.STD_MODES:  # singleton: std 0, no NaN
        m1, s1, _ = core.group_stats(r, gi, conv)
        assert s1[5].item() == 0.0 and m1[5].item() == 2.0


def test_group_stats_degenerate_group_is_exact():
    for dtype in (torch.float32, F64):
        r = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7], dtype=dtype)
        gi = torch.tensor([0, 0, 0, 1, 1, 1])
        for conv in core.STD_MODES:
            mean, sd, _ = core.group_stats(r, gi, conv)
            assert (sd == 0).all()
            assert torch.equal(r - mean, torch.zeros_like(r))
    with pytest.raises(UsageError, match="population"):
        core.group_stats(r, gi, "biased")


# ----------------------------------------------------------------------------- PPO clip

RATIOS = [0.5, 0.9, 1.1, 1.5, 4.0]


@pytest.mark.parametrize(
    "adv,expected,clipped",
    [
        # docs/algorithms.md §21 (verl vanilla), ε = 0.2, c = 3
        (1.0, [-0.5, -0.9, -1.1, -1.2, -1.2], [False, False, False, True, True]),
        (-1.0, [0.8, 0.9, 1.1, 1.5, 3.0], [True, False, False, False, True]),  # 3.0 is the dual-clip cap
    ],
)
def test_ppo_clip_dual_clip_table(adv, expected, clipped):
    old = torch.zeros(1, 5, dtype=F64)
    lp = t([RATIOS]).log()
    A = torch.full((1, 5), adv, dtype=F64)
    loss, cm = core.ppo_clip_loss(lp, old, A, 0.2, 0.2, dual_clip=3.0)
    assert loss[0].tolist() == pytest.approx(expected)
    assert cm[0].tolist() == clipped


def test_ppo_clip_without_dual_clip_is_unbounded_for_negative_advantage():
    lp = t([RATIOS]).log()
    loss, cm = core.ppo_clip_loss(lp, torch.zeros_like(lp), -torch.ones_like(lp), 0.2, 0.2)
    assert loss[0].tolist() == pytest.approx([0.8, 0.9, 1.1, 1.5, 4.0])
    assert cm[0].tolist() == [True, False, False, False, False]
    with pytest.raises(UsageError):
        core.ppo_clip_loss(lp, torch.zeros_like(lp), -torch.ones_like(lp), 0.2, 0.2, dual_clip=0.9)


@pytest.mark.parametrize(
    "cell,ratio,adv,loss_value,flows",
    [
        # SEED_SPEC row 20, the L10 clip table (ε = 0.2): s1 = ρA, s2 = clip(ρ)A, loss = −min(s1, s2)
        ("lo-pos", 0.7, 1.0, -0.70, True),  # s1 .70 < s2 .80: unclipped, gradient flows
        ("lo-neg", 0.7, -1.0, 0.80, False),  # s1 −.70 vs s2 −.80: clipped, killed
        ("in-pos", 1.0, 1.0, -1.00, True),
        ("in-neg", 1.0, -1.0, 1.00, True),
        ("hi-pos", 1.4, 1.0, -1.20, False),  # s1 1.40 vs s2 1.20: clipped, killed
        ("hi-neg", 1.4, -1.0, 1.40, True),  # s1 −1.40 vs s2 −1.20: unclipped, flows
    ],
)
def test_clip_table_row20(cell, ratio, adv, loss_value, flows):
    lp = t([[math.log(ratio)]]).requires_grad_(True)
    loss, cm = core.ppo_clip_loss(lp, torch.zeros(1, 1, dtype=F64), t([[adv]]), 0.2, 0.2)
    assert loss.item() == pytest.approx(loss_value)
    loss.sum().backward()
    # d(−ρA)/d log ρ = −ρA where the gradient flows, 0 where the clip kills it
    assert lp.grad.item() == pytest.approx(-ratio * adv if flows else 0.0)
    assert cm.item() == (not flows)


def test_asymmetric_clip_higher():
    lp = t([[1.25, 1.30, 0.75]]).log()
    loss, cm = core.ppo_clip_loss(lp, torch.zeros_like(lp), torch.ones_like(lp), 0.2, 0.28)
    assert loss[0].tolist() == pytest.approx([-1.25, -1.28, -0.75])
    assert cm[0].tolist() == [False, True, False]


def test_ratio_metrics():
    lp = t([[0.5, 1.0, 2.0, 50.0]]).log()  # the 4th token is masked out
    mask = t([[1.0, 1.0, 1.0, 0.0]])
    A = t([[-1.0, 1.0, 1.0, 1.0]])
    old = torch.zeros_like(lp)
    _, cm = core.ppo_clip_loss(lp, old, A, 0.2, 0.2)  # clipped: tokens 0 and 2 (and masked 3)
    m = core.ratio_metrics(lp, old, mask, cm)
    assert set(m) == {"clip/frac", "ratio/mean", "ratio/max"}
    assert m["clip/frac"].item() == pytest.approx(2 / 3)
    assert m["ratio/mean"].item() == pytest.approx(3.5 / 3)
    assert m["ratio/max"].item() == pytest.approx(2.0)
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())
