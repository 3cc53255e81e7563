"""Shared math of every RL loss: masked reductions, loss aggregation, KL estimators, entropy,
group statistics, the PPO clip and its diagnostics.

Everything is a pure function on tensors; algorithms import it and never re-implement it.
Conventions (docs/architecture.md §3):

- `[B, T]` tensors are aligned so that `logprobs[:, t] = log π(input_ids[:, t] | input_ids[:, :t])`.
- `loss_mask` is 1 on policy-generated response tokens only. A position with mask 0 never
  contributes to a loss, a gradient or a metric, whatever value it holds (NaN and inf included):
  every reduction goes through `masked_sum`, which selects with `torch.where`, not a product.
- Losses are quantities to MINIMISE.
- Normalisers are those of the WHOLE batch (`batch_norm`), so that the trainer can sum the
  losses of its micro-batches and get the loss, and gradient, of the whole batch.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

import torch

from posttrain.errors import UsageError

if TYPE_CHECKING:
    from posttrain.framework.batch import RolloutBatch

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
STD_MODES = ("unbiased", "population")
LOG_RATIO_CLAMP = 20.0  # |log r| bound before exp(): e^20 ≈ 5e8 is finite in fp16/bf16/fp32 (as verl)
K3_CAP = 10.0  # largest k3 value (verl low_var_kl, OpenRLHF); beyond it the token's KL has no gradient


# ----------------------------------------------------------------------------- masked reductions


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Σ mask·x over `dim` (all dims if None). Positions with mask 0 are selected away, so a
    NaN/inf there neither leaks into the value nor into the gradient of x."""
    xm = torch.where(mask != 0, x * mask, torch.zeros((), dtype=x.dtype, device=x.device))
    return xm.sum() if dim is None else xm.sum(dim)


def on_mask(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x where mask != 0, else exactly 0, and 0 gradient there. For a term whose gradient
    multiplies by another tensor (k2's (lp − ref), CISPO's weight, the value loss's (V − G)):
    a NaN off the mask would otherwise come back as NaN·0 = NaN, however the sum is masked."""
    return torch.where(mask != 0, x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Σ mask·x / Σ mask over `dim`; 0 (not NaN) where the mask is empty."""
    num = masked_sum(x, mask, dim)
    den = mask.sum() if dim is None else mask.sum(dim)
    den = den.to(num.dtype)
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(num))


def float_rewards(rewards: torch.Tensor) -> torch.Tensor:
    """Rewards [B] as floats, at the boundary of every advantage estimator: an integer tensor
    (0/1 from a user's verifier) would keep its dtype through the group mean, truncating it
    (mean 1/3 → 0) and the advantages with it."""
    return rewards if rewards.is_floating_point() else rewards.to(torch.get_default_dtype())


def broadcast(adv: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Outcome advantage [B] → per-token [B, T], 0 where loss_mask is 0."""
    return adv.to(loss_mask.dtype).unsqueeze(-1) * loss_mask  # [B, T]


# ----------------------------------------------------------------------------- aggregation


def batch_norm(loss_mask: torch.Tensor, max_len: float | None = None) -> dict:
    """Normalisers of the WHOLE batch, computed once before it is split into micro-batches.

    tokens  = Σ mask (loss tokens in the batch)
    seqs    = sequences with at least one loss token (as verl: a fully masked row, e.g. a
              filtered sample, neither counts nor dilutes the mean)
    max_len = the constant L_max of `seq-mean-token-sum-norm` (Dr. GRPO: the generation cap);
              None falls back to the padded width T (verl's fallback).
    """
    return {
        "tokens": float(loss_mask.sum()),
        "seqs": float((loss_mask.sum(-1) > 0).sum()),
        "max_len": float(loss_mask.shape[-1] if max_len is None else max_len),
    }


def _pos(x: float) -> float:
    return x if x > 0 else 1.0  # an empty batch gives a 0 loss, not 0/0


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, norm: dict) -> torch.Tensor:
    """Reduce a per-token loss [B, T] to a scalar with a named mode (docs/algorithms.md §2).

    token-mean               Σ mℓ / tokens                      (DAPO "token-level")
    seq-mean-token-mean      (1/seqs) Σ_i (Σ_t mℓ / |y_i|)       (original GRPO)
    seq-mean-token-sum       Σ mℓ / seqs                         (REINFORCE, RLOO)
    seq-mean-token-sum-norm  Σ mℓ / (seqs · max_len)            (Dr. GRPO, constant normaliser)

    Every mode is a sum over rows divided by a batch constant (|y_i| is per row), so with the
    same `norm` the sum of aggregate() over micro-batches equals aggregate() of the batch.
    """
    if mode == "token-mean":
        return masked_sum(per_token, mask) / _pos(norm["tokens"])
    if mode == "seq-mean-token-mean":
        per_seq = masked_sum(per_token, mask, dim=-1)  # [B]
        lengths = mask.sum(-1).to(per_seq.dtype).clamp_min(1.0)  # [B]  |y_i|
        return (per_seq / lengths).sum() / _pos(norm["seqs"])
    if mode == "seq-mean-token-sum":
        return masked_sum(per_token, mask) / _pos(norm["seqs"])
    if mode == "seq-mean-token-sum-norm":
        return masked_sum(per_token, mask) / _pos(norm["seqs"] * norm["max_len"])
    raise UsageError(f"unknown aggregation {mode!r}; valid: {', '.join(AGGREGATIONS)}")


def as_token_weighted(value: torch.Tensor, loss_mask: torch.Tensor, norm: dict) -> torch.Tensor:
    """Rescale a micro-batch's additive share of a batch quantity (e.g. its aggregate()) into
    a metric the trainer can average with token weights (local tokens / batch tokens): the
    weighted mean over micro-batches is then exactly the batch quantity. No host read (a CUDA sync,
    issue 43): the factor in float64, rounded to the value's dtype, is the old Python float's."""
    local = loss_mask.sum().to(torch.float64)  # 0-dim, on the device
    factor = (norm["tokens"] / torch.where(local > 0, local, torch.ones_like(local))).to(value.dtype)
    return torch.where(local > 0, value.detach() * factor, value.detach() * 0.0)


# ----------------------------------------------------------------------------- KL and entropy


def kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) on tokens sampled from π_θ (Schulman's k1/k2/k3,
    docs/algorithms.md §3). Argument order is pinned: first the policy, second the reference.

    k1 = log π_θ − log π_ref                       unbiased, can be < 0
    k2 = ½ (log π_θ − log π_ref)²                   biased, ≥ 0
    k3 = e^d − 1 − d,  d = log π_ref − log π_θ     unbiased, ≥ 0 (GRPO's D_{i,t})
    k3 uses expm1 (exact near d = 0, where e^d − 1 would cancel), clamps d to ±20 and caps the
    value at 10, both as verl's `low_var_kl` (OpenRLHF caps at 10 too; TRL does neither). The
    cap bounds the estimate and its gradient e^d − 1: a token whose k3 exceeds 10 adds 10 and
    no gradient, so one runaway token cannot dominate a step.
    """
    if kind == "k1":
        return logprobs - ref_logprobs
    if kind == "k2":
        return 0.5 * (logprobs - ref_logprobs) ** 2
    if kind == "k3":
        d = (ref_logprobs - logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return (torch.expm1(d) - d).clamp(max=K3_CAP)
    raise UsageError(f"unknown KL estimator {kind!r}; valid: {', '.join(KL_ESTIMATORS)}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Token entropy H = −Σ_v p_v log p_v of the categorical given by logits [B, T, V] → [B, T].
    Computed in float32 at least; −inf logits (banned tokens) contribute exactly 0."""
    x = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    return entropy_from_logprobs(torch.log_softmax(x, dim=-1))  # [B, T, V] → [B, T]


def entropy_from_logprobs(logp: torch.Tensor) -> torch.Tensor:
    """H = −Σ_v p_v log p_v from log-probabilities [..., V] (a log_softmax already made) → [...]."""
    p = logp.exp()
    # clamp turns log 0 = −inf into a finite number, so 0·log 0 = 0 in value and in gradient
    return -(p * logp.clamp_min(torch.finfo(logp.dtype).min)).sum(-1)  # [B, T]


# ----------------------------------------------------------------------------- group statistics


def group_stats(rewards: torch.Tensor, group_index: torch.Tensor, std: str = "unbiased"):
    """Per-group mean, std and size of `rewards` [B], broadcast back to each sample.

    Returns (mean [B], std [B], size [B]), all in rewards' dtype. `group_index` [B] may hold any
    integers (samples of a group need not be contiguous). std="unbiased" divides by n−1 (torch,
    TRL, verl), "population" by n (the course's tables).
    A group whose rewards are all equal (singletons included) gets std exactly 0 and mean
    exactly its common value, so `rewards − mean` is exactly 0 there: degenerate groups never
    turn a rounding error into a large advantage.
    """
    if std not in STD_MODES:
        raise UsageError(f"unknown std convention {std!r}; valid: {', '.join(STD_MODES)}")
    if rewards.numel() == 0:
        return rewards.clone(), rewards.clone(), rewards.clone()
    _, inv = torch.unique(group_index, return_inverse=True)  # [B] → 0..G-1
    G = int(inv.max()) + 1
    r = rewards.detach().double()  # stats in float64
    zeros = torch.zeros(G, dtype=r.dtype, device=r.device)
    size = zeros.index_add(0, inv, torch.ones_like(r))  # [G]
    mean = zeros.index_add(0, inv, r) / size  # [G]
    ss = zeros.index_add(0, inv, (r - mean[inv]) ** 2)  # [G]  Σ (r − μ)²
    dof = size - 1 if std == "unbiased" else size
    sd = torch.where(dof > 0, ss / dof.clamp_min(1), zeros).sqrt()  # [G]
    rmax = zeros.scatter_reduce(0, inv, r, reduce="amax", include_self=False)
    rmin = zeros.scatter_reduce(0, inv, r, reduce="amin", include_self=False)
    same = (rmax == rmin)[inv]  # [B] degenerate group
    mean_b = torch.where(same, r, mean[inv])
    sd_b = torch.where(same, torch.zeros_like(r), sd[inv])
    return mean_b.to(rewards.dtype), sd_b.to(rewards.dtype), size[inv].to(rewards.dtype)


# ----------------------------------------------------------------------------- PPO clip


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
):
    """Per-token clipped surrogate, to minimise (docs/algorithms.md §4):

        ℓ = −min(r·A, clip(r, 1−ε_low, 1+ε_high)·A),   r = exp(logp − old_logp)
        dual clip (c > 1), only where A < 0:  ℓ = min(ℓ, −c·A)   (loss bounded by c·|A|)

    The log-ratio is clamped to ±20 before exp. Returns (per_token_loss [B, T],
    clipped_mask [B, T] bool). clipped_mask marks tokens where a clipped branch is strictly
    the active one, i.e. the clip zeroes the token's gradient: A>0 and r>1+ε_high, A<0 and
    r<1−ε_low, or (dual clip) A<0 and r>c. Tokens with r outside the band but on the
    improving side (A>0, r<1−ε_low; A<0, r>1+ε_high) still pass their gradient: not clipped.
    """
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)  # [B, T]
    s1 = ratio * advantages  # [B, T]
    s2 = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = -torch.minimum(s1, s2)  # [B, T]  the PPO clip
    r = ratio.detach()
    clipped = ((advantages > 0) & (r > 1.0 + eps_high)) | ((advantages < 0) & (r < 1.0 - eps_low))
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise UsageError(f"dual_clip must be > 1 (got {dual_clip}); the paper uses 3")
        capped = torch.minimum(loss, -dual_clip * advantages)
        loss = torch.where(advantages < 0, capped, loss)
        clipped = clipped | ((advantages < 0) & (r > dual_clip))
    return loss, clipped


def ratio_metrics(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, loss_mask: torch.Tensor, clipped_mask: torch.Tensor
) -> dict:
    """Diagnostics of the importance ratio over loss tokens (0-dim detached tensors).

    clip/frac   fraction of loss tokens in `clipped_mask` (gradient zeroed by a clip; see
                ppo_clip_loss), the number CleanRL logs as clipfrac
    ratio/mean  mean of r = π_θ/π_old; exactly 1 on-policy with one update per batch
    ratio/max   largest r (0 on an empty mask)
    """
    with torch.no_grad():
        m = loss_mask
        ratio = torch.exp((logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        rmax = torch.where(m != 0, ratio, torch.zeros_like(ratio)).max() if ratio.numel() else ratio.new_zeros(())
        return {
            "clip/frac": masked_mean(clipped_mask.to(m.dtype), m),
            "ratio/mean": masked_mean(ratio, m),
            "ratio/max": rmax,
        }


def importance_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    """r = π_θ/π_old = exp(logp − old_logp) per token [B, T], the log-ratio clamped to ±20 as
    in ppo_clip_loss. Losses that use r only as a detached weight (CISPO, DPPO) take it here."""
    return torch.exp((logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


# ----------------------------------------------------------------------------- shared by several algorithms


@contextlib.contextmanager
def across(ranks):
    """Inside, `masked_whiten`'s statistics are every rank's rows' (framework/world.World's sum and max)."""
    _ACROSS.append(ranks)
    try:
        yield
    finally:
        _ACROSS.pop()


_ACROSS: list = []  # the ranks of `across`, innermost last


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, std: str = "unbiased", eps: float = 1e-8, scale: bool = True
) -> torch.Tensor:
    """Token-level z-score over the loss tokens of the whole batch [B, T] → [B, T], 0 off the mask:

        (x − mean) / √(var + eps)       (verl `masked_whiten`: eps inside the root; OpenRLHF alike)

    Every loss token weighs the same, so long sequences weigh more (docs/algorithms.md §5).
    std="unbiased" divides the variance by n−1 (verl), "population" by n. scale=False only
    centres. If every loss token holds the same value the result is exactly 0 (a float mean
    of equal values need not be exact, and eps = 1e-8 would blow its error up to ~1e-9·x).
    Used by REINFORCE++ and by PPO's whitened GAE; under `across(ranks)`, over every rank's rows (two passes).
    """
    if std not in STD_MODES:
        raise UsageError(f"unknown std convention {std!r}; valid: {', '.join(STD_MODES)}")
    on = mask != 0
    zero = torch.zeros_like(x)
    xd = x.double()  # stats in float64
    vals = xd[on]
    ranks = _ACROSS[-1] if _ACROSS and _ACROSS[-1].size > 1 else None
    if ranks is None:
        if not bool(on.any()) or bool(vals.max() == vals.min()):
            return zero
        n, mean = vals.numel(), vals.mean()
    else:
        n, total = ranks.sum([float(vals.numel()), float(vals.sum())])
        hi, neg_lo = ranks.max([float(vals.max()), -float(vals.min())] if vals.numel() else [-math.inf, -math.inf])
        if n == 0 or hi == -neg_lo:
            return zero
        mean = total / n
    centred = xd - mean  # [B, T]
    if scale:
        ss = (vals - mean).pow(2).sum() if ranks is None else ranks.sum([float((vals - mean).pow(2).sum())])[0]
        var = ss / (n - 1 if std == "unbiased" and n > 1 else n)
        centred = centred / math.sqrt(var + eps) if ranks is not None else centred / torch.sqrt(var + eps)
    return torch.where(on, centred.to(x.dtype), zero)


def bernoulli_kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(Bern(p) ‖ Bern(q)) = p·log(p/q) + (1−p)·log((1−p)/(1−q)), elementwise, 0·log 0 = 0.

    DPPO's binary-KL trust region (p = π_old(y_t), q = π_θ(y_t)) and MGPO's max-entropy
    deviation (p = pass rate, q = ½) are both this one function.
    """
    return torch.xlogy(p, p) - torch.xlogy(p, q) + torch.xlogy(1 - p, 1 - p) - torch.xlogy(1 - p, 1 - q)


def check_config(cfg, who: str) -> None:
    """Validate the fields that loss configs share (whichever of them `cfg` has): aggregation,
    kl_estimator, std, and kl_coef / adv_eps ≥ 0. Raises UsageError naming the algorithm."""
    checks = (("aggregation", AGGREGATIONS), ("kl_estimator", KL_ESTIMATORS), ("std", STD_MODES))
    for name, valid in checks:
        if hasattr(cfg, name) and getattr(cfg, name) not in valid:
            raise UsageError(f"{who}: {name}={getattr(cfg, name)!r} is unknown; valid: {', '.join(valid)}")
    for name in ("kl_coef", "adv_eps"):
        if getattr(cfg, name, 0.0) < 0:
            raise UsageError(f"{who}: {name} must be ≥ 0 (got {getattr(cfg, name)})")


def policy_inputs(batch: RolloutBatch, who: str = "loss") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What every policy loss reads first: (loss_mask [B, T], old_logprobs [B, T], advantages
    [B, T]); advantages given per sample [B] are broadcast over the loss tokens. The batch is
    read, never written."""
    mask = batch.loss_mask  # [B, T]
    if batch.old_logprobs is None or batch.advantages is None:
        raise UsageError(
            f"{who}: the loss needs batch.old_logprobs and batch.advantages "
            "(collate_samples and the controller's advantage step give them)"
        )
    adv = batch.advantages
    if adv.dim() == 1:
        adv = broadcast(adv, mask)  # [B] → [B, T]
    return mask, batch.old_logprobs, adv


def finish_loss(
    pg: torch.Tensor,
    logprobs: torch.Tensor,
    batch: RolloutBatch,
    cfg,
    norm: dict,
    entropy: torch.Tensor | None = None,
    who: str = "loss",
):
    """The tail every policy loss shares once its per-token policy term `pg` [B, T] is known:

        ℓ_{i,t} = pg_{i,t} + β·KL_{i,t}(π_θ ‖ π_ref) − c_H·H_{i,t},   L = Agg(ℓ)

    as grpo.loss does it (KL and entropy per token, before aggregation, same mode as verl).
    `cfg` needs `aggregation`, `kl_coef`, `kl_estimator`, `entropy_coef`. The KL is measured
    (`kl/ref`) whenever batch has ref_logprobs, the entropy whenever it is given. Returns
    (loss, metrics) with `loss/policy` scaled for the trainer's token-weighted mean.
    """
    mask = batch.loss_mask  # [B, T]
    per_token = pg
    metrics = {"loss/policy": as_token_weighted(aggregate(pg.detach(), mask, cfg.aggregation, norm), mask, norm)}
    ref = batch.ref_logprobs
    if cfg.kl_coef > 0 and ref is None:
        raise UsageError(f"{who}: kl_coef > 0 needs batch['ref_logprobs']; load a reference or set kl_coef=0")
    if ref is not None:
        kl_tok = kl(on_mask(logprobs, mask), on_mask(ref, mask), cfg.kl_estimator)  # [B, T]  0 off the mask
        metrics["kl/ref"] = masked_mean(kl_tok.detach(), mask)
        if cfg.kl_coef > 0:
            per_token = per_token + cfg.kl_coef * kl_tok
    if cfg.entropy_coef != 0 and entropy is None:
        raise UsageError(f"{who}: entropy_coef != 0 needs the token entropy; ask the trainer for it")
    if entropy is not None:
        metrics["entropy"] = masked_mean(entropy.detach(), mask)
        if cfg.entropy_coef != 0:
            per_token = per_token - cfg.entropy_coef * entropy
    return aggregate(per_token, mask, cfg.aggregation, norm), metrics


# ----------------------------------------------------------------------------- off-policy correction

OFF_POLICY_CORRECTIONS = ("none", "tis", "seq_tis", "mask")


def off_policy_weights(
    prox_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, loss_mask: torch.Tensor, mode: str, cap: float = 2.0
):
    """Importance weights [B, T] that carry samples of the behaviour policy μ (the sampler's
    weights, `policy_version` steps old) over to π_prox (the trainer's weights before this
    update), detached, 0 off the mask (docs/algorithms.md §6):

        w_t = π_prox(y_t) / μ(y_t) = exp(log π_prox − log μ)       (log-ratio clamped to ±20)
        none     1
        tis      min(w_t, C)                                         token-level truncated IS
        seq_tis  min(Π_t w_t, C), broadcast to the row's tokens      sequence-level truncated IS
        mask     w_t · 1[1/C ≤ w_t ≤ C]                              masked IS (IcePop band [1/C, C])

    On-policy (π_prox = μ) every mode gives exactly 1. Returns (weights, metrics):
    `offpolicy/weight_mean`, `offpolicy/weight_max`, `offpolicy/capped_frac` (tokens truncated
    or masked), `offpolicy/log_ratio_abs` (mean |log π_prox − log μ|: how far off-policy) and
    `mismatch/sampler_max` (the largest: a sync run's sampler/trainer gap; 0 on the built-in engine
    in fp32, ~1e-5 with vLLM).
    """
    if mode not in OFF_POLICY_CORRECTIONS:
        raise UsageError(f"off_policy_correction={mode!r} is unknown; valid: {', '.join(OFF_POLICY_CORRECTIONS)}")
    if cap <= 1.0:
        raise UsageError(f"off_policy_cap must be > 1 (got {cap}); 2 is verl's default")
    with torch.no_grad():
        m = loss_mask
        log_w = torch.where(m != 0, prox_logprobs - behaviour_logprobs, torch.zeros_like(prox_logprobs))
        log_w = log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, T]
        if mode == "none":
            w, capped = torch.ones_like(log_w), torch.zeros_like(m, dtype=torch.bool)
        elif mode == "tis":
            raw = log_w.exp()
            w, capped = raw.clamp(max=cap), raw > cap
        elif mode == "seq_tis":
            seq = log_w.sum(-1, keepdim=True).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()  # [B, 1]
            w, capped = seq.clamp(max=cap).expand_as(log_w), (seq > cap).expand_as(log_w)
        else:
            raw = log_w.exp()
            capped = (raw > cap) | (raw < 1.0 / cap)
            w = torch.where(capped, torch.zeros_like(raw), raw)
        w = w * m  # [B, T]
        gap = log_w.abs()  # [B, T], 0 off the mask
        metrics = {
            "offpolicy/weight_mean": masked_mean(w, m),
            "offpolicy/weight_max": torch.where(m != 0, w, torch.zeros_like(w)).max() if w.numel() else w.new_zeros(()),
            "offpolicy/capped_frac": masked_mean(capped.to(m.dtype), m),
            "offpolicy/log_ratio_abs": masked_mean(gap, m),
            "mismatch/sampler_max": gap.max() if gap.numel() else gap.new_zeros(()),
        }
    return w, metrics
