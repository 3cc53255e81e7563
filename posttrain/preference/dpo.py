"""The DPO family: preference losses on sequence log-probabilities, no sampling, no reward model.

DPO's one-line difference from RLHF: the KL-regularised reward-maximisation optimum gives
r(x, y) = β·log π(y|x)/π_ref(y|x) + const, so a Bradley–Terry loss on that implicit reward
trains the policy directly on pairs (Rafailov et al. 2023, arXiv 2305.18290).

Notation (docs/algorithms.md §19): log-probs are SUMS over response tokens; for chosen w and
rejected l, h = [log π(w) − log π_ref(w)] − [log π(l) − log π_ref(l)]. Every loss is per pair,
averaged over pairs (TRL's convention).

    dpo      −log σ(βh)                                          β = 0.1
    cdpo     −(1−ε) log σ(βh) − ε log σ(−βh)                     label smoothing ε (conservative DPO)
    robust   [(1−ε) L(h) − ε L(−h)] / (1 − 2ε)                   Chowdhury et al. 2024
    hinge    max(0, 1 − βh)                                      SLiC
    ipo      (h̄ − 1/(2β))²,  h̄ from per-TOKEN mean log-ratios    TRL's length-normalised IPO
    simpo    −log σ(β·(avg log π(w) − avg log π(l)) − γ)         reference-free, length-normalised
    orpo     NLL(w) − λ·log σ(log odds(w) − log odds(l))          odds = P/(1−P), P = exp(avg log π); λ = β
    kto      1 − σ(β(ρ − z0)) for w, 1 − σ(β(z0 − ρ)) for l      ρ = log π/π_ref (sum), z0 below
    dpo_nll  dpo + α·NLL(w)                                      "RPO"; NLL = token-mean over chosen

Deviations (numbered, as everywhere in posttrain):
1. KTO is run on paired data (each pair gives one desirable and one undesirable example) and
   its reference point z0 is the mean of the detached log-ratios ρ of all completions of the
   WHOLE batch, clamped at 0 (recipes/dpo.py scores the batch once before the step, like every
   normaliser: a micro-batch's own mean would make the gradient depend on the micro-batch size)
   — TRL estimates z0 on mismatched (prompt, completion) pairs, which also costs an extra
   forward per batch. λ_D = λ_U = 1.
2. ORPO's NLL and DPO+NLL's NLL are per-pair token-means of the chosen response (TRL takes
   one token-mean over the whole batch); the two agree when responses have equal length.
3. cDPO is kept as its own loss: TRL ≥ 0.29 dropped `label_smoothing` from `sigmoid`.

Metrics (so likelihood displacement is visible): pref/accuracy (implicit reward of chosen >
rejected), pref/margin (mean βh), logps/chosen and logps/rejected (policy sums),
rewards/chosen and rewards/rejected (β·log-ratio).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

LOSSES = ("dpo", "cdpo", "robust", "hinge", "ipo", "simpo", "orpo", "kto", "dpo_nll")
REFERENCE_FREE = ("simpo", "orpo")


@dataclass
class DPOLossConfig:
    loss_type: str = "dpo"  # one of LOSSES
    beta: float = 0.1  # β (λ for orpo, τ for ipo); simpo's paper default is 2.5
    label_smoothing: float = 0.1  # ε of cdpo / robust
    simpo_gamma: float = 1.375  # γ: simpo's target margin (γ/β = 0.55 at β = 2.5)
    nll_alpha: float = 1.0  # α of dpo_nll


@dataclass
class SeqLogps:
    """Per-pair tensors [P]: policy and reference log-prob sums, response token counts."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    ref_chosen: torch.Tensor | None
    ref_rejected: torch.Tensor | None
    len_chosen: torch.Tensor
    len_rejected: torch.Tensor


def preference_loss(cfg: DPOLossConfig, s: SeqLogps, kto_z0: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Per-pair losses [P] and the detached metrics. `kto_z0`: KTO's reference point of the whole
    batch (kto_reference_point); None = the mean over these pairs (exact for a one-micro-batch step)."""
    beta, kind = cfg.beta, cfg.loss_type
    if kind in REFERENCE_FREE:
        h = s.chosen - s.rejected
        r_w, r_l = beta * s.chosen.detach(), beta * s.rejected.detach()
    else:
        rho_w, rho_l = s.chosen - s.ref_chosen, s.rejected - s.ref_rejected  # [P] log-ratios
        h = rho_w - rho_l
        r_w, r_l = beta * rho_w.detach(), beta * rho_l.detach()
    if kind == "dpo":
        loss = -F.logsigmoid(beta * h)
    elif kind == "cdpo":
        eps = cfg.label_smoothing
        loss = -(1 - eps) * F.logsigmoid(beta * h) - eps * F.logsigmoid(-beta * h)
    elif kind == "robust":
        eps = cfg.label_smoothing
        loss = (-(1 - eps) * F.logsigmoid(beta * h) + eps * F.logsigmoid(-beta * h)) / (1 - 2 * eps)
    elif kind == "hinge":
        loss = torch.relu(1 - beta * h)
    elif kind == "ipo":
        h_bar = rho_w / s.len_chosen - rho_l / s.len_rejected
        loss = (h_bar - 1 / (2 * beta)) ** 2
    elif kind == "simpo":
        loss = -F.logsigmoid(beta * (s.chosen / s.len_chosen - s.rejected / s.len_rejected) - cfg.simpo_gamma)
    elif kind == "orpo":
        avg_w, avg_l = s.chosen / s.len_chosen, s.rejected / s.len_rejected
        log_odds = (avg_w - log1mexp(avg_w)) - (avg_l - log1mexp(avg_l))
        loss = -avg_w - beta * F.logsigmoid(log_odds)
    elif kind == "kto":
        z0 = kto_z0 if kto_z0 is not None else torch.cat([rho_w, rho_l]).detach().mean().clamp(min=0)
        loss = (kto_desirable(rho_w, z0, beta) + kto_undesirable(rho_l, z0, beta)) / 2  # mean over examples
    elif kind == "dpo_nll":
        loss = -F.logsigmoid(beta * h) - cfg.nll_alpha * s.chosen / s.len_chosen
    else:
        raise ValueError(f"loss_type={kind!r} is unknown; use one of {', '.join(LOSSES)}")
    metrics = {
        "pref/accuracy": (r_w > r_l).float().mean(),
        "pref/margin": (r_w - r_l).mean(),
        "logps/chosen": s.chosen.detach().mean(),
        "logps/rejected": s.rejected.detach().mean(),
        "rewards/chosen": r_w.mean(),
        "rewards/rejected": r_l.mean(),
    }
    return loss, {k: float(v) for k, v in metrics.items()}


def kto_reference_point(policy_sums: torch.Tensor, ref_sums: torch.Tensor) -> torch.Tensor:
    """KTO's z0 = max(0, mean ρ) over every completion of the batch: [2P] detached policy and
    reference log-prob sums in, a 0-dim tensor out."""
    return (policy_sums - ref_sums).detach().mean().clamp(min=0)


def kto_desirable(rho: torch.Tensor, z0, beta: float) -> torch.Tensor:
    return 1 - torch.sigmoid(beta * (rho - z0))


def kto_undesirable(rho: torch.Tensor, z0, beta: float) -> torch.Tensor:
    return 1 - torch.sigmoid(beta * (z0 - rho))


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − eˣ) for x < 0, stable at both ends (Mächler 2012)."""
    return torch.where(x > -0.6931, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))
