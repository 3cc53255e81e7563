"""Role 2, the reference: a frozen copy of the starting policy that scores tokens for the KL term.

Frozen by construction: a deep copy with `requires_grad_(False)`, in eval mode, never handed
to an optimizer. It is built only when an algorithm needs it (a KL coefficient > 0, or a
metric such as `kl/ref` that was asked for); otherwise the controller passes None.
"""

from __future__ import annotations

import copy

import torch

from posttrain.framework.trainer import score_logprobs


class Reference:
    def __init__(self, policy: torch.nn.Module, temperature: float = 1.0):
        self.model = copy.deepcopy(policy).eval().requires_grad_(False)
        self.temperature = temperature

    def score(self, batch: dict, micro_batch_tokens: int = 16384) -> torch.Tensor:
        """ref_logprobs [B, T], zero where loss_mask is 0 (the same convention as old_logprobs)."""
        return score_logprobs(self.model, batch, self.temperature, micro_batch_tokens)
