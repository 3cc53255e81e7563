"""Throughput math: where an RL step's wall clock goes, and which role bounds it (lessons 22, 22a, 22b).

    step_time(rollout_s=30, reward_s=1, reference_s=3, train_s=8, sync_s=1, topology="disaggregated")
    # -> {"step_s": 32.0, "bottleneck": "rollout", "idle_s": {"trainer": 20.0, ...}, ...}
    step_time(**from_metrics(metrics))        # the same from a posttrain run's time/* metrics

The three topologies (lesson 22a):
    colocated       τ = τ_R + τ_V + τ_ref + τ_T + τ_S          every role on the same GPUs, in turn
    disaggregated   τ = max(τ_R + τ_V, τ_ref + τ_T) + τ_S      rollout and trainer pools overlap
    async           τ ≈ max(τ_R + τ_V, τ_ref + τ_T, τ_S)       the sync overlaps too (bounded staleness)

Every function is pure and returns plain numbers or dicts. Decisions on the course's numbers:
  * Lesson 22's worked example trains 1M tokens in ~5 s on 4 H100s (200k tok/s); the 6P rule
    at 800 TFLOP/s caps 4 GPUs at 76k tok/s, so ≥13.8 s (`train_time_s`). We keep the rule.
  * The lesson 22a widget (`role_model`) divides the decode time by 4 GPUs twice, so it
    cannot reproduce the text's worked example (32 s, 33k tok/s); we keep the widget's
    formula as written (its numbers are the ones the lesson page shows) and reproduce the
    worked example through `step_time` with the text's role times.
"""

from __future__ import annotations

import math

from posttrain.errors import UsageError

TOPOLOGIES = ("colocated", "disaggregated", "async")
ROLE_TERMS = ("rollout", "reward", "reference", "train", "sync")


def step_time(
    rollout_s: float,
    train_s: float,
    reward_s: float = 0.0,
    reference_s: float = 0.0,
    sync_s: float = 0.0,
    topology: str = "disaggregated",
) -> dict:
    """Step time of one RL step from per-role times (seconds) under `topology`.

    Returns {topology, step_s, steps_per_hour, terms, rollout_side_s, trainer_side_s,
    bottleneck (the role whose time sets the step), shares (term / step), idle_s (per side:
    time it waits each step), compute_util ((τ_ref + τ_T) / τ_step; disaggregated leaves
    τ_S out of the denominator, as the lesson's widget does)}.
    """
    if topology not in TOPOLOGIES:
        raise UsageError(f"topology {topology!r} is unknown; use one of {', '.join(TOPOLOGIES)}")
    terms = dict(zip(ROLE_TERMS, (rollout_s, reward_s, reference_s, train_s, sync_s)))
    if any(v < 0 for v in terms.values()):
        raise ValueError(f"role times must be ≥ 0, got {terms}")
    sides = {"rollout": rollout_s + reward_s, "trainer": reference_s + train_s, "sync": sync_s}
    if topology == "colocated":
        step = sum(terms.values())
        bottleneck = max(terms, key=terms.get)
        idle = {"rollout": 0.0, "trainer": 0.0}
    else:
        step = max(sides["rollout"], sides["trainer"]) + sync_s if topology == "disaggregated" else max(sides.values())
        critical = max(sides if topology == "async" else ("rollout", "trainer"), key=sides.get)
        members = {"rollout": ("rollout", "reward"), "trainer": ("reference", "train"), "sync": ("sync",)}[critical]
        bottleneck = max(members, key=terms.get)
        idle = {side: step - sync_s * (topology == "disaggregated") - sides[side] for side in ("rollout", "trainer")}
    busy = step - sync_s if topology == "disaggregated" else step
    return {
        "topology": topology,
        "step_s": step,
        "steps_per_hour": 3600 / step if step else math.inf,
        "terms": terms,
        "rollout_side_s": sides["rollout"],
        "trainer_side_s": sides["trainer"],
        "bottleneck": bottleneck,
        "shares": {k: v / step if step else 0.0 for k, v in terms.items()},
        "idle_s": idle,
        "compute_util": (reference_s + train_s) / busy if busy else 0.0,
    }


def compare_topologies(**times) -> dict:
    """step_time under each topology, plus each one's speed-up over colocated."""
    out = {t: step_time(**times, topology=t) for t in TOPOLOGIES}
    for r in out.values():
        r["speedup_vs_colocated"] = out["colocated"]["step_s"] / r["step_s"] if r["step_s"] else math.inf
    return out


def from_metrics(metrics: dict) -> dict:
    """Role times from one step of a posttrain run's metrics (the controller's `time/*_s`
    timers): rollout; reward; reference (+ the critic's V_old pass: both are forward-only
    passes over the batch); train (+ collate and advantages); sync. Missing timers are 0."""

    def t(*names):
        return sum(float(metrics.get(f"time/{n}_s", 0.0)) for n in names)

    return {
        "rollout_s": t("rollout"),
        "reward_s": t("reward"),
        "reference_s": t("reference", "critic"),
        "train_s": t("train", "collate", "algorithm"),
        "sync_s": t("sync"),
    }


def useful_tokens_per_s(prompts: int, k: int, mean_len: float, step_s: float, keep_rate: float = 1.0) -> float:
    """B·K·L̄·keep_rate / τ_step: tokens that reach the loss per second (lesson 22a)."""
    return prompts * k * mean_len * keep_rate / step_s


def max_of_k(k: int, cv: float) -> float:
    """Expected longest of k log-normal lengths, in units of the mean μ (lesson 22b):
    exp(s·√(2 ln k) − s²/2), s = √ln(1 + cv²). k=16, cv=1 → 5.02; the rollout waits for it."""
    s = math.sqrt(math.log1p(cv * cv))
    return math.exp(s * math.sqrt(2 * math.log(k)) - s * s / 2) if k > 1 else 1.0


def train_tokens_per_s(params: float, flops_per_s: float = 800e12, recompute: bool = False) -> float:
    """Training tokens/s of one GPU at `flops_per_s` sustained: 6P FLOPs a token (forward 2P +
    backward 4P), 8P with full recomputation. 7B at 800 TFLOP/s → 19,048 (lesson 22)."""
    return flops_per_s / ((8 if recompute else 6) * params)


def train_time_s(
    tokens: float, params: float, gpus: int = 1, flops_per_s: float = 800e12, recompute: bool = False
) -> float:
    """Seconds to train `tokens` on `gpus` GPUs by the 6P rule. 6·7e9·32k on 1 H100 → 1.7 s."""
    return tokens / (gpus * train_tokens_per_s(params, flops_per_s, recompute))


def decode_tokens_per_s(weight_bytes: float, kv_bytes: float, batch: int, hbm_bytes_per_s: float = 3.35e12) -> float:
    """Memory-bound decode ceiling: each step streams the weights and the whole KV cache once
    and yields `batch` tokens. 7B (14 GB) + 8.6 GB KV, B=32, H100 → ≈4.7k tok/s (lesson 28)."""
    return batch * hbm_bytes_per_s / (weight_bytes + kv_bytes)


def role_model(
    params_b: float = 7, k: int = 16, response_len: int = 1024, topology: str = "disaggregated", prompts: int = 64
) -> dict:
    """Lesson 22a's per-role wall-clock widget, formula as the page computes it (see the
    module docstring): decode 21 s per 1M tokens at 7B with a tail 1 + 1.8·tanh(L/2048) on 4
    GPUs; train 8 s per 1M tokens at 7B on 4 GPUs; reference = train / 3; sync 0.15P + 0.005P².
    Defaults → τ_R 10.1, τ_T 2.1, τ_ref 0.7, τ_V 1, τ_S 1.3, step 12.4 s, 84.7k tok/s."""
    tokens = prompts * k * response_len
    scale = params_b / 7 * tokens / 1e6
    train = 8 * scale / 4
    tail = 1 + 1.8 * math.tanh(response_len / 2048)  # long responses straggle more
    r = step_time(
        rollout_s=21 * scale * tail / 4,
        reward_s=0.5 + 0.5 * prompts / 64,
        reference_s=train / 3,
        train_s=train,
        sync_s=0.15 * params_b + 0.005 * params_b**2,
        topology=topology,
    )
    r["tokens"] = tokens
    r["useful_tokens_per_s"] = useful_tokens_per_s(prompts, k, response_len, r["step_s"])
    return r
