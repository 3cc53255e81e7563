"""GRPO = PPO with the critic replaced by a group-normalised advantage, A_i = (R_i − μ_G)/(σ_G + ε).

Shao et al., DeepSeekMath, arXiv 2402.03300 (docs/algorithms.md §11). Sample G responses per
prompt, score them, and use the group's own statistics as the baseline: no value head, no
GAE. The policy loss is PPO's clipped surrogate on the per-token ratio, and the KL to the
reference policy sits in the loss (k3, β = 0.04), added per token before aggregation:

    ℓ_{i,t} = −min(r_{i,t} A_i, clip(r_{i,t}, 1−ε, 1+ε) A_i) + β·k3_{i,t}
    L = (1/G) Σ_i (1/|y_i|) Σ_t ℓ_{i,t}                       (seq-mean-token-mean)

Deviations from the paper, each a config value unless stated:
1. Group std: `std="unbiased"` (÷(n−1), as torch, TRL and verl) by default; the paper does not
   say, and the course's tables use `"population"` (÷n). ε = 1e-6 as verl (TRL uses 1e-4).
2. Degenerate groups (all rewards equal, singletons included) get an advantage of exactly 0
   (verl gives a singleton std 1, i.e. A = R). Not a switch: they carry no relative signal.
3. The clip may be asymmetric (`eps_low`, `eps_high`, DAPO's clip-higher) and dual-clipped
   (`dual_clip`, Ye et al. 2019); the defaults are the paper's symmetric ε = 0.2, no dual clip.
4. Numerics: the log-ratio and k3's log-ratio are clamped to ±20 before exp (as verl).
5. An optional entropy bonus (`entropy_coef`, 0 = paper), subtracted per token before
   aggregation with the same mode, as verl does (TRL always token-means it).
6. `aggregation` is a named mode; sequences with no loss token are not counted in the mean.
7. Outcome supervision only: the process-supervision advantage (sum of normalised future
   step rewards) is not implemented. Reward and advantage are per response.
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


@dataclass
class Config(AlgoConfig):
    name: str = "grpo"
    eps_low: float = 0.2  # clip r below at 1 − eps_low (paper ε = 0.2)
    eps_high: float = 0.2  # clip r above at 1 + eps_high; larger (DAPO 0.28) lets rare tokens grow
    kl_coef: float = 0.04  # β of the KL term in the loss (paper 0.04, R1 0.001); 0 = no reference model
    kl_estimator: str = "k3"  # k1 | k2 | k3 per-token KL; k3 is the paper's D_{i,t} (unbiased, ≥ 0)
    std: str = "unbiased"  # group std: unbiased ÷(n−1) (torch/TRL/verl) | population ÷n (course tables)
    scale_by_std: bool = True  # divide by σ_G + adv_eps; False = Dr. GRPO (no difficulty reweighting)
    adv_eps: float = 1e-6  # added to σ_G (verl 1e-6, TRL 1e-4); bounds A when σ_G is tiny but non-zero
    aggregation: str = "seq-mean-token-mean"  # core.AGGREGATIONS; paper: token mean per sequence, then mean
    entropy_coef: float = 0.0  # entropy bonus: loss −= coef·H per token (0 = paper); more exploration
    dual_clip: float | None = None  # c > 1 caps the loss of A < 0 tokens at c·|A| (Ye et al.: 3); None = off

    def __post_init__(self):
        if self.aggregation not in core.AGGREGATIONS:
            raise UsageError(f"aggregation={self.aggregation!r} is unknown; valid: {', '.join(core.AGGREGATIONS)}")
        if self.kl_estimator not in core.KL_ESTIMATORS:
            raise UsageError(f"kl_estimator={self.kl_estimator!r} is unknown; valid: {', '.join(core.KL_ESTIMATORS)}")
        if self.std not in core.STD_MODES:
            raise UsageError(f"std={self.std!r} is unknown; valid: {', '.join(core.STD_MODES)}")
        if self.eps_low < 0 or self.eps_high < 0 or self.eps_low >= 1:
            raise UsageError(f"clip range needs 0 ≤ eps_low < 1 and eps_high ≥ 0 (got {self.eps_low}, {self.eps_high})")
        if self.kl_coef < 0 or self.adv_eps < 0:
            raise UsageError(f"kl_coef and adv_eps must be ≥ 0 (got {self.kl_coef}, {self.adv_eps})")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise UsageError(f"dual_clip must be > 1 or None (got {self.dual_clip}); the paper uses 3")


def needs_reference(cfg: Config) -> bool:
    """The reference model is loaded only when the KL term is on."""
    return cfg.kl_coef > 0


def advantages(rewards: torch.Tensor, group_index: torch.Tensor, cfg: Config, **kw) -> torch.Tensor:
    """Group-normalised outcome advantage [B] (broadcast over response tokens by the caller).

    rewards [B] float (an integer tensor is cast), group_index [B] long (samples of one prompt share an index).
    """
    rewards = core.float_rewards(rewards)
    mean, std, _ = core.group_stats(rewards, group_index, cfg.std)  # [B] each
    adv = rewards - mean  # ← the group baseline replaces V(s)
    if cfg.scale_by_std:
        # degenerate groups have adv = 0 and std = 0 exactly (core.group_stats): keep 0, even with adv_eps = 0
        adv = torch.where(std > 0, adv / (std + cfg.adv_eps), torch.zeros_like(adv))
    return adv


def loss(logprobs: torch.Tensor, batch: RolloutBatch, cfg: Config, norm: dict, entropy: torch.Tensor | None = None):
    """GRPO loss of a (micro-)batch, normalised by the whole batch's `norm` (core.batch_norm).

    logprobs [B, T]: log π_θ of the batch tokens, with gradient. batch: `loss_mask`,
    `old_logprobs`, `advantages` ([B, T], or [B] and broadcast here), `ref_logprobs` when
    kl_coef > 0 (if present with kl_coef = 0 it is still measured). entropy [B, T] | None.
    Returns (loss scalar, metrics): `loss/policy` (the clipped-surrogate part, scaled so the
    trainer's token-weighted mean over micro-batches is the batch value), `clip/frac`,
    `ratio/mean`, `ratio/max`, and `kl/ref`, `entropy` (masked means) when available.
    """
    mask, old, adv = core.policy_inputs(batch, "grpo")  # [B, T] each; the batch is only read
    pg, clipped = core.ppo_clip_loss(logprobs, old, adv, cfg.eps_low, cfg.eps_high, cfg.dual_clip)  # [B, T]
    # ← β·k3 per token before aggregation, then the entropy bonus: core.finish_loss
    total, metrics = core.finish_loss(pg, logprobs, batch, cfg, norm, entropy, who="grpo")
    metrics.update(core.ratio_metrics(logprobs, old, mask, clipped))
    return total, metrics
