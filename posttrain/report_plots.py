"""The run report's plots (report.py): every metric group drawn so that it reads at a glance.

A group's series can differ by orders of magnitude (the eval group held `eval/length_mean` ≈ 28
beside accuracies ≈ 0.8, so pass@1 was a flat line at the bottom; `rollout/tokens_per_s` ≈ 15k beside
counts), so a group is cut into panels, one scale each (issue 29):

- accuracies (`eval/pass@k`, `maj@k`, `best@k`, `greedy_acc`, ...) on their own axis, fixed at 0–1,
  and so are fractions (`*_frac`, `*_occupancy`);
- every other series with those of its unit (seconds `*_s`, rates `*per_s`, the rest) and order of
  magnitude: sorted by their median |value|, a panel takes series until one is more than ten times
  the panel's smallest (series that are all zero join the smallest panel of their unit when its
  values are at most 1, else have a panel of their own).

A panel of one series has no legend (the y axis names it); otherwise the legend is one row band
between the title and the plot, so it never covers the curves or the x axis title.
"""

from __future__ import annotations

import json
import math
import re

ACCURACY = re.compile(r"pass@|maj@|best@|(^|_)acc($|_)")  # an eval key measured in [0, 1]
FRACTION = re.compile(r"(^|_)frac$|_occupancy$")  # a share, also in [0, 1]
SCALE = 10.0  # a panel holds series within this factor of its smallest typical value
LEGEND_ROW = 22  # pixels per legend row
LEGEND_WIDTH = 520  # pixels a legend row may take in a half-width plot (a 1280-pixel window)


def is_accuracy(key: str) -> bool:
    return key.startswith("eval/") and bool(ACCURACY.search(key.split("/", 1)[1]))


def unit(key: str) -> str:
    """What a series measures, by its name: accuracy and fraction (drawn on 0–1), rate, seconds, other."""
    name = key.rsplit("/", 1)[-1]
    if is_accuracy(key):
        return "accuracy"
    if FRACTION.search(name):
        return "fraction"
    return "rate" if name.endswith("per_s") else "seconds" if name.endswith("_s") else "other"


def _typical(values: list[float]) -> float:
    """The median |value| of a series: its scale (0 for a series that is all zero or empty)."""
    mags = sorted(abs(v) for v in values)
    return mags[len(mags) // 2] if mags else 0.0


def _by_scale(keys: list[str], values: dict[str, list[float]]) -> list[list[str]]:
    """Keys of one unit cut where the typical value jumps more than SCALE× (all-zero series aside)."""
    scaled: list[list[str]] = []
    for k in sorted((k for k in keys if _typical(values[k]) > 0), key=lambda k: (_typical(values[k]), k)):
        if scaled and _typical(values[k]) <= SCALE * _typical(values[scaled[-1][0]]):
            scaled[-1].append(k)
        else:
            scaled.append([k])
    zero = sorted(k for k in keys if _typical(values[k]) == 0)
    if zero and scaled and _typical(values[scaled[0][0]]) <= 1:  # no scale of their own: beside small values
        scaled[0] = zero + scaled[0]
    elif zero:  # not beside counts or seconds: a panel of their own
        scaled.insert(0, zero)
    return scaled


def panels(keys: list[str], values: dict[str, list[float]]) -> list[tuple[list[str], str]]:
    """A group's keys cut into panels of one unit and scale each: (keys, unit), accuracies first."""
    out: list[tuple[list[str], str]] = []
    for u in ("accuracy", "fraction", "other", "rate", "seconds"):
        mine = [k for k in keys if unit(k) == u]
        if mine and u in ("accuracy", "fraction"):  # a fixed 0–1 axis: no scale to cut by
            out.append((mine, u))
        elif mine:
            out += [(p, u) for p in _by_scale(mine, values)]
    return out


def _title(group: str, panel: list[str], short: dict, kind: str, alone: bool) -> str:
    if len(panel) == 1:
        return panel[0]
    if kind in ("accuracy", "fraction"):
        return f"{group}: {kind}"
    if alone:
        return group
    names = ", ".join(short[k] for k in panel)
    return f"{group}: {names if len(names) <= 40 else names[:39] + '…'}"


def plot(div: str, traces: list[dict], title: str, barmode: str | None = None, axes: dict | None = None) -> str:
    """A plotly figure in a div: the title at the top, the legend (two or more traces) in its own
    band under it, the x axis `step` unless `axes` says otherwise."""
    named = [str(t.get("name", "")) for t in traces if t.get("showlegend", True)]
    width = sum(45 + 7 * len(n) for n in named)  # an entry: its symbol, gap and about 7 px a character
    rows = math.ceil(width / LEGEND_WIDTH) if len(named) > 1 else 0
    band = LEGEND_ROW * rows + 12 if rows else 0  # 12: the top tick label's upper half, above the plot
    height = 300 + band
    layout = {
        "title": {
            "text": title,
            "x": 0.02,
            "xanchor": "left",
            "y": 1.0,
            "yref": "container",
            "yanchor": "top",
            "pad": {"t": 8},
        },
        "height": height,
        "margin": {"l": 60, "r": 20, "t": 36 + band, "b": 45},
        "xaxis": {"title": {"text": "step"}},
        "showlegend": rows > 0,
        "legend": {
            "orientation": "h",
            "x": 0,
            "xanchor": "left",
            "y": 1 - 36 / height,
            "yanchor": "top",
            "yref": "container",
        },
        **(axes or {}),
    }
    if barmode:
        layout["barmode"] = barmode
    spec = json.dumps({"data": traces, "layout": layout}).replace("</", "<\\/")
    return (
        f'<div class="plot" id="{div}"></div><script>(function(){{var s={spec};'
        f'Plotly.newPlot("{div}", s.data, s.layout, {{responsive: true, displayModeBar: false}});}})();</script>'
    )


def _traces(panel: list[str], pts: dict, short: dict) -> list[dict]:
    """One line per distinct series. Series with the same points share one line named `a = b`: drawn
    apart, the later would hide the earlier (a single reward function's `reward/correct` is
    `reward/mean`; counters that stay 0, such as `reward/errors` and `reward/timeouts`)."""
    same: dict[tuple, list[str]] = {}
    for k in panel:
        same.setdefault(tuple(pts[k]), []).append(k)
    return [
        {
            "x": [p[0] for p in points],
            "y": [p[1] for p in points],
            "name": " = ".join(short[k] for k in keys),
            "type": "scatter",
            "mode": "lines+markers" if len(points) < 30 else "lines",
        }
        for points, keys in same.items()
    ]


def curves(metrics: list[dict], groups: dict[str, list[str]], lead: tuple[str, ...] = ()) -> list[str]:
    """One figure per panel of every group (`plot-<group>`, then `plot-<group>-2`, ...), in group
    order, except that the panels holding the `lead` keys come first, in that order (the report puts
    reward/mean beside eval/pass@1: the two plots a reader looks at first, side by side)."""
    out = []
    for g, keys in groups.items():
        pts = {
            k: [(m["step"], float(m[k])) for m in metrics if isinstance(m.get(k), (int, float)) and math.isfinite(m[k])]
            for k in keys
        }
        cut = panels(keys, {k: [v for _, v in p] for k, p in pts.items()})
        for i, (panel, kind) in enumerate(cut):
            short = {k: k.split("/", 1)[1] if "/" in k else k for k in panel}
            yaxis = _yaxis(panel, short, kind, [v for k in panel for _, v in pts[k]])
            title = _title(g, panel, short, kind, len(cut) == 1)
            div = f"plot-{g}" + (f"-{i + 1}" if i else "")
            rank = next((j for j, k in enumerate(lead) if k in panel), len(lead))
            out.append((rank, len(out), plot(div, _traces(panel, pts, short), title, axes={"yaxis": yaxis})))
    return [figure for _, _, figure in sorted(out)]


def _yaxis(panel: list[str], short: dict, kind: str, ys: list[float]) -> dict:
    """0–1 for accuracies and fractions; a constant series gets ±50% of its value around it (plotly
    would draw ±1, so a learning rate of 3e-5 read as 0)."""
    title = kind if kind in ("accuracy", "fraction") else short[panel[0]] if len(panel) == 1 else ""
    axis: dict = {"title": {"text": title}}
    if kind in ("accuracy", "fraction"):
        axis.update(range=[-0.02, 1.02], tickformat=".1f")
    elif ys and min(ys) == max(ys) != 0:
        axis.update(range=sorted([0.5 * ys[0], 1.5 * ys[0]]))
    return axis
