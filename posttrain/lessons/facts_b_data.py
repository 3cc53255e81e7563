"""Where the lesson facts of text engineer B read their data: the committed benchmark results
(benchmarks/results/*.json) and a widget's KPI at a setting other than its default (the text
quotes defaults with {{kpi:...}} directly)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from posttrain.lessons.registry import kpi  # noqa: F401 — the facts modules' one kpi

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def result(name: str):
    """benchmarks/results/<name>.json, parsed."""
    return json.loads((RESULTS / f"{name}.json").read_text())


def t(*xs) -> torch.Tensor:
    """A float64 tensor of the given numbers."""
    return torch.tensor(xs, dtype=torch.float64)
