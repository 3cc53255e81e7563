"""Widgets of part I, lessons 03–04: reward and reference (the verifier, the KL estimators, β against a
hackable reward) and the advantages of one group under each algorithm plug-in. Lessons 01–02 (the
policy gradient, the sampler) are widgets_roles.py."""

from __future__ import annotations

import math

import torch
from numpy.polynomial.hermite_e import hermegauss

from posttrain.algorithms import core, dr_grpo, grpo, reinforce, rloo
from posttrain.lessons.registry import Knob, Widget, bar, figure, line, r, register
from posttrain.tasks.arithmetic import last_integer, verify

# ---- 03 · verifier, KL estimators, and β ------------------------------------------------------

PROBES = [
    "let me think 3+4=7, 7+5=12, so 12#",
    "12#",
    "let me think... 12#",
    "11#",
    "120#",
    "no digits here#",
    "42#",
    "12 is wrong, it is 13#",
]


def verifier(response: str) -> dict:
    rewards = [verify(p, 12) for p in PROBES]
    colors = ["#d62728" if p == response else "#1f77b4" for p in PROBES]
    ans = last_integer(response)
    return {
        "figure": figure(
            [bar(list(range(len(PROBES))), rewards, "reward", marker={"color": colors}, text=PROBES, hovertext=PROBES)],
            "reward of each probe (gold = 12); red = selected",
            "probe",
            "reward",
            yaxis={"range": [0, 1.1]},
        ),
        "kpis": [
            ["extracted answer", "— (no integer)" if ans is None else ans],
            ["gold", 12],
            ["reward", verify(response, 12)],
        ],
        "note": "The verifier reads the last integer of the response; anything before it is free text.",
    }


register(
    Widget(
        "verifier",
        "The arithmetic verifier",
        verifier,
        [Knob("response", "response", PROBES, PROBES[0], kind="select")],
        {
            "knobs": {"response": "12 is wrong, it is 13#"},
            "what": "A verifier that only reads the last integer can be gamed by format: a response that "
            "states the right answer and then another number scores 0, and '…so 12#' after wrong "
            "reasoning scores 1. Rewarding the format teaches the format.",
        },
        "Each bar is one probe response to <3+4+5>.",
        ["posttrain.tasks.arithmetic:verify", "posttrain.tasks.arithmetic:last_integer"],
    )
)


def kl_toy(shift: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The KL widget's two distributions over 16 tokens: log π_θ, and log π_ref moved `shift` of the
    way toward the mirror image of π_θ."""
    base = torch.linspace(-1.5, 1.5, 16, dtype=torch.float64)
    return torch.log_softmax(base, -1), torch.log_softmax(base.flip(0) * shift + base * (1 - shift), -1)


def kl_estimators(shift: float, samples: int, order: str) -> dict:
    """Monte-Carlo k1/k2/k3 (core.kl) on tokens drawn from π_θ, against the exact KL(π_θ‖π_ref)."""
    lp_theta, lp_ref = kl_toy(shift)
    exact = float((lp_theta.exp() * (lp_theta - lp_ref)).sum())
    gen = torch.Generator().manual_seed(0)
    y = torch.multinomial(lp_theta.exp(), samples, replacement=True, generator=gen)  # [n] ~ π_θ
    a, b = lp_theta[y], lp_ref[y]
    if order == "ref, policy":  # the argument-order bug
        a, b = b, a
    est = {k: core.kl(a, b, k) for k in ("k1", "k2", "k3")}  # [n] each
    n = torch.arange(1, samples + 1, dtype=torch.float64)
    keep = torch.unique(torch.logspace(0, math.log10(samples), 120).round().long()) - 1  # ≤ 120 points per curve
    traces = [line(n[keep].tolist(), (v.cumsum(0) / n)[keep].tolist(), f"{k}: running mean") for k, v in est.items()]
    traces.append(line([1, samples], [exact, exact], "exact KL(π_θ‖π_ref)", line={"dash": "dash", "color": "black"}))
    return {
        "figure": figure(
            traces,
            f"shift = {shift}, {samples} samples, kl({order})",
            "samples drawn from π_θ",
            "KL estimate",
            xaxis={"type": "log", "title": {"text": "samples drawn from π_θ"}},
        ),
        "kpis": [["exact KL", r(exact)]]
        + [[f"{k} mean", r(v.mean())] for k, v in est.items()]
        + [["min k3 (never < 0)", r(est["k3"].min())], ["share of k1 < 0", r((est["k1"] < 0).double().mean(), 3)]],
        "note": "k1 is unbiased but often negative; k2 is always ≥ 0 but biased; k3 is both ≥ 0 and unbiased.",
    }


register(
    Widget(
        "kl",
        "Three estimators of KL(π_θ ‖ π_ref)",
        kl_estimators,
        [
            Knob("shift", "how far π_ref is from π_θ", [0.0, 0.1, 0.25, 0.5, 0.75, 1.0], 0.25),
            Knob("samples", "tokens sampled", [4, 16, 64, 256, 1024, 4096], 256),
            Knob("order", "arguments", ["policy, ref", "ref, policy"], "policy, ref", kind="select"),
        ],
        {
            "knobs": {"order": "ref, policy", "shift": 1.0},
            "what": "Swapping the arguments estimates a different quantity on the wrong samples: the curves "
            "settle far from the dashed line, and the anchor pulls with the wrong strength.",
        },
        "Running means of k1, k2, k3 as more tokens are drawn, against the exact KL (dashed). The two "
        "16-token policies are a deliberate toy; the estimators are core.kl.",
        ["posttrain.algorithms.core:kl"],
    )
)


HACK_AT = 5.0  # past this distance from the reference the reward pays for a flaw
_Z, _W = (torch.tensor(a, dtype=torch.float64) for a in hermegauss(20))  # ∫ f(z) N(z; 0, 1) dz ≈ Σ w f(z) / √(2π)
_W = _W / _W.sum()


def _hack_reward(theta: float) -> float:
    return 0.7 * (1 - math.exp(-theta / 1.5)) + 0.5 * max(0.0, theta - HACK_AT) / 5


def anchor_kl(theta: torch.Tensor) -> torch.Tensor:
    """KL(π_θ ‖ π_ref) for π_θ = N(θ, ½) and π_ref = N(0, ½): the mean of core.kl's k1 over
    π_θ's samples, taken exactly by Gauss–Hermite quadrature (20 nodes). It equals θ², and its
    gradient 2θ is the anchor's pull (autograd through core.kl)."""
    x = theta + math.sqrt(0.5) * _Z  # [20] nodes of π_θ
    lp_theta, lp_ref = -((x - theta) ** 2), -(x**2)  # log-densities up to the same constant
    return (_W * core.kl(lp_theta, lp_ref, "k1")).sum()


BETA_LR = {"fixed": 0.7, "course": 0.05}


def beta_tradeoff(beta: float, schedule: str) -> dict:
    """Gradient ascent on J = r(θ) − β·KL(π_θ ‖ π_ref), 200 steps of step size η, θ ∈ [0, 10]:
    r is the course's reward, honest up to θ = 5 and paying for a flaw beyond it; the KL and
    its gradient come from core.kl (anchor_kl). schedule 'course' is the course's η = 0.05,
    which never reaches the flaw whatever β; 'fixed' (η = 0.7) lets a weak anchor reach it."""
    lr = BETA_LR[schedule]
    theta, rs, kls = 0.05, [], []
    for _ in range(200):
        t = torch.tensor(theta, dtype=torch.float64, requires_grad=True)
        (g_kl,) = torch.autograd.grad(anchor_kl(t), t)
        grad = 0.7 / 1.5 * math.exp(-theta / 1.5) + (0.1 if theta > HACK_AT else 0.0) - beta * float(g_kl)
        theta = min(10.0, max(0.0, theta + lr * grad))
        rs.append(_hack_reward(theta))
        kls.append(float(anchor_kl(torch.tensor(theta, dtype=torch.float64))))
    steps = list(range(1, 201))
    hacked = theta > HACK_AT
    first = next((i + 1 for i, k in enumerate(kls) if k > HACK_AT**2), None)
    note = (
        f"θ ends at {theta:.2f}, past θ = {HACK_AT:g} (from step {first}): the last stretch of reward "
        "comes from the reward function's flaw, not from better answers."
        if hacked
        else f"θ ends at {theta:.2f}, short of θ = {HACK_AT:g}: the anchor keeps the policy in the region "
        "where reward means better answers."
    )
    return {
        "figure": figure(
            [
                line(steps, rs, "reward r(θ)"),
                line(steps, kls, "KL(π_θ ‖ π_ref) = θ²", yaxis="y2"),
                line(
                    [1, 200],
                    [HACK_AT**2] * 2,
                    "KL where the flaw starts (θ = 5)",
                    yaxis="y2",
                    line={"dash": "dot", "color": "#d62728"},
                ),
            ],
            f"β = {beta}, step size η = {lr}",
            "step",
            "reward",
            yaxis={"range": [0, 1.3], "title": {"text": "reward"}},
            yaxis2={"overlaying": "y", "side": "right", "range": [0, 100], "title": {"text": "KL (nats)"}},
        ),
        "kpis": [
            ["final θ", r(theta, 2)],
            ["final reward", r(rs[-1], 3)],
            ["final KL", r(kls[-1], 2)],
            ["reward-hacked (θ > 5)?", "yes" if hacked else "no"],
        ],
        "note": note,
    }


register(
    Widget(
        "beta",
        "β trades reward against drift from the reference",
        beta_tradeoff,
        [
            Knob("beta", "KL coefficient β", [0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0], 0.05),
            Knob("schedule", "step size", ["fixed", "course"], "fixed", kind="select"),
        ],
        {
            "knobs": {"beta": 0.0, "schedule": "fixed"},
            "what": "With no anchor the policy walks past θ = 5 into the region where reward rises only "
            "because of a flaw (reward hacking): θ ends at the wall (10) and KL at 100.",
        },
        "Reward (left axis) and KL (right axis) over 200 steps of gradient ascent on r − β·KL. The reward "
        "function is a deliberate one-dimensional toy; the KL is core.kl's k1 averaged exactly over π_θ.",
        ["posttrain.algorithms.core:kl"],
    )
)


# ---- 04 · the algorithm plug-in: advantages of one group -----------------------------------------


def advantage_table(r0: float, r1: float, r2: float, std: str) -> dict:
    rw = torch.tensor([r0, r1, r2], dtype=torch.float64)
    g = torch.zeros(3, dtype=torch.long)
    rows = {
        "REINFORCE (A = r)": reinforce.advantages(rw, g, reinforce.Config()),
        "+ group baseline (r − mean)": reinforce.advantages(rw, g, reinforce.Config(baseline="mean")),
        "GRPO": grpo.advantages(rw, g, grpo.Config(std=std)),
        "RLOO": rloo.advantages(rw, g, rloo.Config()),
        "Dr. GRPO": dr_grpo.advantages(rw, g, dr_grpo.Config(std=std)),
    }
    traces = [
        bar(list(rows), [float(v[i]) for v in rows.values()], f"rollout {i} (r = {float(rw[i])})") for i in range(3)
    ]
    mean, sd, _ = core.group_stats(rw, g, std)
    out = [
        ["mean", r(mean[0], 3)],
        [f"std ({std})", r(sd[0], 3)],
        ["degenerate (all equal)?", "yes: GRPO gives 0 to all" if float(sd[0]) == 0 else "no"],
    ]
    out += [[name, ", ".join(f"{float(x):+.2f}" for x in v)] for name, v in rows.items()]
    return {
        "figure": figure(traces, "advantage of each rollout", "estimator", "advantage", barmode="group"),
        "kpis": out,
        "note": "Same three rewards, five estimators: the baseline and the scale differ.",
    }


_R = [0.0, 0.25, 0.5, 0.75, 1.0]
register(
    Widget(
        "advantages",
        "Advantages of a group of three rollouts",
        advantage_table,
        [
            Knob("r0", "reward r0", _R, 0.0),
            Knob("r1", "reward r1", _R, 0.0),
            Knob("r2", "reward r2", _R, 1.0),
            Knob("std", "group std", ["population", "unbiased"], "population", kind="select"),
        ],
        {
            "knobs": {"r0": 1.0, "r1": 1.0, "r2": 1.0},
            "what": "Equal rewards: the group carries no relative signal; GRPO, RLOO and Dr. GRPO give every "
            "rollout 0 and the step is wasted (REINFORCE without baseline still pushes all three up).",
        },
        "One bar per rollout for each estimator.",
        [
            "posttrain.algorithms.grpo:advantages",
            "posttrain.algorithms.rloo:advantages",
            "posttrain.algorithms.core:group_stats",
        ],
    )
)
