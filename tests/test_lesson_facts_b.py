"""The facts quoted by lessons 13–22 (posttrain/lessons/facts_b.py): every fact runs, returns a
number, a string or a well-formed table, and the values are checked against a hand computation or
an independent formula."""

from __future__ import annotations

import time

import pytest

from posttrain.lessons import facts_b

F = facts_b.FACTS


def v(name):
    return F[name]()


@pytest.mark.parametrize("name", sorted(F))
def test_every_fact_runs_fast_and_has_a_valid_shape(name):
    t0 = time.perf_counter()
    out = F[name]()
    assert time.perf_counter() - t0 < 1.0, f"{name} took more than a second"
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
    assert v("rl13_p_degenerate_09_k4") == pytest.approx(0.9 ** 4 + 0.1 ** 4, abs=5e-5)   # 0.6562
    assert v("rl13_p_degenerate_09_k16") == pytest.approx(0.9 ** 16 + 0.1 ** 16, abs=5e-5)
    table = v("rl13_degenerate_table")
    for p, *useful in table["rows"]:
        for k, u in zip((4, 8, 16), useful):
            assert u == pytest.approx(1 - p ** k - (1 - p) ** k, abs=5e-4)


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
    assert v("rl13_acc_all_on") - v("rl13_acc_no_dynamic") > 0.1           # the one switch that matters here
    assert v("rl13_other_switches_spread") < 0.05
    assert v("rl13_sample_ratio") == pytest.approx(v("rl13_samples_all_on") / v("rl13_samples_no_dynamic"), abs=0.05)
    # at equal sampled responses the refilling run is behind the one that never refilled
    assert v("rl13_equal_compute_acc") < v("rl13_acc_no_dynamic")
    assert 0 < v("rl13_ablation_useful_off") < rows["all four on"][1]
