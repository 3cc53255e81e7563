"""Test-time search with reward models, at equal sample budgets (course lesson 17).

For each held-out problem, with the same policy and N samples' worth of generation:

    pass@1        one sample (the mean over the N)
    maj@N         the most frequent final answer of N samples
    orm best@N    the sample the outcome RM (`posttrain rm`) scores highest
    prm best@N    the sample whose weakest step the PRM scores highest (min over steps)
    prm-last best@N  ... by the PRM's score at the end-of-turn token only: an outcome score
                  (that boundary's label is the verifier's 0/1), the PRM used as an ORM
    prm beam      step-level beam search: keep the `beam` prefixes the PRM values most, extend
                  each with N/beam sampled next steps (one step = up to `;`, `}` or the end), so
                  every depth samples N steps: about N responses' tokens in all (measured)

`sample_table` scores the sampled columns, `beam_search` runs the last one; the benchmark that
trains a PRM and fills the whole table is `posttrain bench search` (bench/search.py).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch

from posttrain.framework.backends import make_engine
from posttrain.framework.rollout import SamplingParams
from posttrain.reward_models.prm import step_scores
from posttrain.tasks.arithmetic import last_integer
from posttrain.tasks.base import safe_reward


def solved(task, item, text: str) -> float:
    """1.0 when the verifier gives the response full reward (the table's accuracy), else 0.0."""
    return float(safe_reward(task, item, text).reward >= 1.0)


def sample_table(task, items, samples, n: int, orm_scores=None, prm_scores=None, **more_scores) -> dict:
    """Accuracy of pass@1, maj@n, and best@n by each given score list (aligned with samples)."""
    acc = {"pass@1": [], f"maj@{n}": []}
    rankers = {
        name: sc for name, sc in (("orm", orm_scores), ("prm", prm_scores), *more_scores.items()) if sc is not None
    }
    for name in rankers:
        acc[f"{name} best@{n}"] = []
    for i, it in enumerate(items):
        group = samples[i * n : (i + 1) * n]
        right = [solved(task, it, s.text) for s in group]
        acc["pass@1"].append(float(np.mean(right)))
        votes = Counter(a for a in (last_integer(s.text) for s in group) if a is not None)
        acc[f"maj@{n}"].append(float(bool(votes) and votes.most_common(1)[0][0] == task.gold(it)))
        for name, scores in rankers.items():
            mine = scores[i * n : (i + 1) * n]
            acc[f"{name} best@{n}"].append(right[int(np.argmax(mine))])
    return {k: float(np.mean(v)) for k, v in acc.items()}


@torch.no_grad()
def beam_search(
    policy,
    prm,
    tok,
    task,
    items,
    beam: int = 2,
    expand: int = 4,
    temperature: float = 1.0,
    max_len: int = 64,
    step_tokens: int = 24,
    seed: int = 0,
) -> tuple[list[str], int]:
    """(final response text per item, tokens generated). All items advance together, one
    step per depth; finished beams (ended by end-of-turn or the length cap) stop expanding
    but keep competing for the top `beam` places. Prefixes are ranked by the PRM score of
    their last step (≈ P(success | prefix)); the answer is the best finished beam."""
    engine = make_engine(policy, tok)
    stops = (tok.stoi[";"], tok.think_close_id)
    sp = SamplingParams(temperature=temperature, max_new_tokens=step_tokens, stop_ids=stops)
    prompts = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    beams = [[([], 1.0, False)] for _ in items]  # per item: (response ids, score, done)
    generated, depth = 0, 0
    while any(not done for b in beams for _, _, done in b) and depth < max_len:
        live = [(i, ids) for i, b in enumerate(beams) for ids, _, done in b if not done]
        out = engine.generate([prompts[i] + ids for i, ids in live], expand, sp, seed=seed, step=depth)
        generated += int(engine.stats["rollout/generated_tokens"])
        children = [
            (i, (ids + s.response_ids)[:max_len])
            for j, (i, ids) in enumerate(live)
            for s in out[j * expand : (j + 1) * expand]
        ]
        scores = step_scores(prm, tok, [prompts[i] for i, _ in children], [ids for _, ids in children])
        pool = {i: [c for c in b if c[2]] for i, b in enumerate(beams)}  # finished beams stay in the running
        for (i, ids), sc in zip(children, scores):
            done = ids[-1] == tok.eot_id or len(ids) >= max_len
            pool[i].append((ids, sc[-1], done))
        beams = [sorted(pool[i], key=lambda c: -c[1])[:beam] for i in range(len(items))]
        depth += 1
    texts = []
    for b in beams:
        finished = [c for c in b if c[2]] or b
        texts.append(tok.decode(max(finished, key=lambda c: c[1])[0]))
    return texts, generated
