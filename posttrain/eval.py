"""Evaluation: greedy and sampled accuracy, pass@k, majority vote, a per-K table.

pass@k uses the unbiased estimator of Chen et al. 2021 (HumanEval): with n samples of which
c are correct, pass@k = 1 − C(n−c, k) / C(n, k), averaged over problems. It is the chance
that at least one of k samples drawn without replacement from the n is correct.
Majority vote (maj@n) is correct when the most frequent final answer among the n samples
equals the gold answer (ties broken by first occurrence). With a reward-model `scorer`,
best-of-n (best@n) is correct when the sample the RM scores highest is: the two ways to
spend n samples at test time, voting and reranking, next to pass@1 (training it in).
"""

from __future__ import annotations

import weakref
from collections import Counter, defaultdict

import numpy as np
import torch

from posttrain.framework.agent import episode_metrics, run_episodes, solved
from posttrain.framework.backends import make_engine
from posttrain.framework.card import phase
from posttrain.framework.roles import RolloutEngine
from posttrain.framework.rollout import SamplingParams
from posttrain.progress import generate_with_progress
from posttrain.tasks.arithmetic import last_integer
from posttrain.tasks.base import correctness, faults, received_text, score_results

SUSPECT = "alarm/heldout_accuracy"  # the metric that carries suspicious_accuracy's line (report.py reads it)
_told: weakref.WeakSet = weakref.WeakSet()  # tasks whose suspicious accuracy has been printed once


def pass_at_k(n: int, c: int, k: int) -> float:
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {n}")
    if n - c < k:
        return 1.0
    # 1 - prod_{i=n-c+1}^{n} (1 - k/i): the stable product form of C(n-c,k)/C(n,k)
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def majority_correct(answers: list, gold) -> bool:
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return False
    return votes.most_common(1)[0][0] == gold


def response_budget(task, items) -> int:
    """Tokens a correct chain-of-thought response needs, plus slack for wrong ones (characters of the
    longest demonstration: exact for the character tokenizer, an upper bound for subword ones);
    64 for items without demonstrations."""
    known = [
        len(it.target(True)) for it in items if hasattr(it, "target") and getattr(it, "completion", "") is not None
    ]
    return (max(known) if known else 56) + 8


@torch.no_grad()
@phase("eval")
def evaluate(
    model,
    tokenizer,
    task,
    items,
    n: int = 0,
    ks=(1,),
    temperature: float = 1.0,
    max_new_tokens: int | None = None,
    seed: int = 0,
    engine: RolloutEngine | None = None,
    greedy: bool = True,
    prefix: str = "eval/",
    scorer=None,
    pool=None,
    label: str = "evaluation",
) -> dict:
    """Greedy accuracy, and with n > 0 sampled pass@1, pass@k for k in ks, maj@n, the mean reward,
    and with a reward-model `scorer` (`.score(prompts, responses)`, reward_models/reward_model.py) best@n.

    "Correct" is the task's correctness signal (tasks/base.py `correctness`), not the reward: a
    format bonus never counts as a solved problem. A task that has none (a dataset with reward
    functions but no answers) gets the reward metrics only. Majority vote needs an extracted
    answer (`task.final_answer`); without one maj@n is left out, not reported as 0. Scoring goes
    through the verifier `pool` when the run has one, so a crashing or hanging verifier costs a
    sample, never the run. Its faults are counted beside the accuracy, over greedy and sampled
    responses: `errors`, `timeouts`, and with a pool `workers_replaced` (a verifier failure scores
    0, so a low accuracy must say whether the policy or the verifier failed). Returns a flat dict
    of metrics plus `per_k`: {K: {...}} for tasks whose items have `k`.
    """
    if not items:  # eval.problems=0: no evaluation (benchmarks that time steps only)
        return {"per_k": {}}
    model.eval()
    engine = engine or make_engine(model, tokenizer)
    max_new = max_new_tokens or response_budget(task, items)
    prompts = [tokenizer.encode(tokenizer.chat_prompt(task.prompt(it))) for it in items]
    judged = getattr(task, "correctness", "task") is not None  # False: no way to tell right from wrong
    out: dict = {}
    scored: list = []  # (sample, result) pairs of both passes, for suspicious_accuracy
    counted: Counter = Counter()  # verifier faults, greedy and sampled together
    rows: dict = defaultdict(lambda: defaultdict(list))
    kof = (lambda it: it.k) if hasattr(items[0], "k") else (lambda it: 0)
    if greedy:
        samples = generate_with_progress(
            engine,
            prompts,
            1,
            SamplingParams(temperature=0.0, max_new_tokens=max_new),
            f"{label} (greedy)",
            seed=seed,
            items=items,
        )
        results, scoring = score_results(task, samples, pool)
        counted.update(faults(results, scoring, prefix))
        scored += zip(samples, results)
        if judged:
            correct = [correctness(r) for r in results]
            out[f"{prefix}greedy_acc"] = float(np.mean(correct))
            for it, c in zip(items, correct):
                rows[kof(it)]["greedy"].append(c)
        out[f"{prefix}greedy_reward"] = float(np.mean([r.reward for r in results]))
        out[f"{prefix}length_mean"] = float(np.mean([len(s.response_ids) for s in samples]))
    if n > 0:
        samples = generate_with_progress(
            engine,
            prompts,
            n,
            SamplingParams(temperature=temperature, max_new_tokens=max_new),
            f"{label} ({n} samples each)",
            seed=seed,
            items=items,
        )
        results, scoring = score_results(task, samples, pool)
        counted.update(faults(results, scoring, prefix))
        scored += zip(samples, results)
        out[f"{prefix}reward_mean"] = float(np.mean([r.reward for r in results]))
        if judged:
            out.update(_sampled(task, items, samples, results, n, ks, scorer, rows, kof, prefix))
    out.update({k: float(v) for k, v in counted.items()})
    line = suspicious_accuracy(task, scored) if judged else None
    if line is not None:
        out[SUSPECT] = line
        _tell_once(task, line)
    out["per_k"] = {
        k: {name: float(np.mean(v)) for name, v in cols.items()} | {"n": len(cols[next(iter(cols))])}
        for k, cols in sorted(rows.items())
    }
    return out


def evaluate_episodes(
    engine,
    tok,
    task,
    items,
    n: int = 0,
    ks=(1,),
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    seed: int = 0,
    prefix: str = "eval/",
) -> dict:
    """Held-out evaluation of an env task, with the keys of eval.evaluate: greedy accuracy, and
    with n > 0 sampled pass@1 and pass@k; plus the tool-call rate of each, and the episodes whose
    environment reported an error (`errors`; episodes run without a deadline, so no `timeouts`)."""
    greedy = run_episodes(
        engine, tok, task, items, 1, SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens), seed=seed
    )
    out = {
        f"{prefix}greedy_acc": float(np.mean([solved(e) for e in greedy])),
        f"{prefix}length_mean": float(np.mean([len(e.response_ids) for e in greedy])),
        f"{prefix}greedy_tool_call_rate": episode_metrics(greedy, "")["tool_call_rate"],
    }
    failed = [e.reward_error is not None for e in greedy]
    if n > 0:
        eps = run_episodes(
            engine,
            tok,
            task,
            items,
            n,
            SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens),
            seed=seed,
        )
        correct = [sum(solved(e) for e in eps[i * n : (i + 1) * n]) for i in range(len(items))]
        for k in ks:
            if k <= n:
                out[f"{prefix}pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for c in correct]))
        out[f"{prefix}tool_call_rate"] = episode_metrics(eps, "")["tool_call_rate"]
        failed += [e.reward_error is not None for e in eps]
        for name, used in (("with_tool", True), ("without_tool", False)):  # where the accuracy comes from
            part = [solved(e) for e in eps if (e.tool_calls > 0) == used]
            if part:
                out[f"{prefix}acc_{name}"] = float(np.mean(part))
    out[f"{prefix}errors"] = float(sum(failed))
    out["per_k"] = {}
    return out


def suspicious_accuracy(task, scored: list) -> str | None:
    """One line when every held-out sample is judged the same (all wrong, or all right) while their
    rewards differ: the usual sign that correctness reads the response differently from the reward
    (a marker left on the text, a parse that never matches), not that the policy is that bad or that
    good (issue 29). It names the correctness source and shows one completion exactly as that source
    received it (repr), the best-rewarded one; None when accuracy varies or the rewards do not."""
    if len(scored) < 2:
        return None
    correct = {correctness(r) for _, r in scored}
    rewards = [r.reward for _, r in scored]
    if len(correct) != 1 or max(rewards) - min(rewards) <= 1e-9:
        return None
    source = getattr(task, "correctness", None)
    cfg = getattr(task, "config", None)
    named = {
        "task.correct": f"task.correct={getattr(cfg, 'correct', '') or 'your function'}",
        "task.correct_threshold": f"task.correct_threshold={getattr(cfg, 'correct_threshold', None)} on the reward",
        "answer": "the answer match (the completion's last number, or its text, against the answer column)",
    }.get(source, f"the {getattr(task, 'name', type(task).__name__)} task's verifier")
    sample, _ = max(scored, key=lambda sr: sr[1].reward)
    return (
        f"held-out accuracy is {correct.pop():.0f} on all {len(scored)} samples while their rewards vary "
        f"({min(rewards):.3g} to {max(rewards):.3g}): correctness comes from {named}; the best-rewarded "
        f"completion, exactly as it received it: {received_text(task, sample)!r}"
    )


def _tell_once(task, line: str) -> None:
    """Print the line at a task's first suspicious evaluation only (every evaluation logs it)."""
    try:
        if task in _told:
            return
        _told.add(task)
    except TypeError:  # a task object that takes no weak reference: said every time
        pass
    print(line, flush=True)


def _sampled(task, items, samples, results, n, ks, scorer, rows, kof, prefix) -> dict:
    """pass@1, pass@k, maj@n (and best@n with an RM) from n scored samples per item."""
    p1, pk, maj, best = [], defaultdict(list), [], []
    scores = (
        scorer.score([task.prompt(it) for it in items for _ in range(n)], [s.text for s in samples])
        if scorer is not None
        else None
    )  # [len(items) · n], one RM pass
    answer = getattr(task, "final_answer", last_integer)  # a task's own answer extraction, if any
    for i, it in enumerate(items):
        group = samples[i * n : (i + 1) * n]
        correct = [correctness(r) for r in results[i * n : (i + 1) * n]]
        c = int(sum(correct))
        p1.append(c / n)
        for k in ks:
            if k <= n:
                pk[k].append(pass_at_k(n, c, k))
        gold = task.gold(it) if hasattr(task, "gold") else None
        answers = [answer(s.text) for s in group]
        if gold is not None and any(a is not None for a in answers):
            maj.append(float(majority_correct(answers, gold)))
        if scores is not None:  # the RM's pick among the n
            mine = scores[i * n : (i + 1) * n]
            best.append(correct[max(range(n), key=mine.__getitem__)])
            rows[kof(it)][f"best@{n}"].append(best[-1])
        rows[kof(it)]["pass@1"].append(c / n)
        for k in ks:
            if k <= n and k != 1:
                rows[kof(it)][f"pass@{k}"].append(pass_at_k(n, c, k))
    out = {f"{prefix}pass@1": float(np.mean(p1)), **{f"{prefix}pass@{k}": float(np.mean(v)) for k, v in pk.items()}}
    if maj:  # majority vote over the items whose responses have an extractable answer
        out[f"{prefix}maj@{n}"] = float(np.sum(maj) / len(items))
    if best:
        out[f"{prefix}best@{n}"] = float(np.mean(best))
    return out


def format_per_k(per_k: dict, title: str = "") -> str:
    if not per_k:
        return ""
    cols = [c for c in next(iter(per_k.values())) if c != "n"]
    lines = [title] if title else []
    lines.append("K    n     " + "  ".join(f"{c:>8}" for c in cols))
    for k, row in per_k.items():
        lines.append(f"{k:<4} {row['n']:<5} " + "  ".join(f"{row[c]:>8.3f}" for c in cols))
    return "\n".join(lines)
