"""The facts added in answer to the blind reads of the remaining pages (issue 44, docs/course_reviews.md §3):
each against the benchmark JSON it reads or a hand computation, so that a page's corrected claim cannot
drift back."""

import inspect
import json
import math
from pathlib import Path

import pytest

from posttrain.lessons import facts, registry

ROOT = Path(__file__).resolve().parents[1]


def v(name):
    return facts.value(name)


def runs_of(name: str) -> list[dict]:
    return json.loads((ROOT / "benchmarks/results" / name).read_text())


# ---- 05–09 (review B) ------------------------------------------------------------------------------


def test_rl05_fp32_sync_runs_have_ratio_one_up_to_the_numerical_mismatch():
    sync = [r["mean ratio/max"] for r in runs_of("async_vs_sync.json")["runs"] if r["run"] == "sync"]
    assert len(sync) == 3 and v("rl05_sync_ratio_max") == f"{sum(sync) / 3:.5f}"
    assert 1.0 < float(v("rl05_sync_ratio_max")) < 1.001  # not exactly 1: the sampler's logprobs are π_old


def test_rl06_the_four_stale_runs_by_hand():
    # staleness 0, 1, 2, 3 over the first four steps, then 4: (0 + 1 + 2 + 3 + 56·4) / 60
    assert v("rl06_fixed4_staleness") == f"{(6 + 56 * 4) / 60:.2f}" == "3.83"
    tis = next(r for r in runs_of("async_vs_sync.json")["runs"] if r["run"] == "fixed4_tis")
    assert (
        v("rl06_fixed4_tis_loss_pts")
        == pytest.approx(100 * (0.84875 - 0.805))
        == pytest.approx(100 * (tis["pass@1_before"] - tis["pass@1_after"]))
    )
    assert float(v("rl06_fixed4_tis_reward")) < float(v("rl06_sync_reward"))  # the page: it lost on this seed
    assert v("rl06_fixed4_clip") < 0.01 < v("rl06_break_clip")  # the real run trims a tail; the toy loses a fifth
    assert v("rl06_break_tis_reward50") > v("rl06_break_reward50") + 0.5  # the toy's rescue by the knob


def test_rl07_step_length_and_the_widgets_learning_rate():
    from posttrain.framework.controller import Controller

    assert v("rl07_step_lines") == len(inspect.getsourcelines(Controller.step)[0]) < 60
    assert float(v("rl07_widget_lr")) >= 100 * float(v("rl07_recipe_lr"))  # the page: "far above the recipe's"


def test_rl08_the_example_episode_is_in_posttrains_markup():
    from posttrain.chat import CALL_CLOSE, CALL_OPEN
    from posttrain.lessons.widgets_step import TURNS

    assert TURNS[1][1].startswith(CALL_OPEN) and TURNS[1][1].endswith(CALL_CLOSE)
    assert TURNS[2] == ("tool", v("rl08_observation_text"))  # what the episode runner inserts


def test_rl09_seed_zero_did_not_start_where_seeds_one_and_two_did():
    ent = {r["seed"]: r["entropy"] for r in runs_of("algorithms.json") if r["algorithm"] == "reinforce"}
    assert v("rl09_seed0_entropy_ratio") == pytest.approx(ent[0] / ((ent[1] + ent[2]) / 2))
    assert v("rl09_seed0_entropy_ratio") > 2
    assert [r[3] for r in v("rl09_reinforce_runs")["rows"]] == [f"{ent[s]:.3f}" for s in (0, 1, 2)]


def test_render_keeps_knob_values_with_commas_apart():
    from posttrain.lessons.render import values_md

    assert values_md(["12, 11, 14", "12, 12, 12"]) == "12, 11, 14 | 12, 12, 12"
    assert values_md([1, 2]) == "1, 2"


def test_controller_widget_says_what_keep_does():
    k = registry.compute("controller", {"phase": "5", "answers": "12, 12, 12"})
    assert dict(k["kpis"])["degenerate (dropped under skip / resample)?"] == "yes"
    assert math.isfinite(float(dict(registry.compute("controller", {"phase": "8"})["kpis"])["grad norm"]))


# ---- 15, 18, 18a, the gpt index (review C) ---------------------------------------------------------


def test_rl15_the_final_ranking_over_runs_not_one_runs_running_agreement():
    from posttrain.lessons.widgets_reward_model import PAIR_IDX, _bt_run

    default, hot = _bt_run(0.3)[500], _bt_run(1.0)[500]
    cd = PAIR_IDX.index((2, 3))
    assert min(default["by_pair"]) == default["by_pair"][cd]  # the close pair is the one most often wrong
    assert hot["all_right"] < default["all_right"] < _bt_run(0.01)[500]["all_right"]
    assert v("rl15_all_right_lr1") == f"{100 * hot['all_right']:.1f}%"
    assert v("rl15_cd_wrong_lr1") == f"{100 * (1 - hot['cd_right']):.1f}%"


def test_rl18a_probe_and_curation_facts_by_hand():
    from posttrain.data import curate
    from posttrain.lessons.widgets_signal import CURATE_PROBE

    assert v("rl18a_fresh_dead_1of8") == pytest.approx(0.875**8) == pytest.approx(0.3436, abs=1e-4)
    assert v("rl18a_widget_probe") == CURATE_PROBE == 16  # the widget's probe, not lesson 18a's 8
    assert v("rl18a_widget_probe_se") == pytest.approx(math.sqrt(0.5 * 0.5 / 16)) == 0.125
    assert v("rl18a_widget_max_band") == "[0.45, 0.55]"  # ½ ± (½ − 0.45)
    sig = inspect.signature(curate.curate).parameters
    assert (v("rl18a_near_threshold"), v("rl18a_ngram")) == (sig["near_threshold"].default, sig["ngram"].default)


# ---- the gpt_mini track (review D) -----------------------------------------------------------------


def test_g01_unscaled_scores_are_small_at_posttrains_init_and_root_k_for_unit_variance():
    assert v("g01_init_score_std_nano") < 1 < math.sqrt(32)  # N(0, 0.02): nowhere near √k at step 0
    assert 3 < v("g01_init_score_std_512") < v("g01_sqrt512") == pytest.approx(22.63, abs=0.01)
    course, ours = 796_416, 799_104  # widgets_gpt at d 128, L 4, V 29: GPT-2 layout (T_max 11), gpt_mini
    assert (v("g01_course_params"), v("g01_same_v_params")) == (course, ours)
    assert v("g01_layout_gap_pct") == pytest.approx(100 * (ours / course - 1))
    assert v("g01_layout_gap_pct") < 1  # at equal V; against nano's 806,528 (V = 58) it would be 1.3%


def test_g02_g03_corrected_landmarks():
    from posttrain.lessons import runs
    from posttrain.lessons.widgets_gpt import EXAMPLES

    assert v("g02_final_loss_mean4") == pytest.approx(sum(runs.recorded()["pretrain"]["loss"][-4:]) / 4)
    assert v("g02_window") == runs.PRETRAIN_WINDOW == 32
    assert v("g03_term_floor") == pytest.approx(math.log(20))  # terms 0..19, uniform
    assert v("g03_widget_example") == EXAMPLES[0] == "<3+4+5+6>18#"
    assert dict(registry.compute("sft_mask")["kpis"])["trained positions"] == "3 of 11"  # 1, 8, #


def test_g05_excerpts_show_the_losses_they_name_and_pass8_falls_everywhere():
    from posttrain.lessons.render import code_md

    assert "loss = -F.logsigmoid(beta * h)" in code_md("posttrain.preference.dpo:preference_loss:8-13")
    assert "cfg.nll_alpha * s.chosen / s.len_chosen" in code_md("posttrain.preference.dpo:preference_loss:34-35")
    for row in v("g05_family_table")["rows"]:
        start, end = (float(x) for x in row[4].split(" → "))
        assert end < start  # the pass@1 gains are a trade against pass@8


def test_g06_per_sampled_answer_small_groups_are_not_slower():
    from posttrain.lessons.widgets_gpt_train import grpo_sim

    for K in (2, 8):
        k = dict(grpo_sim(K, 0.05)["kpis"])
        assert k["answers sampled per seed to reach 0.9"] == k["first step with P(correct) ≥ 0.9"] * K
    assert v("g06_w_k2_answers") < v("g06_w_k8_answers")  # fewer answers, more steps
    assert v("g06_target_acc") == 0.7 and v("g06_sync_samples") == 16 * 8
    assert v("g06_sync_gain_sd_pts") > 0.5 * v("g06_sync_gain_pts")  # the spread is the gain's size


# ---- 00–04 (review A) ------------------------------------------------------------------------------


def test_rl00_the_cost_force_changes_only_the_critic():
    from posttrain.sizing import memory

    kw = dict(gpus=8, checkpointing=True, suggest=False)
    grpo, ppo = (memory.plan("qwen2.5-14b", algo=a, critic="separate", **kw) for a in ("grpo", "ppo"))
    shared = memory.plan("qwen2.5-14b", algo="ppo", critic="shared", **kw)
    assert grpo["fits"] and not ppo["fits"] and shared["fits"]  # the separate critic alone tips it over
    assert v("rl00_cost_grpo_gib") == pytest.approx(grpo["peak_bytes"] / 2**30)
    assert v("rl00_bytes_per_param") == 2 + 4 + 4 + 8  # bf16 weights, fp32 master, grads, Adam m and v


def test_rl01_wrong_arm_share_starts_between_0_2_and_0_4():
    shares = [registry.kpi("bandit", "seeds ending on a wrong arm", lr=lr) for lr in (0.2, 0.4, 0.8, 1.2, 1.6, 2.0)]
    assert shares[0] == v("rl01_wrong_share_02") == 0.0 < shares[1] == v("rl01_wrong_share_04")
    assert shares[1:] == sorted(shares[1:]) and shares[-1] == v("rl01_break_wrong_share")


def test_rl03_k3_spreads_less_than_k1_only_near_the_reference():
    from posttrain.algorithms import core
    from posttrain.lessons.widgets_reward import kl_toy

    assert v("rl03_sd_k3_near") < v("rl03_sd_k1_near") and v("rl03_sd_k3_far") > v("rl03_sd_k1_far")
    lp, ref = kl_toy(0.25)
    kl = float((lp.exp() * (lp - ref)).sum())
    assert float((lp.exp() * core.kl(lp, ref, "k3")).sum()) == pytest.approx(kl, abs=1e-12)  # unbiased there
    assert (v("rl03_k3_cap"), v("rl03_log_ratio_clamp")) == (f"{core.K3_CAP:g}", f"{core.LOG_RATIO_CLAMP:g}")
