"""Numbers quoted by the lesson pages of TEXT C (rl-22a … rl-28 and the gpt_mini track).

Each entry of FACTS is a function of no arguments that returns a number, a short string or a
table {"columns": [...], "rows": [[...], ...]}; a page quotes it as {{fact:NAME}} or
{{table:NAME}}. Every value is computed by posttrain's own functions (throughput, memory,
shapes, algorithms/core, the engine) or read from a committed JSON (benchmarks/results/,
lessons/data/runs.json), in well under a second on one core; nothing here trains.
Names start with the lesson they belong to (rl22a_…, g01_…).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Callable

from posttrain import throughput as tp

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def table(columns: list[str], rows: list[list]) -> dict:
    return {"columns": columns, "rows": rows}


@lru_cache(maxsize=None)
def result(name: str):
    """A committed benchmark result, benchmarks/results/<name>.json."""
    return json.loads((RESULTS / f"{name}.json").read_text())


# ---- 22a · the throughput equation -------------------------------------------------------------

WORKED = {"rollout_s": 30, "reward_s": 1, "reference_s": 3, "train_s": 8, "sync_s": 1}   # the lesson's example
WORKED_TOKENS = 64 * 16 * 1024                                                          # B·K·L̄


def rl22a_worked(topology: str = "disaggregated") -> dict:
    return tp.step_time(**WORKED, topology=topology)


def rl22a_worked_table() -> dict:
    rows = []
    for t in tp.TOPOLOGIES:
        r = rl22a_worked(t)
        rows.append([t, f"{r['step_s']:g} s", r["bottleneck"], f"{r['idle_s']['trainer']:g} s",
                     f"{tp.useful_tokens_per_s(64, 16, 1024, r['step_s']) / 1000:.1f}k"])
    return table(["topology", "τ_step", "bottleneck", "trainer idle per step", "useful tokens/s"], rows)


SIDE = {"rollout": "rollout side", "reward": "rollout side", "reference": "trainer side", "train": "trainer side",
        "sync": "between the two"}


def rl22a_role_table() -> dict:
    """The role model at its defaults (7B, K = 16, L = 1024, disaggregated)."""
    m = tp.role_model()
    return table(["role", "runs on", "seconds"],
                 [[k, SIDE[k], f"{v:.1f}"] for k, v in m["terms"].items()]
                 + [["τ_step = max(rollout side, trainer side) + sync", "", f"{m['step_s']:.1f}"]])


def rl22a_length_table() -> dict:
    rows = []
    for L in (256, 1024, 4096, 8192):
        m = tp.role_model(response_len=L)
        rows.append([L, f"{1 + 1.8 * math.tanh(L / 2048):.2f}", f"{m['terms']['rollout']:.1f} s", f"{m['step_s']:.1f} s",
                     f"{100 * m['terms']['rollout'] / m['step_s']:.0f}%", f"{m['idle_s']['trainer']:.1f} s"])
    return table(["response length L", "tail factor", "τ_R", "τ_step", "rollout share", "trainer idle"], rows)


def rl22a_colo_drop() -> float:
    """How much useful tokens/s colocation costs at the role model's defaults, in %."""
    colo, dis = tp.role_model(topology="colocated"), tp.role_model()
    return 100 * (1 - colo["useful_tokens_per_s"] / dis["useful_tokens_per_s"])


def rl22a_k_doubling() -> dict:
    a, b = tp.role_model(k=16), tp.role_model(k=32)
    return {"rollout_ratio": b["terms"]["rollout"] / a["terms"]["rollout"], "step_ratio": b["step_s"] / a["step_s"]}


def rl22a_cpu_roles() -> dict:
    """Mean role times of a real posttrain run (benchmarks/async_vs_sync.json, sync, seed 0:
    GRPO on gpt_mini nano, 128 samples a step, one CPU thread), read through step_time."""
    run = next(r for r in result("async_vs_sync")["runs"] if r["run"] == "sync" and r["seed"] == 0)
    return tp.step_time(**run["roles_s"], topology="colocated")


def rl22a_cpu_measured_s() -> float:
    run = next(r for r in result("async_vs_sync")["runs"] if r["run"] == "sync" and r["seed"] == 0)
    return run["mean time/step_s"]


def rl22a_cpu_table() -> dict:
    r = rl22a_cpu_roles()
    return table(["role", "seconds per step", "share"],
                 [[k, f"{v:.3f}", f"{100 * r['shares'][k]:.1f}%"] for k, v in r["terms"].items()])


FACTS: dict[str, Callable[[], object]] = {
    "rl22a_worked_table": rl22a_worked_table,
    "rl22a_worked_disagg_s": lambda: rl22a_worked()["step_s"],
    "rl22a_worked_colo_s": lambda: rl22a_worked("colocated")["step_s"],
    "rl22a_worked_idle_s": lambda: rl22a_worked()["idle_s"]["trainer"],
    "rl22a_worked_tok_s": lambda: tp.useful_tokens_per_s(64, 16, 1024, rl22a_worked()["step_s"]),
    "rl22a_worked_tokens": lambda: WORKED_TOKENS,
    "rl22a_role_table": rl22a_role_table,
    "rl22a_rollout_share": lambda: 100 * tp.role_model()["shares"]["rollout"],
    "rl22a_length_table": rl22a_length_table,
    "rl22a_share_8192": lambda: 100 * tp.role_model(response_len=8192)["shares"]["rollout"],
    "rl22a_colo_drop_pct": rl22a_colo_drop,
    "rl22a_k32_rollout_ratio": lambda: rl22a_k_doubling()["rollout_ratio"],
    "rl22a_k32_step_ratio": lambda: rl22a_k_doubling()["step_ratio"],
    "rl22a_sync_70b_s": lambda: tp.role_model(params_b=70, topology="async")["terms"]["sync"],
    "rl22a_cpu_table": rl22a_cpu_table,
    "rl22a_cpu_bottleneck": lambda: rl22a_cpu_roles()["bottleneck"],
    "rl22a_cpu_train_share": lambda: 100 * rl22a_cpu_roles()["shares"]["train"],
    "rl22a_cpu_rollout_share": lambda: 100 * rl22a_cpu_roles()["shares"]["rollout"],
    "rl22a_cpu_equation_s": lambda: rl22a_cpu_roles()["step_s"],
    "rl22a_cpu_measured_s": rl22a_cpu_measured_s,
    "rl22a_default_rollout_s": lambda: tp.role_model()["terms"]["rollout"],
    "rl22a_default_step_s": lambda: tp.role_model()["step_s"],
}
