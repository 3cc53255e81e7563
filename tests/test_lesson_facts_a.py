"""The facts quoted by lessons 00–12 (posttrain/lessons/facts_a.py): every fact runs, returns a
number, string or well-formed table, and its value agrees with a hand computation or an
independent formula."""

import json
import math
from pathlib import Path

import pytest

from posttrain.lessons import facts_a_algos, facts_a_tools, registry
from posttrain.lessons.facts_a import FACTS

ROOT = Path(__file__).resolve().parents[1]


def rows(name: str) -> list[list]:
    return FACTS[name]()["rows"]


def col(name: str, column: str) -> list:
    t = FACTS[name]()
    i = t["columns"].index(column)
    return [r[i] for r in t["rows"]]


def nums(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


@pytest.mark.parametrize("name", sorted(FACTS))
def test_every_fact_runs_and_is_well_formed(name):
    v = FACTS[name]()
    if isinstance(v, dict):
        assert set(v) == {"columns", "rows"} and v["rows"]
        assert all(len(r) == len(v["columns"]) for r in v["rows"])
    else:
        assert isinstance(v, (int, float, str)) and not isinstance(v, bool)


def test_fact_names_carry_their_lesson_and_live_in_the_loader():
    from posttrain.lessons import facts

    assert all(n[:2] == "rl" and n[2:4].isdigit() and int(n[2:4]) <= 12 for n in FACTS)
    assert set(FACTS) <= set(facts.load_all())


# ---- 00 -----------------------------------------------------------------------------------------


def test_rl00_algorithm_count_is_the_number_of_algorithm_files():
    files = {p.stem for p in (ROOT / "posttrain" / "algorithms").glob("*.py")} - {"__init__", "core", "base"}
    assert FACTS["rl00_n_algorithms"]() == len(files)


def test_rl00_lineage_on_one_right_answer_of_four():
    t = {r[0]: nums(r[1]) for r in rows("rl00_lineage_table")}
    # unbiased std of (1,0,0,0): sqrt((0.75² + 3·0.25²)/3) = 0.5 → GRPO (1.5, −0.5, …)
    assert t["grpo"] == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-2)
    assert t["rloo"] == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3], abs=1e-2)
    assert t["dr_grpo"] == pytest.approx([0.75, -0.25, -0.25, -0.25], abs=1e-2)
    assert t["reinforce"] == [1.0, 0.0, 0.0, 0.0]
    # ppo.advantages with its defaults: V = 0 gives A = R, whitened over the batch (here the one group):
    # (r − ¼)/σ with the unbiased σ = ½ — GRPO's numbers, not REINFORCE's
    assert t["ppo"] == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-2)


def test_rl00_each_force_fails_alone():
    t = rows("rl00_forces_table")
    assert all(c.startswith("holds") for c in t[0][1:])
    for i, row in enumerate(t[1:]):
        assert [c.split(":")[0] for c in row[1:]] == ["fails" if j == i else "holds" for j in range(3)]


# ---- 01 -----------------------------------------------------------------------------------------


def test_rl01_one_step_by_hand():
    r = {row[0]: row for row in rows("rl01_one_step")}
    assert float(r["C"][1]) == pytest.approx(0.4 * 0.9 * 0.8, abs=1e-3)
    assert float(r["A"][1]) == pytest.approx(-0.4 * 0.9 * 0.2, abs=1e-3)
    pc = math.exp(0.288) / (math.exp(0.288) + 4 * math.exp(-0.072))
    assert float(r["C"][3]) == pytest.approx(pc, abs=1e-3)


def test_rl01_expected_gradient_is_pi_times_reward_minus_mean():
    assert FACTS["rl01_mean_reward_uniform"]() == pytest.approx(0.38)
    for _arm, rew, g in rows("rl01_expected_grad"):
        assert float(g) == pytest.approx(0.2 * (rew - 0.38), abs=1e-3)


def test_rl01_bandit_learning_rates():
    assert 0.02 < FACTS["rl01_break_wrong_share"]() < 0.3  # η = 2 locks some seeds on a wrong arm
    assert FACTS["rl01_slow_c_share"]() == 1.0  # η = 0.05: right, ...
    default_top = dict(registry.compute("bandit")["kpis"])["mean max π"]
    assert FACTS["rl01_slow_pi_c"]() < default_top  # ... and slow


# ---- 02 -----------------------------------------------------------------------------------------


def test_rl02_sampler_and_trainer_agree_and_temperature_matters():
    assert FACTS["rl02_parity_max_abs"]() < 1e-5
    assert FACTS["rl02_wrong_temperature_gap"]() > 1e-2
    assert FACTS["rl02_response_tokens"]() > 0


def test_rl02_recomputed_old_logprobs_make_the_ratio_one():
    rec, recomputed = rows("rl02_stale_vs_recomputed")
    assert recomputed[1:] == ["1.000", "1.000", "0.000"]
    assert float(rec[2]) > 1.05


def test_rl02_degenerate_table_follows_the_formula():
    t = FACTS["rl02_degenerate_table"]()
    ks = [int(c.rsplit(" ", 1)[1]) for c in t["columns"][2:]]
    for _T, q, *ps in t["rows"]:
        for k, p in zip(ks, ps):
            assert p == pytest.approx(q**k + (1 - q) ** k, abs=0.01)  # q is shown rounded to 3 places
    assert FACTS["rl02_break_degenerate"]() == t["rows"][0][2]  # T = 0.25, K = 2


def test_rl02_observed_degenerate_rows_are_the_benchmark_json():
    d = json.loads((ROOT / "benchmarks/results/claims.json").read_text())["degenerate"]
    assert rows("rl02_degenerate_observed") == [
        [r["K"], r["observed"], r["predicted_per_prompt"], r["predicted_mean_p"]] for r in d["rows"]
    ]
    assert FACTS["rl02_mean_p"]() == d["mean_p"]


# ---- 03 -----------------------------------------------------------------------------------------


def test_rl03_verifier_probes():
    assert [r[2] for r in rows("rl03_probes")] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert rows("rl03_probes")[-1][1] == 13


def test_rl03_k_estimators_by_hand():
    for d, k1, k2, k3 in rows("rl03_k_table"):
        d = float(d)
        assert float(k1) == pytest.approx(-d, abs=1e-3)
        assert float(k2) == pytest.approx(d * d / 2, abs=1e-3)
        assert float(k3) == pytest.approx(math.exp(d) - 1 - d, abs=1e-3)
        assert float(k3) >= 0


def test_rl03_swapped_arguments_flip_k1_and_miss_the_kl():
    (_o1, exact1, k1a, k3a), (_o2, exact2, k1b, k3b) = rows("rl03_swap_table")
    assert exact1 == exact2 and k1b == pytest.approx(-k1a)
    assert abs(k3a - exact1) < 0.1 < abs(k3b - exact1)


def test_rl03_beta_sweep():
    t = {r[0]: r for r in rows("rl03_beta_table")}
    for _beta, theta, _reward, kl, past in t.values():
        assert kl == pytest.approx(theta**2, rel=0.02, abs=0.05)  # KL = θ² in the toy
        assert past == ("yes" if theta > 5 else "no")
    assert t[0.0][1] == 10.0 and t[1.0][1] < 0.5
    assert FACTS["rl03_beta0_theta"]() == t[0.0][1] and FACTS["rl03_beta1_theta"]() == t[1.0][1]
    thetas = [t[b][1] for b in sorted(t)]
    assert thetas == sorted(thetas, reverse=True)  # a stronger anchor, a shorter walk


def test_rl03_reference_does_not_move():
    n_all, n_train, pol, ref = rows("rl03_reference_frozen")[0]
    assert n_all > 0 and n_train == 0 and float(ref) == 0.0 and float(pol) > 0.0


# ---- 04 -----------------------------------------------------------------------------------------


def test_rl04_std_conventions_by_hand():
    t = {r[0]: r for r in rows("rl04_std_table")}
    # (0, 0, 1): Σ(r−μ)² = 2/3; population σ = √(2/9), unbiased σ = √(1/3)
    assert float(t["population"][1]) == pytest.approx(math.sqrt(2 / 9), abs=1e-3)
    assert float(t["unbiased"][1]) == pytest.approx(math.sqrt(1 / 3), abs=1e-3)
    assert nums(t["population"][2]) == pytest.approx(
        [-1 / 3 / math.sqrt(2 / 9)] * 2 + [2 / 3 / math.sqrt(2 / 9)], abs=1e-2
    )


def test_rl04_grpo_is_scale_free_and_the_others_are_not():
    (_r1, g1, l1, d1), (_r2, g2, l2, d2) = rows("rl04_scale_table")
    assert g1 == g2
    assert nums(l2) == pytest.approx([x / 4 for x in nums(l1)], abs=0.01)
    assert nums(d2) == pytest.approx([x / 4 for x in nums(d1)], abs=0.01)


def test_rl04_defaults_are_each_algorithms_config():
    from posttrain import algorithms

    t = {r[0]: r for r in rows("rl04_defaults_table")}
    assert set(t) == set(algorithms.ALGORITHMS)
    assert t["grpo"][1:] == ["seq-mean-token-mean", "0.04", "—", "yes", "0.2 / 0.2"]
    assert t["dapo"][5] == "0.2 / 0.28" and t["reinforce"][5] == "—"
    assert t["ppo"][2:4] == ["0", "0.05"]  # ppo.Config: kl_in="reward", kl_coef 0.05 (k1, InstructGPT-style)
    assert t["reinforce_pp"][2:5] == ["0", "0.01", "yes"]  # its reference is for the reward KL


# ---- 05 -----------------------------------------------------------------------------------------


def test_rl05_micro_batches_with_the_batch_normaliser_add_up():
    for _mode, whole, shared, alone in rows("rl05_microbatch_table"):
        assert shared == whole
        assert alone != whole
    assert FACTS["rl05_micro_rows"]() == "2+4"


def test_rl05_clip_at_ratio_one_has_reinforce_gradient():
    assert FACTS["rl05_clip_equals_reinforce"]() < 1e-12


def test_rl05_break_and_optimizer():
    assert FACTS["rl05_break_outside"]() == 1.0
    assert 0.0 < FACTS["rl05_break_clipped"]() < 1.0
    assert rows("rl05_optim_table")[0][1:4] == ["0.9, 0.95", "0", "1"]


# ---- 06 -----------------------------------------------------------------------------------------


def test_rl06_a_staler_sampler_learns_slower():
    t = {r[0]: r for r in rows("rl06_sync_table")}
    assert t[1][1] == 0.0 and t[1][4] == 0  # synced every step: ratio 1
    for n, r in t.items():
        assert r[4] == n - 1  # behind by at most N − 1 versions
    at50 = [t[n][2] for n in sorted(t)]
    assert at50 == sorted(at50, reverse=True)  # staler, slower
    assert FACTS["rl06_break_reward50"]() == t[20][2] < t[1][2] - 0.5
    assert FACTS["rl06_break_clip"]() == t[20][1] > 0.1
    assert FACTS["rl06_break_behind"]() == 19


def test_rl06_separate_sync_copies_every_byte_and_bumps_the_version():
    model, _ = facts_a_tools.tiny_model()
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    copy, before, after, copied, version = rows("rl06_separate_sync")[0]
    assert copy == "yes" and float(before) > 0 and float(after) == 0.0
    assert copied == n_bytes and version == "0 → 1"


def test_rl06_stale_runs_are_the_benchmark_json():
    d = json.loads((ROOT / "benchmarks/results/async_vs_sync.json").read_text())
    fixed = next(r for r in d["runs"] if r["run"] == "fixed4_none" and r["seed"] == 0)
    t = {r[0]: r for r in rows("rl06_stale_runs")}
    assert t["4 versions stale, no correction"][2] == f"{fixed['mean ratio/max']:.2f}"
    assert len(t) == 3


# ---- 07 -----------------------------------------------------------------------------------------


def test_rl07_group_bookkeeping():
    t = rows("rl07_group_metrics")
    assert [r[1] for r in t[:4]] == ["no", "yes", "yes", "no"]
    assert t[4][1] == 0.5 and t[5][1] == "0.25, 0.25"


def test_rl07_keeping_degenerate_groups_dilutes_by_their_share():
    t = {r[0]: float(r[3]) for r in rows("rl07_keep_vs_skip")}
    lengths = (3, 5, 4, 2, 6, 3, 2, 4)
    assert t["token-mean"] == pytest.approx(sum(lengths[:4]) / sum(lengths), abs=1e-3)
    assert t["seq-mean-token-mean"] == pytest.approx(0.5, abs=1e-3)


def test_rl07_degenerate_share_from_the_benchmark():
    d = json.loads((ROOT / "benchmarks/results/claims.json").read_text())
    run = next(r for r in d["length"] if r["algorithm"] == "grpo")
    assert FACTS["rl07_degenerate_first"]() == run["group/degenerate_frac_first10"]
    assert FACTS["rl07_degenerate_last"]() == run["group/degenerate_frac_last10"]


# ---- 08 -----------------------------------------------------------------------------------------


def test_rl08_masked_loss_ignores_tool_tokens():
    (_m_on, n_on, l_on, g_on, grad_on), (_m_off, n_off, l_off, g_off, grad_off) = rows("rl08_mask_table")
    assert (n_on, n_off) == (18, 24)  # "⟦123+456+789⟧" 13 + "1368#" 5 policy tokens; + "⟨1368⟩" 6 unmasked
    assert l_on == g_on and float(grad_on) == 0.0
    assert l_off != g_off and float(grad_off) == 1.0  # −A·log π: ∂/∂log π = −A, |A| = 1
    assert FACTS["rl08_observation_text"]() == "⟨1368⟩"


def test_rl07_one_group_through_the_step():
    t = rows("rl07_step_example")
    assert [r[1] for r in t[:3]] == [1.0, 0.0, 0.0]  # only "12#" is right
    # population std of (1, 0, 0) is √2/3: A = (2/3)/(√2/3) = √2, (−1/3)/(√2/3) = −1/√2
    assert [float(r[2]) for r in t[:3]] == pytest.approx([math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2)], abs=0.01)
    assert t[3][1:] == ["(3, 10)", "9 loss tokens"]


# ---- 09 -----------------------------------------------------------------------------------------


def test_rl09_error_falls_like_one_over_root_k_and_the_baseline_cuts_it():
    t = rows("rl09_error_table")
    for k, err, predicted, _zero, loo in t:
        assert err == pytest.approx(float(predicted), rel=0.1)  # K = 1 error / √K
        if k > 1:
            assert loo < err  # leave-one-out: less noise
    assert t[0][3] == FACTS["rl09_k1_zero"]() and 40 <= float(t[0][3].rstrip("%")) <= 60  # reward 0: ĝ = 0
    assert FACTS["rl09_k1_error"]() == t[0][1]
    assert FACTS["rl09_course_floor"]() > 0.7  # against (1, 0.4) it does not fall


def test_rl09_baseline_keeps_the_mean_and_cuts_the_variance():
    t = rows("rl09_baseline_table")
    assert t[0][1] == t[1][1] == t[2][1]  # unbiased
    # exact variance at the uniform policy: E‖(r−b)(e_a − π)‖² − ‖E[…]‖², ‖e_a − π‖² = 0.8 for every a
    r = [0.1, 0.3, 0.9, 0.4, 0.2]
    mean = [0.2 * (x - 0.38) for x in r]
    for row, b in zip(t, (0.0, 0.38, 1.0)):
        var = sum(0.2 * (x - b) ** 2 * 0.8 for x in r) - sum(m * m for m in mean)
        assert float(row[2]) == pytest.approx(var, abs=1e-4)
    assert FACTS["rl09_variance_ratio"]() == pytest.approx(float(t[0][2]) / float(t[1][2]))


def test_rl09_reinforce_runs_are_the_benchmark():
    d = json.loads((ROOT / "benchmarks/results/algorithms.json").read_text())
    seeds = sorted(r["seed"] for r in d if r["algorithm"] == "reinforce")
    assert [r[0] for r in rows("rl09_reinforce_runs")] == seeds


# ---- 10 -----------------------------------------------------------------------------------------


def test_rl10_clip_cells():
    killed = {(r[0], r[1]) for r in rows("rl10_clip_table") if r[5] == "killed"}
    assert killed == {(0.7, "-1"), (1.4, "+1")}
    for rho, a, s1, _s2, g, _ in rows("rl10_clip_table"):
        assert float(s1) == pytest.approx(rho * float(a))
        if _ == "flows":
            assert float(g) == pytest.approx(-rho * float(a), abs=1e-2)  # ∂(−ρA)/∂log π = −ρA


def test_rl10_gae_by_hand():
    t = {r[0]: nums(r[1]) for r in rows("rl10_gae_table")}
    v = [0.2, 0.4, 0.6, 0.8]
    delta = [v[1] - v[0], v[2] - v[1], v[3] - v[2], 1 - v[3]]  # γ = 1, V after the end = 0
    assert t["λ = 0"] == pytest.approx(delta, abs=1e-2)
    assert t["λ = 1"] == pytest.approx([1 - x for x in v], abs=1e-2)
    lam = 0.95
    want = [sum(lam ** (j - i) * delta[j] for j in range(i, 4)) for i in range(4)]
    assert t["λ = 0.95"] == pytest.approx(want, abs=1e-2)


def test_rl10_the_clip_bounds_reuse():
    t = rows("rl10_reuse_table")
    assert all(float(r[1]) < 0.1 and r[2] == "0.0%" for r in t)  # clipped: small KL, never a wrong arm
    assert float(t[-1][3]) > 10 * float(t[-1][1])  # unclipped: the KL keeps growing
    assert float(t[-1][4].rstrip("%")) > 5.0
    assert t[0][1:3] == t[0][3:5]  # one epoch: the clip never acts


def test_rl10_memory_and_clip_fraction():
    t = {r[0]: r for r in rows("rl10_memory_table")}
    assert t["grpo"][4] == "yes" and t["ppo"][4] == "no" and float(t["ppo"][1]) > 0
    assert FACTS["rl10_onpolicy_clip_frac"]() == 0.0
    assert FACTS["rl10_reuse_clip_frac"]().endswith("%")


# ---- 11 -----------------------------------------------------------------------------------------


def test_rl11_binary_advantages_follow_the_closed_form():
    for c, right_pop, wrong_pop, right_unb, _wrong_unb in rows("rl11_patterns_table"):
        if c in (0, 4):
            continue
        p = c / 4
        assert float(right_pop) == pytest.approx(math.sqrt((1 - p) / p), abs=1e-3)
        assert float(wrong_pop) == pytest.approx(-math.sqrt(p / (1 - p)), abs=1e-3)
        assert float(right_unb) == pytest.approx(float(right_pop) * math.sqrt(3 / 4), abs=1e-3)


def test_rl11_group_runs_and_memory():
    d = json.loads((ROOT / "benchmarks/results/claims.json").read_text())["group"]
    assert [r[0] for r in rows("rl11_group_runs")] == ["64 × 2", "16 × 8"]
    assert len(d) == 2
    grpo, ppo = (facts_a_algos._plan(a)["peak_bytes"] for a in ("grpo", "ppo"))
    assert FACTS["rl11_memory_saving"]() == f"{1 - grpo / ppo:.0%}"


# ---- 12 -----------------------------------------------------------------------------------------


def test_rl12_rloo_is_centred_times_k_over_k_minus_one():
    for k, measured, formula in rows("rl12_scale_table"):
        assert measured == formula == f"{k / (k - 1):.3f}"


def test_rl12_group_mean_baseline_shrinks_the_gradient_by_k_minus_one_over_k():
    t = {r[0]: r for r in rows("rl12_bias_table")}
    assert float(t["group mean (r − mean)"][2]) == pytest.approx(3 / 4, abs=0.02)
    assert float(t["leave-one-out (RLOO)"][2]) == pytest.approx(1.0, abs=0.02)
    exact = nums(t["exact"][1])
    assert exact == pytest.approx([0.2 * (x - 0.38) for x in (0.1, 0.3, 0.9, 0.4, 0.2)], abs=0.006)


def test_rl12_runs_table_is_the_benchmark_mean():
    d = json.loads((ROOT / "benchmarks/results/algorithms.json").read_text())
    for name, n, mean, _rng in rows("rl12_runs_table"):
        gains = [r["pass@1_end"] - r["pass@1_start"] for r in d if r["algorithm"] == name]
        assert n == len(gains) and float(mean) == pytest.approx(sum(gains) / n, abs=5e-4)


def test_rl10_the_clip_width_sets_what_one_batch_can_teach():
    t = rows("rl10_eps_table")
    alive = [r[1] for r in t]
    assert alive == sorted(alive) and alive[0] == 0.0 == FACTS["rl10_tight_tokens"]()
    assert t[-1][2] > t[0][2]  # a wider band gains more reward
    assert FACTS["rl10_noclip_wrong"]() == rows("rl10_reuse_table")[-1][4]


def test_rl07_widget_step_moves_only_a_group_with_signal():
    (_a1, r1, adv1, g1, d1, v1), (_a2, r2, _adv2, g2, d2, v2) = rows("rl07_widget_step")
    assert r1 == "1, 0, 0" and adv1 == rows("rl07_step_example")[0][2] + ", " + ", ".join(
        r[2] for r in rows("rl07_step_example")[1:3]
    )
    moved = nums(d1)
    assert moved[0] > 0 > moved[1] and moved[2] < 0 and g1 > 0
    assert r2 == "1, 1, 1" and g2 == 0.0 and nums(d2) == [0.0, 0.0, 0.0]
    assert v1 == v2 == "0 → 1"
