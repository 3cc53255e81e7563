"""Helpers shared by TEXT C's fact modules (facts_c_*.py): tables, committed benchmark results,
and a widget's KPI at a non-default setting."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from posttrain.lessons.registry import kpi  # noqa: F401 — the facts modules' one kpi

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
GIB, MIB = 2**30, 2**20


def table(columns: list[str], rows: list[list]) -> dict:
    return {"columns": columns, "rows": rows}


@cache
def result(name: str):
    """A committed benchmark result, benchmarks/results/<name>.json."""
    return json.loads((RESULTS / f"{name}.json").read_text())
