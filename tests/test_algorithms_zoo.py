"""The algorithm zoo (REINFORCE … DPPO), part 1: registry, configs, advantages and baselines
(docs/algorithms.md §21, SEED_SPEC Part C rows 10, 25, 27, 29), DAPO's switches. Part 2 is
test_algorithms_losses.py. Pure tensors, float64, CPU."""

import dataclasses
import itertools
import math
import statistics

import pytest
import torch

from posttrain import UsageError, algorithms
from posttrain.algorithms import (
    cispo,
    core,
    dapo,
    dppo,
    dr_grpo,
    grpo,
    gspo,
    maxrl,
    mgpo,
    reinforce,
    reinforce_pp,
    rloo,
)
from posttrain.config import build
from posttrain.framework.batch import RolloutBatch

from zoo_util import ALL, F64, GROUP_BASELINED, ZOO, _batch, _grad, _random_batch, adv, cfg_of, t


def test_registry_holds_every_algorithm():
    for name, mod in ALL.items():
        assert algorithms.get(name) is mod and algorithms.ALGORITHMS[name] is mod
        assert callable(mod.advantages) and callable(mod.loss) and callable(mod.needs_reference)
        assert mod.__doc__.strip().splitlines()[0]  # the one-line difference
        assert "Deviations from the paper" in mod.__doc__
    assert set(algorithms.ALGORITHMS) == set(ALL) | {"ppo"}  # PPO (critic) is tested in test_ppo.py
    with pytest.raises(UsageError, match=r"did you mean 'dapo'"):
        algorithms.get("dpao")
    with pytest.raises(UsageError, match=r"did you mean 'reinforce_pp'"):
        algorithms.get("reinforce_ppp")


def test_default_aggregation_is_the_papers():
    expected = {
        "reinforce": "seq-mean-token-sum",
        "rloo": "seq-mean-token-sum",
        "reinforce_pp": "token-mean",
        "dr_grpo": "seq-mean-token-sum-norm",
        "dapo": "token-mean",
        "gspo": "seq-mean-token-mean",
        "cispo": "token-mean",
        "maxrl": "seq-mean-token-mean",
        "mgpo": "seq-mean-token-mean",
        "dppo": "token-mean",
    }
    assert {n: m.Config().aggregation for n, m in ZOO.items()} == expected


def test_paper_defaults():
    assert (dapo.Config().eps_low, dapo.Config().eps_high, dapo.Config().kl_coef) == (0.2, 0.28, 0.0)
    assert (gspo.Config().eps_low, gspo.Config().eps_high, gspo.Config().variant) == (3e-4, 4e-4, "sequence")
    assert (dr_grpo.Config().scale_by_std, dr_grpo.Config().kl_coef) == (False, 0.0)
    assert (cispo.Config().eps_high, cispo.Config().eps_low) == (4.0, None)  # cap 5 (ScaleRL), no floor
    assert dppo.deltas(dppo.Config()) == (0.15, 0.15) and dppo.deltas(dppo.Config(divergence="kl")) == (0.05, 0.05)
    assert dppo.deltas(dppo.Config(divergence="kl", delta_high=0.1)) == (0.05, 0.1)
    assert reinforce_pp.reward_kl(reinforce_pp.Config()) == 0.01
    assert reinforce_pp.reward_kl(reinforce_pp.Config(baseline=True)) == 0.0
    assert (reinforce_pp.Config().eps_low, reinforce_pp.Config().kl_estimator) == (0.2, "k2")
    assert reinforce.Config().baseline == "none" and maxrl.Config().scale_by_std is False


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_aggregation_is_accepted_and_unknown_ones_rejected(name):
    mod = ZOO[name]
    for mode in core.AGGREGATIONS:
        assert mod.Config(aggregation=mode).aggregation == mode
    for bad in ({"aggregation": "token_mean"}, {"kl_estimator": "k4"}, {"kl_coef": -1.0}):
        with pytest.raises(UsageError):
            mod.Config(**bad)
    with pytest.raises(UsageError):  # replace re-validates
        dataclasses.replace(mod.Config(), aggregation="mean")
    # the run config builds it from `algo.*` keys (type hints must resolve)
    assert build(mod.Config, {"aggregation": "token-mean", "kl_coef": 0.5}).kl_coef == 0.5


def test_algorithm_specific_validation():
    bad = [
        (reinforce, {"baseline": "loo"}),
        (gspo, {"variant": "seq"}),
        (dppo, {"divergence": "js"}),
        (dppo, {"delta_low": -0.1}),
        (dppo, {"ratio_cap": 0.0}),
        (dapo, {"overlong_buffer": 20}),
        (dapo, {"overlong_buffer": 20, "max_len": 10}),
        (dapo, {"overlong_penalty_factor": -1.0}),
        (reinforce_pp, {"gamma": 1.5}),
        (reinforce_pp, {"reward_kl_coef": -0.1}),
        (mgpo, {"maxent_lambda": -1.0}),
        (cispo, {"eps_high": -1.0}),
        (cispo, {"std": "sample"}),
        (maxrl, {"dual_clip": 1.0}),
    ]
    for mod, kw in bad:
        with pytest.raises(UsageError):
            mod.Config(**kw)
    assert dapo.Config(overlong_buffer=20, max_len=100).max_len == 100
    assert build(dppo.Config, {"divergence": "kl", "delta_low": 0.02}).delta_low == 0.02
    assert build(cispo.Config, {"eps_low": 0.2}).eps_low == 0.2


def test_needs_reference():
    defaults = {n: m.needs_reference(m.Config()) for n, m in ZOO.items()}
    assert defaults == {
        "reinforce": False,
        "rloo": False,
        "reinforce_pp": True,
        "dr_grpo": False,
        "dapo": False,
        "gspo": False,
        "cispo": False,
        "maxrl": False,
        "mgpo": True,
        "dppo": False,
    }
    assert reinforce_pp.needs_reference(reinforce_pp.Config(baseline=True)) is False
    assert reinforce_pp.needs_reference(reinforce_pp.Config(baseline=True, kl_coef=1e-4)) is True
    for mod in ZOO.values():
        assert mod.needs_reference(mod.Config(kl_coef=0.1)) is True


# ============================================================================= core additions


def test_masked_whiten_worked_value_and_edges():
    # §15.3 GAE: A = [0.46575, 0.385, 0.3] whitened with the unbiased variance
    x = t([[0.46575, 0.385, 0.3, 99.0]])
    m = t([[1.0, 1.0, 1.0, 0.0]])
    w = core.masked_whiten(x, m)
    assert w[0, :3].tolist() == pytest.approx([0.991344, 0.017092, -1.008436], abs=1e-5)
    assert w[0, 3].item() == 0.0
    pop = statistics.pstdev([0.46575, 0.385, 0.3])
    mean = statistics.fmean([0.46575, 0.385, 0.3])
    assert core.masked_whiten(x, m, std="population", eps=0.0)[0, 0].item() == pytest.approx((0.46575 - mean) / pop)
    assert core.masked_whiten(x, m, scale=False)[0, :3].tolist() == pytest.approx(
        [0.46575 - mean, 0.385 - mean, 0.3 - mean]
    )
    same = t([[0.1, 0.1, 0.1, 7.0]])
    assert core.masked_whiten(same, m).abs().sum().item() == 0.0  # exactly 0, not 1e-9
    assert core.masked_whiten(x, torch.zeros_like(m)).abs().sum().item() == 0.0
    with pytest.raises(UsageError):
        core.masked_whiten(x, m, std="sample")


def test_bernoulli_kl_worked_values():
    kl = lambda p, q: core.bernoulli_kl(t(p), t(q)).item()  # noqa: E731
    assert kl(0.3, 0.5) == pytest.approx(0.082283, abs=1e-6)  # DPPO §15.3
    assert kl(0.25, 0.5) == pytest.approx(0.130812, abs=1e-6)  # MGPO D_ME(0.25)
    assert kl(0.5, 0.5) == 0.0
    assert kl(0.0, 0.3) == pytest.approx(-math.log(0.7)) and kl(1.0, 0.3) == pytest.approx(-math.log(0.3))
    assert kl(0.0, 0.5) == pytest.approx(math.log(2)) and kl(1.0, 0.5) == pytest.approx(math.log(2))


def test_finish_loss_reproduces_grpo_tail():
    lp, old, ref, A, ent, mask = _random_batch(3)
    cfg = grpo.Config(entropy_coef=0.02, kl_estimator="k2")
    norm = core.batch_norm(mask, 16)
    loss, m = grpo.loss(lp, _batch(old, A, mask, ref), cfg, norm, ent)
    pg, _ = core.ppo_clip_loss(lp, old, A, cfg.eps_low, cfg.eps_high)
    loss2, m2 = core.finish_loss(pg, lp, _batch(old, A, mask, ref), cfg, norm, ent, "x")
    assert loss2.item() == pytest.approx(loss.item(), rel=1e-14)
    for k in m2:
        assert m2[k].item() == pytest.approx(m[k].item(), rel=1e-14)
    with pytest.raises(UsageError, match="x: kl_coef"):
        core.finish_loss(pg, lp, _batch(old, A, mask), cfg, norm, ent, "x")


# ============================================================================= advantages: worked values


def test_group_advantages_worked_1000():
    # §15.3: r = [1, 0, 0, 0], μ = 0.25, unbiased σ = 0.5
    r = [1, 0, 0, 0]
    assert adv(dr_grpo, r).tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert adv(rloo, r).tolist() == pytest.approx([1, -1 / 3, -1 / 3, -1 / 3], abs=1e-12)
    assert adv(maxrl, r).tolist() == [3.0, -1.0, -1.0, -1.0]  # exact: no ε in p̂
    assert adv(mgpo, r, maxent_lambda=1.0).tolist() == pytest.approx([1.316071, -0.43869, -0.43869, -0.43869], abs=1e-6)
    assert mgpo.trainability(t(0.25), 1.0).item() == pytest.approx(0.877383, abs=1e-6)
    assert adv(reinforce, r, baseline="mean").tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert adv(reinforce, r).tolist() == [1.0, 0.0, 0.0, 0.0]  # no baseline: A = R
    g = [1.499997, -0.499999, -0.499999, -0.499999]  # GRPO's, for the GRPO-advantage family
    for mod in (dapo, gspo, cispo, dppo):
        assert adv(mod, r).tolist() == pytest.approx(g, abs=1e-6)


def test_group_advantages_worked_1101():
    r = [1, 1, 0, 1]
    assert adv(rloo, r).tolist() == pytest.approx([1 / 3, 1 / 3, -1, 1 / 3], abs=1e-12)
    assert adv(maxrl, r).tolist() == pytest.approx([1 / 3, 1 / 3, -1, 1 / 3], abs=1e-12)
    assert adv(dr_grpo, r).tolist() == pytest.approx([0.25, 0.25, -0.75, 0.25])


def test_row10_rloo_and_dr_grpo():
    # SEED row 10: r = (0, 0, 1): RLOO (−.5, −.5, +1); Dr.GRPO (−.33, −.33, +.67)
    a = adv(rloo, [0, 0, 1]).tolist()
    assert a == pytest.approx([-0.5, -0.5, 1.0], abs=1e-12)
    d = adv(dr_grpo, [0, 0, 1], std="population").tolist()
    assert [round(x, 2) for x in d] == [-0.33, -0.33, 0.67]
    assert d == pytest.approx([-1 / 3, -1 / 3, 2 / 3])


@pytest.mark.parametrize("K, factor", [(2, 2.0), (4, 1.333), (8, 1.143)])
def test_row25_rloo_is_k_over_k_minus_1_times_mean_baseline(K, factor):
    g = torch.Generator().manual_seed(K)
    r = torch.rand(3 * K, dtype=F64, generator=g)  # three groups, non-binary rewards
    gi = torch.arange(3).repeat_interleave(K)
    a_loo = rloo.advantages(r, gi, rloo.Config())
    a_mean = dr_grpo.advantages(r, gi, dr_grpo.Config())  # R − μ_G (no /std)
    assert torch.allclose(a_loo, a_mean * K / (K - 1), rtol=1e-12, atol=1e-15)
    assert round(K / (K - 1), 3) == factor
    assert (a_loo / a_mean).tolist() == pytest.approx([K / (K - 1)] * (3 * K), rel=1e-10)
    # the leave-one-out definition itself, by a loop
    for i in range(3 * K):
        others = [r[j].item() for j in range(3 * K) if gi[j] == gi[i] and j != i]
        assert a_loo[i].item() == pytest.approx(r[i].item() - sum(others) / len(others), abs=1e-12)


def test_rloo_singleton_groups_get_zero():
    # documented: a singleton has no other sample to compare with (verl rloo_vectorized)
    a = adv(rloo, [0.7, 1.0, 0.0, 5.0], [0, 1, 1, 2]).tolist()
    assert a == [0.0, 1.0, -1.0, 0.0]


def test_maxrl_zero_pass_rate_and_std_variant():
    a = adv(maxrl, [0, 0, 0, 1, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1]).tolist()
    assert a[:4] == pytest.approx([-1, -1, -1, 3]) and a[4:] == pytest.approx([-1, 1 / 3, 1 / 3, 1 / 3])
    assert adv(maxrl, [0, 0, 0]).tolist() == [0.0, 0.0, 0.0]  # p̂ = 0: no gradient
    # scale_by_std=True: the reference repo's misc variant, GRPO advantage / p̂
    r = [1, 0, 0, 0]
    assert adv(maxrl, r, scale_by_std=True).tolist() == pytest.approx([v / 0.25 for v in adv(grpo, r).tolist()])


def test_mgpo_weight_properties():
    r, gi = t([1, 0, 1, 0, 1, 1, 1, 0]), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    assert torch.equal(mgpo.advantages(r, gi, mgpo.Config(maxent_lambda=0.0)), grpo.advantages(r, gi, grpo.Config()))
    a = mgpo.advantages(r, gi, mgpo.Config(maxent_lambda=2.0))
    g = grpo.advantages(r, gi, grpo.Config())
    assert torch.equal(a[:4], g[:4])  # p̂ = ½: weight exactly 1
    w = math.exp(-2.0 * (0.75 * math.log(1.5) + 0.25 * math.log(0.5)))
    assert a[4:].tolist() == pytest.approx((w * g[4:]).tolist(), rel=1e-12)
    p = t([0.0, 0.1, 0.5, 0.9, 1.0])
    w = mgpo.trainability(p, 3.0)
    assert w[0].item() == pytest.approx(2**-3) and w[4].item() == pytest.approx(2**-3) and w[2].item() == 1.0
    assert w[1].item() == pytest.approx(w[3].item()) and (w <= 1).all() and (w >= 2**-3 - 1e-12).all()


# ============================================================================= degenerate groups


@pytest.mark.parametrize("std", ["unbiased", "population"])
@pytest.mark.parametrize("value", [0.0, 0.7, 1.0])
@pytest.mark.parametrize("name", sorted(ALL))
def test_all_equal_rewards_give_zero_advantage(name, value, std):
    mod = ALL[name]
    mask = t([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 1, 1], [1, 1, 1]])
    lp = -torch.rand(6, 3, dtype=F64, generator=torch.Generator().manual_seed(0)) * mask
    batch = RolloutBatch(loss_mask=mask, old_logprobs=lp, ref_logprobs=lp.clone())
    gi = torch.tensor([0, 0, 0, 1, 1, 2])  # group 2 is a singleton
    r = torch.full((6,), value, dtype=F64)
    a = mod.advantages(r, gi, cfg_of(mod, std=std), batch=batch)
    assert torch.isfinite(a).all()
    if name == "reinforce":  # baseline "none" (default): A = R, by design
        assert a.tolist() == r.tolist()
        a = mod.advantages(r, gi, mod.Config(baseline="mean"), batch=batch)
    assert a.abs().sum().item() == 0.0  # exactly
    if name == "reinforce_pp":
        assert a.shape == mask.shape
        b = mod.advantages(r, gi, reinforce_pp.Config(baseline=True, std=std), batch=batch)
        assert b.abs().sum().item() == 0.0


@pytest.mark.parametrize("std", ["unbiased", "population"])
@pytest.mark.parametrize("name", sorted(GROUP_BASELINED))
def test_degenerate_and_singleton_groups_in_a_mixed_batch(name, std):
    mod = ALL[name]
    rewards = t([0.1, 0.1, 0.1, 1.0, 1.0, 0.0, 0.0, 0.3, 1.0, 0.0])
    gi = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3, 4, 4])  # 0: all .1, 1: all 1, 2: all 0, 3: singleton
    mask = torch.ones(10, 4, dtype=F64)
    batch = RolloutBatch(loss_mask=mask, old_logprobs=-mask, ref_logprobs=-mask)
    for adv_eps in (1e-6, 0.0):
        cfg = cfg_of(mod, std=std, adv_eps=adv_eps, **GROUP_BASELINED[name])
        a = mod.advantages(rewards, gi, cfg, batch=batch).tolist()
        assert a[:8] == [0.0] * 8  # exactly, not approximately
        assert all(math.isfinite(v) for v in a) and a[8] > 0 > a[9]


def test_reinforce_pp_baseline_degenerate_groups_share_the_whitening_shift():
    # documented: in a mixed batch the whitening shift gives equal-reward groups one common value
    mask = torch.ones(6, 3, dtype=F64)
    batch = RolloutBatch(loss_mask=mask, old_logprobs=-mask, ref_logprobs=-mask)
    a = reinforce_pp.advantages(
        t([1, 1, 1, 0, 0, 1]), torch.tensor([0, 0, 1, 1, 2, 3]), reinforce_pp.Config(baseline=True), batch=batch
    )
    assert torch.isfinite(a).all()
    degenerate = torch.cat([a[:2], a[5:]]).flatten()
    assert (degenerate == degenerate[0]).all() and degenerate[0].item() == pytest.approx(0.0, abs=1e-12)
    assert a[2, 0] > 0 > a[3, 0]


@pytest.mark.parametrize("p, K", [(0.9, 4), (0.5, 3), (0.7, 2), (0.2, 8)])
def test_row27_degenerate_fraction_by_enumeration(p, K):
    # SEED row 27: P(group degenerate) = p^K + (1−p)^K, by enumerating all 2^K outcomes as groups
    outcomes = list(itertools.product([0.0, 1.0], repeat=K))
    r = t([x for o in outcomes for x in o])
    gi = torch.arange(len(outcomes)).repeat_interleave(K)
    deg = dapo.degenerate(r, gi).view(len(outcomes), K)
    assert (deg.all(1) == deg.any(1)).all()  # a property of the whole group
    a = dapo.advantages(r, gi, dapo.Config()).view(len(outcomes), K)
    assert torch.equal(a.abs().sum(1) == 0, deg[:, 0])  # zero advantage ⇔ degenerate
    prob = sum(math.prod(p if x else 1 - p for x in o) for o, d in zip(outcomes, deg[:, 0].tolist()) if d)
    assert prob == pytest.approx(p**K + (1 - p) ** K, abs=1e-12)
    if (p, K) == (0.9, 4):
        assert round(prob, 4) == 0.6562 and round(prob, 2) == 0.66


# ============================================================================= DAPO


def test_dapo_overlong_penalty_worked_values_row29():
    # §15.3 (100/20): lengths 50, 80, 90, 100, 110 → 0, 0, −0.5, −1.0, −1; TRL's tests: 50, 90, 110
    pen = dapo.overlong_penalty(t([50, 80, 90, 100, 110]), 100, 20).tolist()
    assert pen == pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0]) and pen[0] == 0.0
    # SEED row 29: −max(0, min(1, (L − L_thr)/(L_max − L_thr))) over a grid
    L_max, L_thr = 64, 40
    for L in range(0, 80):
        expected = -max(0.0, min(1.0, (L - L_thr) / (L_max - L_thr)))
        assert dapo.overlong_penalty(t([L]), L_max, L_max - L_thr).item() == pytest.approx(expected, abs=1e-15)


def test_dapo_overlong_shaping_and_dynamic_sampling():
    # group 0: both correct, lengths 50 and 90 → shaped [1, 0.5]; group 1: [1, 0], lengths 90, 50 → [0.5, 0]
    lengths = [50, 90, 90, 50]
    mask = torch.zeros(4, 100, dtype=F64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    batch = RolloutBatch(loss_mask=mask)
    r, gi = t([1, 1, 1, 0]), torch.tensor([0, 0, 1, 1])
    on = dict(overlong_buffer=20, max_len=100)
    s = 0.25 / math.sqrt(0.125)  # ±0.25 / unbiased σ of two values 0.5 apart
    a = dapo.advantages(r, gi, dapo.Config(dynamic_sampling=False, **on), batch=batch).tolist()
    assert a == pytest.approx([s, -s, s, -s], abs=1e-5)
    a = dapo.advantages(r, gi, dapo.Config(**on), batch=batch).tolist()
    assert a[:2] == [0.0, 0.0] and a[2:] == pytest.approx([s, -s], abs=1e-5)  # raw rewards all 1: skipped
    half = dapo.advantages(r, gi, dapo.Config(overlong_penalty_factor=0.5, dynamic_sampling=False, **on), batch=batch)
    assert half[0].item() == pytest.approx(s, abs=1e-5)  # shaped [1, .75]: same z-score
    with pytest.raises(UsageError, match="batch"):
        dapo.advantages(r, gi, dapo.Config(**on))
    assert dapo.advantages(r, gi, dapo.Config()).tolist()[:2] == [0.0, 0.0]  # no shaping: no batch needed


def test_dapo_clip_higher():
    mask = torch.ones(1, 1, dtype=F64)
    norm = core.batch_norm(mask)
    for ratio, A, grpo_loss, dapo_loss in [(1.25, 1.0, -1.2, -1.25), (1.3, 1.0, -1.2, -1.28), (0.7, -1.0, 0.8, 0.8)]:
        lp = t([[math.log(ratio)]])
        b = _batch(torch.zeros_like(lp), t([[A]]), mask)
        assert grpo.loss(lp, b, grpo.Config(kl_coef=0.0), norm)[0].item() == pytest.approx(grpo_loss)
        assert dapo.loss(lp, b, dapo.Config(), norm)[0].item() == pytest.approx(dapo_loss)


def test_dapo_mask_truncated():
    lp, old, ref, A, ent, mask = _random_batch(4, B=5)
    trunc = torch.tensor([False, True, False, False, True])
    norm = core.batch_norm(mask, 16)
    cfg = dapo.Config(mask_truncated=True)
    loss, m, g = _grad(dapo, cfg, lp, _batch(old, A, mask, ref, truncated=trunc), norm, ent)
    kept = mask * (~trunc).unsqueeze(-1).to(F64)
    loss_ref, _, g_ref = _grad(grpo, cfg, lp, _batch(old, A, kept, ref), norm, ent)
    assert loss.item() == pytest.approx(loss_ref.item(), rel=1e-14) and torch.equal(g, g_ref)
    assert g[trunc].abs().sum() == 0 and g[~trunc].abs().sum() > 0
    _, _, g_off = _grad(dapo, dapo.Config(), lp, _batch(old, A, mask, ref, truncated=trunc), norm, ent)
    assert torch.allclose(g_off[~trunc], g[~trunc], rtol=0, atol=0)  # other rows: same weight (whole-batch norm)
    assert m["dapo/truncated_token_frac"].item() == pytest.approx(float((mask - kept).sum() / mask.sum()))
    # the flag without the key, or the key without the flag: plain GRPO-with-DAPO-config loss
    assert (
        dapo.loss(lp, _batch(old, A, mask, ref), cfg, norm)[0].item()
        == grpo.loss(lp, _batch(old, A, mask, ref), cfg, norm)[0].item()
    )
