"""Widgets of lessons 13–16: the variants of the lineage. DAPO's switches and Dr. GRPO's
normalisation change how GRPO weighs its groups and tokens; DPO (lesson 16) learns from preference
pairs without sampling. Computed by posttrain.algorithms and posttrain.preference; the lineage
itself (09–12) is in widgets_algos.py."""

from __future__ import annotations

import math

import torch

from posttrain.algorithms import core, dapo
from posttrain.lessons import claims
from posttrain.lessons.registry import Knob, Widget, bar, figure, line, r, register
from posttrain.preference.dpo import DPOLossConfig, SeqLogps, preference_loss

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
