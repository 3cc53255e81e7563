"""The Task protocol: what the controller needs from an environment with a verifier.

A task hands out items (whatever its verifier needs), renders each as a prompt, and scores
a response text. Rewards are plain callables returning a `RewardResult`: the scalar the
algorithm sees plus named components that are logged (`reward/<name>`), and an error
string when the verifier could not score (the reward is then 0 and the error is counted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence


@dataclass
class RewardResult:
    reward: float
    components: dict[str, float] = field(default_factory=dict)
    error: str | None = None


class Task(Protocol):
    name: str

    def items(self, n: int, split: str, seed: int) -> list[Any]:
        """`n` items of `split` ("train" or "test"), deterministic in `seed`."""

    def prompt(self, item: Any) -> str:
        """The question text (the chat template is applied by the tokenizer)."""

    def reward(self, item: Any, response: str) -> RewardResult:
        """Score one response text."""


def safe_reward(task: Task, item: Any, response: str) -> RewardResult:
    """Call the verifier; an exception or a non-finite/non-numeric reward becomes 0 with a reason."""
    try:
        result = task.reward(item, response)
    except Exception as e:  # a verifier bug must never kill a step; it is counted instead
        return RewardResult(0.0, error=f"{type(e).__name__}: {e}")
    if not isinstance(result, RewardResult):
        return RewardResult(0.0, error=f"verifier returned {type(result).__name__}, not RewardResult")
    r = result.reward
    if not isinstance(r, (int, float)) or r != r or r in (float("inf"), float("-inf")):
        return RewardResult(0.0, error=f"verifier returned a non-finite reward {r!r}")
    return result


def mean_reward(results: Sequence[RewardResult]) -> float:
    return sum(r.reward for r in results) / max(len(results), 1)


def score_samples(task: Task, samples) -> dict:
    """Fill `reward`, `reward_components` and `reward_error` of every sample; return metrics.

    A verifier error scores 0 and is counted (`reward/errors`); a sample whose generation
    failed (`finish_reason == "error"`) is scored 0 without calling the verifier. A task with
    `reward_batch(items, responses)` (a reward model: one forward for many samples) is called
    once for the batch; if that raises, every sample falls back to `task.reward` one by one.
    """
    errors, comps = 0, {}
    batched = _batch_rewards(task, samples)
    for i, s in enumerate(samples):
        if s.finish_reason == "error":
            res = RewardResult(0.0, error="generation failed")
        elif batched is not None:
            res = batched[i]
        else:
            res = safe_reward(task, s.item, s.text)
        s.reward, s.reward_components, s.reward_error = float(res.reward), res.components, res.error
        errors += res.error is not None
        for k, v in res.components.items():
            comps.setdefault(k, []).append(v)
    n = max(len(samples), 1)
    return {"reward/errors": float(errors), **{f"reward/{k}": sum(v) / n for k, v in comps.items()}}


def _batch_rewards(task, samples) -> list | None:
    fn = getattr(task, "reward_batch", None)
    if fn is None:
        return None
    try:
        results = fn([s.item for s in samples], [s.text for s in samples])
    except Exception:  # counted per sample by the one-by-one fallback
        return None
    if len(results) != len(samples) or not all(isinstance(r, RewardResult) for r in results):
        return None
    return results
