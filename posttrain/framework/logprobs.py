"""Logprob scoring: how the trainer, the reference and every evaluation read a model's logprobs
of the tokens it was given (docs/architecture.md §3).

    logprobs[:, t] = log π(input_ids[:, t] | input_ids[:, :t])      position 0 holds 0

at the sampler's temperature (framework/rollout.token_logprobs, the same function the engine
records behaviour logprobs with), so that trainer and sampler agree to the bit in fp32.

**Memory: logits in token chunks (issue 31).** A model's logits are [tokens × vocab]: at a real
vocabulary (151,936) one fp32 copy for a micro-batch of 16k tokens is 10 GB, and autograd keeps
several (the logits, their log-softmax, the entropy's softmax). When a model's logits are
`head(hidden(ids))` (gpt_mini, a Hugging Face model without a logit transform, the policy of an
ActorCritic: models/heads.lm_parts), the final hidden states [B, T, d] are scored in chunks of tokens
(`hidden_token_stats`): a chunk's logits are made, reduced to what is asked per token (logprob,
entropy) and dropped. Under autograd each chunk is a checkpoint (torch.utils.checkpoint): forward
keeps only the chunk's hidden states, backward remakes one chunk's logits at a time. Peak logit
memory is then a few copies of ONE chunk, `LOGIT_CHUNK_ELEMENTS` entries (models/heads.py;
sizing/run_memory.py counts it), whatever the batch and the vocabulary. The hidden states come from
`compiled.trunk_hidden`: the trunk as it is, or through torch.compile inside the trainer's step and
the reference's scores with `optim.compile` (framework/compiled.py); the chunks stay eager.

Exactness. A chunk row is the same matmul row and the same full-vocabulary log-softmax as in one
piece, so values equal the whole-logits path (bit for bit in fp32 on the CPU: the sampler's
`mismatch/logprob_abs` stays 0) and gradients are the same sums taken chunk by chunk (≤1e-6
relative; tests/test_logprob_chunks.py). A micro-batch whose logits fit in one chunk (every
built-in task's character vocabulary) takes the whole-logits path unchanged, so the pipeline's
numbers do not move. The vocabulary is not chunked: a vocabulary-chunked log-sum-exp adds in
another order than the sampler's log_softmax (the mismatch would leave 0), and one row of
151,936 fp32 logits is only 0.6 MB, so token chunks alone bound the memory. Others: Liger's fused
linear cross-entropy and verl's `FusedLinearForPPO` chunk tokens over hidden states and the head
the same way (Liger computes the gradients during forward, verl recomputes like this file);
prime-rl's fused head also chunks the vocabulary with an online log-sum-exp; TRL materialises
each batch's logits and reads logprobs and entropy from them row by row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from posttrain.algorithms.core import entropy_from_logprobs
from posttrain.framework.batch import view
from posttrain.framework.compiled import active, trunk_hidden
from posttrain.framework.packing import Packed
from posttrain.framework.sampler import log_probs, token_logprobs
from posttrain.models.attention import chosen
from posttrain.models.heads import LOGIT_CHUNK_ELEMENTS, lm_parts


def sequence_logprobs(model, input_ids: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False):
    """logprobs[:, t] = log π(input_ids[:, t] | input_ids[:, :t]) at the sampler's temperature.

    Position 0 has no prediction and holds 0. Returns (logprobs [B, T], entropy [B, T] | None).
    Scored from the hidden states in token chunks when the model allows it (module docstring).
    """
    parts = lm_parts(model)
    if parts is None:
        return logits_logprobs(model(input_ids), input_ids, temperature, with_entropy)
    trunk, head = parts
    return hidden_logprobs(trunk_hidden(trunk, input_ids), head, input_ids, temperature, with_entropy)


def micro_logprobs(model, mb, temperature: float = 1.0, with_entropy: bool = False):
    """sequence_logprobs of a micro-batch (a RolloutBatch or a dict with `input_ids`): packed when
    it carries a `pack_index` and the model exposes its hidden states (framework/packing.py), the
    result in the micro-batch's padded layout [b, w] either way (0 on padding when packed)."""
    fields = view(mb)
    ids, index = fields["input_ids"], fields.get("pack_index")
    parts = lm_parts(model)
    if index is None or parts is None:
        return sequence_logprobs(model, ids, temperature, with_entropy)
    p = Packed.build(ids, index, chosen(parts[0]), compiled=active())  # the mask for the trunk's kernel
    h = trunk_hidden(parts[0], p.ids, p.positions, p.mask)  # [R, w, d]
    lp, ent = hidden_logprobs(h, parts[1], p.ids, temperature, with_entropy)  # [R, w] each
    return p.unpack(lp), None if ent is None else p.unpack(ent)


def hidden_logprobs(
    hidden: torch.Tensor, head, input_ids: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False
):
    """sequence_logprobs from the final hidden states [B, T, d] and the LM head, in token chunks."""
    out = position_stats(hidden, head, input_ids, _logprob_stats(temperature, with_entropy))
    return out[0], out[1] if with_entropy else None


def position_stats(hidden: torch.Tensor, head, input_ids: torch.Tensor, fn, *per_position: torch.Tensor):
    """What `fn(logits [..., V], tokens [...], *per_position [..., ·]) -> tuple of [...]` says of
    every prediction, aligned as logprobs are (column t: the prediction of input_ids[:, t] from
    position t − 1; column 0 holds 0): a tuple of [B, T] tensors. `per_position` are [B, T, ·]
    tensors read at the predicting position (a teacher's hidden states). The logits are made in
    token chunks (`hidden_token_stats`), or whole when they fit one chunk (as before issue 31)."""
    B, T = input_ids.shape
    V = _out_features(head)
    if V is None or B * (T - 1) * V <= LOGIT_CHUNK_ELEMENTS:  # one chunk: the whole logits, as always
        return logits_stats(head(hidden), input_ids, fn, *per_position)
    cut = (hidden[:, :-1], input_ids[:, 1:], *(x[:, :-1] for x in per_position))
    rows = [x.reshape(B * (T - 1), *x.shape[2:]) for x in cut]  # row b·(T−1) + t: position t of row b
    flat = hidden_token_stats(rows[0], head, fn, *rows[1:], chunk=max(8, LOGIT_CHUNK_ELEMENTS // V))
    return tuple(F.pad(o.view(B, T - 1), (1, 0)) for o in flat)  # [B, T] each


def logits_stats(logits: torch.Tensor, input_ids: torch.Tensor, fn, *per_position: torch.Tensor):
    """position_stats from logits [B, T, V] already made whole: `fn` on logits[:, :-1] at once."""
    out = fn(logits[:, :-1], input_ids[:, 1:], *(x[:, :-1] for x in per_position))  # [B, T-1] each
    return tuple(F.pad(o, (1, 0)) for o in out)  # [B, T] each


def hidden_token_stats(h: torch.Tensor, head, fn, *per_token: torch.Tensor, chunk: int) -> tuple[torch.Tensor, ...]:
    """`fn(head(h_c), *per_token_c) -> tuple of [c] tensors` over chunks of at most `chunk` rows of
    h [N, d], concatenated to [N] each. With gradient each chunk is a checkpoint: its logits are
    never kept, backward remakes them one chunk at a time (the module docstring).

    The rows are split evenly (sizes differ by at most 1; at least 8 rows a chunk, so at least 4
    after the split), never into a last chunk of a row or two: a CPU BLAS computes a product of
    few rows on another path, whose rows differ from the same rows in a bigger product in the last
    bit (MKL's AVX-512 path below 4 rows, and 4-5 at some widths; its AVX2 path at most sizes: a
    1-ulp gap there, tests/test_logprob_chunks.py EXACT)."""

    def one(h_c, *xs):
        return fn(head(h_c), *xs)

    N = h.shape[0]
    n = -(-N // chunk)  # chunks
    sizes = [N // n + (i < N % n) for i in range(n)]
    grad = torch.is_grad_enabled() and (h.requires_grad or any(p.requires_grad for p in _params(head)))
    parts = []
    for h_c, *xs in zip(h.split(sizes), *(x.split(sizes) for x in per_token)):
        if grad:  # no RNG inside (preserve_rng_state off): nothing to replay
            parts.append(
                torch.utils.checkpoint.checkpoint(one, h_c, *xs, use_reentrant=False, preserve_rng_state=False)
            )
        else:
            parts.append(one(h_c, *xs))
    return tuple(torch.cat(col) for col in zip(*parts))


def logits_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False
):
    """sequence_logprobs from logits [B, T, V] already computed (a model scored whole)."""
    out = logits_stats(logits, input_ids, _logprob_stats(temperature, with_entropy))
    return out[0], out[1] if with_entropy else None


def _logprob_stats(temperature: float, with_entropy: bool):
    """fn for position_stats: logits [..., V], tokens [...] → (logprob [...], entropy [...]).

    With the entropy, both are read from ONE log-softmax of logits / T (sampler.log_probs, whose
    gather is token_logprobs): one fp32 copy, one log-softmax and one backward of it per chunk fewer
    than making each apart (issue 43). The values are the same floats (an entropy of logits / 1.0 is
    that of the logits), and so are the gradients while the entropy is no part of the loss (every
    algorithm's entropy_coef = 0 by default); with a bonus, the two gradients meet before the
    log-softmax's backward instead of after it: float rounding."""

    def stats(logits, tokens):
        if not with_entropy:
            return (token_logprobs(logits, tokens, temperature),)
        logp = log_probs(logits, temperature)  # [..., V] fp32
        return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), entropy_from_logprobs(logp)

    return stats


def _out_features(head) -> int | None:
    """The head's output width (the vocabulary), read from its weight; None when it has none."""
    w = getattr(head, "weight", None)
    return int(w.shape[0]) if isinstance(w, torch.Tensor) and w.dim() == 2 else None


def _params(module):
    return module.parameters() if isinstance(module, torch.nn.Module) else ()
