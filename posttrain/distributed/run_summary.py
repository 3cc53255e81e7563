"""The throughput equation of a finished run (lesson 22a), from its live per-role timers.

    summary = summarize(read_metrics(run_dir), topology="async")   # also written as throughput.json

Per-role times are the means over the run's steps of the controller's `time/*_s` timers
(posttrain/sizing/throughput.from_metrics groups them into τ_R, τ_V, τ_ref, τ_T, τ_S; the off-policy
correction's proximal forward counts as trainer-side work with τ_ref). The equation for the
run's topology (sync loops run the roles in turn: `colocated`; async: `async`, the producer
loading each version between requests) is set beside the measured step time, with the
bottleneck role and the idle fractions, so a reader sees where the time went.

What another topology would have given is asked on the same GPUs (throughput.compare_topologies,
measured_on="colocated"): the timers were taken with every role on all of the run's GPUs, so a
split gives the sampler and the trainer half of them each, their phases twice as long (times ∝
1/GPUs, the best case for colocated). Each equation is printed with what it assumes: on-policy or
stale, and who pays the sync.
"""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.sizing.throughput import ASSUMES, STALENESS, compare_topologies, from_metrics, step_time


def summarize(rows: list[dict], topology: str, samples_per_step: int) -> dict:
    steps = [r for r in rows if r.get("step", 0) > 0 and "time/step_s" in r and not r.get("train/skipped_step")]
    if not steps:
        return {}
    keys = {k for r in steps for k in r if k.startswith("time/")}
    mean = {k: sum(r.get(k, 0.0) for r in steps) / len(steps) for k in keys}
    roles = from_metrics(mean)
    roles["reference_s"] += mean.get("time/proximal_s", 0.0)
    this = step_time(**roles, topology=topology)  # as the run ran, its own timers
    models = compare_topologies(**roles, measured_on="colocated")  # every topology on this run's GPUs
    step_s = mean["time/step_s"]
    return {
        "topology": topology,
        "steps": len(steps),
        "measured_step_s": step_s,
        "equation_step_s": this["step_s"],
        "bottleneck": this["bottleneck"],
        "roles_s": roles,
        "samples_per_s": samples_per_step / step_s if step_s else 0.0,
        "trainer_idle_frac": mean.get("time/trainer_idle_s", 0.0) / step_s if step_s else 0.0,
        "rollout_idle_frac": mean.get("time/rollout_idle_s", 0.0) / step_s if step_s else 0.0,
        "equation_by_topology_s": {t: m["step_s"] for t, m in models.items()},
        "equation_basis": "the same GPUs: a split gives each pool half, its phases twice as long",
        "assumes_by_topology": dict(ASSUMES),
    }


def write_summary(run_dir: Path, rows: list[dict], topology: str, samples_per_step: int) -> dict:
    """summarize(), printed in one paragraph and saved as RUN_DIR/throughput.json."""
    s = summarize(rows, topology, samples_per_step)
    if not s:
        return s
    Path(run_dir, "throughput.json").write_text(json.dumps(s, indent=2))
    roles = "  ".join(f"{k[:-2]} {v:.3f}" for k, v in s["roles_s"].items())
    eq = "  ".join(f"{t} {v:.3f} ({STALENESS[t]})" for t, v in s["equation_by_topology_s"].items())
    print(
        f"throughput ({s['steps']} steps, {topology}): step {s['measured_step_s']:.3f} s measured, "
        f"{s['equation_step_s']:.3f} s by the equation; per role (s): {roles}; bottleneck: {s['bottleneck']}; "
        f"trainer idle {100 * s['trainer_idle_frac']:.0f}%; {s['samples_per_s']:.1f} samples/s; "
        f"the equation for each topology on the same GPUs, split half and half, phases ∝ 1/GPUs (s): {eq}; "
        "async: the sampler pays the weight load (async_double_buffered: hidden)"
    )
    return s
