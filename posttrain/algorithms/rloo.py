"""RLOO = REINFORCE with the leave-one-out baseline: A_i = R_i − mean_{j≠i} R_j.

Ahmadian et al., arXiv 2402.14740, after Kool et al. 2019 (docs/algorithms.md §8). Each sample
is compared with the mean of the OTHER G−1 samples of its prompt, so the baseline does not
depend on the sample and the gradient is unbiased. Since Σ_{j≠i} R_j = G·μ_G − R_i,

    A_i = R_i − (G·μ_G − R_i)/(G−1) = G/(G−1) · (R_i − μ_G)

i.e. GRPO's centred advantage without /std, scaled by G/(G−1) (2 at G=2, 4/3 at G=4). The
loss is REINFORCE's, −A·log π summed over tokens and averaged over sequences; no clip.

Deviations from the paper, each a config value unless stated:
1. Singleton groups (G = 1) have no other sample: A = 0 (as verl `rloo_vectorized`; verl
   `rloo` leaves A = R). Not a switch: one sample has nothing to be compared with.
2. The KL goes in the loss (`kl_coef`, default 0), not in the reward as the paper and TRL do
   (R ← R − β Σ_t k1, β = 0.05 in TRL); use REINFORCE++ for a KL-in-reward estimator.
3. The loss is REINFORCE's token log-prob sum, not TRL's clipped whole-sequence ratio; it is
   the paper's on-policy estimator (TRL and ours agree at ratio 1).
4. `aggregation` is a named mode (default the paper's seq-mean-token-sum); entropy bonus
   `entropy_coef` (0 = paper).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrain.algorithms import core, reinforce
from posttrain.algorithms.base import AlgoConfig


@dataclass
class Config(AlgoConfig):
    name: str = "rloo"
    aggregation: str = "seq-mean-token-sum"  # core.AGGREGATIONS; the paper's: tokens summed, sequences averaged
    kl_coef: float = 0.0  # β of a per-token KL to the reference in the loss (paper: in the reward); 0 = none
    kl_estimator: str = "k3"  # k1 | k2 | k3 (core.kl)
    entropy_coef: float = 0.0  # entropy bonus: loss −= coef·H per token; 0 = the paper

    def __post_init__(self):
        core.check_config(self, "rloo")


needs_reference = reinforce.needs_reference
loss = reinforce.loss  # RLOO's loss IS REINFORCE's


def advantages(rewards: torch.Tensor, group_index: torch.Tensor, cfg: Config, **kw) -> torch.Tensor:
    """A_i = R_i − (Σ_{j≠i} R_j)/(G−1) [B]; exactly 0 for singletons and equal-reward groups."""
    rewards = core.float_rewards(rewards)
    r = rewards.double()
    mean, std, size = core.group_stats(r, group_index)  # [B] each
    others = (mean * size - r) / (size - 1).clamp_min(1)  # ← leave-one-out baseline
    live = (size > 1) & (std > 0)  # equal rewards: exactly 0, not ±1e-17
    return torch.where(live, r - others, torch.zeros_like(r)).to(rewards.dtype)
