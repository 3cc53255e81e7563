"""The lessons' widgets produce the numbers of SEED_SPEC Part C (rows marked F or W), through the
widget registry: one test per row or group of rows (the systems lessons' rows: test_lessons_rows_systems.py)."""

from __future__ import annotations

import json
import math

import pytest

from posttrain.lessons import registry

from lessons_util import floats, kpis


def pct(text) -> float:
    return float(str(text).rstrip("%"))


# ---- Part C numbers, widget by widget --------------------------------------------------------------


def test_row_01_02_bandit():
    assert kpis("bandit", lr=0.4, steps=200)["seeds ending on C (best)"] >= 0.99
    wrong = kpis("bandit", lr=2.0, steps=200)["seeds ending on a wrong arm"]
    assert 0.05 <= wrong <= 0.14  # the course: ≈ 8.5% of seeds lock onto a wrong arm


def test_row_03_degenerate_groups_at_low_temperature():
    """P(degenerate) = q^K + (1−q)^K with q = P(response right); measured on real sampler draws."""
    k = kpis("sampler", temperature=0.5, top_k=0, top_p=1.0, K=2)
    q = k["P(response right) = p²"]
    assert k["P(degenerate group), formula"] == pytest.approx(q**2 + (1 - q) ** 2, abs=2e-3)
    assert k["P(degenerate group), measured"] == pytest.approx(k["P(degenerate group), formula"], abs=0.05)
    pc = 1 - 0.3 * 0.5  # the course's toy: 0.85 per digit → 0.60
    assert 0.85**4 + (1 - pc**2) ** 2 == pytest.approx(0.60, abs=0.005)
    assert kpis("sampler", temperature=0.0, top_k=0, top_p=1.0, K=2)["P(degenerate group), measured"] == 1.0


def test_row_06_verifier():
    expect = {"12#": 1.0, "let me think... 12#": 1.0, "11#": 0.0, "120#": 0.0, "no digits here#": 0.0}
    for text, reward in expect.items():
        assert kpis("verifier", response=text)["reward"] == reward


def test_row_07_k3_nonnegative_and_unbiased():
    k = kpis("kl", shift=0.5, samples=4096, order="policy, ref")
    assert k["min k3 (never < 0)"] >= 0
    assert k["k3 mean"] == pytest.approx(k["exact KL"], rel=0.1)
    assert k["k1 mean"] == pytest.approx(k["exact KL"], rel=0.1)
    assert k["share of k1 < 0"] > 0.1  # k1 is unbiased but not ≥ 0


def test_row_09_beta_widget_course_numbers_and_the_fix():
    course = {0.0: (2.14, 0.532, 4.57), 0.05: (1.45, 0.434, 2.11)}
    for beta, (theta, rew, kl) in course.items():
        k = kpis("beta", beta=beta, schedule="course")
        assert (k["final θ"], k["final KL"]) == (theta, kl) and k["final reward"] == pytest.approx(rew, abs=1e-3)
        assert k["reward-hacked (θ > 5)?"] == "no"
    assert kpis("beta", beta=0.0, schedule="fixed")["reward-hacked (θ > 5)?"] == "yes"  # decision: fixed
    assert kpis("beta", beta=0.05, schedule="fixed")["reward-hacked (θ > 5)?"] == "no"


def test_row_12_loss_assembly():
    k = kpis("loss_assembly", eps=0.2, beta=0.1, drift=0.5, seed=1)
    assert k["total loss"] == pytest.approx(k["policy loss (token mean)"] + k["KL term β·mean(k3)"], abs=2e-4)
    assert 0 <= k["clip/frac (gradient zeroed)"] <= k["ρ outside [1−ε, 1+ε]"] <= 1


def test_row_14_sync_every():
    """Row 14, on a policy trained through WeightSync: a fresh sampler clips nothing; the staler it
    gets, the more tokens are clipped (up to sync 10) and the slower the reward rises."""
    k = {n: kpis("sync", sync_every=n) for n in (1, 2, 5, 10, 20, 40)}
    assert k[1]["clip/frac (mean over the run)"] == 0.0 and k[1]["sampler versions behind at most"] == 0
    assert (
        k[1]["clip/frac (mean over the run)"]
        < k[2]["clip/frac (mean over the run)"]
        < k[5]["clip/frac (mean over the run)"]
        < k[10]["clip/frac (mean over the run)"]
    )
    at50 = [k[n]["expected reward at step 50"] for n in (1, 2, 5, 10, 20, 40)]
    assert at50 == sorted(at50, reverse=True) and at50[0] > 0.95 and at50[-2] < 0.2
    assert k[40]["sampler versions behind at most"] == 39


def test_row_15_controller():
    """Row 15 on a real step of the loop: the verifier gives (1, 0, 0) → A = (+1.41, −.71, −.71);
    the batch is 3 rows of <3+4+5> + a 3-token response; all right → every advantage 0."""
    k = kpis("controller", phase=8, answers="12, 11, 14")
    assert k["rewards"] == "1, 0, 0" and floats(k["advantages (population std)"]) == [1.41, -0.71, -0.71]
    assert (k["batch input_ids shape"], k["loss tokens"], k["policy_version"]) == ("(3, 10)", 9, "0 → 1")
    assert k["KL to the reference (k3, token mean)"] == 0.0  # the reference is the policy at step 1
    up, *down = floats(k["Δ log π(y) of the trainer"])
    assert up > 0 and all(d < 0 for d in down)  # the step raised 12#, lowered 11# and 14#
    assert "rewards" not in kpis("controller", phase=1, answers="12, 11, 14")  # phases reveal in order
    assert kpis("controller", phase=5, answers="12, 12, 12")["degenerate (dropped under skip / resample)?"] == "yes"


def test_row_17_tool_mask_counts():
    on, off = kpis("tool_mask", mask_tools=True), kpis("tool_mask", mask_tools=False)
    assert (on["assistant tokens"], on["tool tokens"], on["tokens scored"], off["tokens scored"]) == (18, 6, 18, 24)


def test_row_19_snr_course_floor_and_fixed_error():
    course = {1: 0.95, 4: 0.81, 16: 0.78}
    for K, want in course.items():
        assert kpis("snr", K=K, target="course")["mean |ĝ − target|"] == pytest.approx(want, abs=0.03)
    e1, e16 = (kpis("snr", K=K, target="expected")["mean |ĝ − target|"] for K in (1, 16))
    assert e16 < e1 / 3  # the fix: error falls like 1/√K (4× at 16×)
    rloo = kpis("snr", K=16, target="expected", baseline="leave-one-out (RLOO)")["mean |ĝ − target|"]
    assert rloo < 0.8 * e16  # a baseline lowers the variance at the same K


def test_row_20_clip_table():
    cells = {
        (0.7, 1.0): (0.7, 0.8, "flows"),
        (0.7, -1.0): (-0.7, -0.8, "killed (clipped)"),
        (1.4, 1.0): (1.4, 1.2, "killed (clipped)"),
        (1.4, -1.0): (-1.4, -1.2, "flows"),
    }
    for (rho, adv), (s1, s2, grad) in cells.items():
        k = kpis("clip", eps=0.2, rho=rho, adv=adv)
        assert (k["s1 = ρA"], k["s2 = clip(ρ)A"], k["gradient"]) == (s1, s2, grad)


def test_rows_23_24_32_grpo_groups():
    assert floats(kpis("grpo_group", r0=1, r1=0, r2=0, r3=0, std="population")["A"]) == [1.73, -0.58, -0.58, -0.58]
    assert floats(kpis("grpo_group", r0=1, r1=0, r2=1, r3=0, std="population")["A"]) == [1.0, -1.0, 1.0, -1.0]
    assert floats(kpis("grpo_group", r0=1, r1=0, r2=1, r3=0, std="unbiased")["A"]) == [0.87, -0.87, 0.87, -0.87]
    y = kpis("grpo_group", r0=1, r1=1, r2=1, r3=0, std="population")
    assert (y["mean"], y["std (population)"], floats(y["A"])) == (0.75, 0.433, [0.58, 0.58, 0.58, -1.73])


def test_row_25_rloo_scale():
    for K, want in ((2, 2.0), (4, 1.333), (8, 1.143)):
        k = kpis("rloo", K=K, accuracy=0.5, seed=0)
        assert k["K/(K−1)"] == want
        assert k["measured A_RLOO / A_centred"] in (want, "— (degenerate)")
    assert kpis("rloo", K=4, accuracy=0.5, seed=0)["measured A_RLOO / A_centred"] == 1.333


def test_rows_27_29_dapo():
    k = kpis("dapo", accuracy=0.9, K=4, buffer=16)
    assert k["P(degenerate) = p^K + (1−p)^K"] == 0.6562
    assert k["measured"] == pytest.approx(0.6562, abs=0.03)
    assert k["penalty at the cap"] == -1.0


def test_rows_33_34_length_bias():
    k = kpis("length_bias", short=10, long=200)
    assert k["DAPO (÷Σ|y_i|): short / long"] == "0.002381 / 0.002381"
    assert k["÷K (the course's Dr. GRPO): short / long"] == "0.25 / 0.25"
    assert k["GRPO: long token gets"].startswith("5.0%")
    # decision (index): GRPO's mean over sequences also divides by K = 2 → 0.025 / 0.00125
    assert k["GRPO (÷|y_i|, mean over seqs): short / long"] == "0.025 / 0.00125"


def test_row_38_dpo_four_responses():
    k = kpis("dpo4", beta=0.5, lr=0.1, loss_type="dpo")
    pi = floats(k["final π"])
    assert pi == sorted(pi) and 0.55 <= pi[3] <= 0.75 and pi[0] <= 0.05
    assert k["running mean of π(D)"] == pytest.approx(0.46, abs=0.05)
    assert k["implicit Δr(D − A) = β·log-ratio gap"] == pytest.approx(1.8, abs=0.3)


def test_row_39_ipo_minimum_and_dpo_at_zero():
    k = kpis("pref_curves", beta=0.5)
    assert k["IPO minimum at h = 1/(2β)"] == 1.0
    assert k["DPO loss at h = 0"] == pytest.approx(math.log(2), abs=1e-4)


def test_every_widget_default_runs_and_is_json():
    for name in registry.load_all():
        out = registry.compute(name)
        json.dumps(out, allow_nan=False)  # the browser's JSON.parse rejects NaN
        assert out["figure"]["data"] and out["kpis"], name


def test_rows_97_98_parameter_counts():
    k = kpis("shapes", d=128, h=4, L=4, V=29)
    assert (k["course layout, T_max 11"], k["course layout, T_max 64"]) == ("796,416", "803,200")
    assert k["head dim k = d/h"] == 32 and k["unscaled q·k std √k"] == 5.66
    assert 150 < k["blocks / embeddings (course)"] < 160
    from posttrain.models.gpt_mini import GPTMini, ModelConfig

    ours = int(k["posttrain gpt_mini (count_params)"].replace(",", ""))
    model = GPTMini(ModelConfig(d_model=128, n_layers=4, n_heads=4, d_ff=344, vocab_size=29).resolved(29))
    assert ours == model.num_params()


def test_row_102_sft_mask_boundary():
    assert kpis("sft_mask", mask_prompt=True, example="<hello>olleh#")["trained positions"] == "6 of 12"
    assert kpis("sft_mask", mask_prompt=True, example="<abcd>dcba#")["trained positions"] == "5 of 10"
    assert kpis("sft_mask", mask_prompt=False, example="<abcd>dcba#")["trained positions"] == "10 of 10"


def test_row_106_dpo_starts_at_ln2_and_the_margin_grows():
    k = kpis("dpo_pair", beta=0.1, lr=0.2, loss_type="dpo")
    assert k["loss at step 0 (π_θ = π_ref)"] == pytest.approx(math.log(2), abs=1e-4)
    assert k["margin after 220 steps"] > 0 and k["preference accuracy"] == 1.0
    small = kpis("dpo_pair", beta=0.05, lr=0.2, loss_type="dpo")["margin after 220 steps"]
    assert small < k["margin after 220 steps"] / 3  # ∝ β² before saturation


def test_row_110_grpo_policy_stays_a_probability_and_dead_groups_pile_up():
    """Row 110, decided: P(correct) = σ(θ) can approach 1 but never reach or pass it; near the top
    almost every group is all right (absorbing), and a strong anchor (β = 0.5) holds it lower."""
    for K in (2, 4, 8):
        k = kpis("grpo_sim", K=K, beta=0.05)
        assert 0.9 < k["final P(correct)"] < 1.0 and k["groups with no signal, last step"] > 0.8
    k = kpis("grpo_sim", K=8, beta=0.5)
    assert 0.6 < k["final P(correct)"] < 0.9 and k["first step with P(correct) ≥ 0.9"] == "never (in 200 steps)"


def test_recorded_runs_are_reproducible():
    """The first evaluation of a recorded SFT run is re-run from scratch and matches."""
    from posttrain.lessons import runs

    again = runs.sft_run(mask_prompt=True, cot=False, steps=runs.EVAL_EVERY)
    rec = runs.recorded()["sft cot=False mask=True"]
    assert again["loss"][0] == pytest.approx(rec["loss"][0], abs=2e-3)
    assert again["acc"][0] == pytest.approx(rec["acc"][0], abs=0.02)


def test_rows_35_36_bradley_terry():
    k = kpis("bt_rm", lr=0.3, pairs=500)
    assert k["σ(1), σ(3)"] == "0.73, 0.95"
    whole = lambda **kn: float(kpis("bt_rm", **kn)["whole ranking right, share of 200 runs"][:-1])
    cd = lambda **kn: float(kpis("bt_rm", **kn)["C above D at the end, share of runs"][:-1])
    assert whole(lr=0.01, pairs=500) > 95 > whole(lr=0.3, pairs=500) > whole(lr=1.0, pairs=500)  # the final ranking
    assert whole(lr=1.0, pairs=500) < 50 and cd(lr=1.0, pairs=500) < 75  # the close pair is the weak one
    assert whole(lr=0.01, pairs=50) < 75  # few labels: a small step has not settled C vs D


def test_row_40_prm_search():
    """Row 40 with posttrain's search table: one sample ≈ p⁶; at the course's budget (a sixth of
    the steps) the beam loses to reranking; at an equal budget (the default) it wins."""
    pct = lambda k, n: float(k[n][:-1])
    course = kpis("prm", p_good=0.75, N=16, B=4, budget="course")
    assert pct(course, "one sample (pass@1)") == pytest.approx(17.8, abs=2.5)  # 0.75⁶
    assert course["step samples: best-of-N / beam"] == "96 / 24"
    assert pct(course, "PRM beam") < pct(course, "ORM best of N")
    k = kpis("prm")  # the default: matched
    assert k["step samples: best-of-N / beam"] == "96 / 96" and k["best method"] == "PRM beam"
    assert pct(k, "PRM beam") > pct(k, "ORM best of N") + 10 > pct(k, "one sample (pass@1)") + 10


def test_row_42_reward_hacking():
    hacked = kpis("hacking", rho=0.5, steps=500)
    assert hacked["π(solve)"] < 0.1 and hacked["train reward EMA"] > 0.85
    assert hacked["held-out correctness EMA"] == pytest.approx(0.4, abs=0.05)
    for rho in (0.0, 0.2):
        assert kpis("hacking", rho=rho, steps=500)["π(solve)"] > 0.77


def test_rows_44_45_curation():
    """Rows 44/45 through data/curate.py: an uncurated pool wastes ~40% of the rollouts whether the
    policy is weak (20) or strong (80); curating to the middle band (80) cuts it to a few percent
    and raises the signal per rollout (the course: 1.51 → 3.04)."""
    for policy in (20, 80):
        k = kpis("curation", policy=policy, curation=0, K=8)
        assert k["prompts kept"] == 380 and k["duplicates removed"] == 20  # curate() drops the 20 copies
        assert pct(k["rollouts in groups with no signal"]) == pytest.approx(42, abs=3)
        assert k["expected gradient per 100 rollouts"] == pytest.approx(1.51, abs=0.05)
    k = kpis("curation", policy=80, curation=80, K=8)
    assert pct(k["rollouts in groups with no signal"]) < 10 and k["expected gradient per 100 rollouts"] > 2.6


def test_row_90_three_forces():
    k = kpis("forces", signal=60, bias=50, cost=8)
    assert [k[n] for n in ("reward source", "algorithm", "topology", "closest named recipe")] == [
        "mixed",
        "GRPO (mixed reward)",
        "colocated",
        "custom (uncommon mix)",
    ]
    # the course names the Dr. GRPO corner DeepSeek-R1; R1 ran GRPO with both normalisations Dr. GRPO
    # removes (Liu et al. 2025 critique R1-Zero's recipe), so the R1 corner is the GRPO one
    k = kpis("forces", signal=80, bias=20, cost=32)
    assert (k["algorithm"], k["closest named recipe"]) == ("Dr. GRPO", "Oat-Zero (the Dr. GRPO paper)")
    k = kpis("forces", signal=80, bias=50, cost=32)
    assert (k["algorithm"], k["closest named recipe"]) == ("GRPO", "DeepSeek-R1")
    assert kpis("forces", signal=20, bias=50, cost=16)["closest named recipe"] == "InstructGPT-style RLHF"
