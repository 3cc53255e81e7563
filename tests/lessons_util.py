"""Helpers shared by the lessons tests (test_lessons.py, test_lessons_rows*.py)."""

from posttrain.lessons import registry


def kpis(name: str, **knobs) -> dict:
    out = registry.compute(name, {k: registry.fmt(v) for k, v in knobs.items()})
    return dict(out["kpis"])


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]
