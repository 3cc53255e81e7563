"""Dr. GRPO = GRPO with two divisions removed: no /σ_G in the advantage, no /|y_i| in the loss.

Liu et al., "Understanding R1-Zero-like training", arXiv 2503.20783 (docs/algorithms.md §12).
Dividing by the group std up-weights prompts that are nearly always right or wrong (a
question-difficulty bias); dividing each sequence by its own length gives the tokens of short
responses more gradient than those of long ones (a length bias: with A = 0.5, a 10-token
response gets 0.05 per token and a 200-token one 0.0025, SEED row 33). Dr. GRPO keeps GRPO's
code and flips two switches:

    A_i = R_i − μ_G                                            scale_by_std = False
    L = (1/(N·L_max)) Σ_i Σ_t −min(r A_i, clip(r) A_i)         seq-mean-token-sum-norm

L_max is the generation budget, a constant (`norm["max_len"]`, which the trainer sets to
`max_new_tokens`), so every token of every response gets the same weight A/(N·L_max).

Deviations from the paper, each a config value unless stated:
1. The paper drops the KL term (β = 0); so does the default here (`kl_coef = 0`), a third
   default changed from GRPO's, not part of the method.
2. N counts sequences with at least one loss token (as verl); TRL uses the local batch size.
3. Everything else is GRPO's (grpo.py): symmetric clip ε = 0.2, optional dual clip and
   entropy bonus, degenerate groups at exactly 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.algorithms import grpo


@dataclass
class Config(grpo.Config):
    name: str = "dr_grpo"
    scale_by_std: bool = False  # ← switch 1: A = R − μ_G (no difficulty reweighting)
    aggregation: str = "seq-mean-token-sum-norm"  # ← switch 2: Σ/(N·L_max), a constant, not 1/|y_i|
    kl_coef: float = 0.0  # the paper trains without the KL term (β = 0)


needs_reference = grpo.needs_reference
advantages = grpo.advantages
loss = grpo.loss
