"""GSPO = GRPO with the ratio and its clip taken per sequence: s_i = exp(mean_t log r_{i,t}).

Zheng et al. (Qwen), arXiv 2507.18071 (docs/algorithms.md §14). A per-token ratio is a one-sample
estimate whose noise grows with length; the reward is given to the whole sequence, so GSPO
weighs and clips the whole sequence with the length-normalised likelihood ratio

    s_i = (π_θ(y_i|x) / π_old(y_i|x))^{1/|y_i|} = exp((1/|y_i|) Σ_t log r_{i,t})
    ℓ_i = −min(s_i A_i, clip(s_i, 1−ε_low, 1+ε_high) A_i)            ε = 3e-4 / 4e-4
    L = (1/N) Σ_i ℓ_i

`variant="token"` is GSPO-token: s_{i,t} = sg(s_i)·π_θ(y_{i,t})/sg(π_θ(y_{i,t})), whose value is
s_i and whose gradient is s_i·∇log π_θ(y_{i,t}); it admits per-token advantages A_{i,t} and
equals GSPO when A_{i,t} = A_i under seq-mean-token-mean (the verl `gspo` loss is this form).

Deviations from the paper, each a config value unless stated:
1. The sequence loss ℓ_i is written on every token of the row and aggregated by the named
   mode; the default seq-mean-token-mean gives the paper's (1/N) Σ_i ℓ_i exactly. Other modes
   weigh sequences differently (token-mean weighs ℓ_i by |y_i|, as LUSPO).
2. The sequence log-ratio is clamped to ±20 before exp (core.ppo_clip_loss); verl clamps at 10.
3. No KL by default (`kl_coef = 0`, the paper's β = 0); when on it is GRPO's per-token term.
4. Advantage, optional dual clip (applied to s_i) and entropy bonus are GRPO's (grpo.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from posttrain.algorithms import core, grpo
from posttrain.errors import UsageError

if TYPE_CHECKING:
    from posttrain.framework.batch import RolloutBatch

VARIANTS = ("sequence", "token")


@dataclass
class Config(grpo.Config):
    name: str = "gspo"
    eps_low: float = 3e-4  # clip s_i below at 1 − 3e-4 (paper); s_i moves far less than a token ratio
    eps_high: float = 4e-4  # sequence-ratio clip above at 1 + 4e-4 (paper)
    kl_coef: float = 0.0  # the paper trains without the KL term (β = 0)
    variant: str = "sequence"  # sequence: GSPO, one ratio per response | token: GSPO-token (per-token A)

    def __post_init__(self):
        super().__post_init__()
        if self.variant not in VARIANTS:
            raise UsageError(f"gspo: variant={self.variant!r} is unknown; valid: {', '.join(VARIANTS)}")


needs_reference = grpo.needs_reference
advantages = grpo.advantages


def sequence_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, loss_mask: torch.Tensor, variant: str = "sequence"
) -> torch.Tensor:
    """log s_i written on every token [B, T]: the masked mean of log r over the row.
    variant="token" keeps the value but routes the gradient to each token alone:
    log s_{i,t} = log π_θ(y_t) − sg(log π_θ(y_t)) + sg(log s_i)."""
    log_s = core.masked_mean(logprobs - old_logprobs, loss_mask, dim=-1).unsqueeze(-1)  # [B, 1]
    if variant == "token":
        return logprobs - logprobs.detach() + log_s.detach()  # [B, T]
    return log_s.expand_as(logprobs)  # [B, T]


def loss(logprobs: torch.Tensor, batch: RolloutBatch, cfg: Config, norm: dict, entropy: torch.Tensor | None = None):
    """GSPO loss of a (micro-)batch; batch and metrics as grpo.loss, except that `ratio/*` and
    `clip/frac` describe the sequence ratio s_i (token-weighted)."""
    mask, old, adv = core.policy_inputs(batch, "gspo")  # [B, T] each; the batch is only read
    log_s = sequence_log_ratio(logprobs, old, mask, cfg.variant)  # [B, T]
    zero = torch.zeros_like(log_s)
    pg, clipped = core.ppo_clip_loss(log_s, zero, adv, cfg.eps_low, cfg.eps_high, cfg.dual_clip)  # ← clip s_i, not r_t
    total, metrics = core.finish_loss(pg, logprobs, batch, cfg, norm, entropy, "gspo")
    metrics.update(core.ratio_metrics(log_s, zero, mask, clipped))
    return total, metrics
