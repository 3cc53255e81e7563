"""REINFORCE++ = PPO without the critic: A = batch-whitened reward-to-go of (R at the end − β·KL_t).

The loss is GRPO's PPO clip; the advantage has no critic and no group baseline: the per-token
reward-to-go of (R at the last token − β·KL_t), z-scored over all loss tokens of the batch.

Hu et al., arXiv 2501.03262; OpenRLHF is the reference (docs/algorithms.md §9). Two estimators:

    REINFORCE++            r_t = R·1[t = last] − β·k1_t,  k1_t = log π_old(y_t) − log π_ref(y_t)
                           G_t = Σ_{s ≥ t} γ^{s−t} r_s   over loss tokens        A = whiten(G)
    REINFORCE++-baseline   A = whiten(R_i − μ_G)  (the scalar broadcast to its tokens)   `baseline=True`

whiten() is a token-level z-score over the WHOLE batch (core.masked_whiten: unbiased
variance, eps inside the root, as verl/OpenRLHF), so a long response weighs more in the
statistics. The KL sits in the reward, is not differentiated, and reaches every earlier
token's advantage through G_t. The loss is GRPO's (grpo.loss): PPO clip ε = 0.2, token-mean.

Deviations from the paper, each a config value unless stated:
1. `reward_kl_coef=None` means β = 0.01 for REINFORCE++ (OpenRLHF `init_coef`) and 0 for
   -baseline, whose OpenRLHF scripts put a k2 KL in the loss instead (`kl_coef` 1e-5–1e-4,
   `kl_estimator="k2"`, the default estimator here). If β > 0 with -baseline, the row's total
   Σ_t r_t is the score that is centred (as verl `reinforce_plus_plus_baseline`).
2. Observation tokens (loss_mask 0 inside a response) are skipped by the reward-to-go: they get
   G = 0 and do not count a discount step (as verl multi-turn).
3. The whitening shift applies to -baseline too: in a batch that mixes groups, a group of
   equal rewards gets the common value −mean/std, not 0 (OpenRLHF/verl do the same). A batch
   whose tokens all hold one value gets exactly 0.
4. No adaptive KL controller: β is fixed.
5. A singleton group (one sample of its prompt) has R − μ_G = 0 under -baseline, as in
   OpenRLHF (each sample minus its prompt's mean); verl's `reinforce_plus_plus_baseline` takes
   a singleton's mean as 0 and leaves it R. Either way whitening then shifts it with the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from posttrain.algorithms import core, grpo
from posttrain.errors import UsageError

if TYPE_CHECKING:
    from posttrain.framework.batch import RolloutBatch


@dataclass
class Config(grpo.Config):
    name: str = "reinforce_pp"
    aggregation: str = "token-mean"  # core.AGGREGATIONS; the paper's (OpenRLHF's) token-mean
    kl_coef: float = 0.0  # β of a KL in the LOSS (the -baseline recipe: 1e-5..1e-4 with k2); 0 = off
    kl_estimator: str = "k2"  # estimator of that loss KL; k2's gradient is the reverse-KL gradient (OpenRLHF scripts)
    adv_eps: float = 1e-8  # whitening: A = (G − mean)/√(var + adv_eps), as verl masked_whiten
    baseline: bool = False  # False: REINFORCE++ (reward-to-go) | True: REINFORCE++-baseline (R − μ_G)
    reward_kl_coef: float | None = None  # β of the k1 KL in the REWARD; None = 0.01 (plain) / 0 (-baseline)
    gamma: float = 1.0  # discount of the reward-to-go over loss tokens (1 in practice for LLMs)

    def __post_init__(self):
        super().__post_init__()
        if self.reward_kl_coef is not None and self.reward_kl_coef < 0:
            raise UsageError(f"reinforce_pp: reward_kl_coef must be ≥ 0 or None (got {self.reward_kl_coef})")
        if not 0.0 <= self.gamma <= 1.0:
            raise UsageError(f"reinforce_pp: gamma must be in [0, 1] (got {self.gamma})")


def reward_kl(cfg: Config) -> float:
    """The β of the KL in the reward, with the variant's default resolved."""
    if cfg.reward_kl_coef is not None:
        return cfg.reward_kl_coef
    return 0.0 if cfg.baseline else 0.01


def needs_reference(cfg: Config) -> bool:
    """A reference is needed for the KL in the reward (default for REINFORCE++) or in the loss."""
    return cfg.kl_coef > 0 or reward_kl(cfg) > 0


def token_rewards(
    rewards: torch.Tensor, loss_mask: torch.Tensor, kl_tok: torch.Tensor | None = None, beta: float = 0.0
) -> torch.Tensor:
    """r_t = R at the last loss token of each row − β·KL_t on loss tokens, 0 elsewhere [B, T]."""
    B, T = loss_mask.shape
    on = loss_mask != 0
    cols = torch.arange(T, device=loss_mask.device).expand(B, T)
    last = torch.where(on, cols, torch.full_like(cols, -1)).max(-1).values  # [B]  -1: no loss token
    out = torch.zeros(B, T, dtype=rewards.dtype, device=rewards.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = rewards[rows]  # ← the outcome reward on the last token
    if kl_tok is not None and beta > 0:
        out = out - beta * torch.where(on, kl_tok.to(out.dtype), torch.zeros_like(out))
    return out


def returns(token_rewards: torch.Tensor, loss_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Reward-to-go G_t = r_t + γ·G_next over loss tokens only [B, T]; 0 where loss_mask is 0.
    A masked position neither receives a return nor counts a discount step."""
    on = loss_mask != 0
    running = torch.zeros_like(token_rewards[:, 0])  # [B]
    out = torch.zeros_like(token_rewards)
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        running = torch.where(on[:, t], token_rewards[:, t] + gamma * running, running)
        out[:, t] = torch.where(on[:, t], running, torch.zeros_like(running))
    return out


def advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, cfg: Config, batch: RolloutBatch | None = None, **kw
) -> torch.Tensor:
    """Whitened token advantages [B, T] (0 off the loss mask). `batch` must hold loss_mask, and
    old_logprobs + ref_logprobs when the reward carries a KL."""
    if batch is None:
        raise UsageError("reinforce_pp: advantages need the batch (loss_mask, old/ref logprobs): batch=...")
    rewards = core.float_rewards(rewards)
    mask = batch.loss_mask  # [B, T]
    beta = reward_kl(cfg)
    kl_tok = None
    if beta > 0:
        if batch.ref_logprobs is None or batch.old_logprobs is None:
            raise UsageError("reinforce_pp: a KL in the reward needs batch['ref_logprobs']; or set reward_kl_coef=0")
        kl_tok = core.kl(batch.old_logprobs, batch.ref_logprobs, "k1")  # [B, T]  behaviour policy vs reference
    r_tok = token_rewards(rewards, mask, kl_tok, beta)  # [B, T]
    if cfg.baseline:
        score = core.masked_sum(r_tok, mask, dim=-1)  # [B]  R − β Σ_t KL_t
        mean, _, _ = core.group_stats(score, group_index, cfg.std)
        raw = core.broadcast(score - mean, mask)  # ← REINFORCE++-baseline: R − μ_G
    else:
        raw = returns(r_tok, mask, cfg.gamma)  # ← REINFORCE++: reward-to-go
    return core.masked_whiten(raw, mask, cfg.std, cfg.adv_eps, cfg.scale_by_std)  # over the whole batch


loss = grpo.loss
