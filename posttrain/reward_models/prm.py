"""The process reward model (course lesson 17): a score at every reasoning-step boundary.

    PRM(prefix up to step k) ≈ P(verifier(full response) = 1 | prefix)

Steps of the task's chain of thought end at `;` or `}` inside `{…}`, and the final answer
ends at the end-of-turn token: `{3+4=7;` `7+5=12;` `12+6=18}` `18#` are four steps.

1. Labels, Monte-Carlo (Math-Shepherd, Wang et al. 2312.08935): sample responses from the
   policy; for each step prefix, sample K completions from the same policy and label the
   boundary with the fraction that the verifier accepts (a soft label); the last boundary
   (the end-of-turn token) is labelled with the response's own reward.
2. The model: a gpt_mini trunk and a per-position scalar head (models/heads.ValueHead, a
   Linear(d, 1) on the final hidden state) read at each boundary token; BCE against the soft
   labels, averaged over the whole batch's boundaries.
3. Scoring: σ(head) at every boundary of a response; a response's PRM score aggregates its
   steps (min: a chain is as good as its weakest step; or the last step, or the mean).

Deviations: one K for every prefix (no adaptive completion counts); the trunk is trained
with the head (the course's PRM is a separate model; here it starts as a copy of the policy).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from posttrain.errors import UsageError
from posttrain.framework.backends import make_engine
from posttrain.framework.batch import collate
from posttrain.framework.roles import RolloutEngine
from posttrain.framework.rollout import SamplingParams
from posttrain.models.heads import ValueHead
from posttrain.tasks.base import safe_reward, score_samples

AGGREGATIONS = ("min", "mean", "last")


def boundaries(tok, response_ids: list[int]) -> list[int]:
    """Indices in `response_ids` of the tokens that close a step (`;`, `}`, end-of-turn)."""
    ends = {tok.stoi[";"], tok.think_close_id, tok.eot_id}
    return [i for i, t in enumerate(response_ids) if t in ends]


class PRM(nn.Module):
    """A trunk with `.hidden(ids)` and a per-position ValueHead; `forward` gives logits [B, T]."""

    def __init__(self, trunk):
        super().__init__()
        p = next(trunk.parameters())
        self.trunk = trunk
        self.head = ValueHead(trunk.config.d_model).to(device=p.device, dtype=p.dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk.hidden(input_ids)).float()  # [B, T] a logit at every position


def prm_loss(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, n_boundaries: float) -> torch.Tensor:
    """Σ over boundary positions of BCE(σ(logit), soft label) / the whole batch's boundaries."""
    bce = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")  # [B, T]
    return (bce * mask).sum() / max(n_boundaries, 1.0)


@torch.no_grad()
def mc_labels(
    model,
    tok,
    task,
    items,
    responses: int = 2,
    completions: int = 4,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    seed: int = 0,
    engine: RolloutEngine | None = None,
) -> tuple[list[dict], dict]:
    """Rows {prompt_ids, response_ids, positions, labels}: `responses` policy samples per item,
    each boundary labelled with the success rate of `completions` continuations of its prefix."""
    engine = engine or make_engine(model, tok)
    sp = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
    prompts = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    samples = engine.generate(prompts, responses, sp, seed=seed, items=items)
    score_samples(task, samples)
    rows, queries, owners = [], [], []
    for s in samples:
        if s.finish_reason != "stop":
            continue  # a truncated response has no final step
        b = boundaries(tok, s.response_ids)
        rows.append(
            {
                "prompt_ids": s.prompt_ids,
                "response_ids": s.response_ids,
                "positions": b,
                "labels": [0.0] * (len(b) - 1) + [s.reward],
                "item": s.item,
            }
        )
        for j, pos in enumerate(b[:-1]):  # the last boundary is the answer itself
            queries.append(s.prompt_ids + s.response_ids[: pos + 1])
            owners.append((len(rows) - 1, j))
    if queries:
        cont = engine.generate(
            queries,
            completions,
            SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens),
            seed=seed,
            step=1,
            items=[rows[r]["item"] for r, _ in owners],
        )
        for q, (r, j) in enumerate(owners):
            prefix = tok.decode(rows[r]["response_ids"][: rows[r]["positions"][j] + 1])
            ok = [
                safe_reward(task, rows[r]["item"], prefix + c.text).reward >= 1.0
                for c in cont[q * completions : (q + 1) * completions]
            ]
            rows[r]["labels"][j] = sum(ok) / completions
    n_b = sum(len(r["positions"]) for r in rows)
    stats = {
        "responses": len(samples),
        "labelled": len(rows),
        "boundaries": n_b,
        "completions": len(queries) * completions,
        "mean_label": sum(sum(r["labels"]) for r in rows) / max(n_b, 1),
    }
    return rows, stats


def collate_rows(rows: list[dict], pad_id: int) -> dict:
    """input_ids / attention_mask [B, T] plus `step_mask` (1 at boundaries) and `step_labels`."""
    batch = collate([r["prompt_ids"] for r in rows], [r["response_ids"] for r in rows], pad_id)
    mask, labels = torch.zeros_like(batch["loss_mask"]), torch.zeros_like(batch["loss_mask"])
    for i, r in enumerate(rows):
        P = len(r["prompt_ids"])
        for pos, y in zip(r["positions"], r["labels"]):
            mask[i, P + pos], labels[i, P + pos] = 1.0, y
    return {**batch, "step_mask": mask, "step_labels": labels}


def prm_loss_fn(model, mb, norm):
    """The Trainer's loss: `norm["tokens"]` is the whole batch's boundary count (loss_mask = step_mask)."""
    logits = model(mb["input_ids"])  # [b, T]
    loss = prm_loss(logits, mb["step_labels"], mb["step_mask"], norm["tokens"])
    with torch.no_grad():
        m = mb["step_mask"]
        err = ((torch.sigmoid(logits) - mb["step_labels"]).abs() * m).sum() / m.sum().clamp(min=1)
    return loss, {"prm/abs_err": float(err)}


@torch.no_grad()
def step_scores(
    prm: PRM, tok, prompts: list[list[int]], responses: list[list[int]], batch_rows: int = 64
) -> list[list[float]]:
    """σ(PRM) at every boundary of each response (a response without one is scored at its end)."""
    prm.eval()
    device = next(prm.parameters()).device
    out = []
    for a in range(0, len(prompts), batch_rows):
        P, R = prompts[a : a + batch_rows], responses[a : a + batch_rows]
        b = collate(P, R, tok.pad_id)
        probs = torch.sigmoid(prm(b["input_ids"].to(device))).cpu()  # [b, T]
        for i, (p, r) in enumerate(zip(P, R)):
            pos = boundaries(tok, r) or [len(r) - 1]
            out.append([float(probs[i, len(p) + j]) for j in pos])
    return out


def aggregate(scores: list[float], how: str = "min") -> float:
    if how == "min":
        return min(scores)
    if how == "mean":
        return sum(scores) / len(scores)
    if how == "last":
        return scores[-1]
    raise UsageError(f"PRM aggregation {how!r} is unknown; use {', '.join(AGGREGATIONS)}")
