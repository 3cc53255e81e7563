"""Helpers shared by TEXT C's fact modules (facts_c_*.py): tables, committed benchmark results,
and a widget's KPI at a non-default setting."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from posttrain.lessons import registry

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
GIB, MIB = 2**30, 2**20


def table(columns: list[str], rows: list[list]) -> dict:
    return {"columns": columns, "rows": rows}


@cache
def result(name: str):
    """A committed benchmark result, benchmarks/results/<name>.json."""
    return json.loads((RESULTS / f"{name}.json").read_text())


def kpi(widget: str, label: str, **knobs):
    """A widget's KPI at a setting other than its defaults (the page's {{kpi:…}} reads defaults
    only), computed by the widget itself so the text and the plot cannot disagree."""

    out = dict(registry.compute(widget, {k: registry.fmt(v) for k, v in knobs.items()})["kpis"])
    return out[label]
