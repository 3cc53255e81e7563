"""MGPO = GRPO with each group's advantage weighted by w = exp(−λ·KL(Bern(p̂) ‖ Bern(½))).

The weight measures how trainable the prompt is; it is largest (1) at pass rate ½.

MaxEnt-Guided Policy Optimization, VibeThinker-1.5B, arXiv 2511.06221 (docs/algorithms.md §17).
A prompt the model solves half the time is where it learns most; one it almost always solves
or fails teaches little. The max-entropy deviation

    D_ME(p̂) = KL(Bern(p̂) ‖ Bern(½)) = p̂·log(2p̂) + (1−p̂)·log(2(1−p̂)) = log 2 − H_b(p̂)

is 0 at p̂ = ½ and log 2 at p̂ ∈ {0, 1}, so the weight w = exp(−λ·D_ME) lies in [2^−λ, 1].
λ = 0 is GRPO. Everything else is GRPO's (grpo.advantages, grpo.loss).

Deviations from the paper, each a config value unless stated:
1. λ (`maxent_lambda`) is not stated in the paper (per third-party summaries); the default 1.0
   is illustrative (docs/algorithms.md §21: p̂ = 0.25 gives w = 0.877383).
2. p̂ is the group mean reward clamped to [0, 1]: the pass rate for 0/1 rewards, a soft one
   for partial credit (the paper counts R_i = 1).
3. GRPO's loss and defaults are kept (KL β = 0.04, seq-mean-token-mean), as "everything else
   is GRPO"; the VibeThinker RL hyperparameters are not public.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrain.algorithms import core, grpo
from posttrain.errors import UsageError


@dataclass
class Config(grpo.Config):
    name: str = "mgpo"
    maxent_lambda: float = 1.0  # λ of w = exp(−λ·D_ME(p̂)); 0 = GRPO, larger = focus on prompts near pass rate ½

    def __post_init__(self):
        super().__post_init__()
        if self.maxent_lambda < 0:
            raise UsageError(f"mgpo: maxent_lambda must be ≥ 0 (got {self.maxent_lambda})")


needs_reference = grpo.needs_reference
loss = grpo.loss


def trainability(p_hat: torch.Tensor, lam: float) -> torch.Tensor:
    """w = exp(−λ·KL(Bern(p̂) ‖ Bern(½))) elementwise, in [2^−λ, 1]."""
    return torch.exp(-lam * core.bernoulli_kl(p_hat, torch.full_like(p_hat, 0.5)))


def advantages(rewards: torch.Tensor, group_index: torch.Tensor, cfg: Config, **kw) -> torch.Tensor:
    """w(p̂)·A^GRPO [B]; degenerate groups stay at exactly 0."""
    rewards = core.float_rewards(rewards)
    p_hat, _, _ = core.group_stats(rewards, group_index, cfg.std)  # [B]  μ_G
    w = trainability(p_hat.clamp(0.0, 1.0), cfg.maxent_lambda)  # [B]
    return w * grpo.advantages(rewards, group_index, cfg)  # ← the trainability weight
