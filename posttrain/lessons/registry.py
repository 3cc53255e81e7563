"""The widget registry: one entry per widget, its knobs (each a finite grid) and the function
that computes it with posttrain's own code.

A widget function takes its knobs as keyword arguments and returns a JSON-able dict:

    {"figure": {"data": [...plotly traces...], "layout": {...}},
     "kpis": [[label, value], ...],          # numbers shown next to the plot
     "note": "one line on what the reader sees"}

Every knob takes its values from a finite grid, so `posttrain lessons --export` can compute
every setting ahead of time and the static copy behaves exactly like the server. The grid
of a widget (the product of its knobs' grids) is kept under MAX_GRID settings.

Adding a widget is one `register(Widget(...))` call in a widgets_*.py module, named in
WIDGET_MODULES below (the modules are imported explicitly, never as a side effect).
"""

from __future__ import annotations

import functools
import importlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.errors import UsageError

MAX_GRID = 600
WIDGET_MODULES = (
    "roles",
    "reward",
    "loop",
    "step",
    "algos",
    "variants",
    "reward_model",
    "signal",
    "forces",
    "systems",
    "sizing",
    "scale",
    "gpt",
    "gpt_train",
    "lineage",
    "practice",
    "async",
    "recipes",
    "gaps",
)  # posttrain/lessons/widgets_<name>.py


@dataclass
class Knob:
    name: str
    label: str
    values: list  # the grid; a slider moves over its indices
    default: Any
    kind: str = "range"  # range | select | check (check: values [False, True])

    def __post_init__(self):
        if self.default not in self.values:
            raise ValueError(f"knob {self.name}: default {self.default!r} is not in its grid")

    def parse(self, text: str):
        """The grid value whose text form is `text`; UsageError naming the valid ones."""
        for v in self.values:
            if fmt(v) == text:
                return v
        try:  # a number between grid points snaps to the nearest one
            x = float(text)
            nums = [v for v in self.values if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if nums and min(nums) <= x <= max(nums):
                return min(nums, key=lambda v: abs(v - x))
        except ValueError:
            pass
        shown = ", ".join(fmt(v) for v in self.values[:12]) + (" …" if len(self.values) > 12 else "")
        raise UsageError(f"knob {self.name}={text!r} is not one of its values ({shown})")

    def spec(self) -> dict:
        return {
            "name": self.name,
            "label": self.label,
            "kind": self.kind,
            "values": [fmt(v) for v in self.values],
            "default": fmt(self.default),
        }


@dataclass
class Widget:
    name: str
    title: str
    fn: Callable[..., dict]
    knobs: list[Knob]
    breaks: dict  # {"knobs": {name: value}, "what": "what breaks and why"}
    explain: str = ""  # what the plot shows, one or two sentences
    uses: list[str] = field(default_factory=list)  # posttrain functions it calls ("module:qualname")

    def defaults(self) -> dict:
        return {k.name: k.default for k in self.knobs}

    def grid(self):
        """Every knob setting, as dicts, in a fixed order."""
        for combo in itertools.product(*(k.values for k in self.knobs)):
            yield dict(zip((k.name for k in self.knobs), combo))

    def grid_size(self) -> int:
        n = 1
        for k in self.knobs:
            n *= len(k.values)
        return n

    def key(self, knobs: dict) -> str:
        """Canonical text of a setting (the export's lookup key; the JS builds the same)."""
        return "&".join(f"{k.name}={fmt(knobs[k.name])}" for k in self.knobs)

    def parse(self, query: dict) -> dict:
        out = self.defaults()
        names = {k.name: k for k in self.knobs}
        for name, text in query.items():
            if name not in names:
                raise UsageError(f"widget {self.name} has no knob {name!r}; knobs: {', '.join(names)}")
            out[name] = names[name].parse(text)
        return out

    def spec(self) -> dict:
        return {
            "name": self.name,
            "title": self.title,
            "knobs": [k.spec() for k in self.knobs],
            "breaks": {"knobs": {k: fmt(v) for k, v in self.breaks["knobs"].items()}, "what": self.breaks["what"]},
        }


def fmt(v) -> str:
    """Text form of a knob value, identical in Python and in the page's JS (the values list)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(round(v, 10))
    return str(v)


WIDGETS: dict[str, Widget] = {}


def register(w: Widget) -> Widget:
    if w.name in WIDGETS:
        raise ValueError(f"widget {w.name!r} registered twice")
    if w.grid_size() > MAX_GRID:
        raise ValueError(f"widget {w.name}: {w.grid_size()} settings > MAX_GRID={MAX_GRID}; coarsen a knob")
    WIDGETS[w.name] = w
    return w


@functools.cache
def load_all() -> dict[str, Widget]:
    for m in WIDGET_MODULES:
        importlib.import_module(f"posttrain.lessons.widgets_{m}")
    return WIDGETS


def get(name: str) -> Widget:
    ws = load_all()
    if name not in ws:
        raise UsageError(f"unknown widget {name!r}; known: {', '.join(sorted(ws))}")
    return ws[name]


def compute(name: str, query: dict | None = None) -> dict:
    """The widget's result for a query of knob texts (missing knobs take their defaults)."""
    w = get(name)
    knobs = w.parse(query or {})
    return _cached(name, tuple(knobs.items()))


@functools.lru_cache(maxsize=4096)
def kpi(widget: str, label: str, **knobs):
    """The KPI `label` of `widget` at `knobs` (other knobs at their defaults), as the page shows it: computed
    by the widget itself, so a fact quoted in the text and the plot beside it cannot disagree (the page's
    {{kpi:…}} reads the defaults; the facts modules quote other settings through this)."""
    found = dict(compute(widget, {k: fmt(v) for k, v in knobs.items()})["kpis"])
    if label not in found:
        raise KeyError(f"widget {widget} has no KPI {label!r}; it has {list(found)}")
    return found[label]


def _cached(name: str, knobs: tuple) -> dict:
    return WIDGETS[name].fn(**dict(knobs))


# ---- small figure helpers (plotly JSON) -------------------------------------------------------


def figure(traces: list, title: str = "", x: str = "", y: str = "", **layout) -> dict:
    lay = {
        "title": {"text": title, "font": {"size": 14}},
        "margin": {"l": 50, "r": 20, "t": 40, "b": 45},
        "xaxis": {"title": {"text": x}},
        "yaxis": {"title": {"text": y}},
        "height": 340,
        "legend": {"orientation": "h", "y": -0.2},
    }
    lay.update(layout)
    return {"data": traces, "layout": lay}


def bar(x, y, name="", **kw) -> dict:
    return {"type": "bar", "x": list(x), "y": [float(v) for v in y], "name": name, **kw}


def line(x, y, name="", **kw) -> dict:
    return {
        "type": "scatter",
        "mode": kw.pop("mode", "lines"),
        "x": list(x),
        "y": [None if v is None else float(v) for v in y],  # None = a gap in the line
        "name": name,
        **kw,
    }


def r(x, nd=4) -> float:
    """A float rounded for display and JSON (tests compare these)."""
    return round(float(x.detach()) if hasattr(x, "detach") else float(x), nd)


def frange(lo: float, hi: float, step: float) -> list[float]:
    n = int(round((hi - lo) / step))
    return [round(lo + i * step, 10) for i in range(n + 1)]
