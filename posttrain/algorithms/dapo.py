"""DAPO = GRPO + four switches: clip-higher, dynamic sampling, token-mean loss, overlong shaping.

Yu et al., arXiv 2503.14476 (docs/algorithms.md §13). Each fix is one switch:

1. Clip-higher: ε_low = 0.2, ε_high = 0.28 (`eps_high`). A rare token may grow further before
   the clip stops it, which keeps entropy from collapsing.
2. Dynamic sampling (`dynamic_sampling`): a group whose raw rewards are all equal carries no
   relative signal; the paper discards it and samples more prompts until the batch is full.
   The refill is the controller's job (run config `degenerate=resample`, which also drops such
   groups); here, the flag gives those groups an advantage of exactly 0 even when overlong
   shaping made their shaped rewards differ, so a group that slipped through trains nothing.
3. Token-level loss (`aggregation = "token-mean"`): Σ_{i,t} ℓ / Σ_i |y_i| over the whole batch,
   so every token weighs the same, whatever the length of its response.
4. Overlong soft punishment (`overlong_buffer`, `max_len`): with L_thr = max_len − buffer,

       R_i ← R_i − factor · max(0, min(1, (|y_i| − L_thr)/(max_len − L_thr)))

   a linear ramp from 0 at L_thr to −1 at max_len (SEED row 29; TRL `get_soft_overlong_punishment`,
   verl's DAPO reward manager). Also "overlong filtering" (`mask_truncated`): responses cut
   by the length cap get zero loss.

Deviations from the paper, each a config value unless stated:
1. Overlong shaping is off by default (`overlong_buffer = 0`): max_len must be this run's
   generation cap (paper 20,480 with buffer 4,096). |y_i| is the number of loss tokens of the
   row (Σ_t loss_mask), which is the response length unless tool tokens are masked.
2. `mask_truncated` (default off, the paper's final recipe shapes instead) reads a
   `truncated` [B] bool tensor from the batch when present. The truncated rows' tokens still
   count in the batch normaliser (`norm`, computed by the trainer before the split), where
   TRL removes them; the other rows' per-token weight is unchanged by the flag.
3. Dynamic sampling zeroes advantages instead of dropping the group; with a KL or entropy
   term on, those rows still receive that term (both are off by default, as the paper).
4. Everything else is GRPO's (grpo.py): group std unbiased + 1e-6, optional dual clip
   (the verl recipe uses clip_ratio_c = 10).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from posttrain.algorithms import core, grpo
from posttrain.errors import UsageError

if TYPE_CHECKING:
    from posttrain.framework.batch import RolloutBatch


@dataclass
class Config(grpo.Config):
    name: str = "dapo"
    eps_high: float = 0.28  # ← fix 1, clip-higher: upper clip 1.28 (lower stays 0.8)
    aggregation: str = "token-mean"  # ← fix 3, token-level loss over the whole batch
    kl_coef: float = 0.0  # the paper trains without the KL term (β = 0)
    dynamic_sampling: bool = True  # ← fix 2: all-equal raw rewards → A = 0 (the refill: degenerate=resample)
    overlong_buffer: int = 0  # ← fix 4: L_cache, the ramp before max_len; 0 = no shaping (paper 4096)
    max_len: int = 0  # L_max, the generation cap where the ramp reaches −1 (paper 20480)
    overlong_penalty_factor: float = 1.0  # scale of the penalty (verl penalty_factor); 1 = −1 at max_len
    mask_truncated: bool = False  # overlong filtering: rows with batch['truncated'] get zero loss (TRL)

    def __post_init__(self):
        super().__post_init__()
        if self.overlong_buffer < 0 or self.max_len < 0 or self.overlong_penalty_factor < 0:
            raise UsageError("dapo: overlong_buffer, max_len and overlong_penalty_factor must be ≥ 0")
        if self.overlong_buffer > 0 and self.max_len < self.overlong_buffer:
            raise UsageError(
                f"dapo: overlong_buffer={self.overlong_buffer} needs max_len ≥ it (the generation "
                f"cap, e.g. max_new_tokens); got max_len={self.max_len}"
            )


needs_reference = grpo.needs_reference


def overlong_penalty(lengths: torch.Tensor, max_len: float, buffer: float) -> torch.Tensor:
    """−max(0, min(1, (L − L_thr)/(max_len − L_thr))) with L_thr = max_len − buffer [B].
    0 up to L_thr, −1 at and beyond max_len (100/20: 50 → 0, 90 → −0.5, 110 → −1)."""
    threshold = max_len - buffer
    return -((lengths - threshold) / buffer).clamp(0.0, 1.0)


def degenerate(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """[B] bool: the sample's group has all-equal rewards (singletons included). At accuracy p
    and G samples a group is degenerate with probability p^G + (1−p)^G (0.66 at p=0.9, G=4)."""
    _, std, _ = core.group_stats(rewards, group_index)  # exactly 0 for equal rewards
    return std == 0


def advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, cfg: Config, batch: RolloutBatch | None = None, **kw
) -> torch.Tensor:
    """GRPO advantage [B] of the length-shaped reward; `batch` (loss_mask) gives the lengths."""
    rewards = core.float_rewards(rewards)
    shaped = rewards
    if cfg.overlong_buffer > 0:
        if batch is None:
            raise UsageError("dapo: overlong shaping needs the batch (loss_mask) in advantages(batch=...)")
        lengths = batch.loss_mask.sum(-1).to(rewards.dtype)  # [B] |y_i|
        shaped = rewards + cfg.overlong_penalty_factor * overlong_penalty(lengths, cfg.max_len, cfg.overlong_buffer)
    adv = grpo.advantages(shaped, group_index, cfg)  # [B]
    if cfg.dynamic_sampling:
        adv = torch.where(degenerate(rewards, group_index), torch.zeros_like(adv), adv)
    return adv


def loss(logprobs: torch.Tensor, batch: RolloutBatch, cfg: Config, norm: dict, entropy: torch.Tensor | None = None):
    """GRPO's loss (grpo.loss) with DAPO's clip and aggregation; with `mask_truncated`, rows
    flagged in batch.truncated leave the loss mask (zero loss, zero gradient) of a new batch."""
    truncated = batch.truncated
    if not (cfg.mask_truncated and truncated is not None):
        return grpo.loss(logprobs, batch, cfg, norm, entropy)
    full = batch.loss_mask
    kept = full * (~truncated.bool()).unsqueeze(-1).to(full.dtype)  # [B, T]
    total, metrics = grpo.loss(logprobs, dataclasses.replace(batch, loss_mask=kept), cfg, norm, entropy)
    # loss/policy is scaled by kept tokens; the trainer weighs it by all of the row's tokens
    n_full, n_kept = float(full.sum()), float(kept.sum())
    metrics["loss/policy"] = metrics["loss/policy"] * (n_kept / n_full if n_full > 0 else 0.0)
    metrics["dapo/truncated_token_frac"] = (full - kept).sum() / n_full if n_full > 0 else full.sum() * 0.0
    return total, metrics
