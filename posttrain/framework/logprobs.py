"""Logprob scoring: how the trainer, the reference and every evaluation read a model's logprobs
of the tokens it was given (docs/architecture.md §3).

    logprobs[:, t] = log π(input_ids[:, t] | input_ids[:, :t])      position 0 holds 0

at the sampler's temperature (framework/rollout.token_logprobs, the same function the engine
records behaviour logprobs with), so that trainer and sampler agree to the bit in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from posttrain.algorithms.core import entropy_from_logits
from posttrain.framework.rollout import token_logprobs


def sequence_logprobs(model, input_ids: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False):
    """logprobs[:, t] = log π(input_ids[:, t] | input_ids[:, :t]) at the sampler's temperature.

    Position 0 has no prediction and holds 0. Returns (logprobs [B, T], entropy [B, T] | None).
    """
    return logits_logprobs(model(input_ids), input_ids, temperature, with_entropy)


def logits_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False
):
    """sequence_logprobs from logits [B, T, V] already computed (a forward that also gave values)."""
    logits = logits[:, :-1]  # [B, T-1, V]
    lp = token_logprobs(logits, input_ids[:, 1:], temperature)  # [B, T-1]
    lp = F.pad(lp, (1, 0))  # [B, T]
    ent = None
    if with_entropy:
        t = temperature if temperature > 0 else 1.0
        ent = F.pad(entropy_from_logits(logits.float() / t), (1, 0))
    return lp, ent
