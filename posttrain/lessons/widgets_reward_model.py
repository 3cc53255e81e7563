"""Widget of lesson 15: a Bradley–Terry reward model learning four responses' scores from noisy
pairwise labels (reward_models/reward_model.bradley_terry_loss). The rest of the 'signal' lessons
(17, 18, 18a) are widgets_signal.py, registered right after this module."""

from __future__ import annotations

import functools
import math

import torch

from posttrain.lessons.registry import Knob, Widget, bar, figure, r, register
from posttrain.reward_models.reward_model import bradley_terry_loss

# ---- 15 · a Bradley–Terry reward model on four responses -------------------------------------------

TRUE = [0.0, 1.0, 2.0, 2.5]
PAIRS = [50, 100, 200, 500]


@functools.lru_cache(maxsize=16)
def _bt_run(lr: float) -> dict:
    """SGD on bradley_terry_loss over 4 free scores; pairs and 'human' labels drawn from σ(s_i − s_j)."""
    gen = torch.Generator().manual_seed(0)
    rhat = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    agree, losses, snaps = 0, [], {}
    for n in range(1, max(PAIRS) + 1):
        i, j = torch.randperm(4, generator=gen)[:2].tolist()
        w, l_ = (i, j) if float(torch.rand(1, generator=gen)) < 1 / (1 + math.exp(TRUE[j] - TRUE[i])) else (j, i)
        loss = bradley_terry_loss(rhat[w : w + 1], rhat[l_ : l_ + 1]).mean()
        (g,) = torch.autograd.grad(loss, rhat)
        with torch.no_grad():
            rhat -= lr * g
        agree += int((float(rhat.detach()[i]) > float(rhat.detach()[j])) == (TRUE[i] > TRUE[j]))
        losses.append(float(loss.detach()))
        if n in PAIRS:
            snaps[n] = (rhat.detach().clone(), agree / n, losses[-1])
    return snaps


def bt_rm(lr: float, pairs: int) -> dict:
    rhat, agreement, last = _bt_run(lr)[pairs]
    shown = rhat - rhat.mean() + sum(TRUE) / 4  # re-centred: BT is shift-free
    names = ["A", "B", "C", "D"]
    return {
        "figure": figure(
            [bar(names, TRUE, "hidden true score", opacity=0.4), bar(names, shown.tolist(), "learned r̂ (re-centred)")],
            f"η = {lr}, {pairs} labelled pairs",
            "response",
            "score",
            barmode="group",
        ),
        "kpis": [
            ["pairs seen", pairs],
            ["cumulative agreement", f"{100 * agreement:.1f}%"],
            ["last pair loss", r(last, 3)],
            ["σ(1), σ(3)", f"{1 / (1 + math.exp(-1)):.2f}, {1 / (1 + math.exp(-3)):.2f}"],
        ],
        "note": "Only score differences are learned; close pairs (C vs. D) stay noisy because the labels are.",
    }


register(
    Widget(
        "bt_rm",
        "A Bradley–Terry reward model on four responses",
        bt_rm,
        [Knob("lr", "η", [0.01, 0.05, 0.1, 0.3, 0.6, 1.0], 0.3), Knob("pairs", "labelled pairs", PAIRS, 500)],
        {
            "knobs": {"lr": 1.0},
            "what": "η = 1: every noisy label (the 'human' picks the worse answer 38% of the time on C vs. D) "
            "swings the scores, and agreement drops to ~87%; the policy then optimises a jittery reward.",
        },
        "Hidden true scores and the reward model's scores after the labelled pairs.",
        ["posttrain.reward_models.reward_model:bradley_terry_loss"],
    )
)
