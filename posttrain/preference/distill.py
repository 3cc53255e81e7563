"""On-policy distillation: the student samples, a frozen teacher scores the student's own tokens.

Two per-token objectives on the student's rollouts (docs/algorithms.md §20); `posttrain distill`
(recipes/distill.py) runs them.

    rkl   A_t = −c·(log π_S(y_t) − log π_T(y_t))          (Thinking Machines, Oct 2025)
          the single-sample (k1) reverse-KL estimate as a per-token advantage, stop-gradient,
          discount 0; loss −(π_θ/π_sample)·A_t, token-mean. Its expected gradient is that of
          KL(π_S ‖ π_T) on the student's own distribution: mode-seeking, no teacher sampling.
    jsd   JSD_β(T, S) = β·KL(T ‖ M) + (1−β)·KL(S ‖ M),  M = β·T + (1−β)·S   per token over the
          vocabulary (GKD, Agarwal et al. 2306.13649), back-propagated through the student's
          logits. TRL's convention (`GKDTrainer.generalized_jsd_loss`): β = 0 is the forward
          KL(T ‖ S) and β = 1 the reverse KL(S ‖ T), SPECIAL-CASED: the formula itself tends to
          0 at both ends (M → S or M → T); JSD_β/β → KL(T ‖ S) and JSD_β/(1−β) → KL(S ‖ T).

Alignment as everywhere (docs/architecture.md §3): column t holds the divergence of the distribution
that chose input_ids[:, t], read from logits[:, t − 1]; column 0 holds 0.

Deviations: one update per batch (the ratio is 1; it is kept so a stale batch would be
importance-weighted like Tinker's `importance_sampling` loss); GKD's λ (fraction of
on-policy batches) is 1: every batch is the student's own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from posttrain.algorithms.core import masked_mean
from posttrain.errors import UsageError
from posttrain.framework.batch import RolloutBatch
from posttrain.framework.logprobs import logits_stats, position_stats
from posttrain.framework.rollout import token_logprobs
from posttrain.models.heads import lm_parts

LOSSES = ("rkl", "jsd")


def reverse_kl_advantages(
    student_lp: torch.Tensor, teacher_lp: torch.Tensor, mask: torch.Tensor, coef: float = 1.0
) -> torch.Tensor:
    """A [B, T] = −coef·(log π_S − log π_T) on mask, 0 elsewhere; no gradient."""
    return (-coef * (student_lp.detach() - teacher_lp.detach())) * mask  # [B, T]


def generalized_jsd(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float, temperature: float = 1.0
) -> torch.Tensor:
    """Per-position divergence [...] of logits [..., V] (TRL's GKD convention, module doc)."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta={beta} must be in [0, 1]")
    s = F.log_softmax(_wide(student_logits) / temperature, dim=-1)  # [..., V]
    t = F.log_softmax(_wide(teacher_logits) / temperature, dim=-1)  # [..., V]
    if beta == 0.0:
        return kl(t, s)  # forward KL(T ‖ S)
    if beta == 1.0:
        return kl(s, t)  # reverse KL(S ‖ T)
    b = torch.tensor(beta, dtype=s.dtype, device=s.device)
    m = torch.logsumexp(torch.stack([s + torch.log1p(-b), t + torch.log(b)]), dim=0)  # log M  [..., V]
    return beta * kl(t, m) + (1 - beta) * kl(s, m)


def _wide(x: torch.Tensor) -> torch.Tensor:
    """At least fp32 (bf16 logits lose the small differences a divergence is made of)."""
    return x if x.dtype == torch.float64 else x.float()


def kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) [...] over the last dim from log-probabilities."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def _per_token(student, teacher, ids: torch.Tensor, loss: str, beta: float, temperature: float):
    """(student logprob, teacher logprob, exact reverse KL (no gradient), JSD_β or 0) [B, T] each,
    aligned with the token each position chose (column 0 holds 0). From both models' hidden
    states in token chunks when both are head(hidden) (framework/logprobs.position_stats: the two
    [tokens × vocab] logits are never whole), else from their whole logits."""

    def terms(s_logits, tokens, t_in, t_head):  # [..., V], [...], teacher features → 4 × [...]
        with torch.no_grad():
            t_logits = t_head(t_in)  # [..., V]
            t_all = F.log_softmax(_wide(t_logits) / temperature, -1)
            exact = kl(F.log_softmax(_wide(s_logits) / temperature, -1), t_all)
        lp = token_logprobs(s_logits, tokens, temperature)
        t_lp = token_logprobs(t_logits, tokens, temperature)
        jsd = generalized_jsd(s_logits, t_logits, beta, temperature) if loss == "jsd" else torch.zeros_like(lp)
        return lp, t_lp, exact, jsd

    s_parts, t_parts = lm_parts(student), lm_parts(teacher)
    if s_parts is None or t_parts is None:  # whole logits, the teacher's computed without gradient
        with torch.no_grad():
            t_logits = teacher(ids)  # [B, T, V]
        return logits_stats(student(ids), ids, lambda s, y, t: terms(s, y, t, _same), t_logits)
    with torch.no_grad():
        t_hidden = t_parts[0].hidden(ids)  # [B, T, d_teacher]
    s_trunk, s_head = s_parts
    return position_stats(s_trunk.hidden(ids), s_head, ids, lambda s, y, t: terms(s, y, t, t_parts[1]), t_hidden)


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


def distill_loss_fn(teacher, loss: str = "rkl", beta: float = 0.5, coef: float = 1.0, temperature: float = 1.0):
    """`loss_fn(model, mb, norm)` for the Trainer: the teacher's forward runs inside, per
    micro-batch, under no_grad. Token-mean over the WHOLE batch (norm["tokens"])."""
    if loss not in LOSSES:
        raise UsageError(f"loss={loss!r} is unknown; use {' or '.join(LOSSES)}")

    def loss_fn(model, mb: RolloutBatch, norm):
        ids, mask, old = mb.input_ids, mb.loss_mask, mb.old_logprobs  # [B, T] each
        if ids is None or (loss == "rkl" and old is None):
            raise UsageError("distillation needs batch.input_ids (and old_logprobs for rkl): use collate_samples")
        lp, t_lp, exact, jsd = _per_token(model, teacher, ids, loss, beta, temperature)  # [B, T] each
        if loss == "rkl":
            adv = reverse_kl_advantages(lp, t_lp, mask, coef)  # [B, T]
            ratio = torch.exp(lp - old)  # [B, T], 1 on-policy
            per_token = -ratio * adv  # ← the PG loss on −KL
        else:
            per_token = jsd
        total = (per_token * mask).sum() / max(norm["tokens"], 1.0)
        with torch.no_grad():
            metrics = {
                "distill/reverse_kl": float(masked_mean(exact, mask)),
                "distill/reverse_kl_k1": float(masked_mean(lp.detach() - t_lp, mask)),
                "distill/teacher_logprob": float(masked_mean(t_lp, mask)),
                "mismatch/logprob_abs": float(masked_mean((lp.detach() - old).abs(), mask)),
            }
            if loss == "jsd":
                metrics["distill/jsd"] = float(masked_mean(per_token.detach(), mask))
        return total, metrics

    return loss_fn
