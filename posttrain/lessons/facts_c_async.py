"""Facts of lessons 22c and 28: async pipelining and staleness, and where optimisation pays
(sizing/throughput.py and the committed async_vs_sync runs). Lessons 22a and 22b are in facts_c_throughput."""

from __future__ import annotations

import math
from collections.abc import Callable

from posttrain.lessons import dapo_toy, runs
from posttrain.lessons.facts_c_common import kpi, result, table
from posttrain.lessons.widgets_async import pipeline_step_s
from posttrain.sizing import throughput as tp

# ---- 22c · async pipelining and staleness ---------------------------------------------------


def rl22c_topologies() -> dict:
    """The lesson's example on the same GPUs: τ_R = 20 s, τ_T = 8 s on pools of N GPUs, τ_S = 3 s;
    colocated runs each phase on all 2N (throughput.compare_topologies)."""
    return tp.compare_topologies(rollout_s=20, train_s=8, sync_s=3)


def rl22c_topology_table() -> dict:
    runs = rl22c_topologies()
    return table(
        ["placement", "samples", "τ_step on the same GPUs", "speed-up over colocated", "trainer idle per step"],
        [
            [
                n,
                tp.STALENESS[n],
                f"{r['step_s']:g} s",
                f"{r['speedup_vs_colocated']:.2f}×",
                f"{r['idle_s']['trainer']:g} s",
            ]
            for n, r in runs.items()
        ],
    )


def _async_runs(seed: int = 0) -> dict:
    return {r["run"]: r for r in result("async_vs_sync")["runs"] if r["seed"] == seed}


def rl22c_measured_table() -> dict:
    """benchmarks/async_vs_sync.py, seed 0: GRPO on gpt_mini nano from the SFT(CoT) checkpoint,
    60 steps of 128 samples, lr 3e-5, the same prompts in every run."""
    label = {
        "sync": "sync (on-policy)",
        "async_tis": "async, ≤ 1 version behind, TIS",
        "fixed4_none": "every batch 4 versions old, no correction",
        "fixed4_tis": "every batch 4 versions old, TIS",
    }
    rows = []
    for name, r in _async_runs().items():
        lr = r.get("mean offpolicy/log_ratio_abs")
        rows.append(
            [
                label[name],
                f"{r.get('mean staleness/mean', 0.0):.2f}",
                f"{100 * r['mean clip/frac']:.2f}%",
                f"{r['mean ratio/max']:.2f}",
                "—" if lr is None else f"{lr:.4f}",
                f"{r['pass@1_before']:.3f} → {r['pass@1_after']:.3f}",
            ]
        )
    return table(
        [
            "run",
            "mean staleness (versions)",
            "clip/frac",
            "largest ratio r",
            "mean |log π_prox − log μ|",
            "held-out pass@1",
        ],
        rows,
    )


def rl22c_gain(run: str, key: str) -> float:
    return result("async_vs_sync")["summary"][run][key]


def rl22c_stale_curves(correction: str) -> dict:
    """The recorded staleness runs behind the async_pipe widget (dapo_toy.stale_runs: the lesson-13
    DAPO toy with all switches on and the sampler Δ versions behind, 3 seeds averaged)."""

    rec = runs.recorded()
    return {d: rec[dapo_toy.stale_key(d, correction)] for d in dapo_toy.STALENESS}


def _first(curve: dict, target: float = 0.7):
    """The first recorded step whose accuracy reaches `target` (None if none does)."""
    return next((st for st, a in zip(curve["step"], curve["acc"]) if a >= target), None)


def rl22c_stale_table() -> dict:
    """Per staleness: mean clip fraction and steps to accuracy 0.7, without and with TIS; and the
    wall clock to 0.7 at the widget's default role times (τ_R 20, τ_T 8, τ_S 3 s; Δ = 0 the on-policy
    split, whose pools take turns, Δ = 1 one step off, Δ ≥ 2 async: widgets_async.pipeline_step_s)."""
    none, tis = rl22c_stale_curves("none"), rl22c_stale_curves("tis")
    rows = []
    for d in none:
        step_s = pipeline_step_s(20, 8, 3, d)
        wall = [f"{_first(c) * step_s / 60:.0f} min" if _first(c) else "not reached" for c in (none[d], tis[d])]
        rows.append(
            [
                d,
                f"{100 * sum(none[d]['clip']) / len(none[d]['clip']):.1f}%",
                f"{100 * sum(tis[d]['clip']) / len(tis[d]['clip']):.1f}%",
                _first(none[d]) or "—",
                _first(tis[d]) or "—",
                *wall,
            ]
        )
    return table(
        [
            "staleness Δ",
            "clip fraction, no correction",
            "with TIS",
            "steps to accuracy 0.7, no correction",
            "with TIS",
            "wall clock to 0.7, no correction",
            "with TIS",
        ],
        rows,
    )


def rl22c_cpu_async_speedup() -> float:
    """What the throughput equation predicts async would buy for the sync run's measured role times,
    the sampler's thread given a core of its own (the async run's second thread)."""
    roles = _async_runs()["sync"]["roles_s"]
    return tp.step_time(**roles, topology="colocated")["step_s"] / tp.step_time(**roles, topology="async")["step_s"]


def rl22c_steps_to_target(correction: str = "none") -> dict:
    """{Δ: steps to accuracy 0.7} of the recorded staleness runs."""
    return {d: _first(c) for d, c in rl22c_stale_curves(correction).items()}


def rl22c_walls(correction: str = "none") -> dict:
    """{Δ: seconds of wall clock to accuracy 0.7} at the widget's default role times."""
    steps = rl22c_steps_to_target(correction)
    return {d: n * pipeline_step_s(20, 8, 3, d) if n else math.inf for d, n in steps.items()}


def rl22c_first_losing_delta() -> int:
    """The smallest Δ whose wall clock to accuracy 0.7, uncorrected, exceeds the on-policy split's (Δ = 0)."""
    wall = rl22c_walls("none")
    return next(d for d in sorted(wall) if d and wall[d] > wall[0])


def rl22c_tis_last_ahead() -> int:
    """The largest Δ up to which every TIS run reaches accuracy 0.7 no later than the on-policy split."""
    wall = rl22c_walls("tis")
    ahead = [d for d in sorted(wall) if d]
    last = 0
    for d in ahead:
        if wall[d] > wall[0]:
            break
        last = d
    return last


# ---- 28 · bottlenecks and where to optimise --------------------------------------------------


def amdahl(share: float, speedup: float) -> float:
    """Whole-step speed-up when a slice holding `share` of the step gets `speedup`× faster."""
    return 1 / (1 - share + share / speedup)


def rl28_amdahl_table() -> dict:
    cols = [2, 10, math.inf]
    return table(
        ["slice's share of the step", *[("∞" if c == math.inf else f"{c}×") + " on that slice" for c in cols]],
        [[f"{int(100 * f)}%", *[f"{amdahl(f, c):.2f}×" for c in cols]] for f in (0.1, 0.2, 0.6, 0.8)],
    )


def rl28_cpu_table() -> dict:
    """Per-role shares of the three synchronous seeds of benchmarks/async_vs_sync.py (one CPU thread)."""
    rows = []
    for r in result("async_vs_sync")["runs"]:
        if r["run"] == "sync":
            t = tp.step_time(**r["roles_s"], topology="colocated")
            rows.append(
                [
                    r["seed"],
                    f"{t['step_s']:.2f} s",
                    *[f"{100 * t['shares'][k]:.0f}%" for k in ("rollout", "reference", "train")],
                    t["bottleneck"],
                ]
            )
    return table(["seed", "step", "rollout", "reference", "train", "bottleneck"], rows)


# Every switch of the budget widget on: the course's "all of it" row.
ALL_ON = dict(prefix=True, cbatch=True, spec=True, fp8=True, train_opts=True, sync="overlapped", refpool=True)

FACTS: dict[str, Callable[[], object]] = {
    "rl22c_topology_table": rl22c_topology_table,
    "rl22c_onpolicy_step_s": lambda: rl22c_topologies()["disaggregated"]["step_s"],
    "rl22c_split_step_s": lambda: rl22c_topologies()["one_step_off"]["step_s"],
    "rl22c_async_step_s": lambda: rl22c_topologies()["async"]["step_s"],
    "rl22c_double_step_s": lambda: rl22c_topologies()["async_double_buffered"]["step_s"],
    "rl22c_colo_step_s": lambda: rl22c_topologies()["colocated"]["step_s"],
    "rl22c_split_idle_s": lambda: rl22c_topologies()["one_step_off"]["idle_s"]["trainer"],
    "rl22c_steps_d0": lambda: rl22c_steps_to_target()[0],
    "rl22c_steps_d1_d4_max": lambda: max(rl22c_steps_to_target()[d] for d in (1, 2, 4)),
    "rl22c_first_more_steps": lambda: next(
        d for d, n in rl22c_steps_to_target().items() if d and n > rl22c_steps_to_target()[0]
    ),
    "rl22c_first_losing_delta": rl22c_first_losing_delta,
    "rl22c_tis_last_ahead": rl22c_tis_last_ahead,
    "rl22c_course_clip_2": lambda: 100 * (1 - math.exp(-2 / 20)),
    "rl22c_course_clip_8": lambda: 100 * (1 - math.exp(-8 / 20)),
    "rl22c_measured_table": rl22c_measured_table,
    "rl22c_fixed4_clip_pct": lambda: 100 * _async_runs()["fixed4_none"]["mean clip/frac"],
    "rl22c_fixed4_logratio": lambda: _async_runs()["fixed4_tis"]["mean offpolicy/log_ratio_abs"],
    "rl22c_fixed4_ratio_max": lambda: _async_runs()["fixed4_none"]["mean ratio/max"],
    "rl22c_async1_logratio": lambda: _async_runs()["async_tis"]["mean offpolicy/log_ratio_abs"],
    "rl22c_sync_gain_pts": lambda: 100 * rl22c_gain("sync", "pass@1_gain_mean"),
    "rl22c_sync_gain_sd_pts": lambda: 100 * rl22c_gain("sync", "pass@1_gain_sd"),
    "rl22c_async_gain_pts": lambda: 100 * rl22c_gain("async_tis", "pass@1_gain_mean"),
    "rl22c_async_gain_sd_pts": lambda: 100 * rl22c_gain("async_tis", "pass@1_gain_sd"),
    "rl22c_cpu_async_speedup": rl22c_cpu_async_speedup,
    "rl22c_stale_table": rl22c_stale_table,
    "rl22c_w_clip32": lambda: f"{100 * kpi('async_pipe', 'clip fraction (mean over the run)', delta=32):.0f}%",
    "rl22c_w_steps32": lambda: kpi("async_pipe", "steps to accuracy 0.7", delta=32),
    "rl22c_w_wall32": lambda: kpi("async_pipe", "wall clock to accuracy 0.7", delta=32),
    "rl28_amdahl_table": rl28_amdahl_table,
    "rl28_two_on_ten": lambda: 100 * (amdahl(0.1, 2) - 1),
    "rl28_cpu_table": rl28_cpu_table,
    "rl28_train_1gpu_s": lambda: tp.train_time_s(32768, 7e9),
    "rl28_train_8gpu_s": lambda: tp.train_time_s(32768, 7e9, gpus=8),
    "rl28_w_trainonly_speedup": lambda: kpi("budget", "speed-up", prefix=False, cbatch=False, train_opts=True),
    "rl28_w_trainonly_disagg": lambda: kpi(
        "budget", "speed-up", prefix=False, cbatch=False, train_opts=True, placement="one_step_off"
    ),
    "rl28_w_prefixonly_speedup": lambda: kpi("budget", "speed-up", prefix=True, cbatch=False, train_opts=False),
    "rl28_w_all_speedup": lambda: kpi("budget", "speed-up", **ALL_ON),
    "rl28_w_all_largest": lambda: kpi("budget", "largest remaining slice", **ALL_ON),
}
