"""The facts quoted by lessons 13–22 (posttrain/lessons/facts_b.py): every fact runs, returns a
number, a string or a well-formed table, and the values are checked against a hand computation or
an independent formula."""

from __future__ import annotations

import math

import pytest

from posttrain.lessons import facts_b

F = facts_b.FACTS


def v(name):
    return F[name]()


@pytest.mark.parametrize("name", sorted(F))
def test_every_fact_runs_and_has_a_valid_shape(name):
    out = F[name]()
    if isinstance(out, dict):
        assert set(out) == {"columns", "rows"} and out["rows"]
        assert all(len(row) == len(out["columns"]) for row in out["rows"])
    else:
        assert isinstance(out, (int, float, str)) and not isinstance(out, bool)


def test_fact_names_carry_their_lesson_number():
    lessons = ("rl13", "rl14", "rl15", "rl16", "rl17", "rl18_", "rl18a", "rl19", "rl20", "rl21", "rl22_")
    assert all(n.startswith(lessons) for n in F), [n for n in F if not n.startswith(lessons)]


# ---- 13 · DAPO ------------------------------------------------------------------------------------


def test_rl13_degenerate_share_matches_the_closed_form():
    assert v("rl13_p_degenerate_09_k4") == pytest.approx(0.9**4 + 0.1**4, abs=5e-5)  # 0.6562
    assert v("rl13_p_degenerate_09_k16") == pytest.approx(0.9**16 + 0.1**16, abs=5e-5)
    table = v("rl13_degenerate_table")
    for p, *useful in table["rows"]:
        for k, u in zip((4, 8, 16), useful):
            assert u == pytest.approx(1 - p**k - (1 - p) ** k, abs=5e-4)


def test_rl13_clip_band_and_the_rare_token():
    assert (v("rl13_clip_bottom"), v("rl13_clip_top")) == pytest.approx((0.8, 1.28))
    assert v("rl13_rare_token_grpo") == pytest.approx(0.012) and v("rl13_rare_token_dapo") == pytest.approx(0.0128)


def test_rl13_overlong_ramp_is_linear_over_the_buffer():
    rows = dict(map(tuple, v("rl13_overlong_table")["rows"]))
    assert rows == {8000: 0.0, 16384: 0.0, 17408: -0.25, 18432: -0.5, 19456: -0.75, 20480: -1.0}


def test_rl13_ablation_reads_the_recorded_runs():
    rows = {r[0]: r[1:] for r in v("rl13_ablation_table")["rows"]}
    assert rows["all four on"][0] == v("rl13_acc_all_on")
    assert rows["② dynamic sampling off"][0] == v("rl13_acc_no_dynamic")
    assert v("rl13_acc_all_on") - v("rl13_acc_no_dynamic") > 0.1  # the one switch that matters here
    assert v("rl13_other_switches_spread") < 0.05
    assert v("rl13_sample_ratio") == pytest.approx(v("rl13_samples_all_on") / v("rl13_samples_no_dynamic"), abs=0.05)
    # at equal sampled responses the refilling run is behind the one that never refilled
    assert v("rl13_equal_compute_acc") < v("rl13_acc_no_dynamic")
    assert 0 < v("rl13_ablation_useful_off") < rows["all four on"][1]


# ---- 14 · Dr. GRPO --------------------------------------------------------------------------------


def test_rl14_group_advantages_by_hand():
    rows = v("rl14_group_table")["rows"]
    assert rows[0][1:] == [0.5, 0.5, "+1.00, −1.00, +1.00, −1.00", "+0.50, −0.50, +0.50, −0.50"]
    # Y = [1,1,1,0]: mean 0.75, population std √(0.75·0.25) = 0.433; (1 − 0.75)/0.433 = 0.577
    assert rows[1][1:] == [0.75, 0.433, "+0.58, +0.58, +0.58, −1.73", "+0.25, +0.25, +0.25, −0.75"]
    assert (v("rl14_y_wrong_grpo"), v("rl14_y_wrong_dr")) == ("−1.73", "−0.75")


def test_rl14_difficulty_bias_follows_sqrt_vs_p1mp():
    for _label, p, a_g, a_d, sum_g, sum_d in v("rl14_difficulty_table")["rows"]:
        assert a_g == pytest.approx((1 - p) / (p * (1 - p)) ** 0.5, abs=0.006)
        assert a_d == pytest.approx(1 - p, abs=0.006)
        assert sum_g == pytest.approx(2 * 8 * (p * (1 - p)) ** 0.5, abs=0.006)
        assert sum_d == pytest.approx(2 * 8 * p * (1 - p), abs=0.006)
    assert v("rl14_hard_vs_mid_grpo") == pytest.approx((0.125 * 0.875) ** 0.5 / 0.5, abs=0.01)
    assert v("rl14_hard_vs_mid_dr") == pytest.approx(0.125 * 0.875 / 0.25, abs=0.01)


def test_rl14_token_weights_by_hand():
    rows = {r[0]: r[1:] for r in v("rl14_token_table")["rows"]}
    # A = 0.5, two answers of 10 and 200 tokens, L_max = 500
    assert rows["GRPO: seq-mean-token-mean"] == ["0.025", "0.00125", "0.05"]  # A/(2·|y_i|)
    assert rows["DAPO: token-mean"][:2] == [f"{0.5 / 210:.4g}"] * 2  # A/Σ|y_i|
    assert rows["÷G: seq-mean-token-sum"][:2] == ["0.25", "0.25"]  # A/G
    assert rows["Dr. GRPO: ÷(G·L_max)"][:2] == ["0.0005", "0.0005"]  # A/(G·500)
    assert (v("rl14_grpo_long_share"), v("rl14_grpo_break_share")) == ("5.0%", "0.4%")


def test_rl14_bench_numbers_come_from_claims_json():
    assert v("rl14_bench_steps") == 100
    assert v("rl14_bench_wrong_len_grpo") > v("rl14_bench_wrong_len_start")
    assert abs(v("rl14_bench_wrong_len_grpo") - v("rl14_bench_wrong_len_dr")) < 1.0  # no visible length drift here


# ---- 15 · RLHF and the reward model ------------------------------------------------------------


def test_rl15_bradley_terry_table_by_hand():
    for d, p, loss, push in v("rl15_bt_table")["rows"]:
        s = 1 / (1 + math.exp(-d))
        assert p == pytest.approx(s, abs=5e-4)
        assert loss == pytest.approx(-math.log(s), abs=5e-4)
        assert push == pytest.approx(1 - s, abs=5e-4)  # σ(−Δ)


def test_rl15_worked_pair_and_real_rm_numbers():
    assert v("rl15_worked_loss") == pytest.approx(math.log1p(math.exp(-0.8)), abs=1e-6)  # 0.371101
    assert v("rl15_worked_loss_centred") == pytest.approx(math.log1p(math.exp(-0.8)) + 0.01 * 1.2**2, abs=1e-6)
    assert v("rl15_cd_worse_pick") == "38%"  # σ(2 − 2.5)
    assert v("rl15_rm_ensemble") > v("rl15_rm_best_member")
    assert float(v("rl15_all_right_lr1").rstrip("%")) < 50 < 95 < float(v("rl15_all_right_lr001").rstrip("%"))
    assert float(v("rl15_cd_wrong_lr1").rstrip("%")) > 20


# ---- 16 · DPO and its family -----------------------------------------------------------------------


def test_rl16_family_values_match_the_reference_numbers():
    rows = {r[0]: r[3] for r in v("rl16_family_table")["rows"]}
    # docs/algorithms.md §21 (β = 0.1, h = 2): DPO 0.598139, cDPO 0.618139, hinge 0.8, IPO 20.7025, SimPO 0.281150
    assert rows["DPO"] == pytest.approx(math.log1p(math.exp(-0.2)), abs=1e-4)
    assert rows["cDPO (ε = 0.1)"] == pytest.approx(
        0.9 * math.log1p(math.exp(-0.2)) + 0.1 * math.log1p(math.exp(0.2)), abs=1e-4
    )
    assert rows["hinge (SLiC)"] == pytest.approx(0.8)
    assert rows["IPO"] == pytest.approx((1 / 5 + 1 / 4 - 5) ** 2, abs=1e-4)  # h̄ = 1/5 − (−1/4)
    assert rows["SimPO"] == pytest.approx(0.28115, abs=1e-4)


def test_rl16_gradients_by_hand():
    for h, dpo_l, dpo_g, ipo_l, ipo_g in v("rl16_gradient_table")["rows"]:
        s = 1 / (1 + math.exp(-0.5 * h))
        assert dpo_l == pytest.approx(-math.log(s), abs=5e-4) and dpo_g == pytest.approx(0.5 * (1 - s), abs=5e-4)
        assert ipo_l == pytest.approx((h - 1) ** 2, abs=5e-4) and ipo_g == pytest.approx(-2 * (h - 1), abs=5e-4)
    assert v("rl16_dpo_push_at_8") > 0  # DPO never stops pushing


def test_rl16_bench_shows_displacement_and_the_nll_guard():
    assert v("rl16_bench_greedy_dpo") < v("rl16_bench_greedy_start") - 0.2
    assert v("rl16_bench_greedy_nll") >= v("rl16_bench_greedy_start")
    assert v("rl16_bench_chosen_nll") > v("rl16_bench_chosen_dpo")
    assert v("rl16_dpo4_break_pi").split(", ")[1] == "0.97"  # IPO β=2, η=0.5 ends on B


# ---- 17 · ORM, PRM and search ----------------------------------------------------------------------


def test_rl17_pass_at_k_by_hand():
    assert v("rl17_pass1_3_of_16") == pytest.approx(3 / 16)
    assert v("rl17_pass8_3_of_16") == pytest.approx(1 - math.comb(13, 8) / math.comb(16, 8))  # 0.9
    assert v("rl17_chain_075") == f"{100 * 0.75**6:.1f}%"


def test_rl17_beam_loses_only_at_the_unequal_budget():
    pct = lambda s: float(s.rstrip("%"))
    rows = {r[0]: r[1:] for r in v("rl17_budget_table")["rows"]}
    assert rows["step samples: best-of-N / beam"] == ["96 / 96", "96 / 24"]  # B·ceil(N/B)·6 and B·ceil(N/6B)·6
    assert pct(v("rl17_beam_course")) < pct(v("rl17_orm")) < pct(v("rl17_beam_matched"))
    weak = {r[0]: pct(r[1]) for r in v("rl17_weak_table")["rows"]}
    assert weak["PRM beam"] > max(weak["ORM best of N"], weak["PRM best of N"]) > weak["one sample (pass@1)"]


def test_rl17_best_of_n_is_capped_by_pass_at_n():
    for _name, p1, maj, best, ens, p8 in v("rl17_bon_table")["rows"]:
        assert max(p1, maj, best, ens) <= p8


# ---- 18 · environments, verifiers, reward hacking -------------------------------------------------


def test_rl18_verifier_tables():
    assert [r[1] for r in v("rl18_arith_table")["rows"]] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # SEED row 6
    assert [r[1] for r in v("rl18_math_table")["rows"]] == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    leak = {(r[0], r[1]): (r[2], r[3]) for r in v("rl18_leak_table")["rows"]}
    assert leak[("phrase", "trust me#")] == (1.0, 0.0) and leak[("contains", "12? no, 13#")] == (1.0, 0.0)
    assert all(true <= proxy for proxy, true in leak.values())  # a leak only ever adds reward


def test_rl18_hacking_threshold_and_bench_numbers():
    assert v("rl18_toy_threshold") == pytest.approx(0.3)  # 0.4 + ρ > 0.7
    assert v("rl18_toy_phrase_at_05") == pytest.approx(0.9)
    assert v("rl18_sandbox_p50_ms") <= v("rl18_sandbox_p99_ms")
    assert v("rl18_pool4_s") < v("rl18_pool1_s")


# ---- 18a · data: where the gradient is -------------------------------------------------------------


def test_rl18a_signal_identity_exact_constants():
    k = 8
    for p, pq, centred, loo, dead in v("rl18a_signal_table")["rows"]:
        assert pq == pytest.approx(p * (1 - p), abs=1e-4)
        assert centred == pytest.approx(p * (1 - p) * (k - 1) / k, abs=1e-4)  # Var(R_i − R̄)
        assert loo == pytest.approx(p * (1 - p) * k / (k - 1), abs=1e-4)  # RLOO
        assert dead == pytest.approx(p**k + (1 - p) ** k, abs=1e-3)


def test_rl18a_per_prompt_prediction_beats_the_mean():
    for _K, obs, per_prompt, naive in v("rl18a_degenerate_table")["rows"]:
        assert abs(obs - per_prompt) < abs(obs - naive)  # Jensen: the mean underestimates
        assert naive < obs


def test_rl18a_buckets_and_curation_run():
    assert [r[1] for r in v("rl18a_bucket_table")["rows"]] == [
        "never",
        "learnable",
        "learnable",
        "learnable",
        "learnable",
        "always",
    ]
    rows = dict(map(tuple, v("rl18a_curation_table")["rows"]))
    assert rows["never solved"] + rows["learnable (in the band)"] + rows["always solved"] == rows["prompts probed"]
    assert rows["groups with signal after (the probe's own samples)"] == 1.0 > rows["groups with signal before"]


def test_rl18a_widget_numbers_show_the_break():
    pct = lambda s: float(s.rstrip("%"))
    assert pct(v("rl18a_widget_dead_off")) > 30 and pct(v("rl18a_widget_dead_strong")) > pct(v("rl18a_widget_dead_off"))


# ---- 19 · topology ------------------------------------------------------------------------------


def test_rl19_topology_equations_by_hand():
    """The course's step (20 s, 15 s on N-GPU pools, 2 s of sync) on the same 2N GPUs."""
    rows = {r[0]: r[1:] for r in v("rl19_topology_table")["rows"]}
    assert rows["colocated, all 2N GPUs"][1:5] == [20 / 2 + 15 / 2 + 2, 1.0, 20 + 15 / 2 + 2, 1.0]
    assert rows["disaggregated, on-policy"][:2] == ["on-policy", 37.0]  # 20 + 15 + 2: the pools take turns
    assert rows["disaggregated, one step off"][:3] == ["one version stale", 22.0, round(19.5 / 22, 2)]
    assert rows["disaggregated, one step off"][3:] == [22.0, round(29.5 / 22, 2)]  # a tail-bound rollout
    assert rows["async (the sampler loads the weights)"][1] == max(20 + 2, 15)
    assert rows["async, double-buffered weights"][1] == max(20, 15, 2)
    sc = {r[0]: r[4:] for r in v("rl19_scenarios_table")["rows"]}
    assert sc["rollout-bound"][:3] == [round(24.5 / 42, 2), round(24.5 / 42, 2), round(24.5 / 40, 2)]
    assert sc["rollout-bound"][3] == round((40 + 2.5 + 2) / 42, 2)
    assert sc["heavy sync"][:3] == [1.0, round(25 / max(15 + 10, 15), 2), round(25 / 15, 2)]
    assert v("rl19_rollout_bound_split") == sc["rollout-bound"][0] and v("rl19_heavy_async") == 25.0
    assert (v("rl19_colo_step"), v("rl19_split_step"), v("rl19_onpolicy_step")) == (19.5, 22.0, 37.0)
    assert (
        v("rl19_trainer_bound_step") == 22.0 and v("rl19_trainer_bound_idle") == f"{100 * 15 / 22:.0f}%"
    )  # max(5, 20) + 2; waits 20 − 5


def test_rl19_cpu_measurement_falls_short_of_the_formula():
    assert v("rl19_cpu_predicted") > 1.2 and v("rl19_cpu_measured") < v("rl19_cpu_predicted")
    assert v("rl19_sync_70b") == "140 GB (130 GiB)"


# ---- 20 · the KV cache --------------------------------------------------------------------------


def test_rl20_kv_sizes_by_hand():
    rows = {r[0]: r[4] for r in v("rl20_kv_table")["rows"]}
    assert rows == {
        "llama3-8b": "131,072",
        "qwen2.5-7b": "57,344",
        "llama-7b": "524,288",
        "llama3-70b": "327,680",
    }  # SEED row 51
    assert (v("rl20_course_gqa"), v("rl20_course_mha")) == ("128 KiB", "512 KiB")
    assert v("rl20_70b_256_8k") == "640 GiB" and v("rl20_70b_256_8k_gb") == "687 GB"  # SEED row 52
    assert v("rl20_70b_h100s") == math.ceil(256 * 8192 * 327680 / 80e9)


def test_rl20_decode_step_and_prefix_sharing():
    gqa = v("rl20_decode_table")["rows"][0]
    assert gqa[1] == "8.0 GiB" and gqa[2] == f"{32 * 2048 * 131072 / 3.35e12 * 1e3:.1f} ms"
    assert v("rl20_per_seq_gqa") == round(3.35e12 / (14e9 + 32 * 2048 * 131072))
    assert v("rl20_prefix_separate") == f"{16 * 1224:,}" and v("rl20_prefix_shared") == f"{1024 + 16 * 200:,}"
    assert v("rl20_nano_kv") == 4 * 2 * 128 * 4  # layers · (K, V) · d_model · fp32
    assert 0 < v("rl20_engine_cache_occupancy") < 1


# ---- 21 · scheduling ----------------------------------------------------------------------------


def test_rl21_engine_counts():
    from posttrain.lessons.facts_b_sys import engine_run, static_vs_continuous

    for slots, k in ((8, 4), (4, 8), (32, 8)):
        r = engine_run(slots, k)
        assert len(r["lengths"]) == 4 * k
        assert static_vs_continuous(r["lengths"], slots)[1] <= r["engine"]  # no schedule beats a perfect refill
    assert engine_run(32, 8)["engine"] == engine_run(32, 8)["static"]  # one wave: both are max ℓ − 1
    assert static_vs_continuous([5, 1, 1, 1], 2) == (4, 4)  # forwards: batches (4,0), (0,0); refill max(4, ⌈4/2⌉)
    assert (v("rl21_prefill_shared"), v("rl21_prefill_separate")) == (20, 80)  # 4 prompts of 5 tokens, K = 4


def test_rl21_long_tail_is_where_refill_pays():
    rows = dict(map(tuple, v("rl21_tail_table")["rows"]))
    assert rows["static / continuous"] > 2 > v("rl21_static_over_engine")
    assert rows["longest / mean response"] == pytest.approx(4.3, abs=0.2)


# ---- 22 · memory math ---------------------------------------------------------------------------


def test_rl22_bytes_and_state_by_hand():
    assert [r[-1] for r in v("rl22_bytes_table")["rows"]] == [18, 16, 12]  # SEED row 59
    rows = {r[0]: r[1:] for r in v("rl22_state_table")["rows"]}
    assert rows["7B"][:3] == ["126 GB", "117.3 GiB", 2] and rows["70B"][2] == 16 and rows["405B"][2] == 96  # row 60
    assert [rows[m][3] for m in ("7B", "70B", "405B")] == ["19,048", "1,905", "329"]  # row 62


def test_rl22_activations_and_the_worked_example():
    full = 32 * 8192 * 4 * (12 * 4096 + 2 * 8192) * 2  # row 61: 137.4 GB
    assert v("rl22_act_7b") == f"{full / 2**30:,.0f} GiB" and v("rl22_act_7b_gb") == "137.4 GB"
    assert v("rl22_act_7b_ckpt") == f"{full / 8 / 2**30:,.0f} GiB"
    ex = {r[0]: r[2] for r in v("rl22_example_table")["rows"]}
    act = 32 * 4096 * 8 * (12 * 4096 + 2 * 4096) * 2 / 8
    assert ex["trainer (4 GPUs, FSDP)"] == f"{(18 * 7e9 / 4 + act) / 2**30:,.1f} GiB"
    assert ex["rollout (3 GPUs, TP 1)"] == f"{(14e9 + 2**20 * 131072 / 3) / 2**30:,.1f} GiB"
    assert v("rl22_train_1m_4gpu_s") == pytest.approx(1e6 / (4 * 800e12 / (6 * 7e9)), abs=0.05)  # 13.1 s, not 5
    assert v("rl22_envelope_train") == "30.7 GiB" and v("rl22_envelope_train_gb") == "32.9 GB"  # row 64
