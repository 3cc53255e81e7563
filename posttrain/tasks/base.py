"""The Task protocol: what the controller needs from an environment with a verifier.

A task hands out items (whatever its verifier needs), renders each as a prompt, and scores
a response text. Rewards are plain callables returning a `RewardResult`: the scalar the
algorithm sees plus named components that are logged (`reward/<name>`), and an error
string when the verifier could not score (the reward is then 0 and the error is counted).

A multi-turn task is an `Env` (framework/agent.py drives it): `reset(item)` gives the first
observation (the question), `step(action_text)` takes what the policy wrote in one turn and
returns `(observation, reward, done, info)`; the observation is injected into the
conversation with response_mask 0. A task with `make_env(item) -> Env` runs as episodes.

`compose` builds a reward from named parts (correctness + format + length shaping), each
one kept as a component so it is logged as `reward/<name>`.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from posttrain import postmortem


@dataclass
class RewardResult:
    reward: float
    components: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    reason: str | None = None  # why the reward is below 1 (e.g. the sandbox's verdict); not an error
    correct: float | None = None  # 1/0 when the task knows whether the answer is right (eval), None = it cannot say


def correctness(result: RewardResult) -> float | None:
    """Whether a scored response is correct, for evaluation (pass@k, greedy accuracy, maj@k) — not
    its reward: a format bonus must not count as a solved problem. The result's own `correct`,
    else its "correct" component (the built-in tasks), else reward ≥ 1 (tasks scored 0/1)."""
    if result.error is not None:
        return 0.0
    if result.correct is not None:
        return float(result.correct)
    if "correct" in result.components:
        return float(result.components["correct"] >= 1.0)
    return float(result.reward >= 1.0)


@dataclass
class JudgeConfig:
    """A judge model as the reward of any single-turn task (reward_models/judge.py); its verifier is logged beside."""

    model: str = ""  # "" = no judge; a posttrain run/checkpoint, Hugging Face directory or hub id org/name
    # (sampled in this process), or an OpenAI-compatible base URL http://HOST:PORT/v1
    mode: str = (
        "pointwise"  # pointwise (a 0..scale score per response) | pairwise (two responses, shown in random order)
    )
    template: str = ""  # prompt template file ({question} {response} | {response_a} {response_b}, {reference});
    # "" = the built-in one of the mode. Frozen in RUN_DIR/judge_prompt.txt
    scale: float = 10.0  # pointwise: the top score; reward = score / scale
    opponent: str = "group"  # pairwise: group = other responses to the same prompt | reference = the task's answer
    pairs: int = 2  # pairwise, opponent=group: comparisons per response (reward = its win rate)
    max_tokens: int = 64  # the judge's reply cap
    temperature: float = 0.0  # the judge's sampling temperature (0 = greedy)
    timeout_s: float = 30.0  # deadline of one judge call; a late reply fails (reward/judge_errors), the step goes on
    concurrency: int = 8  # URL judges: requests in flight
    api_model: str = ""  # URL judges: the request's `model` ("" = the first one the server's /v1/models lists)
    api_key_env: str = "OPENAI_API_KEY"  # URL judges: the environment variable whose value is sent as a bearer token


@dataclass
class TaskConfig:
    """The `task:` section of a stage config; `name` picks the task (tasks/__init__.py), the
    other keys are that task's own config dataclass, a subclass of this one."""

    name: str = (
        "arithmetic"  # arithmetic | countdown | tool_arith | reasoning_gym | leaky_arith | dataset | code | search,
    )
    # or your own class: FILE.py:Class / module:Class (or an installed entry point)
    judge: JudgeConfig = field(
        default_factory=JudgeConfig
    )  # task.judge.model=...: a judge model's verdicts are the reward


class Task(Protocol):
    name: str

    def items(self, n: int, split: str, seed: int) -> list[Any]:
        """`n` items of `split` ("train" or "test"), deterministic in `seed`."""

    def prompt(self, item: Any) -> str:
        """The question text (the chat template is applied by the tokenizer)."""

    def reward(self, item: Any, response: str) -> RewardResult:
        """Score one response text."""


class Env(Protocol):
    def reset(self, item: Any) -> str:
        """Start an episode on `item`; the first observation (the question text)."""

    def step(self, action_text: str) -> tuple[str | None, float, bool, dict]:
        """One policy turn in, `(observation | None, reward, done, info)` out. `info` may hold
        `components` (named reward parts) and `error` (a tool failure, already in the observation)."""


@runtime_checkable
class MultiTurnTask(Protocol):
    """A task whose items run as episodes (framework/agent.py): one `Env` per episode. What the
    controller checks to choose episodes over single `generate` calls."""

    def make_env(self, item: Any) -> Env: ...


def compose(parts: dict[str, float], weights: dict[str, float] | None = None) -> RewardResult:
    """reward = Σ weights[k]·parts[k] (weight 1 when not given); every part is a logged component.

    `compose({"correct": 1, "format": 1, "length": -0.2}, {"format": 0.1})` = 1 + 0.1 − 0.2 = 0.9."""
    weights = weights or {}
    return RewardResult(sum(weights.get(k, 1.0) * v for k, v in parts.items()), dict(parts))


def length_shaping(length: int, budget: int, ramp: int) -> float:
    """0 up to `budget − ramp` characters, then down linearly to −1 at `budget` and beyond
    (a soft overlong penalty on the response text; 0 when ramp = 0)."""
    if ramp <= 0:
        return 0.0
    return -min(1.0, max(0.0, (length - (budget - ramp)) / ramp))


def in_heldout(text: str, frac: float) -> bool:
    """A problem belongs to the held-out split when a stable hash of its text falls below `frac`."""
    return (zlib.crc32(text.encode()) % 10_000) < frac * 10_000


def split_draws(draw, key, split: str, frac: float, n: int, seed) -> list:
    """`n` problems from `draw(rng)` that fall in `split` (by `in_heldout(key(problem), frac)`),
    deterministic in (split, seed): rejection keeps train and held-out disjoint."""
    rng = random.Random(f"{split}/{seed}")
    want, out = split != "train", list[Any]()
    while len(out) < n:
        p = draw(rng)
        if in_heldout(key(p), frac) == want:
            out.append(p)
    return out


def corpus_lines(task, line, n_chars: int, split: str, seed) -> str:
    """`line(item)` for items of `split`, one per line, until `n_chars` characters: a task's
    pretraining corpus (train split) and its validation text (test split)."""
    lines, size, chunk = [], 0, 0
    while size < n_chars:
        for item in task.items(256, split, f"corpus/{seed}/{chunk}"):
            lines.append(line(item) + "\n")
            size += len(lines[-1])
        chunk += 1
    return "".join(lines)


class LineCorpus:
    """A task whose pretraining corpus and validation text are `corpus_line(item)` lines of its
    train and test problems (countdown, tool arithmetic, reasoning-gym)."""

    corpus_line: Callable[[Any], str]  # each such task's one line per item

    def corpus(self, n_chars: int, seed: int) -> str:
        return corpus_lines(self, self.corpus_line, n_chars, "train", seed)

    def validation_text(self, seed: int) -> str:
        return corpus_lines(self, self.corpus_line, 8000, "test", seed)


REWARD_BOUND = 1e6  # default |reward| accepted (RLConfig.reward_bound); beyond it a verifier is broken, not generous


def validate_reward(value, bound: float = REWARD_BOUND, what: str = "reward") -> tuple[float, str | None]:
    """`(float(value), None)` for a usable reward, else `(0.0, why)`: the one check every verifier
    output passes (reward and each component), in-process and in pool workers alike.

    Usable: a real number (bool, int, float, numpy scalar, a 0-d tensor) that converts to a
    finite float with |r| ≤ bound. Refused: non-numbers (a string is not parsed), an int too
    large for a float (10**400), NaN, ±inf and huge values (±1e308 would make reward/mean
    infinite and pass every `reward >= 1` test)."""
    v = value
    if not isinstance(v, numbers.Real) and hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
        v = v.item()  # numpy bool_, a 0-d array or tensor
    if not isinstance(v, numbers.Real):
        return 0.0, f"{what} {value!r} ({type(value).__name__}), not a number"
    try:
        r = float(v)
    except OverflowError:
        return 0.0, f"{what} {str(value)[:12]}... ({len(str(value))} digits), too large for a float"
    if not math.isfinite(r):
        return 0.0, f"a non-finite {what} {r!r}"
    if abs(r) > bound:
        return 0.0, f"{what} {r:.3g}, beyond reward_bound={bound:g} (raise verifier.reward_bound if it is meant)"
    return r, None


def safe_reward(task: Task, item: Any, response: str, *sampled) -> RewardResult:
    """Call the verifier; an exception or an unusable reward or component (validate_reward)
    becomes 0 with the reason. The bound is `task.reward_bound` when the RL recipe set it.
    A task with `wants_ids` also gets what `verifier_args` adds: the sampled token ids, the
    completion as TRL gives it, the finish reason (the user's reward functions read them)."""
    try:
        reward: Callable[..., RewardResult] = task.reward  # a `wants_ids` task's reward takes more
        result = reward(item, response, *sampled) if getattr(task, "wants_ids", False) else reward(item, response)
    except Exception as e:  # a verifier bug must never kill a step; it is counted instead
        return RewardResult(0.0, error=f"{type(e).__name__}: {e}")
    return checked(task, result)


def verifier_args(task: Task, sample) -> tuple:
    """What the verifier is called with for one sampled response: `(item, text)`, and for a task with
    `wants_ids` (your rows and reward functions, the judge) also `(completion_ids, completion,
    finish_reason)`: the ids with the stop token and no padding, the text as TRL and verl decode
    those ids (no end-of-turn marker: `Sample.completion`), and `stop` or `length` (issue 29)."""
    if not getattr(task, "wants_ids", False):
        return (sample.item, sample.text)
    return (sample.item, sample.text, list(sample.response_ids), received_text(task, sample), sample.finish_reason)


class BatchScored:
    """A `wants_ids` task that scores in batches (your rows' functions, the judge): `reward` is its
    `reward_batch(items, responses, ids, step, completions, finish_reasons)` on one response."""

    wants_ids = True
    reward_batch: Callable[..., list[RewardResult]]  # each subclass's own

    def reward(self, item, response: str, ids=None, completion=None, finish_reason=None) -> RewardResult:
        """One response; called by hand without `completion`, the response is taken as the completion."""
        one = self.reward_batch(
            [item], [response], [ids or []], completions=[completion], finish_reasons=[finish_reason]
        )
        return one[0]


def batch_lists(n: int, ids=None, completions=None, finish_reasons=None) -> tuple[list, list, list]:
    """A reward_batch's optional per-response lists filled in: no ids, no completion (the response
    stands for it), finish reason unknown (None)."""
    return (
        ids if ids is not None else [[] for _ in range(n)],
        list(completions) if completions is not None else [None] * n,
        list(finish_reasons) if finish_reasons is not None else [None] * n,
    )


def received_text(task: Task, sample) -> str:
    """The response text the task's scoring reads: for a `wants_ids` task the completion as TRL gives
    it (`Sample.completion`; the decoded text of a sample no engine decoded), else the decoded text."""
    completion = getattr(sample, "completion", None)
    return sample.text if completion is None or not getattr(task, "wants_ids", False) else completion


def checked(task: Task, result) -> RewardResult:
    """A verifier's result after the one validation every path applies (validate_reward on the
    reward and each component, the bound `task.reward_bound`); 0 with the reason otherwise."""
    if not isinstance(result, RewardResult):
        return RewardResult(0.0, error=f"verifier returned {type(result).__name__}, not RewardResult")
    bound = getattr(task, "reward_bound", REWARD_BOUND)
    reward, why = validate_reward(result.reward, bound)
    if why is None and not isinstance(result.components, dict):
        why = f"components {type(result.components).__name__}, not a dict"
    components = {}
    for name, value in result.components.items() if why is None else ():
        components[name], why = validate_reward(value, bound, f"component {name!r} =")
        if why is not None:
            break
    if why is not None:
        return RewardResult(0.0, error=f"verifier returned {why}")
    return dataclasses.replace(result, reward=reward, components=components)


def mean_reward(results: Sequence[RewardResult]) -> float:
    return sum(r.reward for r in results) / max(len(results), 1)


def score_results(task: Task, samples, pool=None, step: int | None = None) -> tuple[list[RewardResult], dict]:
    """A RewardResult per sample, and the pool's counts.

    A verifier error scores 0 and is counted (`reward/errors`); a sample whose generation
    failed (`finish_reason == "error"`) is scored 0 without calling the verifier. With a
    `pool` (tasks/pool.py) the verifier runs in worker processes under a deadline: hangs
    score 0 and are counted in `reward/timeouts`; in-process, a hang would stall the step.
    A task with `reward_batch(items, responses)` (a reward model: one forward for many samples;
    a dataset's reward functions) is called once for the batch, in-process or in one worker
    (pool.score_batch); if that raises, every sample falls back to `task.reward`.
    """
    results = [
        RewardResult(s.reward, s.reward_components, s.reward_error)
        if getattr(s, "scored", False)
        else RewardResult(0.0, error="generation failed")
        for s in samples
    ]  # episodes arrive scored
    todo = [i for i, s in enumerate(samples) if not getattr(s, "scored", False) and s.finish_reason != "error"]
    args = [verifier_args(task, samples[i]) for i in todo]
    metrics = {"reward/timeouts": 0.0}
    if pool is not None:
        if hasattr(task, "reward_batch"):
            scored, stats = pool.score_batch(args, step)
        else:
            scored, stats = pool.score(args)
        metrics = {
            "reward/timeouts": float(stats["timeouts"]),
            "reward/workers_replaced": float(stats["replaced"]),
            **{f"reward/{k}": v for k, v in stats.items() if k.startswith("latency")},
        }
    else:  # in-process: its time is time/reward_s (latency keys would break the exact-resume test)
        scored = score_in_process(task, args, step)
    for i, res in zip(todo, scored):
        results[i] = res
    return results, metrics


def score_in_process(task: Task, args: list[tuple], step: int | None = None) -> list[RewardResult]:
    """The verifier called in this process: `reward_batch` once when the task has one, else (or when
    that fails) `safe_reward` per response. A pool worker runs this same function on a batch
    (pool.score_batch), so a batch scores alike in both places. A process that dies in here names
    the verifier (posttrain/postmortem.py)."""
    with postmortem.doing(f"while scoring {len(args)} responses in-process with {verifier_name(task)}"):
        scored = _batch_rewards(task, args, step)
        if scored is None:
            scored = [safe_reward(task, *a) for a in args]
    return scored


def verifier_name(task) -> str:
    """The verifier a dying run names: the scoring class's reward method and its file."""
    cls = type(task)
    try:
        return f"{cls.__qualname__}.reward ({inspect.getsourcefile(cls)})"
    except TypeError:  # a class without a source file
        return f"{cls.__module__}.{cls.__qualname__}.reward"


def faults(results: Sequence[RewardResult], metrics: dict, prefix: str) -> dict:
    """The verifier faults of one score_results call under `prefix` (reward/ in training, eval/ in
    evaluation): errors (timeouts apart), timeouts, and workers_replaced when a pool scored."""
    timeouts = metrics.get("reward/timeouts", 0.0)
    out = {f"{prefix}errors": sum(r.error is not None for r in results) - timeouts, f"{prefix}timeouts": timeouts}
    if "reward/workers_replaced" in metrics:
        out[f"{prefix}workers_replaced"] = metrics["reward/workers_replaced"]
    return out


def score_samples(task: Task, samples, pool=None, step: int | None = None) -> dict:
    """Score every sample (score_results), fill its `reward`, `reward_components` and
    `reward_error`, and return the step's reward metrics."""
    results, metrics = score_results(task, samples, pool, step)
    for s, res in zip(samples, results):
        s.reward, s.reward_components, s.reward_error = float(res.reward), res.components, res.error
    logged = {f"reward/{k}": v for k, v in getattr(task, "logged", {}).items()}  # TRL's log_metric
    return {**faults(results, metrics, "reward/"), **metrics, **logged, **component_means(samples)}


def component_means(samples) -> dict:
    """A reward component's mean over the samples it scored (a TRL function's None leaves a sample out),
    a failed sample counting 0 in every component: from the scored samples alone, so the samples of
    every rank give the step's value (framework/controller.py)."""
    errors = sum(s.reward_error is not None for s in samples)
    comps = dict[str, list[float]]()
    for s in samples:
        for k, v in s.reward_components.items():
            comps.setdefault(k, []).append(v)
    return {f"reward/{k}": sum(v) / (len(v) + errors) for k, v in comps.items()}


def _batch_rewards(task, args: list[tuple], step=None) -> list | None:
    """`task.reward_batch` over the responses (their `verifier_args`: a reward model scores many in one
    forward; a dataset's reward functions take the whole batch), or None when the task has none or it
    fails; the caller then scores one by one (errors counted)."""
    fn = getattr(task, "reward_batch", None)
    if fn is None:
        return None
    items, texts = [a[0] for a in args], [a[1] for a in args]
    extra = (
        {
            "ids": [a[2] for a in args],
            "step": step,
            "completions": [a[3] for a in args],
            "finish_reasons": [a[4] for a in args],
        }
        if getattr(task, "wants_ids", False)
        else {}
    )
    try:
        results = fn(items, texts, **extra)
    except Exception:  # counted per sample by the one-by-one fallback
        return None
    if len(results) != len(items) or not all(isinstance(r, RewardResult) for r in results):
        return None
    return [r if r.error is not None else checked(task, r) for r in results]
