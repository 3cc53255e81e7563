"""The off-policy correction: samples drawn by older weights, trained on with importance weights.

An async run (distributed/async_rollout.py) trains on samples up to `max_staleness` versions
old, and even a synchronous run can ask for the correction (`scale.off_policy_correction`).
The controller calls `correct_off_policy` once per step, after the advantages and before the
trainer; the weights themselves (tis, seq_tis, mask) are algorithms/core.off_policy_weights.
"""

from __future__ import annotations

import dataclasses

from posttrain.algorithms.core import off_policy_weights
from posttrain.errors import UsageError
from posttrain.framework.batch import RolloutBatch
from posttrain.framework.reference import score_logprobs


def correct_off_policy(
    model,
    batch: RolloutBatch,
    mode: str,
    cap: float,
    temperature: float,
    micro_batch_tokens: int = 16384,
    packed: bool = False,
) -> tuple[RolloutBatch, dict]:
    """Decoupled off-policy correction (verl's 3-policy form): a new batch, and its metrics.

    The samples were drawn by μ (behaviour logprobs, possibly `policy_version`s old). The
    trainer's current weights π_prox score them once (no gradient); the PPO ratio is then taken
    against π_prox (`old_logprobs` ← π_prox, so the clip acts on this update only) and the
    policy term is reweighted by w = π_prox/μ (algorithms/core.off_policy_weights), folded
    into the advantages: every loss here is homogeneous of degree 1 in A and w ≥ 0, so
    −min(r·wA, clip(r)·wA) = w·(−min(rA, clip(r)A)). KL and entropy terms are not reweighted.
    The behaviour logprobs move to `behaviour_logprobs`; `batch` itself is left as it was.
    """
    if batch.old_logprobs is None or batch.advantages is None:
        raise UsageError("the off-policy correction needs a batch with old_logprobs and advantages")
    prox = score_logprobs(model, batch, temperature, micro_batch_tokens, packed)  # [B, T]
    w, metrics = off_policy_weights(prox, batch.old_logprobs, batch.loss_mask, mode, cap)
    corrected = dataclasses.replace(
        batch, behaviour_logprobs=batch.old_logprobs, old_logprobs=prox, advantages=batch.advantages * w
    )  # [B, T]
    return corrected, {k: float(v) for k, v in metrics.items()}
