"""Tasks: prompts, gold answers and verifiers (reward functions). See tasks/base.py.

The registry: `task.name` in a stage config picks the task class and its config dataclass.
Built-in modules are imported when a task is used (reasoning-gym is only needed for its adapter).
Beyond the built-in names, `task.name` may be

  FILE.py:Class or module:Class   your own Task class (items, prompt, reward; or make_env for
                                  multi-turn episodes) with its own keys in a nested `Config`
                                  dataclass deriving from tasks.base.TaskConfig;
  verifiers:ENV                   a `verifiers` environment (an installed module or a .py file), its
                                  episodes run through the policy server (posttrain/envs/);
  an entry-point name             an installed package's `posttrain.tasks` entry point
                                  (`[project.entry-points."posttrain.tasks"] mytask = "pkg.mod:MyTask"`).
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from posttrain.errors import UsageError
from posttrain.tasks.base import TaskConfig
from posttrain.tasks.rewards import load_callable

# name -> (module, task class, config class)
TASKS = {
    "arithmetic": ("posttrain.tasks.arithmetic", "ArithmeticTask", "ArithmeticConfig"),
    "countdown": ("posttrain.tasks.countdown", "CountdownTask", "CountdownConfig"),
    "tool_arith": ("posttrain.tasks.tools", "ToolArithmeticTask", "ToolArithmeticConfig"),
    "reasoning_gym": ("posttrain.tasks.reasoning_gym", "ReasoningGymTask", "ReasoningGymConfig"),
    "leaky_arith": ("posttrain.tasks.leaky", "LeakyArithmeticTask", "LeakyArithmeticConfig"),
    "dataset": ("posttrain.tasks.dataset", "DatasetTask", "DatasetConfig"),
    "code": ("posttrain.tasks.code", "CodeTask", "CodeConfig"),
    "openenv": ("posttrain.envs.openenv_env", "OpenEnvTask", "OpenEnvConfig"),
    "search": ("posttrain.tasks.search", "SearchTask", "SearchConfig"),
}
VERIFIERS = ("posttrain.envs.verifiers_env", "VerifiersTask", "VerifiersConfig")  # task.name=verifiers:ENV
GROUP = "posttrain.tasks"


def _user_class(name: str):
    """A Task class named FILE.py:Class, module:Class, or by an installed entry point."""
    if ":" in name:
        cls = load_callable(name, "task.name")
    else:
        found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
        if not found:
            installed = sorted(ep.name for ep in entry_points(group=GROUP))
            raise UsageError(
                f"task.name={name!r} is unknown; use one of {', '.join([*TASKS, *installed])}, "
                "or your own class as FILE.py:Class or module:Class"
            )
        cls = found[0].load()
    if (
        not isinstance(cls, type)
        or not any(hasattr(cls, m) for m in ("make_env", "reward", "episode", "group"))
        or not (hasattr(cls, "items") and hasattr(cls, "prompt"))
    ):
        raise UsageError(
            f"task.name={name!r} is not a Task class: it needs items(n, split, seed), prompt(item), and "
            "reward(item, response), make_env(item), or an external driver episode()/group() "
            "(tasks/base.py, envs/__init__.py)"
        )
    return cls


def _lookup(name: str, which: int):
    if name in TASKS or name.startswith("verifiers:"):
        module, task_cls, cfg_cls = TASKS.get(name) or VERIFIERS
        return getattr(importlib.import_module(module), (task_cls, cfg_cls)[which])
    cls = _user_class(name)
    if which == 0:
        return cls

    cfg = getattr(cls, "Config", None)
    if cfg is None:  # a task without keys of its own
        return TaskConfig
    if not (isinstance(cfg, type) and issubclass(cfg, TaskConfig)):
        raise UsageError(
            f"task.name={name!r}: {cls.__name__}.Config must be a dataclass deriving from "
            "posttrain.tasks.base.TaskConfig"
        )
    return cfg


def config_class(name: str):
    """The config dataclass of task `name` (a tasks.base.TaskConfig subclass)."""
    return _lookup(name, 1)


def make(config, **kw):
    """The task a `task:` config section describes (`kw`: Python objects the API hands over, such
    as a dataset's reward functions). A judge's reward (`task.judge.model`) is not the task's own:
    the recipe wraps it (reward_models/wrap.py)."""
    return _lookup(config.name, 0)(config, **kw)
