"""Facts of lesson 19, topology, merged into facts_b_sys.FACTS (so into facts_b.FACTS): every
placement's equation on the same GPUs (sizing/throughput.compare_topologies, the 2026-11-28 review's
#1–#3) and the CPU measurement of benchmarks/async_vs_sync.py."""

from __future__ import annotations

from collections.abc import Callable

from posttrain.lessons.facts_b_data import result
from posttrain.sizing import throughput

COURSE_TIMES = {"rollout_s": 20, "train_s": 15, "sync_s": 2}  # lesson 19's widget defaults, each pool N GPUs
LABEL = {
    "colocated": "colocated, all 2N GPUs",
    "disaggregated": "disaggregated, on-policy",
    "one_step_off": "disaggregated, one step off",
    "async": "async (the sampler loads the weights)",
    "async_double_buffered": "async, double-buffered weights",
}


def rl19_topology_table() -> dict:
    """Each topology on the same 2N GPUs (throughput.compare_topologies): the course's role times
    are those of N-GPU pools; colocated gives every phase all 2N. Two cases: every phase twice
    as fast on twice the GPUs, and a rollout bound by its longest sequence (not shortened)."""
    lin = throughput.compare_topologies(**COURSE_TIMES)
    tail = throughput.compare_topologies(**COURSE_TIMES, rollout_parallel=0.0)
    return {
        "columns": [
            "placement",
            "samples",
            "step (s), phases ∝ 1/GPUs",
            "× colocated",
            "step (s), rollout not shortened",
            "× colocated",
        ],
        "rows": [
            [
                LABEL[t],
                throughput.STALENESS[t],
                round(lin[t]["step_s"], 1),
                round(lin[t]["speedup_vs_colocated"], 2),
                round(tail[t]["step_s"], 1),
                round(tail[t]["speedup_vs_colocated"], 2),
            ]
            for t in throughput.TOPOLOGIES
        ],
    }


SCENARIOS = {"rollout ≈ training": (15, 15, 2), "rollout-bound": (40, 5, 2), "heavy sync": (15, 15, 10)}


def rl19_scenarios() -> dict:
    return {k: throughput.compare_topologies(rollout_s=r, train_s=t, sync_s=s) for k, (r, t, s) in SCENARIOS.items()}


def rl19_scenarios_table() -> dict:
    """Three shapes of step, each topology's speed-up over colocated on the same GPUs."""
    rows = []
    for label, out in rl19_scenarios().items():
        r, t, s = SCENARIOS[label]
        tail = throughput.compare_topologies(rollout_s=r, train_s=t, sync_s=s, rollout_parallel=0.0)
        rows.append(
            [
                label,
                r,
                t,
                s,
                round(out["one_step_off"]["speedup_vs_colocated"], 2),
                round(out["async"]["speedup_vs_colocated"], 2),
                round(out["async_double_buffered"]["speedup_vs_colocated"], 2),
                round(tail["one_step_off"]["speedup_vs_colocated"], 2),
            ]
        )
    return {
        "columns": [
            "step shape",
            "τ_R",
            "τ_T",
            "τ_S",
            "one step off ×",
            "async ×",
            "async double-buffered ×",
            "one step off ×, rollout not shortened",
        ],
        "rows": rows,
    }


def _async_bench() -> dict:
    return result("async_vs_sync")


def _measured_sync_times() -> dict:
    """Mean role times of the synchronous CPU runs (all seeds) as step_time arguments."""
    runs = [r for r in _async_bench()["runs"] if r["run"] == "sync"]
    mean = lambda k: sum(r["roles_s"][k] for r in runs) / len(runs)
    return {
        "rollout_s": mean("rollout_s"),
        "reward_s": mean("reward_s"),
        "reference_s": mean("reference_s"),
        "train_s": mean("train_s"),
        "sync_s": mean("sync_s"),
    }


def rl19_trainer_bound_idle() -> str:
    """Share of a one-step-off step the rollout pool waits, at τ_R 5 s, τ_T 20 s, τ_S 2 s."""
    r = throughput.step_time(rollout_s=5, train_s=20, sync_s=2, topology="one_step_off")
    return f"{100 * r['idle_s']['rollout'] / r['step_s']:.0f}%"


def rl19_cpu_train_share() -> str:
    t = _measured_sync_times()
    return f"{100 * (t['train_s'] + t['reference_s']) / sum(t.values()):.0f}%"


def rl19_cpu_predicted() -> float:
    """The synchronous run's role times, each side given a core of its own (the async run's two
    threads): colocated step / async step."""
    t = _measured_sync_times()
    return round(
        throughput.step_time(**t, topology="colocated")["step_s"]
        / throughput.step_time(**t, topology="async")["step_s"],
        2,
    )


def rl19_cpu_measured() -> float:
    s = _async_bench()["summary"]
    return round(s["async_tis"]["samples_per_s_mean"] / s["sync"]["samples_per_s_mean"], 2)


FACTS: dict[str, Callable[[], object]] = {
    "rl19_topology_table": rl19_topology_table,
    "rl19_scenarios_table": rl19_scenarios_table,
    "rl19_trainer_bound_step": lambda: throughput.step_time(rollout_s=5, train_s=20, sync_s=2, topology="one_step_off")[
        "step_s"
    ],
    "rl19_trainer_bound_idle": rl19_trainer_bound_idle,
    "rl19_rollout_bound_split": lambda: round(
        rl19_scenarios()["rollout-bound"]["one_step_off"]["speedup_vs_colocated"], 2
    ),
    "rl19_rollout_bound_tail": lambda: rl19_scenarios_table()["rows"][1][7],
    "rl19_colo_step": lambda: throughput.compare_topologies(**COURSE_TIMES)["colocated"]["step_s"],
    "rl19_split_step": lambda: throughput.compare_topologies(**COURSE_TIMES)["one_step_off"]["step_s"],
    "rl19_onpolicy_step": lambda: throughput.compare_topologies(**COURSE_TIMES)["disaggregated"]["step_s"],
    "rl19_colo_tail_step": lambda: throughput.compare_topologies(**COURSE_TIMES, rollout_parallel=0.0)["colocated"][
        "step_s"
    ],
    "rl19_heavy_async": lambda: rl19_scenarios()["heavy sync"]["async"]["step_s"],
    "rl19_heavy_double": lambda: rl19_scenarios()["heavy sync"]["async_double_buffered"]["step_s"],
    "rl19_cpu_train_share": rl19_cpu_train_share,
    "rl19_cpu_predicted": rl19_cpu_predicted,
    "rl19_cpu_measured": rl19_cpu_measured,
    "rl19_cpu_steps": lambda: _async_bench()["steps"],
}
