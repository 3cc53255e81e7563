"""DPPO = GRPO with the ratio clip replaced by a TV / binary-KL trust-region mask on each token.

A token whose probability moved more than δ in its advantage's direction is masked; the rest
get a truncated-IS policy gradient −A·sg(min(r, C))·log π_θ.

Qi, Zhou, Liu, Pang, Du, Lin, Lee, "Rethinking the Trust Region in LLM RL", arXiv 2602.04879;
verl `dppo_tv` / `dppo_kl` (docs/algorithms.md §18). The ratio r = p/p_old is a poor proxy for how
far the policy moved: a rare token going from 0.001 to 0.003 has r = 3 yet moved nothing,
while 0.5 → 0.9 has r = 1.8 and moved a lot. DPPO measures the move on the binary
distribution {sampled token, everything else}, with p = π_θ(y_t), p_old = π_old(y_t):

    TV   D = p − p_old                                    (signed; |D| is the binary TV)
         keep = (A > 0 and D ≤ δ_high) or (A ≤ 0 and D ≥ −δ_low)
    KL   D = KL(Bern(p_old) ‖ Bern(p))                    (core.bernoulli_kl)
         keep = (A > 0 and (D ≤ δ_high or p ≤ p_old)) or (A ≤ 0 and (D ≤ δ_low or p ≥ p_old))
    ℓ_t = −A_t · sg(min(r_t, C)) · log π_θ(y_t) · keep_t   (reinforce.surrogate with a weight)

A token moving AGAINST its advantage is always kept, so the update can undo its own overshoot.

Deviations from the paper, each a config value unless stated:
1. The mask is computed against π_old (the training engine's behaviour log-probs, verl's
   choice); the Stable-RL repo defaults to the rollout engine's. Top-K divergences: not here.
2. δ defaults are the verl example's (TV 0.15, KL 0.05), same for both sides; the truncation
   C = `ratio_cap` defaults to 10000 (the example's, "large" as the paper recommends; verl's
   effective default is 3.0).
3. token-mean by default (the paper's; the verl example uses seq-mean-token-sum-norm).
4. `clip/frac` is the fraction of loss tokens masked by the trust region (gradient 0).
5. The advantage is GRPO's (grpo.advantages); optional per-token KL in the loss (`kl_coef`,
   0 = paper) and entropy bonus.
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

DIVERGENCES = ("tv", "kl")
DEFAULT_DELTA = {"tv": 0.15, "kl": 0.05}  # verl examples/dppo_trainer


@dataclass
class Config(AlgoConfig):
    name: str = "dppo"
    divergence: str = "tv"  # tv: |p − p_old| (binary total variation) | kl: binary KL(p_old ‖ p)
    delta_low: float | None = None  # bound on the move for A ≤ 0 tokens; None = 0.15 (tv) / 0.05 (kl)
    delta_high: float | None = None  # bound on the move for A > 0 tokens; None = 0.15 (tv) / 0.05 (kl)
    ratio_cap: float = 10000.0  # C of the truncated IS weight min(r, C); large = no truncation (paper §5.4)
    kl_coef: float = 0.0  # β of a per-token KL to the reference in the loss; 0 = paper (no reference model)
    kl_estimator: str = "k3"  # k1 | k2 | k3 (core.kl)
    std: str = "unbiased"  # GRPO advantage: group std ÷(n−1) | population ÷n
    scale_by_std: bool = True  # GRPO advantage: divide by σ_G + adv_eps (False = Dr. GRPO's R − μ_G)
    adv_eps: float = 1e-6  # GRPO advantage: added to σ_G (verl 1e-6, TRL 1e-4)
    aggregation: str = "token-mean"  # core.AGGREGATIONS; the paper's token-mean
    entropy_coef: float = 0.0  # entropy bonus: loss −= coef·H per token; 0 = the paper

    def __post_init__(self):
        core.check_config(self, "dppo")
        if self.divergence not in DIVERGENCES:
            raise UsageError(f"dppo: divergence={self.divergence!r} is unknown; valid: {', '.join(DIVERGENCES)}")
        for name in ("delta_low", "delta_high"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise UsageError(f"dppo: {name} must be ≥ 0 or None (got {value})")
        if self.ratio_cap <= 0:
            raise UsageError(f"dppo: ratio_cap must be > 0 (got {self.ratio_cap})")


def deltas(cfg: Config) -> tuple[float, float]:
    """(δ_low, δ_high) with the divergence's default filled in."""
    d = DEFAULT_DELTA[cfg.divergence]
    return (d if cfg.delta_low is None else cfg.delta_low, d if cfg.delta_high is None else cfg.delta_high)


needs_reference = reinforce.needs_reference
advantages = grpo.advantages


def trust_region(logprobs: torch.Tensor, old_logprobs: torch.Tensor, adv: torch.Tensor, cfg: Config) -> torch.Tensor:
    """keep [B, T] bool: the token's move p_old → p stays inside the region (or goes against A)."""
    low, high = deltas(cfg)
    p, p_old = logprobs.detach().exp(), old_logprobs.exp()  # [B, T]
    up = adv > 0
    if cfg.divergence == "tv":
        move = p - p_old
        return torch.where(up, move <= high, move >= -low)
    d = core.bernoulli_kl(p_old, p)  # [B, T]
    return torch.where(up, (d <= high) | (p <= p_old), (d <= low) | (p >= p_old))


def loss(logprobs: torch.Tensor, batch: RolloutBatch, cfg: Config, norm: dict, entropy: torch.Tensor | None = None):
    """DPPO loss of a (micro-)batch; batch and metrics as grpo.loss (`clip/frac`: tokens masked)."""
    mask, old, adv = core.policy_inputs(batch, "dppo")  # [B, T] each; the batch is only read
    keep = trust_region(logprobs, old, adv, cfg) & (mask != 0)  # ← the divergence mask replaces the clip
    ratio = core.importance_ratio(logprobs, old).detach()  # [B, T]
    weight = torch.where(keep, ratio.clamp(max=cfg.ratio_cap), torch.zeros_like(ratio))
    pg = reinforce.surrogate(logprobs, adv, weight)  # −A·sg(min(r, C)·keep)·log π
    total, metrics = core.finish_loss(pg, logprobs, batch, cfg, norm, entropy, "dppo")
    metrics.update(core.ratio_metrics(logprobs, old, mask, ~keep))
    return total, metrics
