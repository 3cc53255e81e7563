"""REINFORCE: the root of the lineage, −A·log π summed over a response's tokens, A = R − b.

Williams 1992 (docs/algorithms.md §7). The gradient of the expected reward is
E[(R − b) Σ_t ∇log π_θ(y_t | x, y_<t)]; any baseline b that does not depend on y keeps it
unbiased. The surrogate, to minimise:

    ℓ_{i,t} = −A_i · log π_θ(y_{i,t})                 A_i = R_i (baseline "none") or R_i − μ_G ("mean")
    L = (1/N) Σ_i Σ_t ℓ_{i,t}                            (seq-mean-token-sum)

There is no ratio and no clip: the ratio π_θ/π_old is computed only as a diagnostic, and
exactly 1 when the loop is strictly on-policy. Every later method in this folder reduces to
this gradient at ratio 1 (tests/test_algorithms_zoo.py checks each one).

Deviations from the paper, each a config value unless stated:
1. `baseline="mean"` uses the group mean μ_G of the other samples of the same prompt
   (the GRPO-style baseline, MaxRL repo's `reinforce_with_baseline`); the paper's baseline
   is any state-dependent b, often a learned one (not implemented: that is PPO's critic).
2. The sample itself is in μ_G, so the "mean" gradient is the unbiased one scaled by (G−1)/G;
   RLOO's leave-one-out baseline removes the factor.
3. An optional KL to a reference policy in the loss (`kl_coef`, `kl_estimator` k1/k2/k3),
   per token before aggregation, and an entropy bonus (`entropy_coef`); both 0 = the paper.
4. Strictly on-policy: with `epochs` > 1 the gradient has no importance correction (use an
   algorithm with a ratio, e.g. GRPO or CISPO, for reuse).
5. `aggregation` is a named mode; the paper sums over tokens and averages over sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from posttrain.algorithms import core
from posttrain.algorithms.base import AlgoConfig
from posttrain.errors import UsageError

if TYPE_CHECKING:
    from posttrain.framework.batch import RolloutBatch

BASELINES = ("none", "mean")


@dataclass
class Config(AlgoConfig):
    name: str = "reinforce"
    baseline: str = "none"  # none: A = R (b = 0) | mean: A = R − μ_G (lower variance, gradient × (G−1)/G)
    aggregation: str = "seq-mean-token-sum"  # core.AGGREGATIONS; the paper: sum over tokens, mean over sequences
    kl_coef: float = 0.0  # β of a per-token KL to the reference in the loss; 0 = none (no reference model)
    kl_estimator: str = "k3"  # k1 | k2 | k3 (core.kl); k2's gradient is the reverse KL's, k3's the forward KL's
    entropy_coef: float = 0.0  # entropy bonus: loss −= coef·H per token; 0 = the paper

    def __post_init__(self):
        if self.baseline not in BASELINES:
            raise UsageError(f"reinforce: baseline={self.baseline!r} is unknown; valid: {', '.join(BASELINES)}")
        core.check_config(self, "reinforce")


def needs_reference(cfg) -> bool:
    """The reference model is loaded only when the KL term is on."""
    return cfg.kl_coef > 0


def advantages(rewards: torch.Tensor, group_index: torch.Tensor, cfg: Config, **kw) -> torch.Tensor:
    """A = R, or R − μ_G [B]. A group of equal rewards (singletons included) gets exactly 0
    under "mean" (core.group_stats); under "none" every sample keeps its reward."""
    rewards = core.float_rewards(rewards)
    if cfg.baseline == "none":
        return rewards.clone()
    mean, _, _ = core.group_stats(rewards, group_index)  # [B]
    return rewards - mean


def surrogate(logprobs: torch.Tensor, advantages: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """The score-function surrogate −sg(w)·A·log π_θ per token [B, T]; w = 1 for REINFORCE.

    Its gradient is −w·A·∇log π_θ: every token keeps a gradient. CISPO (w = clipped ratio)
    and DPPO (w = truncated ratio × trust-region mask) re-use it with their own weight.
    """
    if weight is None:
        return -advantages * logprobs
    return -(weight.detach() * advantages) * logprobs


def loss(logprobs: torch.Tensor, batch: RolloutBatch, cfg, norm: dict, entropy: torch.Tensor | None = None):
    """REINFORCE loss of a (micro-)batch, normalised by the whole batch's `norm`.

    logprobs [B, T] with gradient; batch: `loss_mask`, `advantages` ([B, T] or [B]),
    `old_logprobs` (for the ratio diagnostic only), `ref_logprobs` when kl_coef > 0.
    Returns (loss, metrics): `loss/policy`, `ratio/mean`, `ratio/max`, `clip/frac` (always 0:
    nothing is clipped), and `kl/ref`, `entropy` when available.
    """
    mask, old, adv = core.policy_inputs(batch, "reinforce")  # [B, T] each; the batch is only read
    pg = surrogate(logprobs, adv)  # ← −A·log π, no ratio, no clip
    total, metrics = core.finish_loss(pg, logprobs, batch, cfg, norm, entropy, "reinforce")
    never = torch.zeros_like(mask, dtype=torch.bool)
    metrics.update(core.ratio_metrics(logprobs, old, mask, never))
    return total, metrics
