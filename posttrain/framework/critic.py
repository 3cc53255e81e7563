"""PPO's critic hook: the values of the rollout before an update, and the forward that gives
logprobs and values together while training (docs/architecture.md §5).

An algorithm with a learned value function declares `needs_critic(cfg)` and
`value_targets(rewards, batch, cfg)` (algorithms/ppo.py); every other algorithm never reaches
this file. The model is then a models.heads.ActorCritic (the `CriticModel` protocol): the
policy with a value head, one forward for both.

    controller   batch.values  = critic_values(model, batch)              V_old [B, T], before the advantages
                 batch.returns = algorithm.value_targets(rewards, batch)  the value loss's target
    trainer      lp, ent, v    = logprobs_and_values(model, input_ids)    V with gradient, in the loss
                                   (one trunk forward; logprobs from its hidden states in token chunks)
"""

from __future__ import annotations

import torch

from posttrain.errors import UsageError
from posttrain.framework.batch import Batch, split_micro_batches, view
from posttrain.framework.logprobs import hidden_logprobs, logits_logprobs
from posttrain.framework.packing import Packed
from posttrain.framework.roles import CriticModel
from posttrain.models.attention import chosen
from posttrain.models.heads import lm_parts


def needs_critic(algorithm, algo_cfg) -> bool:
    """True for an algorithm with a learned value function (PPO), which declares `needs_critic(cfg)`."""
    fn = getattr(algorithm, "needs_critic", None)
    return bool(fn is not None and fn(algo_cfg))


@torch.no_grad()
def critic_values(model: CriticModel, batch: Batch, micro_batch_tokens: int = 16384) -> torch.Tensor:
    """V_old [B, T] of a batch before any update (PPO's GAE and value clip), zero where loss_mask
    is 0; `model` is a models.heads.ActorCritic. Micro-batched like Reference.score."""
    out = torch.zeros_like(view(batch)["loss_mask"])
    for mb in split_micro_batches(batch, micro_batch_tokens):
        m = view(mb)
        v = model.values(m["input_ids"])  # [b, w]
        out[m["row_index"], : v.shape[1]] = v.to(out.dtype) * m["loss_mask"]
    return out


def logprobs_and_values(model, input_ids: torch.Tensor, temperature: float, pack_index: torch.Tensor | None = None):
    """One forward of an ActorCritic: (logprobs [B, T], entropy [B, T], values [B, T] with gradient);
    on packed rows when given the micro-batch's `pack_index` (framework/packing.py), unpacked."""
    if not isinstance(model, CriticModel):
        raise UsageError(
            "this algorithm learns a critic: train a models.heads.ActorCritic "
            "(recipes/rl.py builds one), not the bare policy"
        )
    parts = lm_parts(model)
    if parts is None:  # a head whose forward transforms its output: the policy's whole logits, V apart
        lp, ent = logits_logprobs(model(input_ids), input_ids, temperature, with_entropy=True)
        return lp, ent, model.values(input_ids)
    if pack_index is None:
        h, values = model.hidden_and_values(input_ids)  # [B, T, d], [B, T]
        lp, ent = hidden_logprobs(h, parts[1], input_ids, temperature, with_entropy=True)  # token chunks
        return lp, ent, values
    p = Packed.build(input_ids, pack_index, chosen(parts[0]))
    h, values = model.hidden_and_values(p.ids, positions=p.positions, attn_mask=p.mask)  # [R, W, d], [R, W]
    lp, ent = hidden_logprobs(h, parts[1], p.ids, temperature, with_entropy=True)
    assert ent is not None
    return p.unpack(lp), p.unpack(ent), p.unpack(values)  # [B, T] each, as padded
