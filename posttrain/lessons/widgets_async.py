"""Widgets of lessons 19 and 22c: where the roles run (a Gantt timeline of one step after another
under each placement, from throughput.step_time) and what running the sampler ahead costs
(recorded runs of the lesson-13 DAPO toy with a sampler Δ versions behind the trainer)."""

from __future__ import annotations

from posttrain.lessons import dapo_toy, runs
from posttrain.lessons.registry import Knob, Widget, figure, line, r, register
from posttrain.sizing import throughput as tp

COLORS = {"rollout": "#1f77b4", "train": "#ff7f0e", "sync": "#2ca02c", "idle": "#dddddd"}
STEPS_SHOWN = 3

# ---- 19 · the roles on a timeline, per placement ------------------------------------------------


SPLIT = ("disaggregated", "one_step_off", "async")  # the split placements drawn, two lanes each
LANE = {
    "colocated": "colocated · all 2N GPUs",
    "disaggregated": "on-policy split",
    "one_step_off": "one step off",
    "async": "async",
}


def lanes(R: float, T: float, S: float, par: float = 1.0) -> tuple[dict, list[tuple[str, str, float, float, str]]]:
    """throughput.compare_topologies on the same 2N GPUs (τ_R, τ_T measured on N-GPU pools; a
    share `par` of the rollout shortens with more GPUs), and the bars of a Gantt chart: (lane,
    role, start, duration, label) for STEPS_SHOWN steps of each. Colocated runs every role on all
    GPUs in turn; the on-policy split's pools take turns; one step off overlaps the sampler
    (batch n + 1, weights vN) with the trainer (batch n), then both take part in the sync; async
    overlaps them too, and the sampler loads each new version itself before its next batch."""
    runs_ = tp.compare_topologies(rollout_s=R, train_s=T, sync_s=S, rollout_parallel=par)
    ct = runs_["colocated"]["terms"]
    bars = []
    tau = {t: runs_[t]["step_s"] for t in runs_}
    for n in range(STEPS_SHOWN):
        t0 = n * tau["colocated"]
        c = LANE["colocated"]
        bars += [
            (c, "rollout", t0, ct["rollout"], f"v{n}"),
            (c, "train", t0 + ct["rollout"], ct["train"], f"→v{n + 1}"),
            (c, "sync", t0 + ct["rollout"] + ct["train"], S, ""),
        ]
        t0 = n * tau["disaggregated"]
        ro, tr = f"{LANE['disaggregated']} · rollout pool", f"{LANE['disaggregated']} · trainer pool"
        bars += [
            (ro, "rollout", t0, R, f"v{n}"),
            (ro, "idle", t0 + R, T, ""),
            (tr, "idle", t0, R, ""),
            (tr, "train", t0 + R, T, f"→v{n + 1}"),
            (ro, "sync", t0 + R + T, S, ""),
            (tr, "sync", t0 + R + T, S, ""),
        ]
        t0, busy = n * tau["one_step_off"], max(R, T)
        ro, tr = f"{LANE['one_step_off']} · rollout pool", f"{LANE['one_step_off']} · trainer pool"
        bars += [
            (ro, "rollout", t0, R, f"v{n}"),
            (ro, "idle", t0 + R, busy - R, ""),
            (tr, "train", t0, T, f"→v{n + 1}"),
            (tr, "idle", t0 + T, busy - T, ""),
            (ro, "sync", t0 + busy, S, ""),
            (tr, "sync", t0 + busy, S, ""),
        ]
        t0 = n * tau["async"]
        ro, tr = f"{LANE['async']} · rollout pool", f"{LANE['async']} · trainer pool"
        bars += [
            (ro, "sync", t0, S, ""),
            (ro, "rollout", t0 + S, R, f"v{max(n - 1, 0)}"),
            (ro, "idle", t0 + S + R, tau["async"] - S - R, ""),
            (tr, "train", t0, T, f"→v{n + 1}"),
            (tr, "idle", t0 + T, tau["async"] - T, ""),
        ]
    return runs_, [b for b in bars if b[3] > 1e-9]


def topology(R: int, T: int, S: int, par: float) -> dict:
    runs_, bars = lanes(R, T, S, par)
    tau = {n: runs_[n]["step_s"] for n in runs_}
    order = [f"{LANE[t]} · {side} pool" for t in reversed(SPLIT) for side in ("trainer", "rollout")]
    order.append(LANE["colocated"])
    traces = []
    for role, color in COLORS.items():
        mine = [b for b in bars if b[1] == role]
        if mine:
            traces.append(
                {
                    "type": "bar",
                    "orientation": "h",
                    "name": role,
                    "y": [b[0] for b in mine],
                    "x": [b[3] for b in mine],
                    "base": [b[2] for b in mine],
                    "text": [b[4] for b in mine],
                    "textposition": "inside",
                    "marker": {"color": color},
                    "hovertemplate": "%{y}: %{base:.0f}–%{x:.0f} s",
                }
            )
    d = runs_["one_step_off"]
    idle_r, idle_t = d["idle_s"]["rollout"] / tau["one_step_off"], d["idle_s"]["trainer"] / tau["one_step_off"]
    fig = figure(
        traces,
        f"τ_R = {R} s, τ_T = {T} s on N GPUs each, τ_S = {S} s: {STEPS_SHOWN} steps on the same 2N GPUs",
        "seconds",
        "",
        barmode="overlay",
        height=460,
        yaxis={"categoryorder": "array", "categoryarray": order, "automargin": True},
        xaxis={"range": [0, STEPS_SHOWN * max(tau.values())], "title": {"text": "seconds"}},
        margin={"l": 210, "r": 20, "t": 40, "b": 45},
    )
    idle_side = "rollout" if idle_r >= idle_t else "trainer"
    best = min(SPLIT + ("async_double_buffered",), key=tau.get)
    return {
        "figure": fig,
        "kpis": [[f"{n} step", f"{tau[n]:g} s ({3600 / tau[n]:.0f} steps/h)"] for n in tau]
        + [
            ["one step off / colocated", r(tau["colocated"] / tau["one_step_off"], 2)],
            ["async / colocated", r(tau["colocated"] / tau["async"], 2)],
            ["rollout pool idle (one step off)", f"{100 * idle_r:.0f}%"],
            ["trainer pool idle (one step off)", f"{100 * idle_t:.0f}%"],
        ],
        "note": (
            f"On the same GPUs colocated takes {tau['colocated']:g} s a step, the on-policy split "
            f"{tau['disaggregated']:g} s, one step off {tau['one_step_off']:g} s and async {tau['async']:g} s "
            f"({tau['async_double_buffered']:g} s with double-buffered weights). The fastest split is {best}, "
            f"{tau['colocated'] / tau[best]:.2f}× colocated; in the one-step-off placement the {idle_side} pool "
            f"waits {100 * max(idle_r, idle_t):.0f}% of every step."
        ),
    }


register(
    Widget(
        "topology",
        "Where the roles run: a timeline per placement, on the same GPUs",
        topology,
        [
            Knob("R", "rollout τ_R on N GPUs (s)", [5, 10, 20, 30, 40], 20),
            Knob("T", "train τ_T on N GPUs (s)", [2, 5, 8, 15, 20], 15),
            Knob("S", "sync τ_S (s)", [0, 2, 3, 10], 2),
            Knob("par", "share of τ_R that more GPUs shorten", [1.0, 0.5, 0.0], 1.0),
        ],
        {
            "knobs": {"R": 5, "T": 20},
            "what": "A trainer-bound step (τ_R = 5 s, τ_T = 20 s): the rollout pool of the one-step-off placement "
            "idles about two-thirds of every step, so half the cluster is paid for and waits, and colocated on "
            "the same GPUs is faster.",
        },
        "Gantt chart of three consecutive steps under each placement on the same 2N GPUs (blue rollout, orange "
        "train, green sync, grey idle); vN marks the weights a rollout samples with. The role times are those "
        "of N-GPU pools; colocated runs each phase on all 2N. Step times from throughput.compare_topologies.",
        ["posttrain.sizing.throughput:compare_topologies", "posttrain.sizing.throughput:step_time"],
    )
)


# ---- 22c · async pipelining: staleness against throughput -----------------------------------------

TARGET = 0.7


def _first(curve: dict, target: float):
    return next((s for s, a in zip(curve["step"], curve["acc"]) if a >= target), None)


def pipeline_topology(delta: int) -> str:
    """The placement a sampler Δ versions behind runs as: Δ = 0 is on-policy, so the two pools take
    turns; Δ = 1 overlaps them one step off; Δ ≥ 2 is async, the sampler loading each version
    between batches as posttrain's producer does (distributed/async_rollout.py)."""
    return {0: "disaggregated", 1: "one_step_off"}.get(delta, "async")


def pipeline_step_s(R: float, T: float, S: float, delta: int) -> float:
    """Seconds per step of a split placement whose sampler runs Δ versions behind (pipeline_topology)."""
    return tp.step_time(rollout_s=R, train_s=T, sync_s=S, topology=pipeline_topology(delta))["step_s"]


def async_pipe(R: int, T: int, S: int, delta: int, correction: str) -> dict:
    """Step time from throughput.step_time (pipeline_topology: Δ = 0 the on-policy split, Δ = 1 one
    step off, Δ ≥ 2 async with the load paid by the sampler) times the steps a recorded run with a
    sampler Δ versions behind needs to reach TARGET accuracy (dapo_toy.run with staleness=Δ, 3 seeds)."""
    rec = runs.recorded()
    curves = {d: rec[dapo_toy.stale_key(d, correction)] for d in dapo_toy.STALENESS}
    step_s = {d: pipeline_step_s(R, T, S, d) for d in dapo_toy.STALENESS}
    colo = tp.compare_topologies(rollout_s=R, train_s=T, sync_s=S)["colocated"]["step_s"]
    to_target = {d: (_first(c, TARGET) or None) for d, c in curves.items()}
    wall = {d: (n * step_s[d] / 60 if n else None) for d, n in to_target.items()}
    this = curves[delta]
    mean = lambda xs: sum(xs) / len(xs)
    traces = [
        line([s * step_s[d] / 60 for s in c["step"]], c["acc"], f"Δ = {d}", line={"width": 4 if d == delta else 1.5})
        for d, c in curves.items()
    ]
    traces.append(
        line(
            [0, max(c["step"][-1] * step_s[d] / 60 for d, c in curves.items())],
            [TARGET, TARGET],
            f"target accuracy {TARGET}",
            line={"dash": "dash", "color": "grey"},
        )
    )
    traces.append(
        line(
            list(dapo_toy.STALENESS),
            [mean(c["clip"]) for c in curves.values()],
            "clip fraction (mean over the run)",
            mode="lines+markers",
            xaxis="x2",
            yaxis="y2",
        )
    )
    w, w0 = wall[delta], wall[0]
    note = (
        f"Δ = {delta}: a step takes {step_s[delta]:g} s ({step_s[0] / step_s[delta]:.2f}× the on-policy split's "
        f"{step_s[0]:g} s; colocated on the same GPUs {colo:g} s), the clip fraction averages {100 * mean(this['clip']):.1f}%, and accuracy {TARGET} "
        + (
            f"comes after {to_target[delta]} steps, {w:.0f} min of wall clock against {w0:.0f} min on-policy."
            if w is not None and w0 is not None
            else "is not reached in 150 steps."
        )
    )
    return {
        "figure": figure(
            traces,
            f"τ_R {R} s, τ_T {T} s, τ_S {S} s, correction {correction}",
            "wall clock (minutes)",
            "accuracy (all prompts)",
            grid={"rows": 1, "columns": 2, "pattern": "independent"},
            yaxis={"range": [0, 1]},
            xaxis2={"title": {"text": "staleness Δ (versions)"}, "type": "log"},
            yaxis2={"title": {"text": "clip fraction"}, "rangemode": "tozero"},
        ),
        "kpis": [
            ["step time", f"{step_s[delta]:g} s"],
            ["speed-up per step over the on-policy split", f"{step_s[0] / step_s[delta]:.2f}×"],
            ["step time, colocated on the same GPUs", f"{colo:g} s"],
            ["clip fraction (mean over the run)", r(mean(this["clip"]), 3)],
            ["accuracy after 150 steps", r(this["acc"][-1], 3)],
            [f"steps to accuracy {TARGET}", to_target[delta] or "not in 150"],
            [f"wall clock to accuracy {TARGET}", f"{w:.0f} min" if w is not None else "not reached"],
            [f"wall clock to accuracy {TARGET}, on-policy", f"{w0:.0f} min" if w0 is not None else "not reached"],
        ],
        "note": note,
    }


register(
    Widget(
        "async_pipe",
        "Async pipelining: staleness against throughput",
        async_pipe,
        [
            Knob("R", "rollout τ_R (s)", [10, 20, 40], 20),
            Knob("T", "train τ_T (s)", [4, 8, 24], 8),
            Knob("S", "sync τ_S (s)", [0, 3, 10], 3),
            Knob("delta", "staleness Δ (versions)", list(dapo_toy.STALENESS), 2),
            Knob("correction", "off-policy correction", list(dapo_toy.CORRECTIONS), "none", "select"),
        ],
        {
            "knobs": {"delta": 32},
            "what": "A sampler 32 versions behind with no correction: each step is as fast as at Δ = 2, but a "
            "quarter of the tokens have their gradient clipped and each step teaches less, so accuracy 0.7 "
            "takes far more steps than on-policy.",
        },
        "Left: accuracy against wall clock for each staleness (recorded runs of the lesson-13 DAPO toy with the "
        "sampler Δ versions behind: a deliberate toy task, posttrain's loss and off-policy correction); "
        "right: the clip fraction each staleness causes. Step times from throughput.step_time: Δ = 0 the "
        "on-policy split (the pools take turns), Δ = 1 one step off, Δ ≥ 2 async with the sampler loading "
        "each version.",
        [
            "posttrain.sizing.throughput:step_time",
            "posttrain.lessons.dapo_toy:run",
            "posttrain.algorithms.core:off_policy_weights",
            "posttrain.algorithms.core:ppo_clip_loss",
        ],
    )
)
