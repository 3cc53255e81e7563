"""Verifiers that misbehave on purpose, one way per fault class, loaded by path as a user's own code:
the fault table (benchmarks/verifier_faults.py) and the fault tests (tests/test_verifier_faults.py,
tests/test_postmortem.py) run them.

    task.name=benchmarks/faulty_verifiers.py:Faulty task.fault=segfault task.where=eval
    task.name=dataset task.train=ROWS.jsonl task.reward=benchmarks/faulty_verifiers.py:faulty

`Faulty` is the built-in arithmetic task whose `reward` misbehaves on a fixed subset of its items
(sum % every == 0) of the split `where` names: train, eval (the held-out items) or both.
`faulty` is a TRL reward function that misbehaves on the rows whose `fault` column is set
(rows_with_faults writes such rows). Outside that subset both score as the built-in verifier.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from dataclasses import dataclass

from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask, is_heldout, verify
from posttrain.tasks.base import RewardResult

# what a faulty call does: a value to return, or an action
VALUES = {
    "nan": float("nan"),
    "inf": float("inf"),
    "huge": 1e308,
    "bigint": 10**400,
    "str": "1.0",
}
FAULTS = (
    "raise",
    "segfault",
    "exit",
    "hang",
    *VALUES,
    "none",  # returns None, not a RewardResult (a reward function: None is "not applicable", so 1 + None)
    "bad_component",  # a NaN component
    "str_component",  # a string component
    "leak",  # keeps 5 GiB of address space per call: past verifier.memory_mb (4096) at once (untouched: no RAM)
)
FATAL = ("segfault", "exit")  # kill the process they run in
_kept: list = []


def misbehave(fault: str):
    """Do what `fault` says; returns a value for the value faults (None for the others)."""
    if fault == "raise":
        raise ValueError("injected fault")
    if fault == "segfault":
        ctypes.string_at(0)
    if fault == "exit":
        os._exit(3)
    if fault == "hang":
        time.sleep(3600)
    if fault == "leak":
        _kept.append(mmap.mmap(-1, 5 << 30))
    return VALUES.get(fault)


@dataclass
class FaultyConfig(ArithmeticConfig):
    name: str = "faulty"
    fault: str = "raise"  # one of FAULTS
    where: str = "both"  # train | eval | both: whose items misbehave
    every: int = 4  # items whose sum is a multiple of this misbehave


class Faulty(ArithmeticTask):
    Config = FaultyConfig
    name = "faulty"

    def fires(self, item) -> bool:
        c = self.config
        held = is_heldout(item, c.heldout_frac)
        return item.answer % c.every == 0 and c.where in ("both", "eval" if held else "train")

    def reward(self, item, response):
        if not self.fires(item):
            return super().reward(item, response)
        fault = self.config.fault
        value = misbehave(fault)
        if fault == "none":
            return None
        if fault == "bad_component":
            return RewardResult(1.0, {"correct": float("nan")})
        if fault == "str_component":
            return RewardResult(1.0, {"correct": "yes"})
        return RewardResult(value if value is not None else 1.0, {"correct": 1.0})


def faulty(prompts, completions, answer, fault, **kwargs):
    """TRL's signature: 1 when the last integer is the answer; the rows with a `fault` misbehave."""
    out = []
    for text, gold, f in zip(completions, answer, fault):
        value = misbehave(f) if f else None
        out.append(value if f in VALUES else None if f == "none" else verify(text, int(gold)))
    return out


def rows_with_faults(task: Faulty, n: int, split: str, seed: int = 0) -> list[dict]:
    """Dataset rows of `task`'s problems with the `fault` column set where `task.fires`."""
    return [
        {"prompt": it.question, "answer": it.answer, "fault": task.config.fault if task.fires(it) else ""}
        for it in task.items(n, split, seed)
    ]
