"""The gpt_mini track's facts (posttrain/lessons/facts_c_gpt.py and facts_c_gpt_post.py) against hand computations and
the course's Part C rows; tests/test_lesson_facts_c.py runs every fact and checks the pages quote them."""

from __future__ import annotations

import math

import pytest

from posttrain.lessons.facts_c import FACTS


def f(name):
    return FACTS[name]()


# ---- gpt-01 ----------------------------------------------------------------------------------


def test_g01_counts_by_hand():
    assert f("g01_nano_params") == f("g01_module_params") == 58 * 128 + 4 * 197_888 + 128 + 58 * 128
    assert f("g01_course_params") == 796_416  # SEED_SPEC row 97
    parts = f("g01_parts_table")["rows"]
    assert sum(int(r[1].replace(",", "")) for r in parts[:-1]) == f("g01_nano_params")
    assert f("g01_block_over_d2") == pytest.approx(197_888 / 128**2)
    assert f("g01_flops_fwd") == 2 * f("g01_nano_params")


def test_g01_unscaled_attention_saturates():
    assert f("g01_peak_32_scaled") < 0.5 < f("g01_peak_32_unscaled") < f("g01_peak_512_unscaled")


# ---- gpt-02 ----------------------------------------------------------------------------------


def test_g02_loss_landmarks_are_ordered_and_the_floor_by_hand():
    rows = [float(r[1]) for r in f("g02_loss_table")["rows"]]
    assert rows[0] == pytest.approx(math.log(58), abs=0.005)
    assert rows[0] > rows[1] > rows[2] > rows[3] > rows[4] > rows[5]  # uniform … trained … floor
    # floor by hand: two or three uniform digits per line (ln 10 each) and the count (ln 2), over the
    # mean line length; 2-term lines "a+b=s\n" and 3-term lines "a+b=s;s+c=t\n"
    import itertools

    def line(ts):
        acc, parts = ts[0], []
        for t in ts[1:]:
            parts.append(f"{acc}+{t}={acc + t}")
            acc += t
        return ";".join(parts) + "\n"

    chars = {k: sum(len(line(ts)) for ts in itertools.product(range(10), repeat=k)) / 10**k for k in (2, 3)}
    floor = (2.5 * math.log(10) + math.log(2)) / ((chars[2] + chars[3]) / 2)
    assert f("g02_floor") == pytest.approx(floor, rel=0.03)  # the held-out split removes ~10%


def test_g02_contexts_and_temperature():
    ent = {r[0]: [float(x) for x in r[3:]] for r in f("g02_context_table")["rows"]}
    for e in ent.values():
        assert e[0] <= e[1] < e[2]  # T = 0.5 ≤ 1 < 2
    assert ent["3+4=7;7+"][1] == pytest.approx(math.log(10), abs=0.1)  # the next term is random
    assert f("g02_ent_34_t1") < 0.1 < f("g02_ent_34_t2") and f("g02_p_7_after_34") > 0.9
    assert f("g02_w_trace10") == pytest.approx(f("g02_w_right_t2") ** 10) and f("g02_w_right_t2") < 0.95
    assert f("g02_targets_per_step") == 32 * 95 and f("g02_tokens_seen") == 300 * 32 * 96
    assert f("g02_chinchilla") == 20 * f("g01_nano_params")


# ---- gpt-03 ----------------------------------------------------------------------------------


def test_g03_mask_boundary_row_102():
    rows = f("g03_mask_table")["rows"]
    P = len("<3+4+5>")
    assert [r[3] for r in rows] == [0] * P + [1, 1, 1]  # trained from column P on
    assert [r[4] for r in rows] == [0] + [1] * (len(rows) - 1)  # unmasked: all but column 0
    assert (f("g03_trained_masked"), f("g03_targets"), f("g03_prompt_targets")) == (3, 9, 6)


def test_g03_prompt_share_by_hand_on_one_problem_and_over_the_task():
    assert 50 < f("g03_prompt_share_direct") < 90 and f("g03_prompt_share_cot") < f("g03_prompt_share_direct")
    rows = f("g03_recorded_table")["rows"]
    assert all(float(r[1]) > float(r[2]) for r in rows)  # masked ahead at every evaluation
    assert all(float(r[4]) > float(r[3]) for r in rows)  # the prompt's random digits stay in the loss
    assert f("g03_acc_masked_200") > f("g03_acc_open_200") and 60 < f("g03_mask_task_share") < 90


# ---- gpt-04 ----------------------------------------------------------------------------------


def test_g04_trace_and_the_measured_gap():
    assert f("g04_example_cot") == "{3+4=7;7+5=12;12+6=18}18" and f("g04_example_direct") == "18"
    assert f("g04_example_len") == len("{3+4=7;7+5=12;12+6=18}18")
    assert f("g04_compound_100") == pytest.approx(0.366, abs=0.001)  # row 105
    rows = f("g04_table")["rows"]
    assert all(float(r[3]) > float(r[2]) for r in rows)  # CoT ≥ direct at every K
    assert float(rows[-1][2]) < float(rows[0][2])  # direct falls with K
    assert f("g04_acc_ratio") == pytest.approx(f("g04_cot_acc") / f("g04_direct_acc"))
    assert rows[2][4] == f"{90**4:.1e}" and 90**4 > f("g01_nano_params") > 90**3


# ---- gpt-05 ----------------------------------------------------------------------------------


def test_g05_first_step_is_ln2_and_beta_over_two():
    assert f("g05_loss0") == pytest.approx(math.log(2)) and f("g05_ln2") == pytest.approx(math.log(2))
    assert f("g05_grad_chosen") == pytest.approx(-0.1 / 2) and f("g05_grad_rejected") == pytest.approx(0.1 / 2)


def test_g05_plain_dpo_displaces_the_chosen_likelihood():
    assert f("g05_dpo_end") < f("g05_start") < f("g05_nll_end")
    assert f("g05_dpo_chosen") < f("g05_nll_chosen")
    assert len(f("g05_family_table")["rows"]) == 4


# ---- gpt-06 ----------------------------------------------------------------------------------


def test_g06_worked_group_row_108_and_the_degenerate_formula():
    rows = {r[0]: r[1:] for r in f("g06_group_table")["rows"]}
    assert rows["1, 1, 0, 0"] == ["+1.000, +1.000, -1.000, -1.000", "+0.866, +0.866, -0.866, -0.866"]
    assert rows["1, 0, 0, 0"][0] == f"{3 / math.sqrt(3):+.3f}, " + ", ".join([f"{-1 / math.sqrt(3):+.3f}"] * 3)
    assert rows["1, 1, 1, 1"][0] == "+0.000, +0.000, +0.000, +0.000"
    for K, obs, per_prompt, mean_p in f("g06_degenerate_table")["rows"]:
        p = f("g06_mean_p")
        assert float(mean_p) == pytest.approx(p**K + (1 - p) ** K, abs=0.006)
        assert abs(float(obs) - float(per_prompt)) < 0.05 and float(obs) >= float(mean_p)
    assert f("g06_k2_degenerate") > f("g06_k8_degenerate")
    assert f("g06_k2_first10_degenerate") > f("g06_k8_first10_degenerate")


def test_g06_preset_values():
    assert (f("g06_cfg_K"), f("g06_cfg_prompts"), f("g06_cfg_kl")) == (8, 32, 0.01)
    assert f("g06_lr_ratio") == pytest.approx(1e-3 / 5e-5)


def test_g04_recorded_widget_runs():
    assert float(f("g04_w_cot6")) > 3 * float(f("g04_w_direct6"))
    one_layer = [float(x) for x in f("g04_w_cot_1layer").split(" → ")]
    assert one_layer[0] > 0.5 > max(one_layer[2:])  # one layer: traces fail past 2 terms


def test_g06_widget_break_k2_lags_k8():
    from posttrain.lessons.facts_c_common import kpi

    assert f("g06_w_k2_p40") < 0.7 < kpi("grpo_sim", "P(correct) at step 40", K=8)
    assert f("g06_w_k2_dead") > 0.5 and f("g06_w_beta05_final") < 0.9
