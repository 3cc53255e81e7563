"""Throughput math: where an RL step's wall clock goes, and which role bounds it (lessons 19, 22a-c).

    step_time(rollout_s=30, reward_s=1, reference_s=3, train_s=8, sync_s=1, topology="one_step_off")
    # -> {"step_s": 32.0, "bottleneck": "rollout", "idle_s": {"trainer": 20.0, ...}, ...}
    step_time(**from_metrics(metrics))        # the same from a posttrain run's time/* metrics (colocated)
    compare_topologies(rollout_s=20, train_s=15, sync_s=2)   # every topology on the same GPUs

Each topology's equation and what it assumes (`EQUATIONS`, `ASSUMES`; τ_V reward, τ_ref reference):
    colocated              τ_R + τ_V + τ_ref + τ_T + τ_S       on-policy; one pool, every role on all of it in turn
    disaggregated          τ_R + τ_V + τ_ref + τ_T + τ_S       on-policy; two pools, each waits while the other works
    one_step_off           max(τ_R + τ_V, τ_ref + τ_T) + τ_S   samples one version stale (verl's one_step_off_policy)
    async                  max(τ_R + τ_V + τ_S, τ_ref + τ_T)   ≤ K versions stale; the sampler pays the weight load
    async_double_buffered  max(τ_R + τ_V, τ_ref + τ_T, τ_S)    the same, the load staged into a second weight copy
An on-policy split cannot overlap: the sampler would need the weights the trainer is producing.
posttrain's own async producer loads each version on the sampler thread between requests
(distributed/async_rollout.py `_produce`, `time/rollout_sync_s`), so `async` is its equation.

`step_time` takes the role times as given, wherever each role ran. Comparing topologies with the
same role times gives a split placement a second pool of GPUs; `compare_topologies` compares them
on the same GPUs instead: colocated gets the two pools together for every phase, and a phase on
more GPUs shortens by its parallel share only (a long tail's last sequence does not decode faster
on more GPUs: verl's one_step_off_policy README, "increasing resources does not reduce the Rollout
duration").

Every function is pure and returns plain numbers or dicts. Decisions on the course's numbers:
  * Lesson 22's worked example trains 1M tokens in ~5 s on 4 H100s (200k tok/s); the 6P rule
    at 800 TFLOP/s caps 4 GPUs at 76k tok/s, so ≥13.8 s (`train_time_s`). We keep the rule.
  * The lesson 22a widget (`role_model`) divides the decode time by 4 GPUs twice, so it
    cannot reproduce the text's worked example (32 s, 33k tok/s); we keep the widget's
    formula as written (its numbers are the ones the lesson page shows) and reproduce the
    worked example through `step_time` with the text's role times.
  * The course's "disaggregated" equation, max(sides) + τ_S, overlaps the pools and so samples
    one version stale: it is `one_step_off` here; `disaggregated` is the on-policy split.
  * The course's max-of-K uses the large-K envelope √(2 ln K) (`max_of_k_envelope`), 30–65%
    high at the K people use; `max_of_k` integrates the expectation exactly.
"""

from __future__ import annotations

import math

import numpy as np

from posttrain.errors import UsageError

TOPOLOGIES = ("colocated", "disaggregated", "one_step_off", "async", "async_double_buffered")
ROLE_TERMS = ("rollout", "reward", "reference", "train", "sync")
EQUATIONS = {
    "colocated": "τ_R + τ_V + τ_ref + τ_T + τ_S",
    "disaggregated": "τ_R + τ_V + τ_ref + τ_T + τ_S",
    "one_step_off": "max(τ_R + τ_V, τ_ref + τ_T) + τ_S",
    "async": "max(τ_R + τ_V + τ_S, τ_ref + τ_T)",
    "async_double_buffered": "max(τ_R + τ_V, τ_ref + τ_T, τ_S)",
}
ASSUMES = {
    "colocated": "on-policy; one pool, every role on all of it in turn; sync paid",
    "disaggregated": "on-policy; two pools, each idle while the other works; sync paid",
    "one_step_off": "samples one version stale; the two pools overlap; sync paid at every step boundary",
    "async": "samples up to K versions stale; the pools overlap; the sampler pays the weight load",
    "async_double_buffered": "samples up to K versions stale; the load goes to a second weight copy, hidden",
}
STALENESS = {  # the samples each topology trains on
    "colocated": "on-policy",
    "disaggregated": "on-policy",
    "one_step_off": "one version stale",
    "async": "up to K versions stale",
    "async_double_buffered": "up to K versions stale",
}


def step_time(
    rollout_s: float,
    train_s: float,
    reward_s: float = 0.0,
    reference_s: float = 0.0,
    sync_s: float = 0.0,
    topology: str = "colocated",
) -> dict:
    """Step time of one RL step from per-role times (seconds, each as measured where the role runs)
    under `topology` (EQUATIONS; what each assumes: ASSUMES).

    Returns {topology, equation, assumes, step_s, steps_per_hour, terms, bottleneck (the role whose
    time sets the step), shares (term / step), idle_s (per pool: the time it waits each step; the
    sync counts as work for the side that pays it)}.
    """
    if topology not in TOPOLOGIES:
        raise UsageError(f"topology {topology!r} is unknown; use one of {', '.join(TOPOLOGIES)}")
    terms = dict(zip(ROLE_TERMS, (rollout_s, reward_s, reference_s, train_s, sync_s)))
    if any(v < 0 for v in terms.values()):
        raise ValueError(f"role times must be ≥ 0, got {terms}")
    R, T = rollout_s + reward_s, reference_s + train_s  # the sampler's side, the trainer's side
    members = {"rollout": ("rollout", "reward"), "trainer": ("reference", "train"), "sync": ("sync",)}
    if topology in ("colocated", "disaggregated"):  # nothing overlaps
        step = R + T + sync_s
        critical = ROLE_TERMS
        idle = {"rollout": 0.0, "trainer": 0.0} if topology == "colocated" else {"rollout": T, "trainer": R}
    elif topology == "one_step_off":
        step = max(R, T) + sync_s
        critical = members["rollout" if R >= T else "trainer"]
        idle = {"rollout": step - sync_s - R, "trainer": step - sync_s - T}
    elif topology == "async":  # the sampler loads each version between requests
        step = max(R + sync_s, T)
        critical = (*members["rollout"], "sync") if R + sync_s >= T else members["trainer"]
        idle = {"rollout": step - R - sync_s, "trainer": step - T}
    else:  # async_double_buffered: the load overlaps both pools' work
        step = max(R, T, sync_s)
        critical = members[max({"rollout": R, "trainer": T, "sync": sync_s}.items(), key=lambda kv: kv[1])[0]]
        idle = {"rollout": step - R, "trainer": step - T}
    return {
        "topology": topology,
        "equation": EQUATIONS[topology],
        "assumes": ASSUMES[topology],
        "step_s": step,
        "steps_per_hour": 3600 / step if step else math.inf,
        "terms": terms,
        "bottleneck": max(critical, key=terms.get),
        "shares": {k: v / step if step else 0.0 for k, v in terms.items()},
        "idle_s": idle,
    }


def on_gpus(seconds: float, share_from: float, share_to: float, parallel: float = 1.0) -> float:
    """A phase timed on a share `share_from` of the GPUs, run on `share_to` of them instead: its
    parallel part scales with 1/GPUs, the rest (a long tail's latency) does not (Amdahl)."""
    return seconds * ((1 - parallel) + parallel * share_from / share_to)


def compare_topologies(
    rollout_s: float,
    train_s: float,
    reward_s: float = 0.0,
    reference_s: float = 0.0,
    sync_s: float = 0.0,
    measured_on: str = "pools",
    rollout_share: float = 0.5,
    rollout_parallel: float = 1.0,
    train_parallel: float = 1.0,
) -> dict:
    """Every topology on the same GPUs: {topology: step_time(...) + speedup_vs_colocated}.

    measured_on="pools": the role times are those of a split placement, rollout (and reward) on
    its sampler pool, a share `rollout_share` of the GPUs, reference and training on the rest;
    colocated runs each phase on all of them. measured_on="colocated": the times were measured with
    every GPU (a colocated run, as posttrain's timers are) and the split pools run on their shares.
    A phase's `*_parallel` share shortens in proportion to the GPUs it gets (1: all of it; 0: none,
    a rollout bound by its longest sequence). Reward (a CPU verifier) and sync do not change.
    rl-19's step (20, 15, 2 s on N + N GPUs) → colocated on 2N: 10 + 7.5 + 2 = 19.5 s; one_step_off 22 s.
    """
    if measured_on not in ("pools", "colocated"):
        raise UsageError(f"measured_on={measured_on!r} is unknown; use pools or colocated")
    if not 0 < rollout_share < 1:
        raise UsageError(f"rollout_share={rollout_share} must lie strictly between 0 and 1")
    shares = {"rollout": rollout_share, "trainer": 1 - rollout_share}

    def moved(side: str, seconds: float, parallel: float, to_pool: bool) -> float:
        share = shares[side]
        return on_gpus(seconds, 1.0, share, parallel) if to_pool else on_gpus(seconds, share, 1.0, parallel)

    given = dict(rollout_s=rollout_s, train_s=train_s, reward_s=reward_s, reference_s=reference_s, sync_s=sync_s)
    other = dict(
        given,
        rollout_s=moved("rollout", rollout_s, rollout_parallel, measured_on == "colocated"),
        reference_s=moved("trainer", reference_s, train_parallel, measured_on == "colocated"),
        train_s=moved("trainer", train_s, train_parallel, measured_on == "colocated"),
    )
    colo, split = (given, other) if measured_on == "colocated" else (other, given)
    out = {t: step_time(**(colo if t == "colocated" else split), topology=t) for t in TOPOLOGIES}
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


def max_of_k(k: int, cv: float, dz: float = 0.01) -> float:
    """Expected longest of k log-normal lengths, in units of the mean μ (lesson 22b), exactly.

    With ln L ~ N(ln μ − σ²/2, σ²), σ² = ln(1 + cv²) (cv = std / mean), the longest is
    μ·exp(σZ − σ²/2) for Z the largest of k standard normals, whose density is k Φ(z)^(k−1) φ(z):
        E[max L] / μ = ∫ e^(σz − σ²/2) k Φ(z)^(k−1) φ(z) dz = ∫ k Φ(z)^(k−1) φ(z − σ) dz,
    integrated by the trapezoid rule on a grid of `dz` over where the integrand lives (log Φ, so a
    large k does not underflow). k=16, cv=1 → 3.44; the envelope √(2 ln k) says 5.02."""
    if k <= 1 or cv <= 0:
        return 1.0
    s = math.sqrt(math.log1p(cv * cv))
    z = np.arange(-10.0, max(s, math.sqrt(2 * math.log(k))) + 10.0, dz)  # φ(z − s) < e⁻⁵⁰ beyond
    log_cdf = np.log([0.5 * math.erfc(-x / math.sqrt(2)) for x in z])
    f = np.exp(math.log(k) + (k - 1) * log_cdf - 0.5 * (z - s) ** 2) / math.sqrt(2 * math.pi)
    return float(np.sum((f[1:] + f[:-1]) / 2) * dz)


def max_of_k_envelope(k: int, cv: float) -> float:
    """The course's approximation of max_of_k: exp(σ√(2 ln k) − σ²/2), σ = √ln(1 + cv²). √(2 ln k)
    is where the largest of k normals concentrates as k → ∞, and above its mean at every finite k:
    k=16, cv=1 → 5.02 against the exact 3.44."""
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
    params_b: float = 7, k: int = 16, response_len: int = 1024, topology: str = "one_step_off", prompts: int = 64
) -> dict:
    """Lesson 22a's per-role wall-clock widget, formula as the page computes it (see the
    module docstring): decode 21 s per 1M tokens at 7B with a tail 1 + 1.8·tanh(L/2048) on 4
    GPUs; train 8 s per 1M tokens at 7B on 4 GPUs; reference = train / 3; sync 0.15P + 0.005P².
    The split placements give each side its 4 GPUs; colocated runs every phase on all 8
    (compare_topologies: the same GPUs, times ∝ 1/GPUs).
    Defaults (one_step_off) → τ_R 10.1, τ_T 2.1, τ_ref 0.7, τ_V 1, τ_S 1.3, step 12.4 s, 84.7k tok/s."""
    tokens = prompts * k * response_len
    scale = params_b / 7 * tokens / 1e6
    train = 8 * scale / 4
    tail = 1 + 1.8 * math.tanh(response_len / 2048)  # long responses straggle more
    if topology not in TOPOLOGIES:
        raise UsageError(f"topology {topology!r} is unknown; use one of {', '.join(TOPOLOGIES)}")
    r = compare_topologies(
        rollout_s=21 * scale * tail / 4,
        reward_s=0.5 + 0.5 * prompts / 64,
        reference_s=train / 3,
        train_s=train,
        sync_s=0.15 * params_b + 0.005 * params_b**2,
    )[topology]
    r["tokens"] = tokens
    r["useful_tokens_per_s"] = useful_tokens_per_s(prompts, k, response_len, r["step_s"])
    return r
