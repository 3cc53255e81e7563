"""Widgets of the gpt_mini lessons 04–06, the stages after plain SFT: chain of thought against direct
answers (recorded runs), DPO's loss on one pair, and GRPO's advantages and loss on a one-number policy.
Lessons 01–03 (shapes, pretraining, the SFT mask) are widgets_gpt.py."""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from posttrain.algorithms import core, grpo
from posttrain.framework.batch import RolloutBatch
from posttrain.lessons import runs
from posttrain.lessons.registry import Knob, Widget, figure, line, r, register
from posttrain.preference.dpo import DPOLossConfig, SeqLogps, preference_loss
from posttrain.tasks.arithmetic import Problem

# ---- G04 · chain of thought: serial compute ------------------------------------------------------


def _final(acc: list[float]) -> float:
    """Accuracy at the end of a recorded run: the mean of its last two evaluations (one is noisy)."""
    return sum(acc[-2:]) / 2


def cot_budget(cot: bool, layers: int, K: int) -> dict:
    """Recorded SFT runs (runs.cot_runs: 1 or 2 layers, direct answers or chain of thought, on sums of
    2–6 terms of 0..19, 1200 steps) and their held-out accuracy for each number of terms."""
    rec = runs.recorded()
    this = rec[f"cot layers={layers} cot={int(cot)}"]
    ks = sorted(int(k) for k in this["acc_k"])
    by_k = {c: [_final(rec[f"cot layers={layers} cot={c}"]["acc_k"][str(k)]) for k in ks] for c in (0, 1)}
    acc = _final(this["acc_k"][str(K)])
    trace = Problem(tuple(range(11, 11 + K))).target(True)  # an example CoT target at this K
    return {
        "figure": figure(
            [
                line(
                    ks,
                    by_k[0],
                    f"direct answers, {layers} layer(s)",
                    mode="lines+markers",
                    line={"width": 4 if not cot else 1.5},
                ),
                line(
                    ks,
                    by_k[1],
                    f"chain of thought, {layers} layer(s)",
                    mode="lines+markers",
                    line={"width": 4 if cot else 1.5},
                ),
                line([K], [acc], "this setting", mode="markers", marker={"size": 14, "color": "#d62728"}),
                line(
                    this["step"],
                    this["acc_k"][str(K)],
                    f"this setting, K = {K}: during training",
                    xaxis="x2",
                    yaxis="y2",
                ),
            ],
            f"{'CoT' if cot else 'direct'}, {layers} layer(s), K = {K} terms",
            "terms K",
            "held-out accuracy",
            grid={"rows": 1, "columns": 2, "pattern": "independent"},
            yaxis={"range": [0, 1.02]},
            xaxis2={"title": {"text": "SFT step"}},
            yaxis2={"range": [0, 1.02], "title": {"text": "held-out accuracy"}},
        ),
        "kpis": [
            ["held-out accuracy (this setting)", r(acc, 3)],
            ["direct / CoT at this K", f"{by_k[0][ks.index(K)]:.2f} / {by_k[1][ks.index(K)]:.2f}"],
            ["direct answers, K = 2 → 6", " → ".join(f"{x:.2f}" for x in by_k[0])],
            ["chain of thought, K = 2 → 6", " → ".join(f"{x:.2f}" for x in by_k[1])],
            ["CoT target (example)", trace],
            ["CoT tokens", len(trace)],
            ["0.99 per token over the trace", r(0.99 ** len(trace), 3)],
        ],
        "note": (
            f"{'With the trace' if cot else 'Answering directly'}, the {layers}-layer model gets {100 * acc:.0f}% "
            f"of held-out {K}-term sums right. A direct answer has to fit {K - 1} additions into one forward "
            f"pass; each written partial sum gives the model another pass."
        ),
    }


register(
    Widget(
        "cot",
        "Direct answer vs. chain of thought",
        cot_budget,
        [
            Knob("cot", "write the chain of thought", [False, True], True, "check"),
            Knob("layers", "layers", [1, 2], 2),
            Knob("K", "terms K", [2, 3, 4, 5, 6], 4),
        ],
        {
            "knobs": {"cot": False, "K": 6},
            "what": "Six terms answered directly: five additions must fit inside one forward pass of a 2-layer "
            "model, and after 1200 steps of SFT it gets few of those sums right; with the trace the same model "
            "gets most of them. One seed each: the direct curves are noisy.",
        },
        "Held-out accuracy by number of terms for recorded SFT runs of a small gpt_mini (left; the final two "
        "evaluations averaged) and the chosen setting's accuracy during training (right).",
        ["posttrain.tasks.arithmetic:Problem.trace", "posttrain.lessons.runs:sft_run", "posttrain.eval:evaluate"],
    )
)


# ---- G05 · DPO on one pair -----------------------------------------------------------------------


def dpo_pair(beta: float, lr: float, loss_type: str) -> dict:
    lp = torch.zeros(2, dtype=torch.float64, requires_grad=True)  # log π/π_ref of chosen, rejected
    zero, one = torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    cfg = DPOLossConfig(loss_type=loss_type, beta=beta)
    margins, losses = [], []
    for _ in range(220):
        loss, m = preference_loss(cfg, SeqLogps(lp[:1], lp[1:], zero, zero, one, one))
        (g,) = torch.autograd.grad(loss.mean(), lp)
        losses.append(float(loss.detach()))
        margins.append(m["pref/margin"])
        with torch.no_grad():
            lp -= lr * g
    xs = list(range(220))
    return {
        "figure": figure(
            [line(xs, margins, "margin β(log-ratio_w − log-ratio_l)"), line(xs, losses, "loss", yaxis="y2")],
            f"{loss_type}, β = {beta}, η = {lr}",
            "step",
            "margin",
            yaxis2={"overlaying": "y", "side": "right", "title": {"text": "loss"}},
        ),
        "kpis": [
            ["loss at step 0 (π_θ = π_ref)", r(losses[0], 4)],
            ["margin after 220 steps", r(margins[-1], 3)],
            ["preference accuracy", 1.0 if margins[-1] > 0 else 0.0],
        ],
        "note": (
            f"{loss_type.upper()} with β = {beta}: the loss starts at {losses[0]:.3f} (π = π_ref) and the margin "
            f"reaches {margins[-1]:.3f} after 220 steps"
            + (
                " — the DPO gradient is β·σ(−margin), so at first the margin grows like β² per step."
                if loss_type == "dpo"
                else "; IPO pulls the log-ratio gap towards 1/(2β) instead of pushing it forever."
            )
        ),
    }


register(
    Widget(
        "dpo_pair",
        "A DPO update on one pair",
        dpo_pair,
        [
            Knob("beta", "β", [0.05, 0.1, 0.2, 0.5, 1.0], 0.1),
            Knob("lr", "η", [0.05, 0.2, 0.5, 1.0], 0.2),
            Knob("loss_type", "loss", ["dpo", "ipo"], "dpo", "select"),
        ],
        {
            "knobs": {"beta": 0.05, "lr": 0.05},
            "what": "β = 0.05 with a small step: the margin barely leaves 0 in 220 steps (it grows like β²), "
            "so the run looks like it learns nothing.",
        },
        "The implicit-reward margin and the loss over 220 updates of preference_loss on one pair whose two "
        "log-ratios are free parameters (a deliberate toy).",
        ["posttrain.preference.dpo:preference_loss"],
    )
)


# ---- G06 · RLVR with GRPO: a one-number policy ----------------------------------------------------

G06_SEEDS, G06_STEPS, G06_P0, G06_LR = 50, 200, 0.1, 0.4


@functools.lru_cache(maxsize=64)
def _grpo_sim_run(K: int, beta: float) -> tuple[list[float], list[float]]:
    """A one-parameter policy per seed: P(correct) = σ(θ), starting at 0.1 (an SFT model that
    sometimes solves the task). Each step samples K answers per seed, takes grpo.advantages
    (population std) and grpo.loss with the KL anchor to the starting policy (β), and steps θ by
    η = 0.4 along the loss's gradient (autograd through grpo.loss). Returns the mean p over
    G06_SEEDS seeds after each step and the share of groups with no signal at each step."""
    gen = torch.Generator().manual_seed(0)
    S = G06_SEEDS
    theta = torch.full((S,), math.log(G06_P0 / (1 - G06_P0)), dtype=torch.float64)
    groups = torch.arange(S).repeat_interleave(K)
    cfg = grpo.Config(std="population", kl_coef=beta)
    ref = torch.tensor([math.log(1 - G06_P0), math.log(G06_P0)], dtype=torch.float64)  # log π_ref(wrong), (right)
    mask = torch.ones(S * K, 1, dtype=torch.float64)
    norm = core.batch_norm(mask)
    mean_p, dead = [], []
    for _ in range(G06_STEPS):
        th = theta.clone().requires_grad_(True)
        right = (
            torch.rand(S * K, generator=gen, dtype=torch.float64) < torch.sigmoid(theta).repeat_interleave(K)
        ).double()
        lp = torch.where(
            right > 0, -F.softplus(-th).repeat_interleave(K), -F.softplus(th).repeat_interleave(K)
        )  # log σ(±θ)
        lp = lp.unsqueeze(1)  # [S·K, 1] one answer token each
        adv = grpo.advantages(right, groups, cfg)  # [S·K]
        batch = RolloutBatch(
            loss_mask=mask,
            advantages=core.broadcast(adv, mask),
            old_logprobs=lp.detach(),
            ref_logprobs=ref[right.long()].unsqueeze(1),
        )
        loss, _ = grpo.loss(lp, batch, cfg, norm)
        (g,) = torch.autograd.grad(loss, th)
        theta = theta - G06_LR * S * g  # the loss averages seeds: × S
        mean_p.append(float(torch.sigmoid(theta).mean()))
        dead.append(float((adv.view(S, K).abs().sum(-1) == 0).double().mean()))
    return mean_p, dead


def grpo_sim(K: int, beta: float) -> dict:
    mean_p, dead = _grpo_sim_run(K, beta)
    xs = list(range(1, G06_STEPS + 1))
    hit = next((i + 1 for i, p in enumerate(mean_p) if p >= 0.9), None)
    early = sum(dead[:40]) / 40
    return {
        "figure": figure(
            [
                line(xs, mean_p, f"mean P(correct) over {G06_SEEDS} seeds"),
                line(xs, dead, "groups with no signal (all right or all wrong)", line={"dash": "dot"}),
                line([40, 40], [0, 1], "step 40", line={"dash": "dash", "color": "grey"}),
            ],
            f"K = {K}, β = {beta}",
            "step",
            "probability",
            yaxis={"range": [0, 1.02]},
        ),
        "kpis": [
            ["P(correct) at step 40", r(mean_p[39], 3)],
            ["final P(correct)", r(mean_p[-1], 3)],
            ["first step with P(correct) ≥ 0.9", hit if hit else "never (in 200 steps)"],
            ["answers sampled per seed to reach 0.9", hit * K if hit else "—"],
            ["groups with no signal, steps 1–40", r(early, 3)],
            ["groups with no signal, last step", r(dead[-1], 3)],
        ],
        "note": (
            f"K = {K}: {100 * early:.0f}% of the groups in the first 40 steps had all-equal rewards and taught "
            f"nothing; P(correct) is {mean_p[39]:.2f} at step 40 and "
            + (f"first reaches 0.9 at step {hit}." if hit else "never reaches 0.9.")
            + " Near the top every group is all right, so learning stops by itself."
        ),
    }


register(
    Widget(
        "grpo_sim",
        "GRPO on a one-parameter policy",
        grpo_sim,
        [Knob("K", "rollouts K", [2, 3, 4, 6, 8], 8), Knob("beta", "β", [0.0, 0.05, 0.1, 0.2, 0.5], 0.05)],
        {
            "knobs": {"K": 2},
            "what": "K = 2 from a 10% start: a group has signal only when exactly one of its two answers is right, "
            "so most early groups teach nothing and learning per step is slow. Per sampled answer it is not: "
            "K = 2 draws a quarter of K = 8's answers a step (compare the KPI 'answers sampled per seed').",
        },
        f"Mean P(correct) of {G06_SEEDS} seeds trained by grpo.advantages and grpo.loss (a one-parameter "
        "policy: a deliberate toy), and the share of groups whose rewards were all equal.",
        ["posttrain.algorithms.grpo:advantages", "posttrain.algorithms.grpo:loss"],
    )
)
