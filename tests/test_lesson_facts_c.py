"""The facts quoted by TEXT C's lesson pages (posttrain/lessons/facts_c.py): every fact runs, is
quick, and its value agrees with a hand computation or an independent formula."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import pytest

from posttrain.lessons.facts_c import FACTS

TEXT = Path(__file__).resolve().parents[1] / "posttrain" / "lessons" / "text"
PAGES = ["rl-22a", "rl-22b", "rl-22c", "rl-23", "rl-24", "rl-25", "rl-26", "rl-27", "rl-28",
         "gpt-01", "gpt-02", "gpt-03", "gpt-04", "gpt-05", "gpt-06", "gpt-index"]


def f(name):
    return FACTS[name]()


def cell(name, row, col):
    t = f(name)
    return t["rows"][row][t["columns"].index(col) if isinstance(col, str) else col]


@pytest.mark.parametrize("name", sorted(FACTS))
def test_every_fact_runs_fast_and_has_a_quotable_value(name):
    t0 = time.perf_counter()
    v = FACTS[name]()
    assert time.perf_counter() - t0 < 5.0            # < 1 s on a quiet core; slack for a loaded machine
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
            quoted |= set(re.findall(r"\{\{(?:fact|table):([a-z0-9_]+)", path.read_text()))
    assert quoted <= set(FACTS), sorted(quoted - set(FACTS))
    assert set(FACTS) <= quoted, f"facts no page quotes: {sorted(set(FACTS) - quoted)}"


# ---- 22a -------------------------------------------------------------------------------------

def test_rl22a_worked_example_by_hand():
    assert f("rl22a_worked_colo_s") == 30 + 1 + 3 + 8 + 1
    assert f("rl22a_worked_disagg_s") == max(30 + 1, 3 + 8) + 1 == 32
    assert f("rl22a_worked_idle_s") == 31 - 11
    assert f("rl22a_worked_tokens") == 1_048_576
    assert f("rl22a_worked_tok_s") == 1_048_576 / 32
    assert cell("rl22a_worked_table", 2, "τ_step") == "31 s"          # async: max(31, 11, 1)


def test_rl22a_role_model_by_hand():
    scale = 64 * 16 * 1024 / 1e6
    rollout = 21 * scale * (1 + 1.8 * math.tanh(1024 / 2048)) / 4
    train = 8 * scale / 4
    step = max(rollout + 1.0, train / 3 + train) + (0.15 * 7 + 0.005 * 49)
    assert f("rl22a_default_rollout_s") == pytest.approx(rollout)
    assert f("rl22a_default_step_s") == pytest.approx(step)
    assert f("rl22a_rollout_share") == pytest.approx(100 * rollout / step)
    colo = rollout + 1.0 + train / 3 + train + 0.15 * 7 + 0.005 * 49
    assert f("rl22a_colo_drop_pct") == pytest.approx(100 * (1 - step / colo))
    assert f("rl22a_k32_rollout_ratio") == pytest.approx(2.0)
    assert f("rl22a_sync_70b_s") == pytest.approx(0.15 * 70 + 0.005 * 70 ** 2)
    assert f("rl22a_share_8192") > 97


def test_rl22a_cpu_run_is_train_bound_and_the_timers_cover_the_step():
    assert f("rl22a_cpu_bottleneck") == "train"
    assert f("rl22a_cpu_train_share") > 50 > f("rl22a_cpu_rollout_share")
    assert f("rl22a_cpu_equation_s") == pytest.approx(f("rl22a_cpu_measured_s"), rel=0.02)
