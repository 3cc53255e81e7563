"""The measured results of issue 22's claims, as five widgets and their lessons show them next to
their simulations: data/claims.json, written by benchmarks/claims_lessons.py from
benchmarks/results/*.json (3-seed means; only the numbers a widget draws).

The package ships the distilled file, not benchmarks/results, so a widget reads it here; each entry
names the widget it belongs to, and `entry` refuses a widget that asks for another's numbers.
Whether a claim held is decided from these numbers (the `*_holds` functions), so a caption that
says "not reproduced" changes by itself when a re-run reproduces it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "claims.json"


@functools.cache
def recorded() -> dict:
    return json.loads(DATA.read_text())


def entry(key: str, widget: str) -> dict:
    """claims.json[key], checked to belong to `widget`."""
    e = recorded()[key]
    if e["widget"] != widget:
        raise ValueError(f"claims.json[{key!r}] belongs to widget {e['widget']!r}, not {widget!r}")
    return e


def label(key: str) -> str:
    """'measured with posttrain (benchmarks/results/X.json[, part])' for entry `key`."""
    path, _, part = recorded()[key]["source"].partition(" (")
    return f"measured with posttrain ({path}{', ' + part.rstrip(')') if part else ''})"


def seeds_text(key: str) -> str:
    """'3 seeds' (or '1 seed'): how many seeds the entry's numbers average."""
    e = recorded()[key]
    rows = list(e.get("algorithms", {}).values()) + e.get("runs", []) + e.get("learning", [])
    seeds = (
        set(e.get("seeds", []))
        | {s for r in rows for s in r.get("seeds", [])}
        | {r["seed"] for r in rows if "seed" in r}
    )
    return f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''}"


# ---- the verdicts ------------------------------------------------------------------------------


def length_bias_holds() -> bool:
    """GRPO's wrong answers grow over training, by more than a token beyond Dr. GRPO's."""
    a = recorded()["length_bias"]["algorithms"]
    growth = {k: v["wrong_length_last10"] - v["wrong_length_first10"] for k, v in a.items()}
    return growth["grpo"] > 0 and growth["grpo"] - growth["dr_grpo"] > 1.0


def prm_holds() -> bool:
    """The PRM's best of 8 beats one sample and the ORM's best of 8."""
    acc = recorded()["prm"]["accuracy"]
    return acc["prm best@8"] > max(acc["pass@1"], acc["orm best@8"])


def overopt_peak(rm: str = "rm_full") -> dict | None:
    """The best-of-n point where the true reward peaks, if it peaks strictly inside the sweep."""
    curve = recorded()["overoptimization"]["best_of_n"][rm]
    i = max(range(len(curve)), key=lambda j: curve[j]["true"])
    return curve[i] if 0 < i < len(curve) - 1 else None


def group_holds() -> bool:
    """Groups of 8 are degenerate less often than groups of 2 at the same number of samples."""
    runs = {r["run"]: r for r in recorded()["group_size"]["runs"]}
    return runs["group_8"]["degenerate_last10"] < runs["group_2"]["degenerate_last10"]


# ---- the measured panel under a widget's simulation ---------------------------------------------


def _f(x: float, nd: int = 3) -> str:
    return f"{x:.{nd}f}"


def _length_bias() -> tuple[list, str, str, list, str]:
    a = recorded()["length_bias"]["algorithms"]
    names = {"grpo": "GRPO (÷|y_i|)", "dr_grpo": "Dr. GRPO (÷K)"}
    traces = [
        {
            "type": "bar",
            "x": list(names.values()),
            "y": [a[k][f"wrong_length_{when}10"] for k in names],
            "name": f"measured: wrong answers, {when} 10 steps",
        }
        for when in ("first", "last")
    ]
    grow = lambda k: f"{names[k]} {_f(a[k]['wrong_length_first10'], 1)} → {_f(a[k]['wrong_length_last10'], 1)}"
    kpis = [
        [
            f"{label('length_bias')}, {seeds_text('length_bias')}, {a['grpo']['max_new_tokens']}-token budget: "
            "wrong-answer length, first → last 10 steps",
            f"{grow('grpo')}; {grow('dr_grpo')}",
        ],
        [
            "measured: held-out wrong answer minus the correct trace (tokens), start → end",
            "; ".join(
                f"{names[k]} {_f(a[k]['wrong_excess_start'], 2)} → {_f(a[k]['wrong_excess_end'], 2)}" for k in names
            ),
        ],
        [
            "measured: held-out pass@1, start → end",
            "; ".join(f"{names[k]} {_f(a[k]['pass@1_start'])} → {_f(a[k]['pass@1_end'])}" for k in names),
        ],
        ["claim: GRPO's wrong answers grow longer", "reproduced" if length_bias_holds() else "not reproduced"],
    ]
    note = (
        f" Measured ({seeds_text('length_bias')}): wrong answers went {grow('grpo')} and {grow('dr_grpo')} tokens"
        + (
            "; the claim reproduced."
            if length_bias_holds()
            else "; GRPO's did not grow, so the claim did not reproduce here."
        )
    )
    return traces, "", "tokens (measured)", kpis, note


def _overoptimization() -> tuple[list, str, str, list, str]:
    e = recorded()["overoptimization"]
    full, chance = e["best_of_n"]["rm_full"], e["best_of_n"]["rm_d0"]
    acc = e["rm_heldout_pair_acc"]
    x = [round(p["sqrt_kl"], 3) for p in full]
    traces = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "x": x,
            "y": [p["true"] for p in full],
            "name": f"measured: true reward, RM {acc['rm_full']:.2f}",
        },
        {
            "type": "scatter",
            "mode": "lines+markers",
            "x": x,
            "y": [p["proxy"] for p in full],
            "name": f"measured: proxy, RM {acc['rm_full']:.2f}",
            "line": {"dash": "dash"},
        },
        {
            "type": "scatter",
            "mode": "lines+markers",
            "x": [round(p["sqrt_kl"], 3) for p in chance],
            "y": [p["true"] for p in chance],
            "name": f"measured: true reward, RM {acc['rm_d0']:.2f}",
            "line": {"dash": "dot"},
        },
    ]
    peak = overopt_peak()
    top = f"{_f(peak['true'])} (n = {peak['n']}, √KL {peak['sqrt_kl']:.2f})" if peak else "no peak"
    kpis = [
        [
            f"{label('overoptimization')}, {seeds_text('overoptimization')}: best of n = 1 … {full[-1]['n']}, "
            f"RM held-out pair accuracy {acc['rm_full']:.2f}: true reward n = 1 → peak → n = {full[-1]['n']}",
            f"{_f(full[0]['true'])} → {top} → {_f(full[-1]['true'])}",
        ],
        ["measured: proxy n = 1 → n = " + str(full[-1]["n"]), f"{_f(full[0]['proxy'])} → {_f(full[-1]['proxy'])}"],
        ["claim: true reward rises then falls against √KL", "reproduced (best of n)" if peak else "not reproduced"],
    ]
    note = (
        f" Measured ({seeds_text('overoptimization')}, best of n against a {acc['rm_full']:.2f} RM): the true reward "
        + (
            f"peaks at {_f(peak['true'])} (n = {peak['n']}) and falls to {_f(full[-1]['true'])} while the proxy climbs."
            if peak
            else "shows no peak."
        )
    )
    return traces, "√KL to the sampling policy (best of n)", "reward (measured)", kpis, note


PRM_NAMES = {
    "pass@1": "one sample (pass@1)",
    "maj@8": "majority of 8",
    "orm best@8": "ORM best of 8",
    "prm best@8": "PRM best of 8",
    "prm beam 2x4": "PRM beam 2×4",
}


def _prm() -> tuple[list, str, str, list, str]:
    e = recorded()["prm"]
    acc, steps = e["accuracy"], e["step_accuracy"]
    traces = [
        {
            "type": "bar",
            "x": list(PRM_NAMES.values()),
            "y": [acc[k] for k in PRM_NAMES],
            "name": "measured: share of problems right",
            "marker": {"color": ["#ff7f0e" if k.startswith("prm") else "#7f7f7f" for k in PRM_NAMES]},
        }
    ]
    kpis = [
        [
            f"{label('prm')}, {seeds_text('prm')}, 8 samples a problem: " + " / ".join(PRM_NAMES.values()),
            " / ".join(_f(acc[k]) for k in PRM_NAMES),
        ],
        [
            "measured: PRM held-out step accuracy (best checkpoint) / majority class",
            f"{_f(max(steps['heldout']))} / {_f(steps['majority'])}",
        ],
        ["claim: the PRM's best of 8 beats pass@1 and the ORM", "reproduced" if prm_holds() else "not reproduced"],
    ]
    note = (
        f" Measured ({seeds_text('prm')}, 8 samples): PRM best of 8 {_f(acc['prm best@8'])} against pass@1 "
        f"{_f(acc['pass@1'])} and ORM best of 8 {_f(acc['orm best@8'])}"
        + ("; the claim reproduced." if prm_holds() else "; the PRM did not help, so the claim did not reproduce.")
    )
    return traces, "", "accuracy (measured)", kpis, note


def delta_bins() -> list[str]:
    """Bin names of the precision lab's log10|δ| histogram (the first bin holds δ = 0 too)."""
    edges = recorded()["precision"]["mismatch"]["fp32"]["log10_abs_delta_edges"]
    return [f"<1e{edges[1]}" if i == 0 else f"1e{a}–1e{b}" for i, (a, b) in enumerate(zip(edges, edges[1:]))]


def _g(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}"


def _precision() -> tuple[list, str, str, list, str]:
    e = recorded()["precision"]
    mm = e["mismatch"]
    traces = [
        {
            "type": "bar",
            "x": delta_bins(),
            "y": [c / sum(v["counts"]) for c in v["counts"]],
            "name": f"measured: {fmt} sampler",
        }
        for fmt, v in mm.items()
    ]
    order = lambda r: (list(mm).index(r["format"]), ["none", "tis", "mask"].index(r["correction"]))
    learn = {(r["format"], r["correction"]): r["pass@1_end"] for r in sorted(e.get("learning", []), key=order)}
    capped = max(max(v["tis_capped_frac"], v["mask_dropped_frac"]) for v in mm.values())
    fmts = " / ".join(mm)
    kpis = [
        [
            f"{label('precision')}, {seeds_text('precision')}, fp32 trainer: mean |δ| per token, {fmts} sampler",
            " / ".join(_g(v["delta_abs_mean"]) for v in mm.values()),
        ],
        [f"measured: PPO clip fraction (ε 0.2), {fmts}", " / ".join(_g(v["clip_frac_eps0.2"]) for v in mm.values())],
        [
            "measured: tokens TIS caps / the mask drops (w outside [½, 2])",
            "; ".join(f"{f} {_g(v['tis_capped_frac'])} / {_g(v['mask_dropped_frac'])}" for f, v in mm.items()),
        ],
    ]
    if learn:
        kpis.append(
            [
                "measured: held-out pass@1 after 20 steps, " + " / ".join(f"{f} {c}" for f, c in learn),
                " / ".join(_f(v) for v in learn.values()),
            ]
        )
    note = (
        f" Measured ({seeds_text('precision')}): a bf16 sampler is off by {mm['bf16']['delta_abs_mean']:.1e} per token "
        f"on average, fp32 by {mm['fp32']['delta_abs_mean']:.1e}; "
        + (
            "no token's weight left [½, 2], so TIS capped none and the mask dropped none."
            if capped == 0
            else f"up to {capped:.1e} of the tokens had a weight outside [½, 2]."
        )
    )
    return traces, "|δ| = |log π_trainer − log μ_sampler| per token", "share of tokens (measured)", kpis, note


def _group_size() -> tuple[list, str, str, list, str]:
    runs = {r["run"]: r for r in recorded()["group_size"]["runs"]}
    names = {"group_2": "groups of 2", "group_8": "groups of 8"}
    traces = [
        {
            "type": "bar",
            "x": list(names.values()),
            "y": [runs[k][f"degenerate_{when}10"] for k in names],
            "name": f"measured: degenerate groups, {when} 10 steps",
        }
        for when in ("first", "last")
    ]
    span = lambda k, a, b, nd: f"{names[k]} {_f(runs[k][a], nd)} → {_f(runs[k][b], nd)}"
    kpis = [
        [
            f"{label('group_size')}, {seeds_text('group_size')}, 128 samples a step: "
            "degenerate groups, first → last 10 steps",
            "; ".join(span(k, "degenerate_first10", "degenerate_last10", 2) for k in names),
        ],
        ["measured: held-out pass@1, start → end", "; ".join(span(k, "pass@1_start", "pass@1_end", 3) for k in names)],
    ]
    note = (
        f" Measured ({seeds_text('group_size')}, 128 samples a step): "
        + " and ".join(f"{_f(runs[k]['degenerate_last10'], 2)} of {names[k]}" for k in names)
        + " were degenerate over the last 10 steps."
    )
    return traces, "", "share of groups (measured)", kpis, note


PARTS = {
    "length_bias": _length_bias,
    "hacking": _overoptimization,
    "prm": _prm,
    "off_policy": _precision,
    "grpo_group": _group_size,
}


def key_of(widget: str) -> str:
    return next(k for k, e in recorded().items() if e["widget"] == widget)


def caption(widget: str) -> str:
    """The sentence a widget's explanation ends with: what the lower panel is."""
    return (
        f" Below: {label(key_of(widget))}, the mean of {seeds_text(key_of(widget))}; "
        "the lower panel does not move with the knobs."
    )


def attach(widget: str, out: dict) -> dict:
    """`out` (a widget's result) with the measured panel under its figure, the measured KPIs after
    its own and one sentence on them after its note. The figure's own axes keep the top 55%."""
    traces, x, y, kpis, note = PARTS[widget]()
    lay = out["figure"]["layout"]
    grid = lay.pop("grid", None)
    if grid and grid.get("rows", 1) != 1:
        raise ValueError(f"widget {widget}: attach() stacks under one row of panels, not {grid['rows']}")
    cols, gap = (grid or {}).get("columns", 1), 0.1
    width = (1 - gap * (cols - 1)) / cols
    for i in range(1, cols + 1):
        s = "" if i == 1 else str(i)
        lo = (i - 1) * (width + gap)
        lay[f"xaxis{s}"] = {
            **lay.get(f"xaxis{s}", {}),
            "domain": [round(lo, 4), round(lo + width, 4)],
            "anchor": f"y{s}",
        }
        lay[f"yaxis{s}"] = {**lay.get(f"yaxis{s}", {}), "domain": [0.55, 1.0], "anchor": f"x{s}"}
    s = str(cols + 1)
    lay[f"xaxis{s}"] = {"domain": [0.0, 1.0], "anchor": f"y{s}", "title": {"text": x}}
    lay[f"yaxis{s}"] = {"domain": [0.0, 0.3], "anchor": f"x{s}", "title": {"text": y}}
    lay["height"] = 640
    out["figure"]["data"] = out["figure"]["data"] + [{**t, "xaxis": f"x{s}", "yaxis": f"y{s}"} for t in traces]
    return {**out, "kpis": out["kpis"] + kpis, "note": out.get("note", "") + note}
