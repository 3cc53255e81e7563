"""Widgets of part II (lessons 09–16): the algorithm lineage, computed by posttrain.algorithms and
posttrain.preference."""

from __future__ import annotations

import functools
import math

import torch

from posttrain.algorithms import core, dapo, dr_grpo, grpo, reinforce, rloo
from posttrain.lessons import claims
from posttrain.lessons.registry import Knob, Widget, bar, figure, line, r, register
from posttrain.preference.dpo import DPOLossConfig, SeqLogps, preference_loss

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


# ---- 13 · DAPO: wasted groups and the overlong ramp ---------------------------------------------


def dapo_waste(accuracy: float, K: int, buffer: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    G = 2000
    rw = (torch.rand(G * K, generator=gen, dtype=torch.float64) < accuracy).double()
    idx = torch.arange(G).repeat_interleave(K)
    measured = float(dapo.degenerate(rw, idx).double().mean())
    ps = [i / 20 for i in range(21)]
    max_len = 64
    lengths = torch.arange(0, 81, dtype=torch.float64)
    pen = dapo.overlong_penalty(lengths, max_len, buffer) if buffer > 0 else torch.zeros_like(lengths)
    return {
        "figure": figure(
            [
                line(ps, [p**K + (1 - p) ** K for p in ps], f"P(degenerate), K = {K}"),
                line([accuracy], [measured], "measured on 2000 groups", mode="markers", marker={"size": 12}),
                line(
                    lengths.tolist(),
                    pen.tolist(),
                    f"overlong shaping, buffer {buffer}, cap {max_len}",
                    xaxis="x2",
                    yaxis="y2",
                ),
            ],
            "wasted groups (left) and the length penalty (right)",
            "accuracy p",
            "P(all rewards equal)",
            grid={"rows": 1, "columns": 2, "pattern": "independent"},
            xaxis2={"title": {"text": "response length (tokens)"}},
            yaxis2={"range": [-1.1, 0.1], "title": {"text": "reward added"}},
        ),
        "kpis": [
            ["P(degenerate) = p^K + (1−p)^K", r(accuracy**K + (1 - accuracy) ** K, 4)],
            ["measured", r(measured, 3)],
            ["useful groups", r(1 - measured, 3)],
            ["penalty at the cap", r(pen[max_len], 2)],
        ],
        "note": "Dynamic sampling refills the batch with groups that carry signal; the ramp tells long "
        "answers apart from truncated ones before the cap.",
    }


register(
    Widget(
        "dapo",
        "DAPO: dynamic sampling and overlong shaping",
        dapo_waste,
        [
            Knob("accuracy", "policy accuracy p", [0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99], 0.9),
            Knob("K", "rollouts K", [2, 4, 8, 16], 4),
            Knob("buffer", "overlong buffer (tokens)", [0, 8, 16, 32], 16),
        ],
        {
            "knobs": {"accuracy": 0.99, "K": 2},
            "what": "A policy that already solves 99% with K = 2: 98% of groups are all-right and produce no "
            "gradient; without dynamic sampling almost every step is wasted.",
        },
        "Left: share of groups whose rewards are all equal (rewards drawn at the given accuracy: a toy). "
        "Right: reward added for a response length.",
        ["posttrain.algorithms.dapo:degenerate", "posttrain.algorithms.dapo:overlong_penalty"],
    )
)


# ---- 14 · Dr. GRPO: how much gradient does each token get? ----------------------------------------

AGG_NAMES = {
    "seq-mean-token-mean": "GRPO (÷|y_i|, mean over seqs)",
    "token-mean": "DAPO (÷Σ|y_i|)",
    "seq-mean-token-sum": "÷K (the course's Dr. GRPO)",
    "seq-mean-token-sum-norm": "Dr. GRPO paper (÷K·L_max)",
}


def length_bias(short: int, long: int) -> dict:
    """∂L/∂log π per token for two responses (A = 0.5 each), by core.aggregate under each mode."""
    T = max(short, long)
    mask = torch.zeros(2, T, dtype=torch.float64)
    mask[0, :short], mask[1, :long] = 1, 1
    A = 0.5
    grads = {}
    for mode in AGG_NAMES:
        lp = torch.zeros(2, T, dtype=torch.float64, requires_grad=True)
        loss = core.aggregate(-A * lp, mask, mode, core.batch_norm(mask, max_len=500))
        (g,) = torch.autograd.grad(loss, lp)
        grads[mode] = (-float(g[0, 0]), -float(g[1, 0]))
    names = [AGG_NAMES[m] for m in grads]
    return claims.attach(
        "length_bias",
        {
            "figure": figure(
                [
                    bar(names, [v[0] for v in grads.values()], f"short response ({short} tokens)"),
                    bar(names, [v[1] for v in grads.values()], f"long response ({long} tokens)"),
                ],
                "gradient on each token's log π (A = 0.5 for both)",
                "aggregation",
                "per-token weight (log scale)",
                barmode="group",
                yaxis={"type": "log"},
            ),
            "kpis": [[f"{AGG_NAMES[m]}: short / long", f"{v[0]:.4g} / {v[1]:.4g}"] for m, v in grads.items()]
            + [
                [
                    "GRPO: long token gets",
                    f"{100 * grads['seq-mean-token-mean'][1] / grads['seq-mean-token-mean'][0]:.1f}% of a short token",
                ]
            ],
            "note": "Dividing each sequence by its own length gives the tokens of short answers more weight; "
            "token-mean and the constant normalisers do not.",
        },
    )


register(
    Widget(
        "length_bias",
        "Per-token gradient under four aggregations",
        length_bias,
        [Knob("short", "|y_short|", [2, 5, 10, 20, 50], 10), Knob("long", "|y_long|", [50, 100, 200, 300, 500], 200)],
        {
            "knobs": {"short": 2, "long": 500},
            "what": "Under GRPO's per-sequence mean a token of a 500-token answer gets 0.4% of the push a token "
            "of a 2-token answer gets: long wrong answers are barely punished, so they grow longer.",
        },
        "Weight of one token's log-probability in the loss gradient, for each aggregation mode."
        + claims.caption("length_bias"),
        ["posttrain.algorithms.core:aggregate", "posttrain.algorithms.core:batch_norm"],
    )
)


# ---- 16 · DPO on four responses, and the per-pair loss curves -----------------------------------

SCORES = [0.0, 1.0, 2.0, 2.5]
RESP = ["A", "B", "C", "D"]


def dpo_four(beta: float, lr: float, loss_type: str) -> dict:
    """Four responses, π_ref uniform, pairs labelled by a Bradley–Terry 'human' on hidden scores;
    each step is one gradient step of preference_loss on the 4 logits."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    ref = torch.full((1,), math.log(0.25), dtype=torch.float64)
    one = torch.ones(1, dtype=torch.float64)
    cfg = DPOLossConfig(loss_type=loss_type, beta=beta)
    hist, avg_d, chosen, rejected = [], 0.0, [], []
    steps = 500
    for s in range(steps):
        i, j = torch.randperm(4, generator=gen)[:2].tolist()
        p_i = 1 / (1 + math.exp(-(SCORES[i] - SCORES[j])))
        w, l_ = (i, j) if float(torch.rand(1, generator=gen)) < p_i else (j, i)
        logp = torch.log_softmax(logits, -1)
        loss, m = preference_loss(cfg, SeqLogps(logp[w : w + 1], logp[l_ : l_ + 1], ref, ref, one, one))
        (g,) = torch.autograd.grad(loss.mean(), logits)
        with torch.no_grad():
            logits -= lr * g
        pi = torch.softmax(logits.detach(), -1)
        hist.append(pi.tolist())
        avg_d += (float(pi[3]) - avg_d) / (s + 1)
        chosen.append(m["logps/chosen"])
        rejected.append(m["logps/rejected"])
    pi = torch.tensor(hist[-1])
    logp = torch.log_softmax(logits.detach(), -1)  # finite even where π underflows
    dr = beta * float(logp[3] - logp[0])  # the log π_ref terms cancel
    xs = list(range(1, steps + 1, 5))  # every 5th pair keeps the export small
    return {
        "figure": figure(
            [line(xs, [h[k] for h in hist[::5]], f"π({RESP[k]}), true score {SCORES[k]}") for k in range(4)],
            f"{loss_type}, β = {beta}, η = {lr}",
            "pair",
            "π_θ",
            yaxis={"range": [0, 1]},
        ),
        "kpis": [
            ["final π", ", ".join(f"{x:.2f}" for x in pi.tolist())],
            ["running mean of π(D)", r(avg_d, 3)],
            ["implicit Δr(D − A) = β·log-ratio gap", r(dr, 2)],
            ["log π(chosen), first → last 50 pairs", f"{sum(chosen[:50]) / 50:.2f} → {sum(chosen[-50:]) / 50:.2f}"],
        ],
        "note": "No reward model and no sampling: the policy's own log-ratio against π_ref is the reward.",
    }


register(
    Widget(
        "dpo4",
        "DPO on four responses",
        dpo_four,
        [
            Knob("beta", "β", [0.05, 0.1, 0.25, 0.5, 1.0, 2.0], 0.5),
            Knob("lr", "η", [0.01, 0.05, 0.1, 0.2, 0.5], 0.1),
            Knob("loss_type", "loss", ["dpo", "ipo", "hinge"], "dpo", kind="select"),
        ],
        {
            "knobs": {"beta": 2.0, "lr": 0.5, "loss_type": "ipo"},
            "what": "IPO with β = 2 and η = 0.5: the squared loss overshoots its target on every pair, the "
            "policy ends on B (π ≈ 0.97), a mediocre answer, and the chosen answers' log-probability "
            "falls from −1.5 to −5.",
        },
        "Probability of each response as labelled pairs arrive: four responses and a simulated labeller, a "
        "deliberate toy trained by preference_loss.",
        ["posttrain.preference.dpo:preference_loss"],
    )
)


def pref_curves(beta: float) -> dict:
    h = torch.linspace(-4, 8, 121, dtype=torch.float64)
    zero, one = torch.zeros_like(h), torch.ones_like(h)
    out = {}
    for kind in ("dpo", "ipo", "hinge"):
        loss, _ = preference_loss(DPOLossConfig(loss_type=kind, beta=beta), SeqLogps(h, zero, zero, zero, one, one))
        out[kind] = loss
    target = 1 / (2 * beta)
    return {
        "figure": figure(
            [line(h.tolist(), v.clamp(max=6).tolist(), k) for k, v in out.items()]
            + [line([target], [0.0], "IPO minimum", mode="markers", marker={"size": 12})],
            f"per-pair loss, β = {beta}",
            "h = log-ratio(chosen) − log-ratio(rejected)",
            "loss",
            yaxis={"range": [0, 6]},
        ),
        "kpis": [
            ["DPO loss at h = 0", r(out["dpo"][40], 4)],
            ["IPO minimum at h = 1/(2β)", r(target, 3)],
            ["hinge is 0 beyond h = 1/β", r(1 / beta, 3)],
        ],
        "note": "DPO keeps pushing the gap up forever; IPO pulls it back to a finite target.",
    }


register(
    Widget(
        "pref_curves",
        "Per-pair losses vs. the log-ratio gap h",
        pref_curves,
        [Knob("beta", "β", [0.05, 0.1, 0.25, 0.5, 1.0, 2.0], 0.5)],
        {
            "knobs": {"beta": 0.05},
            "what": "Small β: DPO's loss stays large until the gap is enormous (it keeps pushing both "
            "log-probabilities down), and IPO's target moves out to h = 10.",
        },
        "Loss of one pair under DPO, IPO and hinge (SLiC).",
        ["posttrain.preference.dpo:preference_loss"],
    )
)
