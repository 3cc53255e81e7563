"""Tasks: prompts, gold answers and verifiers (reward functions). See tasks/base.py.

The registry: `task.name` in a stage config picks the task class and its config dataclass.
Modules are imported when a task is used (reasoning-gym is only needed for its adapter).
"""

from __future__ import annotations

import importlib

# name -> (module, task class, config class)
TASKS = {
    "arithmetic": ("posttrain.tasks.arithmetic", "ArithmeticTask", "ArithmeticConfig"),
    "countdown": ("posttrain.tasks.countdown", "CountdownTask", "CountdownConfig"),
    "tool_arith": ("posttrain.tasks.tools", "ToolArithmeticTask", "ToolArithmeticConfig"),
    "reasoning_gym": ("posttrain.tasks.reasoning_gym", "ReasoningGymTask", "ReasoningGymConfig"),
    "leaky_arith": ("posttrain.tasks.leaky", "LeakyArithmeticTask", "LeakyArithmeticConfig"),
    "dataset": ("posttrain.tasks.dataset", "DatasetTask", "DatasetConfig"),
}


def _lookup(name: str, which: int):
    if name not in TASKS:
        from posttrain import UsageError
        raise UsageError(f"task.name={name!r} is unknown; use one of {', '.join(TASKS)}")
    module, task_cls, cfg_cls = TASKS[name]
    return getattr(importlib.import_module(module), (task_cls, cfg_cls)[which])


def config_class(name: str):
    """The config dataclass of task `name` (a tasks.base.TaskConfig subclass)."""
    return _lookup(name, 1)


def make(config):
    """The task a `task:` config section describes."""
    return _lookup(config.name, 0)(config)
