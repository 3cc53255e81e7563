"""A multi-turn tool environment in your own module: products of two numbers, with a calculator.

    T="task.name=examples/tool_env/calc_task.py:CalcTask"
    posttrain pretrain $T steps=400 out=runs/calc/pt            # the task's demonstrations as a corpus
    posttrain sft $T init=runs/calc/pt steps=300 out=runs/calc/sft
    posttrain rl $T init=runs/calc/sft steps=40 eval_every=20 out=runs/calc/rl

An episode (built-in tokenizer; `⟦ ⟧` wrap a call, `⟨ ⟩` the tool's answer, which the policy never
writes itself and is never trained on):

    <417*382>⟦417*382⟧⟨159294⟩159294#
             ^ turn 1 ends at ⟧: the env runs the calculator
                      ^ observation (masked)  ^ turn 2, scored

posttrain needs four methods from a task: items, prompt, make_env (or reward, for one turn) and,
for the warm-up stages, corpus/validation_text (pretraining text) and an item's target (the SFT
demonstration). The keys of `Config` are this task's own: `task.max_value=99` on the command line.
"""

from __future__ import annotations

import random
import re
import zlib
from dataclasses import dataclass

from posttrain.tasks.base import RewardResult, TaskConfig


@dataclass
class Config(TaskConfig):
    name: str = "calc"
    min_value: int = 100          # smallest factor
    max_value: int = 999          # largest factor: 3-digit products are beyond this model's head arithmetic
    demo_tool_frac: float = 0.5   # demonstrations that call the calculator (the rest answer directly)
    max_calls: int = 2            # calls per episode; one more ends it unscored


@dataclass(frozen=True)
class Product:
    a: int
    b: int

    @property
    def question(self) -> str:
        return f"{self.a}*{self.b}"

    def target(self, cot: bool = True) -> str:
        """A demonstration: call, the tool's answer, then the answer (or the answer directly)."""
        uses_tool = zlib.crc32(self.question.encode()) % 100 < 100 * DEMO_TOOL_FRAC
        answer = str(self.a * self.b)
        return f"⟦{self.question}⟧⟨{answer}⟩{answer}" if uses_tool else answer


DEMO_TOOL_FRAC = 0.5


class CalcEnv:
    """One episode: a turn ending in `⟦expr⟧` gets the calculator's result; any other turn is the answer."""

    def __init__(self, item: Product, max_calls: int):
        self.item, self.max_calls, self.calls = item, max_calls, 0

    def reset(self, item: Product) -> str:
        return item.question

    def step(self, text: str):
        call = re.search(r"⟦(\d+)\*(\d+)⟧$", text)
        if call and self.calls < self.max_calls:
            self.calls += 1
            return str(int(call[1]) * int(call[2])), 0.0, False, {}
        numbers = re.findall(r"\d+", text.split("⟩")[-1])          # what the policy wrote after the last result
        correct = float(bool(numbers) and int(numbers[-1]) == self.item.a * self.item.b)
        return None, correct, True, {"components": {"correct": correct, "called": float(self.calls > 0)}}


class CalcTask:
    Config = Config

    def __init__(self, config: Config):
        global DEMO_TOOL_FRAC
        self.config = config
        DEMO_TOOL_FRAC = config.demo_tool_frac

    def items(self, n: int, split: str = "train", seed=0) -> list[Product]:
        rng, out = random.Random(f"calc/{split}/{seed}"), []
        while len(out) < n:
            p = Product(rng.randint(self.config.min_value, self.config.max_value),
                        rng.randint(self.config.min_value, self.config.max_value))
            if (zlib.crc32(p.question.encode()) % 10 == 0) == (split != "train"):   # 10% held out, by hash
                out.append(p)
        return out

    def prompt(self, item: Product) -> str:
        return item.question

    def make_env(self, item: Product) -> CalcEnv:
        return CalcEnv(item, self.config.max_calls)

    def reward(self, item: Product, response: str) -> RewardResult:     # a whole transcript, scored at once
        numbers = re.findall(r"\d+", response.split("⟩")[-1])
        ok = float(bool(numbers) and int(numbers[-1]) == item.a * item.b)
        return RewardResult(ok, {"correct": ok})

    def corpus(self, n_chars: int, seed: int) -> str:
        lines, size, chunk = [], 0, 0
        while size < n_chars:
            for p in self.items(256, "train", f"corpus/{seed}/{chunk}"):
                lines.append(f"{p.question}={p.target()}\n")
                size += len(lines[-1])
            chunk += 1
        return "".join(lines)

    def validation_text(self, seed: int) -> str:
        return "".join(f"{p.question}={p.target()}\n" for p in self.items(200, "test", seed))
