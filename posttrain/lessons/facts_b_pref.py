"""Facts of lessons 15–16 that hold a claim to its published source, merged into facts_b.FACTS:
the Bradley–Terry margin a calibrated reward model gives pairs that people themselves disagree on
(InstructGPT's labeller agreement), and DPO's closed-form optimum against what the lesson's widget
reaches with plain SGD."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from posttrain.lessons.facts_b_data import kpi
from posttrain.lessons.widgets_variants import SCORES

# Ouyang et al. 2022 (InstructGPT, arXiv 2203.02155, §5): training labellers agreed with each
# other 72.6 ± 1.5% of the time, held-out labellers 77.3 ± 1.3%.
AGREEMENT = {"training labellers": 0.726, "held-out labellers": 0.773}


def bt_margin(p: float) -> float:
    """The reward gap Δ at which Bradley–Terry's σ(Δ) equals p: log(p / (1 − p))."""
    return math.log(p / (1 - p))


def preference_from_agreement(a: float) -> float:
    """The probability q with which a labeller prefers the chosen answer, given that two labellers
    agree at rate a: two independent labellers agree with probability q² + (1 − q)², so
    q = (1 + √(2a − 1)) / 2 (every pair alike; a ≥ 1/2). 72.6% agreement → q = 0.84."""
    return (1 + math.sqrt(2 * a - 1)) / 2


def dpo_optimum(beta: float) -> list[float]:
    """DPO's optimum with infinitely many Bradley–Terry-labelled pairs on the widget's hidden scores
    and a uniform reference (Rafailov et al. 2023, Eq. 4): π*(y) ∝ π_ref(y)·exp(r(y)/β)."""
    return torch.softmax(torch.tensor(SCORES, dtype=torch.float64) / beta, -1).tolist()


FACTS: dict[str, Callable[[], object]] = {
    "rl15_pref_agree_train": lambda: round(preference_from_agreement(AGREEMENT["training labellers"]), 2),
    "rl15_pref_agree_heldout": lambda: round(preference_from_agreement(AGREEMENT["held-out labellers"]), 2),
    "rl15_margin_agree_train": lambda: round(bt_margin(preference_from_agreement(AGREEMENT["training labellers"])), 2),
    "rl15_margin_agree_heldout": lambda: round(
        bt_margin(preference_from_agreement(AGREEMENT["held-out labellers"])), 2
    ),
    "rl16_optimum_d_beta05": lambda: f"{dpo_optimum(0.5)[3]:.2f}",
    "rl16_optimum_d_beta005": lambda: f"{dpo_optimum(0.05)[3]:.5f}",
    "rl16_dpo4_small_beta_pi": lambda: kpi("dpo4", "final π", beta=0.05),
}
