"""The facts quoted by TEXT C's lesson pages (posttrain/lessons/facts_c.py): every fact runs and its
value agrees with a hand computation or an independent formula. How long each fact takes is
measured by benchmarks/lessons_facts.py, not here."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from posttrain.lessons.facts_c import FACTS

TEXT = Path(__file__).resolve().parents[1] / "posttrain" / "lessons" / "text"
PAGES = [
    "rl-22a",
    "rl-22b",
    "rl-22c",
    "rl-23",
    "rl-24",
    "rl-25",
    "rl-26",
    "rl-27",
    "rl-28",
    "gpt-01",
    "gpt-02",
    "gpt-03",
    "gpt-04",
    "gpt-05",
    "gpt-06",
    "gpt-index",
]


def f(name):
    return FACTS[name]()


def cell(name, row, col):
    t = f(name)
    return t["rows"][row][t["columns"].index(col) if isinstance(col, str) else col]


@pytest.fixture(scope="module")
def warm_imports():
    """Module imports (torch, the widget registry) are paid once per process, not by a fact."""
    import posttrain.framework.rollout
    import posttrain.lessons.runs  # noqa: F401
    from posttrain.lessons import registry

    registry.load_all()


@pytest.mark.parametrize("name", sorted(FACTS))
def test_every_fact_runs_and_has_a_quotable_value(name, warm_imports):
    v = FACTS[name]()
    if isinstance(v, dict):
        assert set(v) == {"columns", "rows"} and v["rows"]
        assert all(len(r) == len(v["columns"]) for r in v["rows"])
    else:
        assert isinstance(v, (int, float, str)) and not isinstance(v, bool)
        if isinstance(v, float):
            assert math.isfinite(v)


def test_every_fact_the_pages_quote_exists_and_every_fact_is_quoted():
    quoted = set()
    for page in PAGES:
        path = TEXT / f"{page}.md"
        if path.exists():
            quoted |= set(re.findall(r"\{\{(?:fact|table):([A-Za-z0-9_]+)", path.read_text()))
    assert quoted <= set(FACTS), sorted(quoted - set(FACTS))
    assert set(FACTS) <= quoted, f"facts no page quotes: {sorted(set(FACTS) - quoted)}"


# ---- 22a -------------------------------------------------------------------------------------


def test_rl22a_worked_example_by_hand():
    """The text's role times on two equal pools; colocated runs each phase on both (the same GPUs)."""
    assert f("rl22a_worked_colo_s") == 30 / 2 + 1 + 3 / 2 + 8 / 2 + 1 == 22.5
    assert f("rl22a_worked_colo_pool_s") == 30 + 1 + 3 + 8 + 1 == f("rl22a_worked_onpolicy_s")
    assert f("rl22a_worked_colo_tail_s") == 30 + 1 + 3 / 2 + 8 / 2 + 1
    assert f("rl22a_worked_split_s") == max(30 + 1, 3 + 8) + 1 == 32
    assert f("rl22a_worked_idle_s") == 31 - 11
    assert f("rl22a_worked_tokens") == 1_048_576
    assert f("rl22a_worked_tok_s") == 1_048_576 / 32
    assert cell("rl22a_worked_table", 3, "τ_step on the same GPUs") == "32 s"  # async: max(31 + 1, 11)
    assert cell("rl22a_worked_table", 4, "τ_step on the same GPUs") == "31 s"  # double-buffered: max(31, 11, 1)


def test_rl22a_role_model_by_hand():
    scale = 64 * 16 * 1024 / 1e6
    rollout = 21 * scale * (1 + 1.8 * math.tanh(1024 / 2048)) / 4
    train = 8 * scale / 4
    sync = 0.15 * 7 + 0.005 * 49
    step = max(rollout + 1.0, train / 3 + train) + sync
    assert f("rl22a_default_rollout_s") == pytest.approx(rollout)
    assert f("rl22a_default_step_s") == pytest.approx(step)
    assert f("rl22a_rollout_share") == pytest.approx(100 * rollout / step)
    colo = rollout / 2 + 1.0 + (train / 3 + train) / 2 + sync  # all 8 GPUs on every phase
    assert f("rl22a_colo_gain_pct") == pytest.approx(100 * (step / colo - 1))
    assert f("rl22a_k32_rollout_ratio") == pytest.approx(2.0)
    assert f("rl22a_sync_70b_s") == pytest.approx(0.15 * 70 + 0.005 * 70**2)
    assert f("rl22a_share_8192") > 97


def test_rl22a_cpu_run_is_train_bound_and_the_timers_cover_the_step():
    assert f("rl22a_cpu_bottleneck") == "train"
    assert f("rl22a_cpu_train_share") > 50 > f("rl22a_cpu_rollout_share")
    assert f("rl22a_cpu_equation_s") == pytest.approx(f("rl22a_cpu_measured_s"), rel=0.02)


# ---- 22b -------------------------------------------------------------------------------------


def test_rl22b_max_of_k_table_exact_beside_the_course_row_71():
    """The exact expectation (the 2026-11-28 review's integral: c = 1 → 1.99, 3.44, 5.37, 7.88) beside
    the course's √(2 ln K) envelope, row 71's numbers."""
    rows = {r[0]: tuple(r[1:]) for r in f("rl22b_maxk_table")["rows"]}
    assert [rows[k][1] for k in (4, 16, 64, 256)] == ["1.99", "3.44", "5.37", "7.88"]
    assert rows[256][2] == "18.59"
    assert {k: r[3:] for k, r in rows.items()} == {
        4: ("1.96", "2.83", "3.70"),
        16: ("2.72", "5.02", "8.87"),
        64: ("3.49", "7.80", "17.36"),
        256: ("4.31", "11.31", "30.57"),
    }
    # row 72's "K 16→32 adds ~15%" holds at c = 0.5 only, exactly as with the envelope
    assert [round(f(f"rl22b_k32_{c}_pct")) for c in ("c05", "c1", "c2")] == [15, 26, 40]
    assert round(f("rl22b_envelope_16_1_high_pct")) == 46
    assert f("rl22b_course_p95_is_max_k") == 20  # floor(0.95 · 20) = 19 = K − 1; at 21, 19 < 20


def test_rl22b_tail_share_agrees_with_monte_carlo():
    import torch

    g = torch.Generator().manual_seed(0)
    for row in f("rl22b_tail_table")["rows"]:
        c = row[0]
        s = math.sqrt(math.log1p(c * c))
        L = torch.exp(s * torch.randn(400_000, generator=g, dtype=torch.float64) - s * s / 2)  # μ = 1
        q = torch.quantile(L[:100_000], 0.95)
        assert float(q) == pytest.approx(float(row[2].split()[0]), rel=0.03)
        share = float(L[L > torch.quantile(L, 0.95)].sum() / L.sum())
        assert 100 * share == pytest.approx(float(row[3].rstrip("%")), abs=1.5)


def test_rl22b_cutoff_shortens_the_wall_costs_tokens_and_favours_short_answers():
    assert f("rl22b_cutoff_steps_cut") < f("rl22b_cutoff_steps_all")
    assert f("rl22b_cutoff_tokens_cut") > f("rl22b_cutoff_tokens_all")
    assert f("rl22b_cutoff_mean_cut") < f("rl22b_cutoff_mean_all")
    assert [r[3] for r in f("rl22b_cutoff_table")["rows"]] == [64, 64]


def test_rl22b_overlong_penalty_course_values():
    assert {r[0]: r[1] for r in f("rl22b_overlong_table")["rows"]} == {
        50: "+0.00",
        80: "+0.00",
        90: "-0.50",
        100: "-1.00",
        110: "-1.00",
    }


def test_rl22b_widget_facts_order():
    pct = lambda name: int(f(name).rstrip("%"))
    assert pct("rl22b_w_capdyn_tax") < pct("rl22b_w_cap_tax") < pct("rl22b_w_course_tax") < pct("rl22b_w_cv2_tax")


# ---- 22c -------------------------------------------------------------------------------------


def test_rl22c_topologies_by_hand():
    """τ_R 20 s, τ_T 8 s on N-GPU pools, τ_S 3 s, on the same 2N GPUs."""
    rows = {r[0]: r[1:] for r in f("rl22c_topology_table")["rows"]}
    assert rows["colocated"][:2] == ["on-policy", f"{20 / 2 + 8 / 2 + 3:g} s"]
    assert rows["disaggregated"][:2] == ["on-policy", f"{20 + 8 + 3} s"]  # the review's 31 s
    assert rows["one_step_off"][:2] == ["one version stale", f"{max(20, 8) + 3} s"]  # 23 s
    assert rows["async"][1] == f"{max(20 + 3, 8)} s" and rows["async_double_buffered"][1] == "20 s"
    assert (f("rl22c_onpolicy_step_s"), f("rl22c_split_step_s"), f("rl22c_colo_step_s")) == (31, 23, 17)
    assert f("rl22c_split_idle_s") == 20 - 8
    assert f("rl22c_course_clip_8") == pytest.approx(100 * (1 - math.exp(-0.4)))


def test_rl22c_stale_table_baseline_is_the_on_policy_split():
    """Δ = 0 cannot overlap: 65 steps × 31 s, the review's ≈ 34 min, not 65 × 23 s = 25 min."""
    rows = {r[0]: r for r in f("rl22c_stale_table")["rows"]}
    assert rows[0][3] == 65 and rows[0][5] == f"{65 * 31 / 60:.0f} min" == "34 min"
    assert rows[2][5] == f"{rows[2][3] * 23 / 60:.0f} min"  # async, the sampler paying the 3 s load
    assert f("rl22c_steps_d0") == 65 and f("rl22c_steps_d1_d4_max") <= 65  # the review's #19
    assert f("rl22c_first_more_steps") == 8 and f("rl22c_first_losing_delta") == 32
    assert f("rl22c_tis_last_ahead") == 32


def test_rl22c_recorded_staleness_clips_more_without_a_correction():
    rows = f("rl22c_stale_table")["rows"]
    clip_none = [float(r[1].rstrip("%")) for r in rows]
    assert clip_none == sorted(clip_none) and clip_none[-1] > 3 * clip_none[0]
    assert float(rows[-1][2].rstrip("%")) < clip_none[-1] / 2  # TIS keeps it flat
    assert rows[-1][3] > rows[0][3]  # Δ = 32 needs more steps


def test_rl22c_measured_staleness_shows_in_the_log_ratio():
    rows = {r[0].split(",")[0]: r for r in f("rl22c_measured_table")["rows"]}
    assert rows["sync (on-policy)"][1] == "0.00" and rows["sync (on-policy)"][3] == "1.00"
    assert f("rl22c_fixed4_logratio") > 5 * f("rl22c_async1_logratio") > 0
    assert f("rl22c_fixed4_ratio_max") > 1.5 and 0 < f("rl22c_fixed4_clip_pct") < 5
    roles = next(
        r
        for r in __import__("json").loads(
            (Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "async_vs_sync.json").read_text()
        )["runs"]
        if r["run"] == "sync" and r["seed"] == 0
    )["roles_s"]
    colo = sum(roles.values())
    asyn = max(roles["rollout_s"] + roles["reward_s"] + roles["sync_s"], roles["reference_s"] + roles["train_s"])
    assert f("rl22c_cpu_async_speedup") == pytest.approx(colo / asyn)


# ---- 23 --------------------------------------------------------------------------------------


def test_rl23_alarm_thresholds_are_the_report_functions_defaults():
    rows = {r[0]: r[2] for r in f("rl23_alarm_table")["rows"]}
    assert rows["clip fraction high"] == "clip/frac > 0.2"
    assert rows["many degenerate groups"] == "> 60% of groups"
    assert rows["entropy collapse"] == "entropy < 10% of its start"


def test_rl23_alarms_on_real_runs_follow_the_degenerate_threshold():
    for r in f("rl23_real_runs_table")["rows"]:
        last = float(r[3].split("→")[1])
        assert ("many degenerate groups" in r[4]) == (last > 0.6), r


def test_rl23_each_failure_mode_fires_its_own_alarm():
    want = {
        "healthy": "none",
        "entropy collapse": "entropy collapse",
        "easy prompts": "many degenerate groups",
        "reward hacking": "reward up, held-out flat",
        "stale sampler": "clip fraction high",
        "temperature mismatch": "sampler/trainer mismatch",
        "length blow-up": "length blow-up",
    }
    assert {r[0]: r[1] for r in f("rl23_modes_table")["rows"]} == want


# ---- 24 --------------------------------------------------------------------------------------


def test_rl24_rates_by_hand():
    assert f("rl24_decode_tok_s") == pytest.approx(32 * 3.35e12 / (14e9 + 8.6e9))
    assert f("rl24_train_tok_s") == pytest.approx(800e12 / (6 * 7e9))
    assert f("rl24_speed_ratio") == pytest.approx(f("rl24_train_tok_s") / f("rl24_decode_tok_s"))


def test_rl24_sizing_70b_needs_lora_or_more_gpus():
    fits = {(r[0], r[1], r[2], r[3]): r[6] for r in f("rl24_sizing_table")["rows"]}
    assert fits == {
        ("llama3-8b", 8, "full", 1): "yes",
        ("llama-70b", 8, "full", 1): "no",
        ("llama-70b", 8, "full", 8): "no",
        ("llama-70b", 8, 16, 4): "yes",
        ("llama-70b", 32, "full", 8): "yes",
    }
    assert f("rl24_state_tib") * 2**40 == pytest.approx(18 * 68_976_648_192)  # Llama-2-70B's parameter count
    assert f("rl24_state_tib") * 1024 > f("rl24_hbm_gib")
    persistent = {(r[0], r[1], r[2]): float(r[4]) for r in f("rl24_sizing_table")["rows"]}
    assert persistent[("llama-70b", 8, "full")] == pytest.approx(
        (18 + 2) * 68_976_648_192 / 8 / 2**30, abs=0.1
    )  # state + bf16 reference


def test_rl24_traps_hold_on_a_real_engine():
    assert f("rl24_gap") < 1e-5
    assert f("rl24_ref_trainable") == 0 < f("rl24_ref_params")
    assert f("rl24_eos_in_loss") == f("rl24_stopped") > 0


# ---- 25 --------------------------------------------------------------------------------------


def test_rl25_logits_and_chunks_by_hand():
    assert f("rl25_logits_gib") == 32768 * 131072 * 2 / 2**30 == 8.0
    rows = {r[0]: r[1:] for r in f("rl25_chunk_table")["rows"]}
    assert rows["1,024 columns"] == ["64 MiB", "128×"] and rows["4,096 columns"] == ["256 MiB", "32×"]


def test_rl25_prefix_sharing_course_row_85_and_the_engine():
    rows = {r[0]: r for r in f("rl25_prefix_table")["rows"]}
    assert rows[16][2] == "6.15×" and rows[64][2] == "8.65×"  # SEED_SPEC row 85
    assert rows[16][3] == f"{16 * 1.1 / 2.6:.2f}×"
    prompts = ["<3+4+5>", "<12+7+9+1>", "<6+6>", "<18+2+11>"]
    assert f("rl25_engine_prefill_tokens") == sum(map(len, prompts))
    assert f("rl25_engine_prompt_tokens") == 16 * sum(map(len, prompts)) and f("rl25_engine_prefills") == 4
    assert f("rl25_w_gp05") == f"{16 / (1 + 16 * 0.5):.2f}×" and f("rl25_w_k64") == f"{64 / (1 + 64 * 0.05):.2f}×"


def test_rl25_chunked_logsumexp_is_exact_and_a_forgotten_temperature_is_not():
    assert f("rl25_chunked_exact") < 1e-4
    assert f("rl25_wrong_t_gap") > 1e3 * f("rl24_gap")
    assert f("rl25_cast_ms") == pytest.approx(210e9 / 3.35e12 * 1e3, abs=0.01)  # 62.69: read 140 GB + write 70 GB


# ---- 26 --------------------------------------------------------------------------------------


def test_rl26_cost_table_by_hand():
    rows = {r[0]: r for r in f("rl26_cost_table")["rows"]}
    assert rows["7B"][1] == f"{18 * 7e9 / 2**30:,.0f} GiB" and rows["7B"][2] == 2  # 126 GB → 2 H100s (row 60)
    assert rows["70B"][2] == 16 and rows["405B"][2] == 96  # 92 would hold it: whole 8-GPU nodes past 8
    assert "whole 8-GPU nodes" in f("rl26_cost_table")["columns"][2]
    assert rows["7B"][4] == "128 KiB"  # 32·2·8·128·2 B
    assert f("rl26_train_over_serve") == 9


def test_rl26_corners_recover_the_course_recipes():
    rows = {(r[0], r[1], r[2]): r[3:7] for r in f("rl26_extremes_table")["rows"]}
    # row 90 names the Dr. GRPO corner DeepSeek-R1; R1 ran GRPO with both normalisations (the review's #12)
    assert rows[("100%", "0%", 32)] == ["verifier", "Dr. GRPO", "disaggregated", "Oat-Zero (the Dr. GRPO paper)"]
    assert rows[("100%", "50%", 32)] == ["verifier", "GRPO", "disaggregated", "DeepSeek-R1"]
    assert rows[("20%", "50%", 8)][3] == "InstructGPT-style RLHF"
    assert rows[("20%", "50%", 1)][1] == "DPO (no rollouts)"


# ---- 27 --------------------------------------------------------------------------------------


def test_rl27_gae_limits_by_hand():
    rows = {r[0]: [float(x) for x in r[1:]] for r in f("rl27_gae_table")["rows"]}
    V = [0.2, 0.4, 0.5, 0.7, 0.9]
    assert rows[1.0] == pytest.approx([1 - v for v in V])  # λ = 1: outcome − V
    assert rows[0.0] == pytest.approx(
        [b - a for a, b in zip(V, V[1:] + [1.0])]
    )  # λ = 0: δ_t = V_{t+1} − V_t (last: 1 − V)
    lam, a, expect = 0.95, 0.0, []
    for t in range(4, -1, -1):  # the recursion by hand
        a = (rows[0.0][t]) + lam * a
        expect.insert(0, a)
    assert rows[0.95] == pytest.approx(expect, abs=1e-3)


def test_rl27_kl_estimators_properties():
    t = f("rl27_kl_table")
    exact = float(t["columns"][1].split("= ")[1].rstrip(")"))
    rows = {r[0]: r for r in t["rows"]}
    assert float(rows["k3"][1]) == pytest.approx(exact, rel=0.05)  # unbiased: close on 4,096 tokens
    assert rows["k3"][3] == rows["k2"][3] == "0%" and int(rows["k1"][3].rstrip("%")) > 40
    assert float(rows["k3"][2]) < float(rows["k2"][2]) < float(rows["k1"][2])


def test_rl27_lora_and_off_policy_numbers():
    assert f("rl27_lora_params") == 39_976_960  # shapes.lora_params docstring
    assert f("rl27_lora_pct") == pytest.approx(100 * 39_976_960 / 6_738_415_616)
    assert f("rl27_lora_opt_ratio") > 10
    assert abs(f("rl27_w_bias_tis16")) < abs(f("rl27_w_bias_none16"))
    assert abs(f("rl27_w_bias_tis16_c10")) < abs(f("rl27_w_bias_tis16"))
    assert f("rl27_w_sd_tis16_c10") > f("rl27_w_sd_tis16")


# ---- 28 --------------------------------------------------------------------------------------


def test_rl28_amdahl_by_hand():
    rows = {r[0]: r[1:] for r in f("rl28_amdahl_table")["rows"]}
    assert rows["10%"][0] == f"{1 / (0.9 + 0.05):.2f}×" and rows["20%"][2] == "1.25×"
    assert f("rl28_two_on_ten") == pytest.approx(100 * (1 / 0.95 - 1))
    assert f("rl28_train_1gpu_s") == pytest.approx(6 * 7e9 * 32768 / 800e12)
    assert f("rl28_train_8gpu_s") == pytest.approx(f("rl28_train_1gpu_s") / 8)


def test_rl28_cpu_runs_are_train_bound_and_the_budget_widget_agrees_with_the_course():
    assert [r[5] for r in f("rl28_cpu_table")["rows"]] == ["train"] * 3
    assert f("rl28_w_trainonly_speedup") == "1.12×" and f("rl28_w_prefixonly_speedup") == "1.56×"  # row 95
    assert f("rl28_w_all_speedup") == "4.63×" and f("rl28_w_all_largest").startswith("train")


def test_rl26_leak_grows_as_verifiable_signal_falls():
    leak = {r[0]: float(r[7]) for r in f("rl26_extremes_table")["rows"]}
    assert leak["100%"] == 0 < leak["60%"] < leak["20%"]
