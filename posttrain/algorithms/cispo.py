"""CISPO = GRPO with the clip moved onto a detached IS weight: −sg(clip(r))·A·log π on every token.

MiniMax-M1, arXiv 2506.13585; ScaleRL, arXiv 2510.13786 (docs/algorithms.md §15). PPO's clip
zeroes the gradient of a token whose ratio left the band on the improving side; in long
reasoning those are often the rare "fork" tokens (however, wait, ...), which then never
learn. CISPO clips the importance weight instead and multiplies it, detached, into REINFORCE's
surrogate (reinforce.surrogate), so the clip bounds a token's step but never removes it:

    ℓ_{i,t} = −sg(r̂_{i,t}) · A_i · log π_θ(y_{i,t}),   r̂ = clip(r, 1−ε_low, 1+ε_high)
    L = Σ_{i,t} ℓ / Σ_i |y_i|                                           (token-mean)

Deviations from the paper, each a config value unless stated:
1. Cap 1+ε_high = 5 (ScaleRL; TRL's `epsilon_high=5.0` is this absolute cap); the MiniMax
   value is not public, verl's example uses 1.2 (`eps_high=0.2`).
2. No lower bound by default (`eps_low=None`), as the paper (only ε_high is tuned) and TRL;
   verl clips at 1 − clip_ratio_low (its example sets 10, i.e. none).
3. `clip/frac` counts tokens whose weight was clipped; unlike PPO's, their gradient is not 0.
4. The log-ratio is clamped to ±20 before exp (as verl); optional per-token KL in the loss
   (`kl_coef`, 0 = paper) and entropy bonus. The advantage is GRPO's (grpo.advantages).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from posttrain.algorithms import core, grpo, reinforce
from posttrain.algorithms.base import AlgoConfig
from posttrain.errors import UsageError

if TYPE_CHECKING:
    from posttrain.framework.batch import RolloutBatch


@dataclass
class Config(AlgoConfig):
    name: str = "cispo"
    eps_high: float = 4.0  # weight cap 1 + eps_high = 5 (ScaleRL; verl example 0.2); lower = smaller steps
    eps_low: float | None = None  # weight floor 1 − eps_low; None = no floor (paper, TRL)
    kl_coef: float = 0.0  # β of a per-token KL to the reference in the loss; 0 = paper (no reference)
    kl_estimator: str = "k3"  # k1 | k2 | k3 (core.kl)
    std: str = "unbiased"  # GRPO advantage: group std ÷(n−1) | population ÷n
    scale_by_std: bool = True  # GRPO advantage: divide by σ_G + adv_eps (False = Dr. GRPO's R − μ_G)
    adv_eps: float = 1e-6  # GRPO advantage: added to σ_G (verl 1e-6, TRL 1e-4)
    aggregation: str = "token-mean"  # core.AGGREGATIONS; the paper's: one token-mean over the whole batch
    entropy_coef: float = 0.0  # entropy bonus: loss −= coef·H per token; 0 = the paper

    def __post_init__(self):
        core.check_config(self, "cispo")
        if self.eps_high < 0 or (self.eps_low is not None and self.eps_low < 0):
            raise UsageError(f"cispo: eps_low and eps_high must be ≥ 0 (got {self.eps_low}, {self.eps_high})")


needs_reference = reinforce.needs_reference
advantages = grpo.advantages


def loss(logprobs: torch.Tensor, batch: RolloutBatch, cfg: Config, norm: dict, entropy: torch.Tensor | None = None):
    """CISPO loss of a (micro-)batch; batch and metrics as grpo.loss (`clip/frac`: weights clipped)."""
    mask, old, adv = core.policy_inputs(batch, "cispo")  # [B, T] each; the batch is only read
    ratio = core.importance_ratio(logprobs, old).detach()  # [B, T]
    floor = 1.0 - cfg.eps_low if cfg.eps_low is not None else 0.0
    weight = core.on_mask(ratio.clamp(floor, 1.0 + cfg.eps_high), mask)  # ← clip the weight, not the objective
    pg = reinforce.surrogate(logprobs, adv, weight)  # −sg(r̂)·A·log π, gradient on every token
    total, metrics = core.finish_loss(pg, logprobs, batch, cfg, norm, entropy, "cispo")
    clipped = (ratio > 1.0 + cfg.eps_high) | (ratio < floor)
    metrics.update(core.ratio_metrics(logprobs, old, mask, clipped))
    return total, metrics
