"""Widget of lesson 15: Bradley–Terry reward models learning four responses' scores from noisy
pairwise labels (reward_models/reward_model.bradley_terry_loss). The rest of the 'signal' lessons
(17, 18, 18a) are widgets_signal.py, registered right after this module."""

from __future__ import annotations

import functools
import math

import torch

from posttrain.lessons.registry import Knob, Widget, bar, figure, register
from posttrain.reward_models.reward_model import bradley_terry_loss

# ---- 15 · a Bradley–Terry reward model on four responses -------------------------------------------

TRUE = [0.0, 1.0, 2.0, 2.5]
PAIRS = [50, 100, 200, 500]
BT_RUNS = 200  # independent labelling runs: a single run's final ranking is itself a noisy draw
PAIR_IDX = [(a, b) for a in range(4) for b in range(a + 1, 4)]  # the six pairs, worse answer first
KPI_ALL = f"whole ranking right, share of {BT_RUNS} runs"
KPI_CD = "C above D at the end, share of runs"


def worse_pick(i: int, j: int) -> float:
    """How often the simulated labeller prefers the worse of answers i < j: σ(s_i − s_j)."""
    return 1 / (1 + math.exp(TRUE[j] - TRUE[i]))


@functools.lru_cache(maxsize=16)
def _bt_run(lr: float) -> dict:
    """SGD on bradley_terry_loss over 4 free scores, BT_RUNS independent runs at once; each step
    samples one pair per run and a 'human' label from σ(s_i − s_j). Returns, after each count in
    PAIRS: run 0's scores, and over the runs the share with the whole ranking right, with C above
    D, and the mean share of the six pairs ordered right."""
    gen = torch.Generator().manual_seed(0)
    true = torch.tensor(TRUE, dtype=torch.float64)
    rhat = torch.zeros(BT_RUNS, 4, dtype=torch.float64, requires_grad=True)
    runs = torch.arange(BT_RUNS)
    snaps = {}
    for n in range(1, max(PAIRS) + 1):
        pick = torch.rand(BT_RUNS, 4, generator=gen).argsort(-1)[:, :2]  # a random pair per run
        i, j = pick[:, 0], pick[:, 1]
        first = torch.rand(BT_RUNS, generator=gen, dtype=torch.float64) < torch.sigmoid(true[i] - true[j])
        w, l_ = torch.where(first, i, j), torch.where(first, j, i)
        loss = bradley_terry_loss(rhat[runs, w], rhat[runs, l_]).sum()  # runs are independent
        (g,) = torch.autograd.grad(loss, rhat)
        with torch.no_grad():
            rhat -= lr * g
        if n in PAIRS:
            r = rhat.detach()
            right = torch.stack([r[:, b] > r[:, a] for a, b in PAIR_IDX], -1).double()  # [runs, 6]
            snaps[n] = {
                "scores": r[0].clone(),
                "all_right": float(right.all(-1).double().mean()),
                "cd_right": float(right[:, PAIR_IDX.index((2, 3))].mean()),
                "pairs_right": float(right.mean()),
                "by_pair": right.mean(0).tolist(),  # [6] share of runs ordering each pair right
            }
    return snaps


def bt_rm(lr: float, pairs: int) -> dict:
    snap = _bt_run(lr)[pairs]
    rhat = snap["scores"]
    shown = rhat - rhat.mean() + sum(TRUE) / 4  # re-centred: BT is shift-free
    names = ["A", "B", "C", "D"]
    a, b = PAIR_IDX[snap["by_pair"].index(min(snap["by_pair"]))]
    worst = f"{names[a]} vs {names[b]}"
    return {
        "figure": figure(
            [
                bar(names, TRUE, "hidden true score", opacity=0.4),
                bar(names, shown.tolist(), "learned r̂, one run (re-centred)"),
            ],
            f"lr = {lr}, {pairs} labelled pairs",
            "response",
            "score",
            barmode="group",
        ),
        "kpis": [
            ["pairs seen", pairs],
            [KPI_ALL, f"{100 * snap['all_right']:.1f}%"],
            [KPI_CD, f"{100 * snap['cd_right']:.1f}%"],
            ["pairs ordered right at the end, mean", f"{100 * snap['pairs_right']:.1f}%"],
            ["σ(1), σ(3)", f"{1 / (1 + math.exp(-1)):.2f}, {1 / (1 + math.exp(-3)):.2f}"],
        ],
        "note": (
            f"Over {BT_RUNS} runs of {pairs} noisy labels the final ranking is entirely right in "
            f"{100 * snap['all_right']:.0f}% of them; the pair most often wrong is {worst} "
            f"({100 * (1 - min(snap['by_pair'])):.0f}% of runs). The bars show one run."
        ),
    }


register(
    Widget(
        "bt_rm",
        "A Bradley–Terry reward model on four responses",
        bt_rm,
        [
            Knob("lr", "learning rate", [0.01, 0.05, 0.1, 0.3, 0.6, 1.0], 0.3),
            Knob("pairs", "labelled pairs", PAIRS, 500),
        ],
        {
            "knobs": {"lr": 1.0},
            "what": f"Learning rate 1: every noisy label (the 'human' picks the worse of C and D "
            f"{100 * worse_pick(2, 3):.0f}% of the time) swings the scores by about the C–D gap, so the final "
            "ranking is a draw of the last few labels; the policy then optimises a jittery reward.",
        },
        f"Hidden true scores and one run's learned scores after the labelled pairs; the KPIs are over {BT_RUNS} runs.",
        ["posttrain.reward_models.reward_model:bradley_terry_loss"],
    )
)
