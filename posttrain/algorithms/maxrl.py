"""MaxRL = GRPO with the advantage divided by the pass rate p̂, not σ_G: A = (R − p̂)/p̂ (0 if p̂ = 0).

Tajwar, Zeng, …, Zanette, "Maximum Likelihood Reinforcement Learning", arXiv 2602.02710
(docs/algorithms.md §16). RL maximises E_x[p(x)]; maximum likelihood maximises E_x[log p(x)],
whose gradient ∇p/p up-weights hard prompts by 1/p. With N rollouts and K successes,
(1/K) Σ_i r_i ∇log π(y_i) is unbiased for the gradient of the order-N truncation of log p;
subtracting the zero-mean control variate (1/N) Σ_i ∇log π(y_i) gives per-sample weights
r_i/K − 1/N = (r_i − p̂)/(N·p̂), i.e. the advantage above up to the constant 1/N. A prompt
with no success (p̂ = 0) has no gradient. The step is GRPO's (grpo.loss).

Population weights for comparison: RL w = 1, GRPO ≈ 1/√(p(1−p)), MaxRL (1 − (1−p)^N)/p → 1/p.

Deviations from the paper, each a config value unless stated:
1. p̂ is the group mean reward μ_G (the pass rate for 0/1 rewards, as the reference code's
   `maxrl` estimator); p̂ ≤ 0 gives A = 0. No ε in the denominator (the reference adds 1e-6),
   so the worked values are exact: r = [1, 0, 0, 0] gives [3, −1, −1, −1].
2. `scale_by_std=True` also divides by σ_G + adv_eps first: the reference repo's `misc`
   variant ((R − μ)/(σ + ε))/μ (it uses the population std and binarised rewards).
3. The paper is on-policy with one update per batch; the PPO clip (ε = 0.2) is inactive there.
   No KL by default (`kl_coef = 0`); the paper compares at equal settings with GRPO/RLOO.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrain.algorithms import core, grpo


@dataclass
class Config(grpo.Config):
    name: str = "maxrl"
    scale_by_std: bool = False  # False: (R − p̂)/p̂ (paper) | True: GRPO's advantage / p̂ (ref. repo's misc)
    kl_coef: float = 0.0  # no KL term by default (0 = no reference model)


needs_reference = grpo.needs_reference
loss = grpo.loss


def advantages(rewards: torch.Tensor, group_index: torch.Tensor, cfg: Config, **kw) -> torch.Tensor:
    """(R − p̂)/p̂ per sample [B]; 0 for groups with p̂ ≤ 0 and for equal-reward groups."""
    rewards = core.float_rewards(rewards)
    adv = grpo.advantages(rewards, group_index, cfg)  # R − μ_G  (or /σ_G with scale_by_std)
    p_hat, _, _ = core.group_stats(rewards, group_index, cfg.std)  # [B]  μ_G, the pass rate for 0/1 rewards
    ok = p_hat > 0
    return torch.where(ok, adv / torch.where(ok, p_hat, torch.ones_like(p_hat)), torch.zeros_like(adv))  # ← ÷ p̂
