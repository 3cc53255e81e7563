"""PPO = REINFORCE with a learned critic V(s) as the baseline, GAE advantages and the clipped surrogate.

Schulman et al., arXiv 1707.06347, in its LLM form (Ziegler et al. 1909.08593, InstructGPT
2203.02155; docs/algorithms.md §10). A value head predicts V(s_t) for every response token; the
per-token reward is the task reward on the last response token minus β·KL_t (the KL in the
reward), and GAE turns rewards and values into per-token advantages:

    r_t = R·1[t = last] − β·k1_t,     k1_t = log π_old(y_t) − log π_ref(y_t)     (kl_in="reward")
    δ_t = r_t + γ·V_old(s_{t+1}) − V_old(s_t)           V after the last token = 0 (terminal)
    A_t = Σ_l (γλ)^l δ_{t+l},   G_t = A_t + V_old(s_t),   then A ← whiten(A) over the batch's tokens

    ℓ_t = −min(r_t A_t, clip(r_t, 1−ε_low, 1+ε_high) A_t)               (the PPO clip, core.ppo_clip_loss)
        + vf_coef · ½·max((V_t − G_t)², (clip(V_t, V_old±ε_v) − G_t)²)   (clipped value loss)
    L = Agg(ℓ)                                                            (token-mean by default)

`values` (V_old) come from the critic at rollout time (the controller asks the trainer's critic
before ❻); `new_values` (V_t, with gradient) come from the same forward as the logprobs (the
trainer's policy_loss_fn). The critic is a value head on the policy trunk (`critic="shared"`)
or on a separate copy of the starting model (`"separate"`); see models/heads.py.

Deviations from the paper, each a config value unless stated:
1. LLM defaults (TRL): γ = 1, λ = 0.95, vf_coef = 0.1, value clip ε_v = 0.2, kl_coef 0.05 with
   the k1 KL in the reward measured on the BEHAVIOUR logprobs (as verl/TRL, docs/algorithms.md §3).
   The paper's γ = 0.99, c1 = 1 and 3–10 epochs are config (`epochs`, `minibatches` of the run).
2. `kl_in="loss"` moves the KL into the loss instead (β·KL_t per token before aggregation, the
   GRPO way, differentiated); the KL is then not part of the reward. No adaptive KL controller.
3. Advantages are whitened (`whiten_advantages`) over all loss tokens of the whole batch
   (core.masked_whiten: unbiased variance, eps inside the root, as verl); returns use the raw A.
4. The end of a response is terminal, truncated ones included (no bootstrap from V at the cap).
   Observation tokens (loss_mask 0 inside a response) are skipped by GAE: they neither count a
   discount step nor carry a value (verl multi-turn).
5. Optional dual clip (`dual_clip`, Ye et al. 2019), asymmetric clip range, entropy bonus
   (`entropy_coef`, TRL/verl default 0 rather than the paper's Atari 0.01); the log-ratio is
   clamped to ±20 before exp (verl).
6. The value loss uses the same aggregation mode as the policy loss (verl's `loss_agg_mode`),
   and the two are summed into one loss under one optimizer and one gradient clip (a separate
   critic has no optimizer of its own).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from posttrain.algorithms import core
from posttrain.algorithms.base import AlgoConfig
from posttrain.algorithms.reinforce_pp import token_rewards  # R on the last token − β·KL_t (shared)
from posttrain.errors import UsageError

if TYPE_CHECKING:
    from posttrain.framework.batch import RolloutBatch

KL_PLACES = ("reward", "loss")
CRITICS = ("shared", "separate")


@dataclass
class Config(AlgoConfig):
    name: str = "ppo"
    eps_low: float = 0.2  # clip r below at 1 − eps_low (paper ε = 0.2)
    eps_high: float = 0.2  # clip r above at 1 + eps_high (0.28 = DAPO's clip-higher)
    dual_clip: float | None = None  # c > 1 caps the loss of A < 0 tokens at c·|A| (Ye et al.: 3); None = off
    gamma: float = 1.0  # discount per response token; 1 for LLMs (TRL, verl), paper 0.99
    lam: float = 0.95  # GAE λ: 1 = Monte-Carlo returns (unbiased, noisy), 0 = one-step TD (biased by V)
    vf_coef: float = 0.1  # weight of the value loss in the summed loss (TRL 0.1, paper c1 = 1)
    value_clip: float | None = 0.2  # ε_v: V moves at most ±ε_v from V_old before its loss stops pulling; None = off
    whiten_advantages: bool = True  # z-score A over the batch's loss tokens (stable step size across reward scales)
    kl_coef: float = 0.05  # β of the KL to the reference (TRL 0.05, InstructGPT 0.02); 0 = no reference
    kl_in: str = "reward"  # reward: −β·KL_t in the token rewards (InstructGPT) | loss: +β·KL_t (GRPO)
    kl_estimator: str = "k1"  # k1 | k2 | k3; k1 in the reward is the sequence KL's proper policy gradient
    critic: str = "shared"  # shared: head on the policy trunk | separate: copy of the start model (2× memory)
    aggregation: str = "token-mean"  # core.AGGREGATIONS, for the policy and the value loss alike (TRL/verl token mean)
    entropy_coef: float = 0.0  # entropy bonus: loss −= coef·H per token (TRL/verl 0); more exploration

    def __post_init__(self):
        core.check_config(self, "ppo")
        if self.eps_low < 0 or self.eps_high < 0 or self.eps_low >= 1:
            raise UsageError(
                f"ppo: clip range needs 0 ≤ eps_low < 1 and eps_high ≥ 0 (got {self.eps_low}, {self.eps_high})"
            )
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise UsageError(f"ppo: dual_clip must be > 1 or None (got {self.dual_clip}); the paper uses 3")
        if not (0.0 <= self.gamma <= 1.0 and 0.0 <= self.lam <= 1.0):
            raise UsageError(f"ppo: gamma and lam must be in [0, 1] (got {self.gamma}, {self.lam})")
        if self.vf_coef < 0 or (self.value_clip is not None and self.value_clip <= 0):
            raise UsageError(
                f"ppo: vf_coef must be ≥ 0 and value_clip > 0 or None (got {self.vf_coef}, {self.value_clip})"
            )
        if self.kl_in not in KL_PLACES:
            raise UsageError(f"ppo: kl_in={self.kl_in!r} is unknown; valid: {', '.join(KL_PLACES)}")
        if self.critic not in CRITICS:
            raise UsageError(f"ppo: critic={self.critic!r} is unknown; valid: {', '.join(CRITICS)}")


def needs_reference(cfg: Config) -> bool:
    """The reference model is loaded only when the KL term (in reward or loss) is on."""
    return cfg.kl_coef > 0


def needs_critic(cfg: Config) -> bool:
    """PPO always learns a value function: the trainer adds V to its forward, the controller
    records V_old before the advantages and `value_targets` beside them (framework/critic.py)."""
    return True


# ----------------------------------------------------------------------------- advantages


def gae(rewards: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor, gamma: float, lam: float):
    """Generalised advantage estimation over the loss tokens of each row (Schulman 1506.02438).

    rewards, values, loss_mask [B, T]. Returns (advantages [B, T], returns [B, T]), 0 off the mask:

        δ_t = r_t + γ·V_next − V_t,   A_t = δ_t + γλ·A_next,   G_t = A_t + V_t

    where "next" is the next LOSS token of the row (observation tokens are skipped: they count
    no discount step and their value is never read), and V_next = A_next = 0 after the last one.
    γ = λ = 1 gives the reward-to-go minus V; λ = 0 gives the one-step TD residual δ_t.
    """
    on = loss_mask != 0
    zero = torch.zeros_like(rewards[:, 0])  # [B]
    next_v, next_a = zero, zero
    adv = torch.zeros_like(rewards)
    for t in range(rewards.shape[1] - 1, -1, -1):
        v = torch.where(on[:, t], values[:, t], zero)  # a junk value off the mask never leaks
        delta = rewards[:, t] + gamma * next_v - v  # [B]  TD residual
        a = delta + gamma * lam * next_a  # ← the GAE recursion
        next_a = torch.where(on[:, t], a, next_a)
        next_v = torch.where(on[:, t], v, next_v)
        adv[:, t] = torch.where(on[:, t], a, zero)
    ret = torch.where(on, adv + torch.where(on, values, torch.zeros_like(values)), torch.zeros_like(adv))
    return adv, ret


def advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, cfg: Config, batch: RolloutBatch | None = None, **kw
) -> torch.Tensor:
    """GAE advantages [B, T] (whitened when `whiten_advantages`), 0 off the loss mask.

    `batch` must hold `loss_mask`, `values` (V_old [B, T], recorded by the controller before
    this call), and `old_logprobs` + `ref_logprobs` when the KL is in the reward. The value
    loss's target comes from `value_targets`; the batch is only read.
    group_index is unused: the critic, not the group, is the baseline.
    """
    adv, _, mask = _gae_of(rewards, batch, cfg)  # [B, T] each
    if cfg.whiten_advantages:
        adv = core.masked_whiten(adv, mask)  # over the whole batch's loss tokens
    return adv


def value_targets(rewards: torch.Tensor, batch: RolloutBatch, cfg: Config) -> torch.Tensor:
    """The value loss's target G = A + V_old [B, T] (GAE before whitening), 0 off the mask: the
    controller puts it in the batch as `returns`, next to the advantages (framework/critic.py)."""
    return _gae_of(rewards, batch, cfg)[1]  # [B, T]


def _gae_of(rewards: torch.Tensor, batch: RolloutBatch | None, cfg: Config):
    """(A, G, loss_mask) [B, T] of a batch: the token rewards (with the KL when it is in the
    reward) through gae()."""
    if batch is None or batch.values is None:
        raise UsageError(
            "ppo: advantages need batch=... with 'values' (V_old from the critic); "
            "run PPO through the controller, which records them, or add them yourself"
        )
    mask, values = batch.loss_mask, batch.values  # [B, T] each
    kl_tok, beta = None, 0.0
    if cfg.kl_in == "reward" and cfg.kl_coef > 0:
        if batch.ref_logprobs is None or batch.old_logprobs is None:
            raise UsageError("ppo: a KL in the reward needs batch['ref_logprobs']; load a reference or set kl_coef=0")
        kl_tok = core.kl(batch.old_logprobs, batch.ref_logprobs, cfg.kl_estimator)  # [B, T] behaviour vs ref
        beta = cfg.kl_coef
    r_tok = token_rewards(rewards.to(values.dtype), mask, kl_tok, beta)  # [B, T]
    adv, ret = gae(r_tok, values, mask, cfg.gamma, cfg.lam)  # [B, T] each
    return adv, ret, mask


# ----------------------------------------------------------------------------- loss


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float | None):
    """Per-token clipped value loss ½·max((V − G)², (clip(V, V_old − ε, V_old + ε) − G)²) [B, T].

    Like the PPO clip it is pessimistic: once V has moved more than ε from V_old AWAY from G's
    side, the clipped branch (constant in V) wins and the token stops pulling. Returns
    (loss [B, T], clipped [B, T] bool: the clipped branch strictly larger, gradient 0).
    clip=None is the plain ½(V − G)².
    """
    unclipped = (values - returns) ** 2  # [B, T]
    if clip is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    v_clip = old_values + (values - old_values).clamp(-clip, clip)  # [B, T]
    clipped_sq = (v_clip - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped_sq), (clipped_sq > unclipped).detach()


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 − Var(G − V)/Var(G) over loss tokens (CleanRL's diagnostic): 1 = V predicts the returns,
    0 = no better than their mean, < 0 = worse. 0 when the returns do not vary."""
    with torch.no_grad():

        def var(x):
            return core.masked_mean((x - core.masked_mean(x, mask)) ** 2, mask)

        vr = var(returns)
        return torch.where(
            vr > 0, 1 - var(returns - values) / torch.where(vr > 0, vr, torch.ones_like(vr)), torch.zeros_like(vr)
        )


def loss(logprobs: torch.Tensor, batch: RolloutBatch, cfg: Config, norm: dict, entropy: torch.Tensor | None = None):
    """PPO loss of a (micro-)batch, normalised by the whole batch's `norm` (core.batch_norm).

    logprobs [B, T] with gradient. batch: `loss_mask`, `old_logprobs`, `advantages`, `values`
    (V_old), `returns`, `new_values` (V with gradient, from the trainer's forward), and
    `ref_logprobs` when the KL is on. entropy [B, T] | None.
    Returns (loss, metrics): `loss/policy`, `loss/value` (½·Agg of the clipped value loss before
    vf_coef; both scaled for the trainer's token-weighted mean), `value/mean`,
    `value/explained_variance` (per micro-batch, exact with one), `value/clip_frac`,
    `clip/frac`, `ratio/mean`, `ratio/max`, and `kl/ref`, `entropy` when available.
    """
    new_values, values, returns = batch.new_values, batch.values, batch.returns
    if new_values is None:
        raise UsageError(
            "ppo: the loss needs batch['new_values'] from the critic; train through "
            "framework.trainer.policy_loss_fn with a models.heads.ActorCritic model"
        )
    if values is None or returns is None:
        raise UsageError(
            "ppo: the loss needs batch.values and batch.returns (the controller's critic hook "
            "and ppo.value_targets give them)"
        )
    mask, old, adv = core.policy_inputs(batch, "ppo")  # [B, T] each; the batch is only read
    pg, clipped = core.ppo_clip_loss(logprobs, old, adv, cfg.eps_low, cfg.eps_high, cfg.dual_clip)  # [B, T]
    # KL in the reward: already in the advantages, so the loss only measures it (kl/ref)
    tail_cfg = cfg if cfg.kl_in == "loss" else dataclasses.replace(cfg, kl_coef=0.0)
    total, metrics = core.finish_loss(pg, logprobs, batch, tail_cfg, norm, entropy, who="ppo")
    metrics.update(core.ratio_metrics(logprobs, old, mask, clipped))

    v_new = core.on_mask(new_values, mask)  # [B, T] with gradient, 0 off the mask
    vf, v_clipped = value_loss(v_new, core.on_mask(values, mask), core.on_mask(returns, mask), cfg.value_clip)  # [B, T]
    v_loss = core.aggregate(vf, mask, cfg.aggregation, norm)  # ← the critic's loss, same mode
    total = total + cfg.vf_coef * v_loss
    metrics.update(
        {
            "loss/value": core.as_token_weighted(v_loss, mask, norm),
            "value/mean": core.masked_mean(v_new.detach(), mask),
            "value/explained_variance": explained_variance(v_new.detach(), returns, mask),
            "value/clip_frac": core.masked_mean(v_clipped.to(mask.dtype), mask),
        }
    )
    return total, metrics
