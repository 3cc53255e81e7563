"""Widgets of part II, lessons 09–12: the algorithm lineage from REINFORCE through PPO and GRPO to RLOO,
computed by posttrain.algorithms. The variants that follow (DAPO, Dr. GRPO, DPO) are in widgets_variants.py."""

from __future__ import annotations

import functools
import math

import torch

from posttrain.algorithms import core, dr_grpo, grpo, reinforce, rloo
from posttrain.lessons import claims
from posttrain.lessons.registry import Knob, Widget, bar, figure, line, r, register

# ---- 09 · REINFORCE: how noisy is one estimate? -------------------------------------------------

_G = torch.tensor([1.0, 0.4], dtype=torch.float64)
BASELINES = ["none (REINFORCE)", "leave-one-out (RLOO)"]


def _estimates(K: int, trials: int, gen: torch.Generator, baseline: str = BASELINES[0]) -> torch.Tensor:
    """[trials, 2] estimates ĝ = (1/K) Σ A_i·u_i: u a random unit direction (the 'response'),
    reward r ~ Bernoulli(clamp(u·g + ½)), A from reinforce.advantages (A = r) or rloo.advantages
    (r minus the mean of the other K − 1, still unbiased)."""
    ang = torch.rand(trials, K, generator=gen, dtype=torch.float64) * 2 * math.pi
    u = torch.stack([ang.cos(), ang.sin()], -1)  # [trials, K, 2]
    rew = (u @ _G > torch.rand(trials, K, generator=gen, dtype=torch.float64) - 0.5).double()  # [trials, K]
    groups = torch.arange(trials).repeat_interleave(K)
    if baseline == BASELINES[0]:
        adv = reinforce.advantages(rew.flatten(), groups, reinforce.Config(baseline="none"))
    else:
        adv = rloo.advantages(rew.flatten(), groups, rloo.Config())
    return (adv.view(trials, K).unsqueeze(-1) * u).mean(1)  # [trials, 2]


@functools.lru_cache(maxsize=1)
def _expected() -> torch.Tensor:
    return _estimates(1, 200_000, torch.Generator().manual_seed(0)).mean(0)  # E[ĝ], what every estimate aims at


def snr(K: int, target: str, baseline: str) -> dict:
    gen = torch.Generator().manual_seed(1)
    mean_g = _expected()
    est = _estimates(K, 2000, gen, baseline)
    goal = _G if target == "course" else mean_g
    err = (est - goal).norm(dim=-1)
    dot = est @ mean_g
    wrong = float((dot < 0).double().mean())  # estimates pointing away from E[ĝ]
    zero = float((est.abs().sum(-1) == 0).double().mean())  # no signal at all
    show = est[:200]
    live = K > 1 or baseline == BASELINES[0]
    return {
        "figure": figure(
            [
                line(
                    show[:, 0].tolist(),
                    show[:, 1].tolist(),
                    f"200 estimates with K = {K}",
                    mode="markers",
                    marker={"size": 5, "opacity": 0.5},
                ),
                line([0, float(goal[0])], [0, float(goal[1])], "comparison target", mode="lines+markers"),
                line([0, float(mean_g[0])], [0, float(mean_g[1])], "E[ĝ]", line={"dash": "dot"}),
            ],
            f"K = {K}, baseline {baseline}, error against {'(1, 0.4)' if target == 'course' else 'E[ĝ]'}",
            "ĝ₁",
            "ĝ₂",
            xaxis={"range": [-1.2, 1.6], "title": {"text": "ĝ₁"}},
            yaxis={"range": [-1.2, 1.2], "scaleanchor": "x", "title": {"text": "ĝ₂"}},
        ),
        "kpis": [
            ["mean |ĝ − target|", r(err.mean(), 3)],
            ["estimates pointing the wrong way", f"{100 * wrong:.0f}%"],
            ["estimates that are exactly 0", f"{100 * zero:.0f}%"],
            ["E[ĝ]", f"({float(mean_g[0]):.2f}, {float(mean_g[1]):.2f})"],
            ["mean of the estimates", f"({float(est[:, 0].mean()):.2f}, {float(est[:, 1].mean()):.2f})"],
        ],
        "note": (
            f"With K = {K} and baseline {baseline}, {100 * wrong:.0f}% of the estimates point away from the true "
            f"direction, {100 * zero:.0f}% carry no signal at all, and their mean error is {float(err.mean()):.3f}."
            + (
                ""
                if live
                else " (A single sample has no 'others': leave-one-out needs K ≥ 2, so every advantage is 0.)"
            )
        ),
    }


register(
    Widget(
        "snr",
        "Noise of one REINFORCE estimate vs. K",
        snr,
        [
            Knob("K", "rollouts per estimate K", [1, 2, 4, 8, 16, 32, 64], 4),
            Knob("target", "measure the error against", ["expected", "course"], "expected", kind="select"),
            Knob("baseline", "baseline", BASELINES, BASELINES[0], kind="select"),
        ],
        {
            "knobs": {"K": 1},
            "what": "K = 1: a single binary reward decides the whole step. Half the estimates are exactly 0 (the "
            "reward was 0), each of the others is one random direction, and the mean error is twice that "
            "of K = 4.",
        },
        "Each dot is one gradient estimate from K rollouts (a deliberate 2-D toy: the 'policy' is a direction); "
        "the advantages are posttrain's reinforce.advantages or rloo.advantages.",
        ["posttrain.algorithms.reinforce:advantages", "posttrain.algorithms.rloo:advantages"],
    )
)


# ---- 10 · PPO: the clip, cell by cell -----------------------------------------------------------

PPO_EPOCHS, PPO_TOKENS, PPO_LR = 8, 256, 4.0


@functools.lru_cache(maxsize=8)
def _ppo_epochs(eps: float) -> list[tuple[float, float, float]]:
    """PPO's reuse of one batch: 256 tokens sampled from a uniform policy over 8 answers whose
    rewards are 0, 1/7, …, 1; advantages r − mean; PPO_EPOCHS full-batch gradient steps (η = 4)
    on core.ppo_clip_loss. Per epoch: (share of tokens whose gradient survived the clip,
    expected reward of the policy after the step, KL(π ‖ π_old))."""
    gen = torch.Generator().manual_seed(0)
    rew = torch.linspace(0, 1, 8, dtype=torch.float64)
    old = torch.full((8,), -math.log(8), dtype=torch.float64)  # log π_old, uniform
    y = torch.multinomial(old.exp(), PPO_TOKENS, replacement=True, generator=gen)  # [N]
    adv = rew[y] - rew[y].mean()
    theta = torch.zeros(8, dtype=torch.float64, requires_grad=True)
    out = []
    for _ in range(PPO_EPOCHS):
        loss, clipped = core.ppo_clip_loss(torch.log_softmax(theta, -1)[y], old[y], adv, eps, eps)  # [N]
        (g,) = torch.autograd.grad(loss.mean(), theta)
        with torch.no_grad():
            theta -= PPO_LR * g
        pi = torch.softmax(theta.detach(), -1)
        out.append((float((~clipped).double().mean()), float(pi @ rew), float((pi * (pi.log() - old)).sum())))
    return out


def clip_cell(eps: float, rho: float, adv: float) -> dict:
    rhos = torch.linspace(0.4, 1.8, 141, dtype=torch.float64)
    A = torch.full_like(rhos, adv)
    curve, _ = core.ppo_clip_loss(rhos.log(), torch.zeros_like(rhos), A, eps, eps)
    lp = torch.tensor([math.log(rho)], dtype=torch.float64, requires_grad=True)
    loss, clipped = core.ppo_clip_loss(
        lp, torch.zeros(1, dtype=torch.float64), torch.tensor([adv], dtype=torch.float64), eps, eps
    )
    (g,) = torch.autograd.grad(loss.sum(), lp)
    s1, s2 = rho * adv, min(max(rho, 1 - eps), 1 + eps) * adv
    ep = _ppo_epochs(eps)
    xs = list(range(1, PPO_EPOCHS + 1))
    dead = next((i + 1 for i, e in enumerate(ep) if e[0] == 0), None)
    return {
        "figure": figure(
            [
                line(rhos.tolist(), curve.tolist(), f"loss −min(ρA, clip(ρ)A), A = {adv:+}"),
                line(
                    [rho],
                    [float(loss.detach())],
                    "this cell",
                    mode="markers",
                    marker={"size": 14, "color": "#d62728" if bool(clipped) else "#2ca02c"},
                ),
                line(
                    xs,
                    [e[0] for e in ep],
                    "tokens whose gradient survives",
                    mode="lines+markers",
                    xaxis="x2",
                    yaxis="y2",
                ),
                line(
                    xs,
                    [e[1] for e in ep],
                    "expected reward of the policy",
                    mode="lines+markers",
                    xaxis="x2",
                    yaxis="y2",
                ),
            ],
            f"ε = {eps}: the clipped loss (left), {PPO_EPOCHS} epochs on one batch (right)",
            "ρ = π_θ/π_old",
            "loss",
            grid={"rows": 1, "columns": 2, "pattern": "independent"},
            xaxis2={"title": {"text": "epoch over the same batch"}},
            yaxis2={"range": [0, 1.05], "title": {"text": "share / reward"}},
            shapes=[
                {
                    "type": "rect",
                    "x0": 1 - eps,
                    "x1": 1 + eps,
                    "y0": 0,
                    "y1": 1,
                    "yref": "y domain",
                    "xref": "x",
                    "fillcolor": "#dddddd",
                    "opacity": 0.4,
                    "line": {"width": 0},
                }
            ],
        ),
        "kpis": [
            ["s1 = ρA", r(s1, 2)],
            ["s2 = clip(ρ)A", r(s2, 2)],
            ["min(s1, s2)", r(min(s1, s2), 2)],
            ["∂loss/∂log π", r(g[0], 3)],
            ["gradient", "killed (clipped)" if bool(clipped) else "flows"],
            ["tokens with a gradient, epoch 3", r(ep[2][0], 2)],
            ["reward gained over the epochs", r(ep[-1][1] - 0.5, 3)],
            ["KL(π ‖ π_old) after the epochs", r(ep[-1][2], 3)],
        ],
        "note": (
            f"This cell's gradient {'is killed: the ratio is past the band on the side the advantage pushes' if bool(clipped) else 'flows'}. "
            f"Reusing one batch for {PPO_EPOCHS} epochs at ε = {eps}: "
            + (
                f"from epoch {dead} no token has a gradient left, so the policy stops after gaining "
                f"{ep[-1][1] - 0.5:.3f} reward."
                if dead
                else f"{100 * ep[-1][0]:.0f}% of the tokens still pass a gradient in the last epoch; the reward gained "
                f"is {ep[-1][1] - 0.5:.3f}."
            )
        ),
    }


register(
    Widget(
        "clip",
        "The PPO clip, one cell at a time",
        clip_cell,
        [
            Knob("eps", "clip ε", [0.05, 0.1, 0.2, 0.3], 0.2),
            Knob("rho", "ratio ρ", [0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6], 1.1),
            Knob("adv", "advantage A", [-1.0, 1.0], 1.0, kind="select"),
        ],
        {
            "knobs": {"eps": 0.05, "rho": 1.5},
            "what": "A tiny ε with a ratio already far from 1: every token that would improve is clipped and its "
            "gradient is 0; reusing one batch, no token has a gradient left after the second epoch, and the "
            "remaining epochs of PPO updates learn nothing.",
        },
        "Left: the clipped surrogate as a function of ρ (grey band: [1−ε, 1+ε]). Right: PPO's epochs over one "
        "batch of a toy 8-answer policy, each a gradient step on core.ppo_clip_loss.",
        ["posttrain.algorithms.core:ppo_clip_loss"],
    )
)


# ---- 11 · GRPO: a group of four --------------------------------------------------------------


def grpo_group(r0: int, r1: int, r2: int, r3: int, std: str) -> dict:
    rw = torch.tensor([r0, r1, r2, r3], dtype=torch.float64)
    g = torch.zeros(4, dtype=torch.long)
    adv = grpo.advantages(rw, g, grpo.Config(std=std))
    mean, sd, _ = core.group_stats(rw, g, std)
    effect = ["push up" if a > 0.05 else "push down" if a < -0.05 else "no signal" for a in adv.tolist()]
    return claims.attach(
        "grpo_group",
        {
            "figure": figure(
                [
                    bar(
                        [f"y{i} (r={int(x)})" for i, x in enumerate(rw)],
                        adv.tolist(),
                        "A_i",
                        text=effect,
                        marker={"color": ["#2ca02c" if a > 0 else "#d62728" for a in adv.tolist()]},
                    )
                ],
                f"GRPO advantages, {std} std",
                "rollout (its reward)",
                "advantage A_i",
                yaxis={"range": [-2, 2]},
            ),
            "kpis": [
                ["mean", r(mean[0], 3)],
                [f"std ({std})", r(sd[0], 3)],
                ["A", ", ".join(f"{a:+.2f}" for a in adv.tolist())],
                ["degenerate?", "yes (skip step)" if float(sd[0]) == 0 else "no"],
            ],
            "note": "The group's own mean replaces the critic; dividing by its std makes the step scale-free.",
        },
    )


_BIN = [0, 1]
register(
    Widget(
        "grpo_group",
        "GRPO advantages for a group of K = 4",
        grpo_group,
        [
            Knob("r0", "r0", _BIN, 1, "select"),
            Knob("r1", "r1", _BIN, 0, "select"),
            Knob("r2", "r2", _BIN, 1, "select"),
            Knob("r3", "r3", _BIN, 0, "select"),
            Knob("std", "group std", ["population", "unbiased"], "population", "select"),
        ],
        {
            "knobs": {"r0": 1, "r1": 1, "r2": 1, "r3": 1},
            "what": "All four right (or all wrong): std = 0, A = 0 for everyone — the prompt was too easy (or "
            "too hard) and teaches nothing.",
        },
        "One bar per rollout." + claims.caption("grpo_group"),
        ["posttrain.algorithms.grpo:advantages", "posttrain.algorithms.core:group_stats"],
    )
)


# ---- 12 · RLOO: leave one out ----------------------------------------------------------------


def rloo_vs_grpo(K: int, accuracy: float, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    rw = (torch.rand(K, generator=gen, dtype=torch.float64) < accuracy).double()
    g = torch.zeros(K, dtype=torch.long)
    a_c = dr_grpo.advantages(rw, g, dr_grpo.Config())  # r − mean (no /std)
    a_l = rloo.advantages(rw, g, rloo.Config())
    live = a_c.abs() > 1e-8
    ratio = float((a_l[live] / a_c[live]).mean()) if bool(live.any()) else float("nan")
    names = [f"y{i} (r={int(x)})" for i, x in enumerate(rw)]
    return {
        "figure": figure(
            [
                bar(names, a_c.tolist(), "r − mean (GRPO centred, no /std)"),
                bar(names, a_l.tolist(), "RLOO: r − mean of the others"),
                line(
                    [names[0], names[-1]],
                    [accuracy, accuracy],
                    "policy accuracy (expected reward)",
                    line={"dash": "dot", "color": "grey"},
                ),
            ],
            f"K = {K}, accuracy {accuracy}",
            "rollout (its reward)",
            "advantage A_i",
            barmode="group",
        ),
        "kpis": [
            ["K/(K−1)", r(K / (K - 1), 3)],
            ["measured A_RLOO / A_centred", "— (degenerate)" if math.isnan(ratio) else r(ratio, 3)],
            ["mean reward", r(rw.mean(), 3)],
        ],
        "note": "RLOO is the centred advantage scaled by K/(K−1): same direction, a slightly larger step.",
    }


register(
    Widget(
        "rloo",
        "RLOO vs. the group mean",
        rloo_vs_grpo,
        [
            Knob("K", "rollouts K", list(range(2, 11)), 4),
            Knob("accuracy", "policy accuracy", [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0], 0.5),
            Knob("seed", "draw", [0, 1, 2], 0),
        ],
        {
            "knobs": {"accuracy": 1.0},
            "what": "Accuracy 0 or 1: every group is all-equal, both estimators give 0, nothing is learned.",
        },
        "Advantages of one sampled group under the two baselines.",
        ["posttrain.algorithms.rloo:advantages"],
    )
)
