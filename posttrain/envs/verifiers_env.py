"""`task.name=verifiers:ENV`: an environment written with Prime Intellect's `verifiers`, trained through the server.

    posttrain rl task.name=verifiers:my_env task.env_args='{difficulty: 2}' rollout.max_new_tokens=48
    posttrain rl task.name=verifiers:envs/my_env.py ...          # a local file with load_environment()

ENV is an installed environment module (what `vf.load_environment(ENV)` imports) or a local
`.py` file; its `load_environment(**task.env_args)` returns a `vf.Environment` (SingleTurnEnv,
MultiTurnEnv, ...). Each RL step draws rows of the environment's dataset; for each row the
environment runs its `samples_per_prompt` rollouts as one group (`env.run_group`) against the
live policy served on 127.0.0.1, and scores them with its rubric: the rubric's reward is the
reward, each rubric function and metric is logged as `reward/<name>`. The episode id rides on
every request as the X-Episode-Id header (verifiers' `extra_headers_from_state`, from the
rollout's `example_id`), so the server records exactly what each rollout was served.

Held-out rows are the environment's eval dataset when it has one, else a stable hash split
(`task.test_frac`) of its dataset. Written for the classic environment API of verifiers
0.1.9–0.2.x (Environment, Rubric, load_environment); verifiers 0.3 replaced it with tasksets
and harness programs, which this adapter does not run.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

from posttrain.chat import check_messages, prompt_text
from posttrain.errors import UsageError
from posttrain.tasks.base import RewardResult, TaskConfig, in_heldout

PREFIX = "verifiers:"
KEY_VAR = "POSTTRAIN_SERVE_KEY"  # verifiers reads the API key from an environment variable


@dataclass
class VerifiersConfig(TaskConfig):
    name: str = "verifiers:"  # verifiers:MODULE (installed) or verifiers:PATH.py (a local file)
    env_args: dict = field(default_factory=dict)  # keyword arguments of the environment's load_environment()
    test_frac: float = 0.1  # held-out share of the dataset rows (by a stable hash) when the env has no eval set


def load_env(spec: str, env_args: dict):
    """The `vf.Environment` that `spec` (a module name or a .py file) builds; UsageError naming what failed."""
    try:
        import verifiers as vf
    except ImportError:
        raise UsageError(
            "task.name=verifiers:... needs the verifiers package: pip install 'posttrain[verifiers]'"
        ) from None
    if not hasattr(vf, "Environment"):
        raise UsageError(
            f"verifiers {getattr(vf, '__version__', '?')} has no Environment API (0.3 replaced it with "
            "tasksets); install verifiers>=0.1.9,<0.3: pip install 'posttrain[verifiers]'"
        )
    if not spec:
        raise UsageError("task.name=verifiers: names no environment; use verifiers:MODULE or verifiers:PATH/TO/env.py")
    try:
        if spec.endswith(".py") or Path(spec).is_file():
            path = Path(spec)
            if not path.is_file():
                raise UsageError(f"task.name=verifiers:{spec}: no such file")
            module_spec = importlib.util.spec_from_file_location(f"posttrain_vf_{path.stem}", path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_spec.name] = module
            module_spec.loader.exec_module(module)
            if not hasattr(module, "load_environment"):
                raise UsageError(f"task.name=verifiers:{spec}: the file defines no load_environment()")
            env = module.load_environment(**env_args)
        else:
            env = vf.load_environment(spec, **env_args)
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - an environment that does not load is a usage error, named
        raise UsageError(
            f"task.name=verifiers:{spec} does not load ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
            "check the module and task.env_args"
        ) from None
    if not isinstance(env, vf.Environment):
        raise UsageError(
            f"task.name=verifiers:{spec}: load_environment() returned {type(env).__name__}, not a verifiers Environment"
        )
    return env


class VerifiersTask:
    """A verifiers environment as a posttrain task whose episodes run outside (envs/source.py)."""

    Config = VerifiersConfig
    external = True

    def __init__(self, config: VerifiersConfig):
        self.config = config
        self.name = config.name
        self.env = load_env(config.name[len(PREFIX) :], dict(config.env_args))
        rows = [dict(r) for r in self.env.get_dataset()]
        if not rows:
            raise UsageError(f"task.name={config.name}: the environment's dataset is empty")
        eval_set = getattr(self.env, "eval_dataset", None)
        if eval_set is not None and len(eval_set):
            self.rows = {"train": rows, "test": [dict(r) for r in self.env.get_eval_dataset()]}
        else:
            test = [r for r in rows if in_heldout(prompt_text(self._messages(r)), config.test_frac)]
            train = [r for r in rows if not in_heldout(prompt_text(self._messages(r)), config.test_frac)]
            self.rows = {"train": train or rows, "test": test or rows}
        os.environ.setdefault(KEY_VAR, "posttrain")

    @staticmethod
    def _messages(row) -> list[dict]:
        prompt = row.get("prompt")
        return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt

    def items(self, n: int, split: str, seed) -> list[dict]:
        """n dataset rows of `split`, a shuffled pass after a shuffled pass (deterministic in seed)."""
        pool, rng, out = self.rows["test" if split != "train" else "train"], random.Random(f"{split}/{seed}"), []
        while len(out) < n:
            order = list(range(len(pool)))
            rng.shuffle(order)
            out.extend(pool[i] for i in order[: n - len(out)])
        return out

    def prompt(self, item: dict):
        return check_messages(self._messages(item), f"task.name={self.name}: dataset row")

    def check(self, tok, max_len: int | None, max_new_tokens: int) -> None:
        """Before training: the first rows render with this model's template and leave room for a response."""
        for i, row in enumerate(self.rows["train"][:50]):
            try:
                n = len(tok.encode(tok.chat_prompt(self.prompt(row))))
            except UsageError as e:
                raise UsageError(f"task.name={self.name}: dataset row {i}: {e}") from None
            if max_len is not None and n + max_new_tokens > max_len:
                raise UsageError(
                    f"task.name={self.name}: dataset row {i} renders to {n} tokens; with "
                    f"rollout.max_new_tokens={max_new_tokens} that exceeds the model's {max_len}"
                )

    async def group(self, item: dict, endpoint, episode_ids: list[str]) -> list[RewardResult]:
        """The environment's rollouts of one row, scored as a group by its rubric."""
        from verifiers.types import ClientConfig

        client = ClientConfig(
            api_base_url=endpoint.base_url,
            api_key_var=KEY_VAR,
            max_retries=0,
            extra_headers_from_state={"X-Episode-Id": "example_id"},
        )
        inputs = [{**item, "example_id": eid} for eid in episode_ids]
        sampling = {"temperature": endpoint.temperature, "max_tokens": endpoint.max_tokens}
        outputs = await self.env.run_group(inputs, client, endpoint.model, sampling)
        results = []
        for out in outputs:
            err = out.get("error")
            comps = {k: float(v) for k, v in (out.get("metrics") or {}).items() if isinstance(v, (int, float))}
            results.append(
                RewardResult(
                    out.get("reward"),
                    comps,
                    error=None
                    if err is None
                    else str(err.get("error_chain_repr", err) if isinstance(err, dict) else err),
                )
            )
        return results
