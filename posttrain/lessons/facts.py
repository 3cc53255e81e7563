"""The numbers a lesson's text quotes that are not a widget KPI: `{{fact:NAME}}` in text/<id>.md.

Each of facts_a.py, facts_b.py and facts_c.py defines `FACTS = {name: function}`; a function takes
no argument and returns a number, a short string, or a table {"columns": [...], "rows": [[...]]}.
It runs posttrain's own functions (or reads a committed JSON) in well under a second, so every
page render recomputes what it quotes and the text cannot drift from the code. Names are global:
they carry their lesson's number (`rl03_k3_at_d05`).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

from posttrain.errors import UsageError

MODULES = ("facts_a", "facts_b", "facts_c")  # posttrain/lessons/<name>.py


@functools.cache
def load_all() -> dict[str, Callable[[], object]]:
    facts: dict[str, Callable[[], object]] = {}
    for m in MODULES:
        for name, fn in importlib.import_module(f"posttrain.lessons.{m}").FACTS.items():
            if name in facts:
                raise ValueError(f"fact {name!r} is defined twice (second time in {m}.py); names are global")
            facts[name] = fn
    return facts


@functools.cache
def value(name: str) -> object:
    """The fact's value, computed once per process."""
    facts = load_all()
    if name not in facts:
        raise UsageError(f"unknown fact {name!r}; define it in one of {', '.join(m + '.py' for m in MODULES)}")
    out = facts[name]()
    if is_table(out):
        widths = {len(row) for row in out["rows"]}
        if widths - {len(out["columns"])}:
            raise ValueError(f"fact {name}: rows of {sorted(widths)} cells under {len(out['columns'])} columns")
    elif not isinstance(out, (int, float, str)):
        raise ValueError(f"fact {name} returned a {type(out).__name__}; return a number, a string or a table")
    return out


def is_table(v) -> bool:
    return isinstance(v, dict) and set(v) == {"columns", "rows"}
