"""Widgets of part I, lessons 01–02: the policy gradient on a bandit, and the sampler. Lessons 03–04
(reward and reference, advantages) are widgets_reward.py."""

from __future__ import annotations

import functools
import math

import torch

from posttrain.algorithms import core, reinforce
from posttrain.framework.batch import RolloutBatch
from posttrain.framework.rollout import (
    SamplingParams,
    draw_keys,
    sample_keys,
    sample_tokens,
)
from posttrain.lessons.registry import Knob, Widget, bar, figure, line, r, register

# ---- 01 · the smallest REINFORCE: a 5-armed bandit ----------------------------------------------

BANDIT_REWARDS = [0.1, 0.3, 0.9, 0.4, 0.2]
ARMS = ["A", "B", "C", "D", "E"]
BANDIT_SEEDS = 1000


BANDIT_STEPS = [0, 10, 25, 50, 100, 200]


@functools.lru_cache(maxsize=16)
def _bandit_run(lr: float) -> dict:
    """REINFORCE on a softmax policy over 5 actions, BANDIT_SEEDS independent seeds at once. The
    update is reinforce.loss's gradient (A = R, no baseline), applied with step lr per seed.
    Returns the policies after each count in BANDIT_STEPS (one run serves every step knob)."""
    S = BANDIT_SEEDS
    gen = torch.Generator().manual_seed(0)
    rewards = torch.tensor(BANDIT_REWARDS, dtype=torch.float64)
    theta = torch.zeros(S, 5, dtype=torch.float64, requires_grad=True)
    cfg = reinforce.Config(baseline="none")
    mask = torch.ones(S, 1, dtype=torch.float64)
    norm = core.batch_norm(mask)
    snaps = {0: torch.softmax(theta.detach(), -1)}
    for t in range(1, max(BANDIT_STEPS) + 1):
        logp = torch.log_softmax(theta, -1)  # [S, 5]
        a = torch.multinomial(logp.exp().detach(), 1, generator=gen)  # [S, 1]
        lp = logp.gather(1, a)  # [S, 1] log π(a)
        adv = reinforce.advantages(rewards[a[:, 0]], torch.arange(S), cfg)  # [S] A = R
        batch = RolloutBatch(loss_mask=mask, advantages=adv, old_logprobs=lp.detach())
        loss, _ = reinforce.loss(lp, batch, cfg, norm)
        (g,) = torch.autograd.grad(loss, theta)
        with torch.no_grad():  # the loss averages seeds: × S
            theta -= lr * S * g
        if t in BANDIT_STEPS:
            snaps[t] = torch.softmax(theta.detach(), -1)
    return snaps


def bandit(lr: float, steps: int) -> dict:
    pi = _bandit_run(lr)[steps]  # [S, 5]
    top = pi.argmax(-1)
    share = [float((top == i).double().mean()) for i in range(5)]
    return {
        "figure": figure(
            [
                bar(ARMS, pi[0].tolist(), "π after training (seed 0)"),
                bar(ARMS, share, "share of 1000 seeds whose argmax is this arm"),
                line(ARMS, BANDIT_REWARDS, "true reward", mode="markers", marker={"size": 10}),
            ],
            f"η = {lr}, {steps} steps",
            "action",
            "probability",
            barmode="group",
            yaxis={"range": [0, 1.05]},
        ),
        "kpis": [
            ["seeds ending on C (best)", r(share[2], 3)],
            ["seeds ending on a wrong arm", r(1 - share[2], 3)],
            ["mean max π", r(pi.max(-1).values.mean(), 3)],
            ["π(C), seed 0", r(pi[0, 2], 3)],
        ],
        "note": "Every reward is positive, so every sampled arm is pushed up; only the difference in "
        "how often and how hard separates the best arm.",
    }


register(
    Widget(
        "bandit",
        "A 5-armed bandit trained by REINFORCE",
        bandit,
        [
            Knob("lr", "learning rate η", [0.01, 0.05, 0.1, 0.2, 0.4, 0.8, 1.2, 1.6, 2.0], 0.4),
            Knob("steps", "updates", BANDIT_STEPS, 200),
        ],
        {
            "knobs": {"lr": 2.0, "steps": 200},
            "what": "With η = 2 one lucky early sample of a mediocre arm can push its probability so high that "
            "the best arm is never tried again: some seeds lock onto a wrong action for good.",
        },
        "Bars: the policy of one seed, and over 1000 seeds how often each arm ends up the favourite. A five-armed "
        "bandit is a deliberate toy; the update is reinforce.loss's gradient.",
        ["posttrain.algorithms.reinforce:advantages", "posttrain.algorithms.reinforce:loss"],
    )
)


# ---- 02 · the sampler: temperature, top-k, top-p and the degenerate group ------------------------

DIGITS = [str(i) for i in range(10)]
_DIGIT_LOGITS = torch.tensor([0.3, 2.2, 0.9, -0.4, 0.6, -1.0, 0.1, 1.2, -0.6, 0.0])  # the model's logits; "1" is right


def sampler(temperature: float, top_k: int, top_p: float, K: int) -> dict:
    """Draws from rollout.sample_tokens on one fixed next-digit distribution; a response is two draws
    from it, right iff both are the right digit ("1")."""
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    N = 4000
    logits = _DIGIT_LOGITS.expand(N, 10)
    keys = draw_keys(
        sample_keys(0, 0, torch.zeros(N, dtype=torch.long), torch.arange(N)), torch.zeros(N, dtype=torch.long)
    )
    tok, _lp = sample_tokens(logits, params, keys)
    freq = torch.bincount(tok, minlength=10).double() / N
    full = torch.softmax(_DIGIT_LOGITS / (temperature if temperature > 0 else 1.0), -1)
    p = float(freq[1])  # P(one digit right)
    q = p * p  # P(response right)
    p_deg = q**K + (1 - q) ** K
    # measured: groups of K responses (2 digits each) from the same draws
    right = (tok == 1).view(-1, 2).all(-1).double()  # [N/2]
    groups = right[: (right.numel() // K) * K].view(-1, K)
    measured = float(((groups.sum(-1) == 0) | (groups.sum(-1) == K)).double().mean())
    ks = list(range(1, 17))
    return {
        "figure": figure(
            [
                bar(DIGITS, freq.tolist(), "sampled frequency (4000 draws)"),
                bar(DIGITS, full.tolist(), "softmax(logits / T), what the logprob records"),
                line(ks, [q**k + (1 - q) ** k for k in ks], "P(group of K is degenerate)", xaxis="x2", yaxis="y2"),
                line([K], [p_deg], f"K = {K}", mode="markers", marker={"size": 12}, xaxis="x2", yaxis="y2"),
            ],
            f"T = {temperature}, top-k = {top_k}, top-p = {top_p}",
            "next digit",
            "probability",
            barmode="group",
            grid={"rows": 1, "columns": 2, "pattern": "independent"},
            xaxis2={"title": {"text": "K samples per prompt"}},
            yaxis2={"range": [0, 1.05], "title": {"text": "P(degenerate group)"}},
        ),
        "kpis": [
            ["P(digit right)", r(p, 3)],
            ["P(response right) = p²", r(q, 3)],
            ["P(degenerate group), formula", r(p_deg, 3)],
            ["P(degenerate group), measured", r(measured, 3)],
            ["recorded log π(right) − log of what was sampled", r(math.log(full[1]) - math.log(max(p, 1e-9)), 3)],
        ],
        "note": "Temperature reshapes the distribution; top-k/top-p cut its tail, but the logprob the "
        "engine records is the full distribution's (orange), which the trainer can recompute.",
    }


register(
    Widget(
        "sampler",
        "One sampler: temperature, top-k, top-p",
        sampler,
        [
            Knob("temperature", "temperature T", [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0], 1.0),
            Knob("top_k", "top-k (0 = off)", [0, 2, 5], 0),
            Knob("top_p", "top-p (1 = off)", [1.0, 0.9, 0.7], 1.0),
            Knob("K", "samples per prompt K", [2, 4, 8, 16], 4),
        ],
        {
            "knobs": {"temperature": 0.25, "K": 2},
            "what": "At low temperature almost every response is right, so groups of K = 2 are nearly always "
            "all-right: the group std is 0, every advantage is 0, and the step learns nothing.",
        },
        "Left: the distribution the sampler draws from and the one its logprob records. Right: the chance "
        "that all K responses to a prompt get the same reward. The next-digit logits are a fixed toy; the "
        "sampling is posttrain's sample_tokens.",
        ["posttrain.framework.rollout:sample_tokens", "posttrain.framework.rollout:token_logprobs"],
    )
)
