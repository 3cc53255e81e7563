"""The user's own reward functions, called unchanged in TRL's or verl's signature.

    task.reward=rewards.py:correct,rewards.py:fmt  task.reward_weights=[1.0,0.1]

TRL (batched):  f(prompts, completions, completion_ids=..., **columns) -> list[float | None]
    `prompts` are the dataset's prompts (strings or message lists), `completions` the responses
    exactly as TRL's GRPOTrainer decodes them, `batch_decode(completion_ids, skip_special_tokens=True)`:
    no end-of-turn marker (gpt_mini's `#`, a Hugging Face model's eos such as `<|im_end|>`), no
    special token (for message prompts: `[{"role": "assistant", "content": text}]`, as TRL gives them);
    `completion_ids` the sampled token ids (the stop token included, no padding: TRL's), every
    other column of the rows by name (but `prompt`, `completion` and `completion_ids`, as in TRL),
    `trainer_state` and `log_metric` (TRL's), and posttrain's own `finish_reason`: "stop" when the
    response ended with its end-of-turn token, "length" when the token cap cut it (what the marker
    told). None = not applicable: left out of the sum and of that function's mean (as TRL's nansum).
verl (per sample):  compute_score(data_source, solution_str, ground_truth, extra_info=None)
    -> float (or a dict with "score"), from verl's row fields; `solution_str` is the same text,
    as verl's reward managers decode it (`skip_special_tokens=True`), and `extra_info` the row's
    dict with `num_turns` and `rollout_reward_scores` added, as verl's naive manager passes it.
`async def` functions are awaited. A function is named by FILE.py:FUNC (a path) or module:FUNC
(importable), or handed over as a Python callable by the API (posttrain/api.py).

The sample's reward is Σ_i w_i·f_i over the functions that applied; each function's raw value is
a component, logged as `reward/<name>`. A function that raises, returns the wrong number of
values or a non-number fails the samples it was scoring: reward 0, an error counted in
`reward/errors` (the batch is retried one sample at a time first, so one bad sample costs only
itself). At startup `dry_run` calls every function once on real rows and turns any of those
faults into a one-line UsageError, before training.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from posttrain.errors import UsageError
from posttrain.tasks.base import validate_reward

_NOT_COLUMNS = ("prompt", "completion", "completion_ids")  # TRL's GRPOTrainer passes every other column
RESERVED = {"mean", "std", "errors", "timeouts", "workers_replaced", "latency_p50_s", "latency_p99_s", "proxy", "true"}


def load_callable(spec: str, key: str) -> Callable:
    """The function named by `FILE.py:FUNC` or `module:FUNC`; a UsageError naming `key` otherwise."""
    where, _, name = spec.strip().rpartition(":")
    if not where or not name:
        raise UsageError(f"{key}={spec!r}: name a function as FILE.py:FUNCTION or module:FUNCTION")
    if where.endswith(".py") or "/" in where:
        module = _import_file(Path(where), key)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise UsageError(f"{key}={spec!r}: cannot import module {where!r} ({e})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        names = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise UsageError(f"{key}={spec!r}: {where} has no function {name!r} (it has: {', '.join(names[:12])})")
    return fn


def _import_file(path: Path, key: str):
    if not path.is_file():
        raise UsageError(f"{key}: file {str(path)!r} not found")
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
    name = f"posttrain_user_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it (dataclasses look their module up), and so
    sys.path.insert(0, str(path.resolve().parent))  # it pickles by reference; the file may import neighbours
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise UsageError(f"{key}: {path} does not import: {type(e).__name__}: {e}") from None
    finally:
        sys.path.remove(str(path.resolve().parent))
    return module


def fn_name(fn) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return f"fn_{name}" if name in RESERVED else name


def style_of(fn, key: str) -> str:
    """ "trl" (batched: prompts, completions, …) or "verl" (per sample: compute_score)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        raise UsageError(f"{key}: {fn!r} has no inspectable signature") from None
    if "solution_str" in params or {"data_source", "ground_truth"} <= set(params):
        return "verl"
    if (
        "completions" in params
        or "completion_ids" in params
        or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    ):
        return "trl"
    raise UsageError(
        f"{key}: {fn_name(fn)}{inspect.signature(fn)} has neither TRL's reward signature "
        "f(prompts, completions, **kwargs) nor verl's compute_score(data_source, solution_str, "
        "ground_truth, extra_info=None)"
    )


def _await(value):
    """The value of an `async def` function's call (in a thread when this one runs an event loop,
    as in a notebook)."""
    if not inspect.isawaitable(value):
        return value

    async def wrap():
        return await value

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wrap())
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, wrap()).result()


def as_number(value, what: str) -> float | None:
    """A reward value as float: None stays None (not applicable), verl's {"score": x} is x; any
    other value must pass tasks.base.validate_reward's number check (bools, ints, floats, numpy and
    0-d tensor scalars; finite), else ValueError naming `what` (the bound is checked after the sum)."""
    if value is None:
        return None
    if isinstance(value, dict) and "score" in value:  # verl's {"score": ..., **extra}
        value = value["score"]
    x, why = validate_reward(value, math.inf, f"{what} returned")
    if why is not None:
        raise ValueError(why)
    return x


@dataclass
class RewardFn:
    """One user function: how to call it on a batch of samples, and its weight."""

    fn: Callable
    name: str
    style: str
    weight: float = 1.0

    @functools.cached_property
    def where(self) -> str:
        """FILE:FUNC, as a dying run names it (postmortem.py)."""
        try:
            return f"{inspect.getsourcefile(self.fn)}:{self.fn.__qualname__}"
        except (TypeError, AttributeError):  # a callable object, a builtin
            return describe(self.fn)

    def __call__(self, rows, texts, ids, step=None, log=None, finish=None) -> list[float | None]:
        """One value per row; `texts` are the completions as TRL gives them (tasks/base.verifier_args)
        and `finish` their finish reasons ("stop" when not known)."""
        if self.style == "verl":
            out = [
                _await(
                    self.fn(
                        data_source=r.columns.get("data_source", ""),
                        solution_str=t,
                        ground_truth=r.answer,
                        extra_info=_verl_extra_info(r.columns.get("extra_info")),
                    )
                )
                for r, t in zip(rows, texts)
            ]
        else:
            conversational = [not isinstance(r.prompt, str) for r in rows]
            kwargs = {
                "prompts": [r.prompt for r in rows],
                "completions": [
                    [{"role": "assistant", "content": t}] if c else t for t, c in zip(texts, conversational)
                ],
                "completion_ids": [list(i) for i in ids],
                **{k: [r.columns.get(k) for r in rows] for k in rows[0].columns if k not in _NOT_COLUMNS},
                "finish_reason": list(finish) if finish is not None else ["stop"] * len(rows),
                "trainer_state": SimpleNamespace(global_step=step),
                "log_metric": (lambda k, v: log.__setitem__(str(k), float(v))) if log is not None else None,
            }
            params = inspect.signature(self.fn).parameters
            if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
                kwargs = {k: v for k, v in kwargs.items() if k in params}  # a plain f(prompts, completions)
            out = _await(self.fn(**kwargs))
        if not isinstance(out, (list, tuple)) and not hasattr(out, "tolist"):
            raise ValueError(f"{self.name} returned {type(out).__name__}, not a list of rewards")
        out = list(out.tolist() if hasattr(out, "tolist") else out)
        if len(out) != len(rows):
            raise ValueError(f"{self.name} returned {len(out)} values for {len(rows)} completions (one per completion)")
        return [as_number(v, self.name) for v in out]


def _verl_extra_info(value):
    """The row's extra_info as verl's naive reward manager hands it over: a dict ({} when the row has
    none) with `num_turns` (None: single-turn) and `rollout_reward_scores` ({}) set; any other value as is."""
    if value is not None and not isinstance(value, dict):
        return value
    return {**(value or {}), "num_turns": None, "rollout_reward_scores": {}}


def reward_fns(specs, weights, key: str = "task.reward") -> list[RewardFn]:
    """RewardFn per spec (a "FILE.py:FUNC" / "module:FUNC" string or a callable), with its weight;
    names made unique (`f`, `f_2`)."""
    if weights and len(weights) != len(specs):
        n, fit = len(weights), ([*weights, *[1.0] * len(specs)])[: len(specs)]
        raise UsageError(
            f"task.reward_weights has {n} weight{'s' * (n != 1)} for {len(specs)} reward function{'s' * (len(specs) != 1)}; "
            f"give one per function, in their order: task.reward_weights=[{','.join(str(float(w)) for w in fit)}]"
        )
    out, seen = [], {}
    for i, spec in enumerate(specs):
        fn = load_callable(spec, key) if isinstance(spec, str) else spec
        if not callable(fn):
            raise UsageError(f"{key}: {spec!r} is not callable")
        name = fn_name(fn)
        seen[name] = seen.get(name, 0) + 1
        name = name if seen[name] == 1 else f"{name}_{seen[name]}"
        out.append(RewardFn(fn, name, style_of(fn, key), float(weights[i]) if weights else 1.0))
    return out


def split_specs(spec: str | list) -> list:
    if isinstance(spec, (list, tuple)):
        return [s for s in spec if s != ""]
    return [s.strip() for s in spec.split(",") if s.strip()]


def describe(fn: Any) -> str:
    """A callable as a config value: `module:qualname` (what the resolved config.yaml records)."""
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"
