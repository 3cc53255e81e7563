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


def lanes(R: float, T: float, S: float) -> tuple[dict, list[tuple[str, str, float, float, str]]]:
    """throughput.compare_topologies for the three placements, and the bars of a Gantt chart:
    (lane, role, start, duration, label) for STEPS_SHOWN steps of each. Colocated runs every
    role on all GPUs in turn; disaggregated overlaps the rollout pool (sampling step n + 1)
    with the trainer pool (training on step n), then both wait for the sync; async also
    overlaps the sync, so each pool works back to back."""
    runs_ = tp.compare_topologies(rollout_s=R, train_s=T, sync_s=S)
    bars = []
    tc, td, ta = (runs_[t]["step_s"] for t in ("colocated", "disaggregated", "async"))
    for n in range(STEPS_SHOWN):
        t0 = n * tc
        bars += [
            ("colocated · all GPUs", "rollout", t0, R, f"v{n}"),
            ("colocated · all GPUs", "train", t0 + R, T, f"→v{n + 1}"),
            ("colocated · all GPUs", "sync", t0 + R + T, S, ""),
        ]
        t0, busy = n * td, max(R, T)
        bars += [
            ("disaggregated · rollout pool", "rollout", t0, R, f"v{n}"),
            ("disaggregated · rollout pool", "idle", t0 + R, busy - R, ""),
            ("disaggregated · trainer pool", "train", t0, T, f"→v{n + 1}"),
            ("disaggregated · trainer pool", "idle", t0 + T, busy - T, ""),
            ("disaggregated · rollout pool", "sync", t0 + busy, S, ""),
            ("disaggregated · trainer pool", "sync", t0 + busy, S, ""),
        ]
        t0 = n * ta
        bars += [
            ("async · rollout pool", "rollout", t0, R, f"v{max(n - 1, 0)}"),
            ("async · rollout pool", "idle", t0 + R, ta - R, ""),
            ("async · trainer pool", "train", t0, T, f"→v{n + 1}"),
            ("async · trainer pool", "idle", t0 + T, ta - T, ""),
            ("async · sync (overlapped)", "sync", t0, S, ""),
        ]
    return runs_, [b for b in bars if b[3] > 0]


def topology(R: int, T: int, S: int) -> dict:
    runs_, bars = lanes(R, T, S)
    names = ("colocated", "disaggregated", "async")
    tau = {n: runs_[n]["step_s"] for n in names}
    order = [
        "async · sync (overlapped)",
        "async · trainer pool",
        "async · rollout pool",
        "disaggregated · trainer pool",
        "disaggregated · rollout pool",
        "colocated · all GPUs",
    ]
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
    d = runs_["disaggregated"]
    idle_r, idle_t = d["idle_s"]["rollout"] / tau["disaggregated"], d["idle_s"]["trainer"] / tau["disaggregated"]
    fig = figure(
        traces,
        f"τ_R = {R} s, τ_T = {T} s, τ_S = {S} s: {STEPS_SHOWN} steps of each placement",
        "seconds",
        "",
        barmode="overlay",
        height=380,
        yaxis={"categoryorder": "array", "categoryarray": order, "automargin": True},
        xaxis={"range": [0, STEPS_SHOWN * tau["colocated"]], "title": {"text": "seconds"}},
        margin={"l": 190, "r": 20, "t": 40, "b": 45},
    )
    idle_side = "rollout" if idle_r >= idle_t else "trainer"
    return {
        "figure": fig,
        "kpis": [[f"{n} step", f"{tau[n]:g} s ({3600 / tau[n]:.0f} steps/h)"] for n in names]
        + [
            ["async / colocated", r(tau["colocated"] / tau["async"], 2)],
            ["disaggregated / colocated", r(tau["colocated"] / tau["disaggregated"], 2)],
            ["rollout pool idle (disaggregated)", f"{100 * idle_r:.0f}%"],
            ["trainer pool idle (disaggregated)", f"{100 * idle_t:.0f}%"],
        ],
        "note": (
            f"Colocated takes {tau['colocated']:g} s a step, disaggregated {tau['disaggregated']:g} s and async "
            f"{tau['async']:g} s. In the disaggregated placement the {idle_side} pool waits "
            f"{100 * max(idle_r, idle_t):.0f}% of every step: the shorter side only hides inside the longer one."
        ),
    }


register(
    Widget(
        "topology",
        "Where the roles run: a timeline per placement",
        topology,
        [
            Knob("R", "rollout τ_R (s)", [5, 10, 20, 30, 40], 20),
            Knob("T", "train τ_T (s)", [2, 5, 8, 15, 20], 15),
            Knob("S", "sync τ_S (s)", [0, 2, 3, 10], 2),
        ],
        {
            "knobs": {"R": 5, "T": 20},
            "what": "A trainer-bound step (τ_R = 5 s, τ_T = 20 s): the rollout pool of the disaggregated placement "
            "idles about two-thirds of every step, so half the cluster is paid for and waits; async only "
            "hides the 2 s of sync.",
        },
        "Gantt chart of three consecutive steps under each placement (blue rollout, orange train, green sync, "
        "grey idle); vN marks the weights a rollout samples with. Step times from throughput.step_time.",
        ["posttrain.sizing.throughput:compare_topologies", "posttrain.sizing.throughput:step_time"],
    )
)


# ---- 22c · async pipelining: staleness against throughput -----------------------------------------

TARGET = 0.7


def _first(curve: dict, target: float):
    return next((s for s, a in zip(curve["step"], curve["acc"]) if a >= target), None)


def async_pipe(R: int, T: int, S: int, delta: int, correction: str) -> dict:
    """Step time from throughput.step_time (Δ = 0: the synchronous disaggregated loop; Δ ≥ 1:
    async, the sync overlapped) times the steps a recorded run with a sampler Δ versions
    behind needs to reach TARGET accuracy (dapo_toy.run with staleness=Δ, 3 seeds)."""
    rec = runs.recorded()
    curves = {d: rec[dapo_toy.stale_key(d, correction)] for d in dapo_toy.STALENESS}
    step_s = {
        d: tp.step_time(rollout_s=R, train_s=T, sync_s=S, topology="async" if d else "disaggregated")["step_s"]
        for d in dapo_toy.STALENESS
    }
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
        f"Δ = {delta}: a step takes {step_s[delta]:g} s ({step_s[0] / step_s[delta]:.2f}× the synchronous "
        f"{step_s[0]:g} s), the clip fraction averages {100 * mean(this['clip']):.1f}%, and accuracy {TARGET} "
        + (
            f"comes after {to_target[delta]} steps, {w:.0f} min of wall clock against {w0:.0f} min synchronous."
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
            ["speed-up per step over synchronous", f"{step_s[0] / step_s[delta]:.2f}×"],
            ["clip fraction (mean over the run)", r(mean(this["clip"]), 3)],
            ["accuracy after 150 steps", r(this["acc"][-1], 3)],
            [f"steps to accuracy {TARGET}", to_target[delta] or "not in 150"],
            [f"wall clock to accuracy {TARGET}", f"{w:.0f} min" if w is not None else "not reached"],
            [f"wall clock to accuracy {TARGET}, synchronous", f"{w0:.0f} min" if w0 is not None else "not reached"],
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
            "what": "A sampler 32 versions behind with no correction: each step is as fast as at Δ = 1, but a "
            "quarter of the tokens have their gradient clipped and each step teaches less, so accuracy 0.7 "
            "takes about 110 steps instead of 65: more wall clock than the synchronous loop.",
        },
        "Left: accuracy against wall clock for each staleness (recorded runs of the lesson-13 DAPO toy with the "
        "sampler Δ versions behind: a deliberate toy task, posttrain's loss and off-policy correction); "
        "right: the clip fraction each staleness causes. Step times from throughput.step_time.",
        [
            "posttrain.sizing.throughput:step_time",
            "posttrain.lessons.dapo_toy:run",
            "posttrain.algorithms.core:off_policy_weights",
            "posttrain.algorithms.core:ppo_clip_loss",
        ],
    )
)
