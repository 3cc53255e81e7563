"""Rejection-sampling fine-tuning (RFT / RAFT / STaR / ReST-EM): best-of-N → SFT.

Sample N responses per train-split prompt from the current model, keep the ones the verifier
accepts, drop duplicates, and fine-tune on what is left with the ordinary SFT loss. It is
REINFORCE with advantage 1[accepted] and no negative samples (docs/algorithms.md §19), run offline
in one round. `posttrain sft data=rejection init=RUN` runs it (recipes/sft.py).

Deviations: one round, no reward-model ranking (the verifier decides; an RM scorer can be
passed as `accept`); responses are kept only when they ended on their own (`finish_reason ==
"stop"`), so a truncated correct-looking response is never imitated.
"""

from __future__ import annotations

from posttrain.framework.backends import make_engine
from posttrain.framework.roles import RolloutEngine
from posttrain.framework.rollout import SamplingParams
from posttrain.progress import generate_with_progress
from posttrain.tasks.base import score_samples


def rejection_sample(
    model,
    tok,
    task,
    items,
    n: int = 8,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    seed: int = 0,
    dedupe: bool = True,
    engine: RolloutEngine | None = None,
):
    """(prompt ids, response ids, stats): accepted, distinct responses of every prompt."""
    engine = engine or make_engine(model, tok)
    prompts = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    sp = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, stop_ids=(tok.eot_id,))
    samples = generate_with_progress(engine, prompts, n, sp, "rejection sampling", seed=seed, items=items)
    score_samples(task, samples)
    out_p, out_r, seen = [], [], set()
    stats = {"samples": len(samples), "accepted": 0, "duplicates": 0, "truncated": 0, "prompts_without_any": 0}
    covered = set()
    for s in samples:
        if s.reward < 1.0:
            continue
        if s.finish_reason != "stop":
            stats["truncated"] += 1
            continue
        stats["accepted"] += 1
        key = (s.group, tuple(s.response_ids))
        if dedupe and key in seen:
            stats["duplicates"] += 1
            continue
        seen.add(key)
        covered.add(s.group)
        out_p.append(s.prompt_ids)
        out_r.append(list(s.response_ids))
    stats["prompts_without_any"] = len(items) - len(covered)
    stats["kept"] = len(out_r)
    stats["accept_rate"] = stats["accepted"] / max(len(samples), 1)
    return out_p, out_r, stats
