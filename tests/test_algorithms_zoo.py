"""The algorithm zoo (REINFORCE … DPPO): worked values (ALGORITHMS.md §15.3, SEED_SPEC Part C
rows 10, 25, 27, 29, 33, 34), equivalences between algorithms, and the invariances every
loss must keep (micro-batches, masks, degenerate groups). Pure tensors, float64, CPU."""

import dataclasses
import itertools
import math
import statistics

import pytest
import torch

from posttrain import UsageError
from posttrain import algorithms
from posttrain.algorithms import (cispo, core, dapo, dppo, dr_grpo, grpo, gspo, maxrl, mgpo, reinforce,
                                  reinforce_pp, rloo)
from posttrain.config import build

F64 = torch.float64
ZOO = {"reinforce": reinforce, "rloo": rloo, "reinforce_pp": reinforce_pp, "dr_grpo": dr_grpo, "dapo": dapo,
       "gspo": gspo, "cispo": cispo, "maxrl": maxrl, "mgpo": mgpo, "dppo": dppo}
# estimators whose baseline is the prompt's own group: a group of equal rewards gets exactly 0
GROUP_BASELINED = {"reinforce": {"baseline": "mean"}, "rloo": {}, "dr_grpo": {}, "dapo": {}, "gspo": {},
                   "cispo": {}, "maxrl": {}, "mgpo": {}, "dppo": {}, "grpo": {}}
ALL = {**ZOO, "grpo": grpo}


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def cfg_of(mod, **kw):
    fields = {f.name for f in dataclasses.fields(mod.Config)}
    return mod.Config(**{k: v for k, v in kw.items() if k in fields})


def adv(mod, rewards, groups=None, batch=None, **kw):
    r = t(rewards)
    gi = torch.zeros(len(rewards), dtype=torch.long) if groups is None else torch.tensor(groups)
    if batch is None:
        mask = torch.ones(len(rewards), 3, dtype=F64)
        batch = {"loss_mask": mask, "old_logprobs": -mask, "ref_logprobs": -mask}
    return mod.advantages(r, gi, mod.Config(**kw), batch=batch)


def _batch(old, A, mask, ref=None, **extra):
    b = {"loss_mask": mask, "old_logprobs": old, "advantages": A, **extra}
    if ref is not None:
        b["ref_logprobs"] = ref
    return b


def _random_batch(seed, B=6, T=7):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, T, generator=g) < 0.7).to(F64)
    mask[:, 0] = 0.0                                               # prompt position
    mask[2] = 0.0                                                  # a fully masked row
    old = -torch.rand(B, T, dtype=F64, generator=g) * 3 * mask - 0.05 * mask
    lp = (old + 0.3 * torch.randn(B, T, dtype=F64, generator=g)).clamp_max(-1e-3) * mask
    ref = (old + 0.2 * torch.randn(B, T, dtype=F64, generator=g)) * mask
    A = core.broadcast(torch.randn(B, dtype=F64, generator=g), mask)
    ent = torch.rand(B, T, dtype=F64, generator=g) * 2 * mask
    return lp, old, ref, A, ent, mask


def _grad(mod, cfg, lp, batch, norm, entropy=None):
    lp = lp.clone().requires_grad_(True)
    loss, m = mod.loss(lp, batch, cfg, norm, entropy)
    (g,) = torch.autograd.grad(loss, lp)
    return loss.detach(), m, g


# ============================================================================= registry and configs

def test_registry_holds_every_algorithm():
    for name, mod in ALL.items():
        assert algorithms.get(name) is mod and algorithms.ALGORITHMS[name] is mod
        assert callable(mod.advantages) and callable(mod.loss) and callable(mod.needs_reference)
        assert mod.__doc__.strip().splitlines()[0]                 # the one-line difference
        assert "Deviations from the paper" in mod.__doc__
    assert set(algorithms.ALGORITHMS) == set(ALL) | {"ppo"}   # PPO (critic) is tested in test_ppo.py
    with pytest.raises(UsageError, match=r"did you mean 'dapo'"):
        algorithms.get("dpao")
    with pytest.raises(UsageError, match=r"did you mean 'reinforce_pp'"):
        algorithms.get("reinforce_ppp")


def test_default_aggregation_is_the_papers():
    expected = {"reinforce": "seq-mean-token-sum", "rloo": "seq-mean-token-sum", "reinforce_pp": "token-mean",
                "dr_grpo": "seq-mean-token-sum-norm", "dapo": "token-mean", "gspo": "seq-mean-token-mean",
                "cispo": "token-mean", "maxrl": "seq-mean-token-mean", "mgpo": "seq-mean-token-mean",
                "dppo": "token-mean"}
    assert {n: m.Config().aggregation for n, m in ZOO.items()} == expected


def test_paper_defaults():
    assert (dapo.Config().eps_low, dapo.Config().eps_high, dapo.Config().kl_coef) == (0.2, 0.28, 0.0)
    assert (gspo.Config().eps_low, gspo.Config().eps_high, gspo.Config().variant) == (3e-4, 4e-4, "sequence")
    assert (dr_grpo.Config().scale_by_std, dr_grpo.Config().kl_coef) == (False, 0.0)
    assert (cispo.Config().eps_high, cispo.Config().eps_low) == (4.0, None)   # cap 5 (ScaleRL), no floor
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
    with pytest.raises(UsageError):                                # replace re-validates
        dataclasses.replace(mod.Config(), aggregation="mean")
    # the run config builds it from `algo.*` keys (type hints must resolve)
    assert build(mod.Config, {"aggregation": "token-mean", "kl_coef": 0.5}).kl_coef == 0.5


def test_algorithm_specific_validation():
    bad = [(reinforce, {"baseline": "loo"}), (gspo, {"variant": "seq"}), (dppo, {"divergence": "js"}),
           (dppo, {"delta_low": -0.1}), (dppo, {"ratio_cap": 0.0}), (dapo, {"overlong_buffer": 20}),
           (dapo, {"overlong_buffer": 20, "max_len": 10}), (dapo, {"overlong_penalty_factor": -1.0}),
           (reinforce_pp, {"gamma": 1.5}), (reinforce_pp, {"reward_kl_coef": -0.1}), (mgpo, {"maxent_lambda": -1.0}),
           (cispo, {"eps_high": -1.0}), (cispo, {"std": "sample"}), (maxrl, {"dual_clip": 1.0})]
    for mod, kw in bad:
        with pytest.raises(UsageError):
            mod.Config(**kw)
    assert dapo.Config(overlong_buffer=20, max_len=100).max_len == 100
    assert build(dppo.Config, {"divergence": "kl", "delta_low": 0.02}).delta_low == 0.02
    assert build(cispo.Config, {"eps_low": 0.2}).eps_low == 0.2


def test_needs_reference():
    defaults = {n: m.needs_reference(m.Config()) for n, m in ZOO.items()}
    assert defaults == {"reinforce": False, "rloo": False, "reinforce_pp": True, "dr_grpo": False, "dapo": False,
                        "gspo": False, "cispo": False, "maxrl": False, "mgpo": True, "dppo": False}
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
    assert core.masked_whiten(x, m, scale=False)[0, :3].tolist() == pytest.approx([0.46575 - mean, 0.385 - mean, 0.3 - mean])
    same = t([[0.1, 0.1, 0.1, 7.0]])
    assert core.masked_whiten(same, m).abs().sum().item() == 0.0  # exactly 0, not 1e-9
    assert core.masked_whiten(x, torch.zeros_like(m)).abs().sum().item() == 0.0
    with pytest.raises(UsageError):
        core.masked_whiten(x, m, std="sample")


def test_bernoulli_kl_worked_values():
    kl = lambda p, q: core.bernoulli_kl(t(p), t(q)).item()  # noqa: E731
    assert kl(0.3, 0.5) == pytest.approx(0.082283, abs=1e-6)      # DPPO §15.3
    assert kl(0.25, 0.5) == pytest.approx(0.130812, abs=1e-6)     # MGPO D_ME(0.25)
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
    assert adv(maxrl, r).tolist() == [3.0, -1.0, -1.0, -1.0]      # exact: no ε in p̂
    assert adv(mgpo, r, maxent_lambda=1.0).tolist() == pytest.approx([1.316071, -0.43869, -0.43869, -0.43869], abs=1e-6)
    assert mgpo.trainability(t(0.25), 1.0).item() == pytest.approx(0.877383, abs=1e-6)
    assert adv(reinforce, r, baseline="mean").tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert adv(reinforce, r).tolist() == [1.0, 0.0, 0.0, 0.0]    # no baseline: A = R
    g = [1.499997, -0.499999, -0.499999, -0.499999]                 # GRPO's, for the GRPO-advantage family
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
    r = torch.rand(3 * K, dtype=F64, generator=g)                  # three groups, non-binary rewards
    gi = torch.arange(3).repeat_interleave(K)
    a_loo = rloo.advantages(r, gi, rloo.Config())
    a_mean = dr_grpo.advantages(r, gi, dr_grpo.Config())           # R − μ_G (no /std)
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
    assert adv(maxrl, [0, 0, 0]).tolist() == [0.0, 0.0, 0.0]       # p̂ = 0: no gradient
    # scale_by_std=True: the reference repo's misc variant, GRPO advantage / p̂
    r = [1, 0, 0, 0]
    assert adv(maxrl, r, scale_by_std=True).tolist() == pytest.approx([v / 0.25 for v in adv(grpo, r).tolist()])


def test_mgpo_weight_properties():
    r, gi = t([1, 0, 1, 0, 1, 1, 1, 0]), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    assert torch.equal(mgpo.advantages(r, gi, mgpo.Config(maxent_lambda=0.0)), grpo.advantages(r, gi, grpo.Config()))
    a = mgpo.advantages(r, gi, mgpo.Config(maxent_lambda=2.0))
    g = grpo.advantages(r, gi, grpo.Config())
    assert torch.equal(a[:4], g[:4])                               # p̂ = ½: weight exactly 1
    w = math.exp(-2.0 * (0.75 * math.log(1.5) + 0.25 * math.log(0.5)))
    assert a[4:].tolist() == pytest.approx((w * g[4:]).tolist(), rel=1e-12)
    p = t([0.0, 0.1, 0.5, 0.9, 1.0])
    w = mgpo.trainability(p, 3.0)
    assert w[0].item() == pytest.approx(2 ** -3) and w[4].item() == pytest.approx(2 ** -3) and w[2].item() == 1.0
    assert w[1].item() == pytest.approx(w[3].item()) and (w <= 1).all() and (w >= 2 ** -3 - 1e-12).all()


# ============================================================================= degenerate groups

@pytest.mark.parametrize("std", ["unbiased", "population"])
@pytest.mark.parametrize("value", [0.0, 0.7, 1.0])
@pytest.mark.parametrize("name", sorted(ALL))
def test_all_equal_rewards_give_zero_advantage(name, value, std):
    mod = ALL[name]
    mask = t([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 1, 1], [1, 1, 1]])
    lp = -torch.rand(6, 3, dtype=F64, generator=torch.Generator().manual_seed(0)) * mask
    batch = {"loss_mask": mask, "old_logprobs": lp, "ref_logprobs": lp.clone()}
    gi = torch.tensor([0, 0, 0, 1, 1, 2])                          # group 2 is a singleton
    r = torch.full((6,), value, dtype=F64)
    a = mod.advantages(r, gi, cfg_of(mod, std=std), batch=batch)
    assert torch.isfinite(a).all()
    if name == "reinforce":                                        # baseline "none" (default): A = R, by design
        assert a.tolist() == r.tolist()
        a = mod.advantages(r, gi, mod.Config(baseline="mean"), batch=batch)
    assert a.abs().sum().item() == 0.0                             # exactly
    if name == "reinforce_pp":
        assert a.shape == mask.shape
        b = mod.advantages(r, gi, reinforce_pp.Config(baseline=True, std=std), batch=batch)
        assert b.abs().sum().item() == 0.0


@pytest.mark.parametrize("std", ["unbiased", "population"])
@pytest.mark.parametrize("name", sorted(GROUP_BASELINED))
def test_degenerate_and_singleton_groups_in_a_mixed_batch(name, std):
    mod = ALL[name]
    rewards = t([0.1, 0.1, 0.1, 1.0, 1.0, 0.0, 0.0, 0.3, 1.0, 0.0])
    gi = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3, 4, 4])              # 0: all .1, 1: all 1, 2: all 0, 3: singleton
    mask = torch.ones(10, 4, dtype=F64)
    batch = {"loss_mask": mask, "old_logprobs": -mask, "ref_logprobs": -mask}
    for adv_eps in (1e-6, 0.0):
        cfg = cfg_of(mod, std=std, adv_eps=adv_eps, **GROUP_BASELINED[name])
        a = mod.advantages(rewards, gi, cfg, batch=batch).tolist()
        assert a[:8] == [0.0] * 8                                  # exactly, not approximately
        assert all(math.isfinite(v) for v in a) and a[8] > 0 > a[9]


def test_reinforce_pp_baseline_degenerate_groups_share_the_whitening_shift():
    # documented: in a mixed batch the whitening shift gives equal-reward groups one common value
    mask = torch.ones(6, 3, dtype=F64)
    batch = {"loss_mask": mask, "old_logprobs": -mask, "ref_logprobs": -mask}
    a = reinforce_pp.advantages(t([1, 1, 1, 0, 0, 1]), torch.tensor([0, 0, 1, 1, 2, 3]),
                                reinforce_pp.Config(baseline=True), batch=batch)
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
    assert (deg.all(1) == deg.any(1)).all()                         # a property of the whole group
    a = dapo.advantages(r, gi, dapo.Config()).view(len(outcomes), K)
    assert torch.equal(a.abs().sum(1) == 0, deg[:, 0])              # zero advantage ⇔ degenerate
    prob = sum(math.prod(p if x else 1 - p for x in o) for o, d in zip(outcomes, deg[:, 0].tolist()) if d)
    assert prob == pytest.approx(p ** K + (1 - p) ** K, abs=1e-12)
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
    batch = {"loss_mask": mask}
    r, gi = t([1, 1, 1, 0]), torch.tensor([0, 0, 1, 1])
    on = dict(overlong_buffer=20, max_len=100)
    s = 0.25 / math.sqrt(0.125)                                    # ±0.25 / unbiased σ of two values 0.5 apart
    a = dapo.advantages(r, gi, dapo.Config(dynamic_sampling=False, **on), batch=batch).tolist()
    assert a == pytest.approx([s, -s, s, -s], abs=1e-5)
    a = dapo.advantages(r, gi, dapo.Config(**on), batch=batch).tolist()
    assert a[:2] == [0.0, 0.0] and a[2:] == pytest.approx([s, -s], abs=1e-5)   # raw rewards all 1: skipped
    half = dapo.advantages(r, gi, dapo.Config(overlong_penalty_factor=0.5, dynamic_sampling=False, **on), batch=batch)
    assert half[0].item() == pytest.approx(s, abs=1e-5)             # shaped [1, .75]: same z-score
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
    assert dapo.loss(lp, _batch(old, A, mask, ref), cfg, norm)[0].item() == \
        grpo.loss(lp, _batch(old, A, mask, ref), cfg, norm)[0].item()


# ============================================================================= GSPO

def test_gspo_worked_values():
    # §15.3: token log-ratios [0.1, −0.2, 0.4] → s = e^0.1; ε = 3e-4/4e-4
    lp, old, mask = t([[0.1, -0.2, 0.4]]), torch.zeros(1, 3, dtype=F64), torch.ones(1, 3, dtype=F64)
    norm = core.batch_norm(mask)
    s = math.exp(0.1)
    for variant in gspo.VARIANTS:
        cfg = gspo.Config(variant=variant)
        loss, m, g = _grad(gspo, cfg, lp, _batch(old, t([1.0]), mask), norm)
        assert loss.item() == pytest.approx(-1.0004, abs=1e-12) and m["ratio/mean"].item() == pytest.approx(1.105171, abs=1e-6)
        assert g.abs().sum() == 0 and m["clip/frac"].item() == 1.0   # A > 0 and s > 1 + ε: clipped
        loss, m, g = _grad(gspo, cfg, lp, _batch(old, t([-1.0]), mask), norm)
        assert loss.item() == pytest.approx(1.105171, abs=1e-6) and m["clip/frac"].item() == 0.0
        assert g[0].tolist() == pytest.approx([s / 3] * 3, rel=1e-12)  # ∂s/∂lp_t = s/|y|


def test_gspo_token_variant_takes_per_token_advantages():
    lp, mask = torch.zeros(1, 3, dtype=F64), torch.ones(1, 3, dtype=F64)
    A = t([[1.0, -1.0, 2.0]])
    norm = core.batch_norm(mask)
    _, _, g_tok = _grad(gspo, gspo.Config(variant="token"), lp, _batch(lp.clone(), A, mask), norm)
    assert g_tok[0].tolist() == pytest.approx([-1 / 3, 1 / 3, -2 / 3])           # −s·A_t/(N|y|)
    _, _, g_seq = _grad(gspo, gspo.Config(), lp, _batch(lp.clone(), A, mask), norm)
    assert g_seq[0].tolist() == pytest.approx([-2 / 9] * 3)                      # −Σ_t A_t/|y| spread over tokens


def test_gspo_variants_agree_on_outcome_advantages():
    lp, old, ref, A, ent, mask = _random_batch(5, B=8)
    norm = core.batch_norm(mask, 16)
    for eps in (3e-4, 0.05):                                       # the paper's band (most rows clipped), and wider
        seq = _grad(gspo, gspo.Config(eps_low=eps, eps_high=eps), lp, _batch(old, A, mask, ref), norm)
        tok = _grad(gspo, gspo.Config(eps_low=eps, eps_high=eps, variant="token"), lp, _batch(old, A, mask, ref), norm)
        assert tok[0].item() == pytest.approx(seq[0].item(), rel=1e-12)
        assert torch.allclose(tok[2], seq[2], rtol=1e-10, atol=1e-15)


def test_gspo_on_one_token_responses_is_token_level_grpo():
    g = torch.Generator().manual_seed(6)
    B, T = 6, 3
    mask = torch.zeros(B, T, dtype=F64)
    mask[:, 1] = 1                                                 # one response token per row
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
    assert m["clip/frac"].item() == 1.0                            # weight clipped, gradient NOT zero
    loss, m, g = _grad(cispo, cispo.Config(), lp, b, norm)
    assert g.item() == pytest.approx(-5 / 3) and m["clip/frac"].item() == 0.0
    assert _grad(grpo, grpo.Config(kl_coef=0.0), lp, b, norm)[2].item() == 0.0   # PPO drops this token
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
    assert g.item() == pytest.approx(5 / 3) and m["clip/frac"].item() == 0.0   # −A·min(r, C)
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
    assert _grad(dppo, dppo.Config(divergence=divergence, delta_high=0.25), lp, b, norm)[2].item() == pytest.approx(-5 / 3)


# ============================================================================= REINFORCE and REINFORCE++

def test_reinforce_loss_hand_computed():
    lp = t([[math.log(0.5), math.log(0.25), 0.0], [math.log(0.8), 0.0, 0.0]])
    old = t([[math.log(0.25), math.log(0.25), 0.0], [math.log(0.8), 0.0, 0.0]])   # ratio 2 on one token
    ref = t([[math.log(0.4), math.log(0.25), 0.0], [math.log(0.5), 0.0, 0.0]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    norm = core.batch_norm(mask, 3)
    b = _batch(old, t([2.0, -1.0]), mask, ref)
    loss, m = reinforce.loss(lp, b, reinforce.Config(), norm)
    expected = (-2 * (math.log(0.5) + math.log(0.25)) + math.log(0.8)) / 2        # −Σ_i A_i Σ_t log π / N
    assert loss.item() == pytest.approx(expected)
    assert m["ratio/max"].item() == pytest.approx(2.0) and m["clip/frac"].item() == 0.0   # a diagnostic only
    assert m["ratio/mean"].item() == pytest.approx(4 / 3)
    d = [math.log(0.5) - math.log(0.4), 0.0, math.log(0.8) - math.log(0.5)]       # log π_θ − log π_ref
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
    assert r.tolist() == [[0, 0, 0, 0, 3, 0], [0] * 6]              # on the last loss token; empty row: nothing


def test_reinforce_pp_advantages_hand_computed():
    mask = t([[1, 1, 0], [1, 0, 0]])
    old = t([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    ref = t([[-1.5, -1.8, 0.0], [-0.5, 0.0, 0.0]])                  # k1 = old − ref = [0.5, −0.2], [0]
    batch = {"loss_mask": mask, "old_logprobs": old, "ref_logprobs": ref}
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
    assert statistics.fmean(got) == pytest.approx(0.0, abs=1e-12) and statistics.stdev(got) == pytest.approx(1.0, abs=1e-6)
    # -baseline: rows of lengths 2, 1, 1; groups [0, 0, 1]; R = [1, 0, 1] → centred [.5, .5], [−.5], [0]
    mask3 = t([[1, 1, 0], [1, 0, 0], [0, 1, 0]])
    b3 = {"loss_mask": mask3, "old_logprobs": -mask3, "ref_logprobs": -mask3}
    a = reinforce_pp.advantages(t([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]), reinforce_pp.Config(baseline=True), batch=b3)
    got = [a[0, 0].item(), a[0, 1].item(), a[1, 0].item(), a[2, 1].item()]
    assert got == pytest.approx(whiten([0.5, 0.5, -0.5, 0.0]), abs=1e-9)
    assert got == pytest.approx([0.783349, 0.783349, -1.305582, -0.261116], abs=1e-6)
    with pytest.raises(UsageError, match="batch"):
        reinforce_pp.advantages(r, gi, reinforce_pp.Config())
    with pytest.raises(UsageError, match="ref_logprobs"):
        reinforce_pp.advantages(r, gi, reinforce_pp.Config(), batch={"loss_mask": mask, "old_logprobs": old})


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
    g = _grad(grpo, grpo.Config(kl_coef=0.0), lp, b, norm)[2]      # seq-mean-token-mean: A/(K·|y_i|)
    short, long = -K * g[0, 0].item(), -K * g[1, 0].item()
    assert (short, long) == pytest.approx((0.05, 0.0025)) and long / short == pytest.approx(0.05)
    g = _grad(dapo, dapo.Config(), lp, b, norm)[2]                   # token-mean: A/Σ|y|
    assert (-g[0, 0].item(), -g[1, 0].item()) == pytest.approx((0.002381, 0.002381), abs=1e-6)
    g = _grad(dr_grpo, dr_grpo.Config(), lp, b, norm)[2]             # Σ/(K·L_max): A/K per token, ÷ L_max
    assert (-200 * g[0, 0].item(), -200 * g[1, 199].item()) == pytest.approx((0.25, 0.25))
    g = _grad(dr_grpo, dr_grpo.Config(aggregation="seq-mean-token-sum"), lp, b, norm)[2]   # the lesson's "sum / K"
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
    pg, _ = core.ppo_clip_loss(lp, old, A, 0.2, 0.2)                # by hand: Σ ℓ / (N · L_max)
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
        policy += float(mask[s].sum()) / norm["tokens"] * float(m["loss/policy"])   # the trainer's weighting
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

    base = run(lp, old, ref, A, ent)
    off = mask == 0
    junk = lambda x, v: torch.where(off, torch.full_like(x, v), x)   # noqa: E731
    other = run(junk(lp, 30.0), junk(old, -40.0), junk(ref, 25.0), junk(A, 1e6), junk(ent, float("nan")))
    assert other[0].item() == base[0].item()
    assert other[1] == base[1]
    assert torch.equal(other[2], base[2]) and (base[2][off] == 0).all()


def test_advantages_accept_the_controller_call():
    # the controller calls advantages(rewards, group_index, cfg, batch=batch) for every algorithm
    lp, old, ref, _, _, mask = _random_batch(12)
    batch = {"loss_mask": mask, "old_logprobs": old, "ref_logprobs": ref, "input_ids": torch.zeros_like(mask).long()}
    r, gi = t([1, 0, 1, 1, 0, 0]), torch.tensor([0, 0, 0, 1, 1, 1])
    for name, mod in ALL.items():
        a = mod.advantages(batch.get("rewards", r), gi, mod.Config(), batch=batch)
        assert a.shape in ((6,), (6, 7)) and torch.isfinite(a).all(), name
    a = reinforce_pp.advantages(r, gi, reinforce_pp.Config(), batch=batch)
    assert (a[mask == 0] == 0).all() and a[mask != 0].abs().sum() > 0
