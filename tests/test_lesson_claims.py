"""The five widgets of issue 22's claims show the recorded results next to their simulations: each
widget's lower panel and KPIs carry the numbers of posttrain/lessons/data/claims.json (read here
straight from the file, not through posttrain.lessons.claims), labelled with the results file they
come from, and a claim that did not reproduce is said to be so. Changing the data changes the
widget and its verdict, so a widget that stopped reading the file would fail here."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from posttrain.lessons import claims, registry

DATA = json.loads((Path(__file__).resolve().parents[1] / "posttrain/lessons/data/claims.json").read_text())
WIDGETS = {
    "length_bias": "length_bias",
    "overoptimization": "hacking",
    "prm": "prm",
    "precision": "off_policy",
    "group_size": "grpo_group",
}


def out(widget: str, **knobs) -> dict:
    return registry.compute(widget, {k: registry.fmt(v) for k, v in knobs.items()})


def measured(widget: str) -> list[dict]:
    """The traces of the lower panel (the axes no simulated trace uses)."""
    fig = out(widget)["figure"]
    axis = fig["data"][-1]["yaxis"]
    return [t for t in fig["data"] if t.get("yaxis") == axis]


def kpi_text(widget: str) -> str:
    return " | ".join(f"{k}: {v}" for k, v in out(widget)["kpis"])


@pytest.mark.parametrize("key", sorted(WIDGETS))
def test_each_entry_names_its_widget_and_the_widget_says_where_its_numbers_come_from(key):
    assert DATA[key]["widget"] == WIDGETS[key]
    path = DATA[key]["source"].split(" (")[0]
    assert path.startswith("benchmarks/results/") and path.endswith(".json")
    assert f"measured with posttrain ({path}" in kpi_text(WIDGETS[key])
    assert f"measured with posttrain ({path}" in registry.get(WIDGETS[key]).explain


def test_length_bias_shows_the_measured_wrong_answer_lengths_and_that_the_claim_did_not_reproduce():
    a = DATA["length_bias"]["algorithms"]
    first, last = measured("length_bias")
    assert first["y"] == [a["grpo"]["wrong_length_first10"], a["dr_grpo"]["wrong_length_first10"]]
    assert last["y"] == [a["grpo"]["wrong_length_last10"], a["dr_grpo"]["wrong_length_last10"]]
    text = kpi_text("length_bias")
    for algo in ("grpo", "dr_grpo"):
        assert f"{a[algo]['wrong_length_first10']:.1f} → {a[algo]['wrong_length_last10']:.1f}" in text
        assert f"{a[algo]['pass@1_start']:.3f} → {a[algo]['pass@1_end']:.3f}" in text
    assert a["grpo"]["wrong_length_last10"] < a["grpo"]["wrong_length_first10"]  # recorded: GRPO's did not grow
    assert "claim: GRPO's wrong answers grow longer: not reproduced" in text
    assert "did not reproduce" in out("length_bias")["note"]


def test_overoptimization_draws_true_and_proxy_reward_against_sqrt_kl():
    bon = DATA["overoptimization"]["best_of_n"]
    true, proxy, chance = measured("hacking")
    assert true["y"] == [p["true"] for p in bon["rm_full"]] and proxy["y"] == [p["proxy"] for p in bon["rm_full"]]
    assert chance["y"] == [p["true"] for p in bon["rm_d0"]]
    assert true["x"] == [round(p["sqrt_kl"], 3) for p in bon["rm_full"]]
    peak = max(bon["rm_full"], key=lambda p: p["true"])
    assert bon["rm_full"][0]["true"] < peak["true"] > bon["rm_full"][-1]["true"]  # recorded: a peak inside
    text = kpi_text("hacking")
    assert f"{peak['true']:.3f} (n = {peak['n']}, √KL {peak['sqrt_kl']:.2f})" in text
    assert "reproduced (best of n)" in text and "not reproduced" not in text


def test_prm_shows_the_measured_accuracies_and_that_the_prm_did_not_beat_pass1():
    acc = DATA["prm"]["accuracy"]
    (bars,) = measured("prm")
    assert bars["y"] == [acc[k] for k in ("pass@1", "maj@8", "orm best@8", "prm best@8", "prm beam 2x4")]
    text = kpi_text("prm")
    assert " / ".join(f"{acc[k]:.3f}" for k in ("pass@1", "maj@8", "orm best@8", "prm best@8", "prm beam 2x4")) in text
    assert acc["prm best@8"] < acc["pass@1"]  # recorded
    assert "not reproduced" in text and "did not reproduce" in out("prm")["note"]


def test_precision_shows_the_measured_log_ratio_histogram_and_learning():
    mm = DATA["precision"]["mismatch"]
    traces = measured("off_policy")
    assert [t["name"] for t in traces] == [f"measured: {f} sampler" for f in mm]
    for t, v in zip(traces, mm.values()):
        assert t["y"] == pytest.approx([c / sum(v["counts"]) for c in v["counts"]]) and sum(t["y"]) == pytest.approx(1)
    text = kpi_text("off_policy")
    assert " / ".join(f"{v['delta_abs_mean']:.1e}" for v in mm.values()) in text
    for r in DATA["precision"]["learning"]:
        assert f"{r['pass@1_end']:.3f}" in text and f"{r['format']} {r['correction']}" in text


def test_group_size_shows_the_measured_degenerate_share_per_group_size():
    runs = {r["run"]: r for r in DATA["group_size"]["runs"]}
    first, last = measured("grpo_group")
    assert first["y"] == [runs["group_2"]["degenerate_first10"], runs["group_8"]["degenerate_first10"]]
    assert last["y"] == [runs["group_2"]["degenerate_last10"], runs["group_8"]["degenerate_last10"]]
    text = kpi_text("grpo_group")
    assert f"groups of 8 {runs['group_8']['pass@1_start']:.3f} → {runs['group_8']['pass@1_end']:.3f}" in text
    assert "1 seed," in text  # one seed recorded: the label does not say three


@pytest.mark.parametrize("widget", sorted(WIDGETS.values()))
def test_the_measured_panel_is_the_same_at_every_knob_and_the_simulation_still_moves(widget):
    w = registry.get(widget)
    default = out(widget)
    for knob in w.knobs:
        other = next(v for v in knob.values if v != knob.default)
        moved = out(widget, **{knob.name: other})
        n = len(measured(widget))
        assert moved["figure"]["data"][-n:] == default["figure"]["data"][-n:]
        assert moved["figure"]["data"][:-n] != default["figure"]["data"][:-n] or moved["kpis"] != default["kpis"], (
            knob.name
        )


def test_a_re_run_that_reproduces_flips_the_verdicts(monkeypatch):
    data = copy.deepcopy(claims.recorded())
    data["length_bias"]["algorithms"]["grpo"]["wrong_length_last10"] = 45.0
    data["prm"]["accuracy"]["prm best@8"] = 0.7
    data["overoptimization"]["best_of_n"]["rm_full"] = [
        {**p, "true": 0.3 + 0.1 * i} for i, p in enumerate(data["overoptimization"]["best_of_n"]["rm_full"])
    ]
    monkeypatch.setattr(claims, "recorded", lambda: data)
    call = lambda name: registry.get(name).fn(**registry.get(name).defaults())  # past registry's cache
    assert dict(call("length_bias")["kpis"])["claim: GRPO's wrong answers grow longer"] == "reproduced"
    assert dict(call("prm")["kpis"])["claim: the PRM's best of 8 beats pass@1 and the ORM"] == "reproduced"
    assert dict(call("hacking")["kpis"])["claim: true reward rises then falls against √KL"] == "not reproduced"
    assert (
        "45.0"
        in dict(call("length_bias")["kpis"])[
            next(k for k, _ in call("length_bias")["kpis"] if k.startswith("measured with posttrain"))
        ]
    )


def test_entry_refuses_another_widgets_numbers():
    assert claims.entry("prm", "prm") is claims.recorded()["prm"]
    with pytest.raises(ValueError, match="belongs to widget 'prm'"):
        claims.entry("prm", "hacking")


def test_the_lessons_text_quotes_the_recorded_numbers_through_facts():
    from posttrain.lessons import facts

    a, acc = DATA["length_bias"]["algorithms"], DATA["prm"]["accuracy"]
    assert (
        facts.value("rl14_claim_wrong_grpo")
        == f"{a['grpo']['wrong_length_first10']:.1f} → {a['grpo']['wrong_length_last10']:.1f}"
    )
    assert facts.value("rl14_claim_verdict") == "did not reproduce here either"
    assert facts.value("rl17_claim_verdict") == "did not reproduce"
    assert facts.value("rl17_claim_prm") == acc["prm best@8"] and facts.value("rl17_claim_pass1") == acc["pass@1"]
    full = DATA["overoptimization"]["best_of_n"]["rm_full"]
    assert facts.value("rl18_claim_true_end") == round(full[-1]["true"], 3)
    assert facts.value("rl18_claim_peak").startswith(f"{max(p['true'] for p in full):.3f} at n = ")
    rows = {r[0]: r for r in facts.value("rl27_precision_table")["rows"]}
    assert rows["bf16"][1] == f"{DATA['precision']['mismatch']['bf16']['delta_abs_mean']:.1e}"
    for name in ("rl14", "rl17", "rl18", "rl27"):
        text = (
            Path(__file__).resolve().parents[1] / f"posttrain/lessons/text/{name.replace('rl', 'rl-')}.md"
        ).read_text()
        assert f"{{{{fact:{name}_claim" in text or f"{{{{table:{name}_precision" in text
