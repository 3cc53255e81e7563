"""Lesson claims held to their sources: a paper, a framework's default, or the H100 this project ran
on (the practitioner review of 2026-11). The facts are facts_a_algos' practitioner checks (lessons
10–12), facts_b_pref (15–16), facts_b_hw (20–22) and the measured-H100 facts of facts_c (22a, 24,
25); each is checked against a hand computation from the source's own numbers."""

from __future__ import annotations

import math

import pytest

from posttrain.lessons import facts, facts_a_algos
from posttrain.lessons.facts_b_hw import h100_run


def v(name):
    return facts.load_all()[name]()


# ---- 10–12: GAE over a long answer, k3's gradient, AdamW and a constant scale ----------------------


def test_rl10_gae_discounts_a_terminal_reward_by_lambda_to_the_distance():
    assert v("rl10_lam095_100") == f"{0.95**100:.3f}" == "0.006"
    assert v("rl10_lam095_1000") == f"{0.95**1000:.0e}" == "5e-23"


def test_rl11_k3_in_the_loss_descends_the_forward_kl():
    g = facts_a_algos._k3_gradients()
    assert float((g["k3 in the loss"] - g["forward KL(π_ref‖π)"]).abs().max()) < 1e-12
    assert float((g["k3 in the loss"] - g["reverse KL(π‖π_ref)"]).abs().max()) > 0.05
    assert v("rl11_k3_grad_vs_reverse") == f"{float((g['k3 in the loss'] - g['reverse KL(π‖π_ref)']).abs().max()):.2f}"


def test_rl12_adamw_normalises_a_constant_gradient_scale_and_sgd_does_not():
    assert v("rl12_adam_scale_ratio") == "1.0000"  # the same step up to AdamW's ε (1e-8)
    assert v("rl12_sgd_scale_ratio") == "10.0"
    a1, a10 = facts_a_algos._adamw_displacement(1.0), facts_a_algos._adamw_displacement(10.0)
    assert float((a10 - a1).abs().max()) < 1e-3 * float(a1.abs().max())  # ε shifts steps by ~1e-4 here


# ---- 15–16 held to their sources (facts_b_pref) ----------------------------------------------------


def test_rl15_calibrated_margins_from_instructgpt_agreement():
    """Agreement a between two labellers who each prefer the chosen answer with probability q is
    q² + (1 − q)² (not q itself, the 2026-11-28 review's R15-2): q = 0.836 for a = 72.6%."""
    for a, q, margin, name in ((0.726, 0.84, 1.63, "train"), (0.773, 0.87, 1.90, "heldout")):
        exact_q = (1 + math.sqrt(2 * a - 1)) / 2
        assert exact_q**2 + (1 - exact_q) ** 2 == pytest.approx(a)
        assert v(f"rl15_pref_agree_{name}") == round(exact_q, 2) == q
        assert v(f"rl15_margin_agree_{name}") == round(math.log(exact_q / (1 - exact_q)), 2) == margin


def test_rl16_dpo_optimum_by_hand_and_the_sgd_widget_stays_near_uniform():
    z = [math.exp(s / 0.5) for s in (0.0, 1.0, 2.0, 2.5)]
    assert v("rl16_optimum_d_beta05") == f"{z[3] / sum(z):.2f}" == "0.70"
    assert float(v("rl16_optimum_d_beta005")) > 0.9999
    assert all(abs(float(x) - 0.25) < 0.15 for x in v("rl16_dpo4_small_beta_pi").split(","))


# ---- 20–22 held to the hardware (facts_b_hw) -------------------------------------------------------


def test_rl20_capacity_reported_against_the_planners_budget():
    assert v("rl20_h100_reported_gib") == "79.6 GiB" and v("rl20_h100_gib") == "74.5 GiB"
    assert v("rl20_h100_margin_gib") == f"{81559 / 1024 - 80e9 / 2**30:.1f} GiB" == "5.1 GiB"
    assert v("rl20_70b_h100s_reported") == math.ceil(640 * 1024 / 81559) == 9  # 8.04 cards


def test_rl20_measured_decode_step_against_its_bandwidth_floor():
    row = next(r for r in h100_run()["rollout"] if r["batch"] == 256)
    assert v("rl20_h100_decode_tok_s") == "15,372" and v("rl20_h100_decode_ms") == round(4.2634 / 256 * 1e3, 1)
    kv = 256 * (64 + 128) * 24 * 2 * 2 * 64 * 2  # rows × mean context × layers · (K, V) · kv heads · head dim · bf16
    assert v("rl20_h100_decode_floor_ms") == round((2 * 494_005_120 + kv) / 3.35e12 * 1e3, 2)
    assert row["engine_tok_s"] == pytest.approx(256 * 256 / row["engine_s"])  # the JSON is self-consistent
    assert v("rl20_h100_decode_over_floor") > 10


def test_rl21_batching_and_speculation_by_hand():
    kv = lambda n: n * 2048 * 131072  # course 7B, GQA
    assert v("rl21_decode_8_ms") == round((14e9 + kv(8)) / 3.35e12 * 1e3, 1)
    assert v("rl21_decode_64_over_8") == round((14e9 + kv(64)) / (14e9 + kv(8)), 1) == 1.9
    assert v("rl21_ridge_tokens") == round(989 / 3.35) == 295 and v("rl21_ridge_seqs_spec") == 59
    assert v("rl21_spec_alpha_t1") < v("rl21_spec_alpha_t0") and v("rl21_spec_gain_t1") > 1.5


def test_rl22_flops_scores_and_the_b1_fix_by_hand():
    assert v("rl22_mfu_at_800") == "81%" and v("rl22_llama3_mfu") == "38–43%"
    assert [round(t / 989 * 100) for t in (380, 430)] == [38, 43]  # Llama 3's TFLOP/s and MFU agree
    assert v("rl22_train_1m_4gpu_400_s") == round(1e6 / (4 * 400e12 / (6 * 7e9)), 1) == 26.3
    assert v("rl22_scores_ratio") == 5 * 32 // 4  # 5·a·L² against the course's 4·L² bytes
    assert v("rl22_scores_course") == f"{32 * 8192 * 4 * 2 * 8192 * 2 / 2**30:.1f} GiB"
    assert v("rl22_act_double_course") == 2.5 and v("rl22_act_double_sdpa") == 2.0
    assert v("rl22_envelope_b1_nockpt") == f"{(18 * 7e9 / 8 + 32 * 8192 * 65536 * 2) / 2**30:.1f} GiB"  # fits


def test_rl22_measured_h100_step():
    assert v("rl22_h100_train_tflops") == round(6 * 494_005_120 * 82709 / 3.2724007730000153 / 1e12) == 75
    assert v("rl22_h100_peak_alloc") == "55.0 GiB" and v("rl22_h100_reserved_gap") == "16.5 GiB"
    assert (v("rl22_h100_rollout_s"), v("rl22_h100_trainer_side_s")) == (5.48, 5.51)


# ---- 22a, 24, 25: the measured H100 and the precision lab (facts_c) -----------------------------


def test_rl25_measured_mismatch_sizes():
    assert v("rl25_lab_fp32") < 1e-6 < v("rl25_lab_fp16") < v("rl25_lab_bf16") < 0.05 < v("rl25_lab_bf16_max")
    assert v("rl25_h100_mismatch") == 0.0048


def test_rl24_capacity_and_the_realistic_trainer():
    assert v("rl24_hbm_gib") == pytest.approx(8 * 81559 / 1024)
    assert v("rl24_speed_ratio_400") == pytest.approx(v("rl24_speed_ratio") / 2)


def test_rl22a_h100_step_through_the_equation():
    assert v("rl22a_6p_1m_4gpu_s") == round(1e6 / (4 * 800e12 / (6 * 7e9)), 1) == 13.1  # the toy's 8 s beats it
    rows = {r[0]: float(r[1]) for r in v("rl22a_h100_table")["rows"]}
    assert rows["rollout"] == 5.48 and rows["reference"] == 2.24
    assert v("rl22a_h100_equation_s") == pytest.approx(sum(rows.values()), abs=0.03)
    assert v("rl22a_h100_equation_s") < v("rl22a_h100_measured_s") < 1.05 * v("rl22a_h100_equation_s")
    split = max(rows["rollout"] + rows["reward"], rows["reference"] + rows["train"]) + rows["sync"]
    assert v("rl22a_h100_split_s") == pytest.approx(split, abs=0.02)  # two GPUs, one step off
    colo2 = (rows["rollout"] + rows["reference"] + rows["train"]) / 2 + rows["reward"] + rows["sync"]
    assert v("rl22a_h100_colo2_s") == pytest.approx(colo2, abs=0.03)  # the same two GPUs, colocated
    assert abs(v("rl22a_h100_colo2_s") - v("rl22a_h100_split_s")) < 0.05 * split  # no gain per GPU


# ---- claims about other frameworks and papers name the file or doc they were read from -------------
# (the 2026-11-28 review: page, the claim as the page states it, and the source it must cite in the
# same paragraph; the sources were read for that review's verdicts, docs/course_reviews.md)

CITED = [
    ("rl-19", "actor_rollout_ref.hybrid_engine: True", "verl/trainer/config/ppo_trainer.yaml"),
    ("rl-19", "policy.generation.colocated.enabled: true", "examples/configs/grpo_math_1B.yaml"),
    ("rl-19", 'vllm_mode="server"', "vLLM integration guide"),
    ("rl-19", "increasing resources does not reduce the Rollout duration", "recipe/one_step_off_policy/README.md"),
    ("rl-19", "interruptible rollout workers", "arXiv 2505.24298"),
    ("rl-19", "time/rollout_sync_s", "distributed/async_rollout.py"),
    ("rl-22a", "one step off", "recipe/one_step_off_policy"),
    ("rl-22", "Free all non-split cached blocks and retry alloc", "c10/cuda/CUDACachingAllocator.cpp"),
    ("rl-28", "at least one", "nvmlUtilization_t.gpu"),
    ("rl-28", "DRAM and tensor-core activity", "DCGM_FI_PROF_DRAM_ACTIVE"),
    ("rl-23", "SFT of the *base* model on ~800k examples", "§2.3.3"),
    ("rl-23", "language consistency", "§2.3.2"),
    ("rl-23", '"PPO-ptx"', "§3.5 Eq. 2"),
    ("rl-26", "β = 0", '"Removing KL Divergence"'),
    ("rl-26", "Oat-Zero", "arXiv 2503.20783"),
    ("rl-17", "**product**", "Let's Verify Step by Step"),
    # the blind reads of the remaining pages (docs/course_reviews.md §3)
    ("rl-05", "# recompute old_log_probs", "verl/trainer/ppo/ray_trainer.py"),
    ("rl-05", "weight_decay: 0.01", "verl/trainer/config/optim/fsdp.yaml"),
    ("rl-06", "Copy, not share memory", "verl/workers/sharding_manager/fsdp_vllm.py"),
    ("rl-06", "# recompute old_log_probs", "verl/trainer/ppo/ray_trainer.py"),
    ("rl-06", "decoupled PPO objective", "arXiv 2505.24298"),
    ("rl-09", "reinforcement baseline", "Williams 1992, §3"),
    ("rl-09", "clip-higher, dynamic sampling", "arXiv 2503.14476"),
    ("rl-09", "standard-deviation normalisations", "arXiv 2503.20783"),
    ("rl-15", "6B reward models from a 6B SFT model", "§3.5"),
    ("rl-15", "mitigate reward hacking but do not eliminate it", "arXiv 2312.09244"),
    ("rl-00", "the reference model is not loaded", "trl/trainer/grpo_config.py"),
    ("rl-00", "leave-one-out baseline", "arXiv 2402.14740"),
    ("rl-00", "masked_whiten", "verl/trainer/ppo/core_algos.py"),
    ("rl-00", "difficulty bias", "arXiv 2503.20783"),
    ("rl-02", "raw_logprobs", "vllm/v1/sample/sampler.py"),
    ("rl-02", "# recompute old_log_probs", "verl/trainer/ppo/ray_trainer.py"),
    ("rl-03", "low_var_kl", "verl/trainer/ppo/core_algos.py"),
    ("rl-03", "DeepSeek-R1's 0.001", "trl/trainer/grpo_config.py"),
    ("rl-03", "DeepSeekMath's 0.04", "arXiv 2402.03300"),
    ("rl-04", ".std(dim=1)", "trl/trainer/grpo_trainer.py"),
    ("gpt-01", "non-embedding", "Kaplan et al. (2020, §2.1)"),
    ("gpt-02", "about 20 training tokens per parameter", "arXiv 2203.15556"),
    ("gpt-05", "*likelihood displacement*", "arXiv 2410.08847"),
    ("gpt-05", "DPOConfig.rpo_alpha", "trl/trainer/dpo_config.py"),
    ("gpt-06", ".std(dim=1)", "trl/trainer/grpo_trainer.py"),
    ("gpt-06", "torch.std", "verl/trainer/ppo/core_algos.py"),
    ("gpt-06", "seq-mean-token-mean", "arXiv 2402.03300"),
]


@pytest.mark.parametrize("page, claim, source", CITED)
def test_a_claim_about_another_framework_cites_its_source(page, claim, source):
    from posttrain.lessons import markdown

    paragraphs = [p.replace("\n", " ") for p in markdown.lesson_text(page).split("\n\n")]
    claim, source = claim.replace("\n", " "), source.replace("\n", " ")
    assert any(claim in p and source in p for p in paragraphs), f"{page}: {claim!r} without {source!r}"
