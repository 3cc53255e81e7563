"""Countdown (TinyZero's task): reach a target with the given numbers and + − × ÷, each once.

    prompt   16 from 3,5,2
    CoT      {3+5=8;8*2=16}(3+5)*2
    direct   (3+5)*2

Problems are generated locally: the numbers are drawn, then combined pairwise in a random
order with random operations (− only when it stays ≥ 0, ÷ only when exact) until one value
is left: the target. So every problem has a solution; the verifier accepts ANY expression
that uses each given number exactly once and evaluates to the target, not only the one the
generator built. It reads the text after the last think-close and before the end of turn
(an `=` and what follows it are ignored), parses it with the calculator's safe evaluator
(tasks/tools.py: `ast` walk, no `eval`) and scores, as in TinyZero,
    correct (1 when the value is the target) + format_weight · format (1 when it parses and
    uses exactly the given numbers).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from posttrain.chat import EOT, THINK_CLOSE
from posttrain.errors import UsageError
from posttrain.tasks.base import LineCorpus, RewardResult, TaskConfig, compose, split_draws
from posttrain.tasks.tools import ToolError, safe_eval


@dataclass
class CountdownConfig(TaskConfig):
    name: str = "countdown"
    min_numbers: int = 3  # numbers given (TinyZero: 3–4)
    max_numbers: int = 3
    max_value: int = 9  # numbers are drawn from 1..max_value
    max_target: int = 99  # problems whose target falls outside 1..max_target are redrawn
    heldout_frac: float = 0.1  # share of problems reserved for evaluation
    format_weight: float = 0.1  # reward for a well-formed expression (TinyZero's format score)


@dataclass(frozen=True)
class CountdownProblem:
    numbers: tuple[int, ...]
    goal: int  # the number to reach
    solution: str  # one expression that reaches the target
    steps: tuple[str, ...]  # its pairwise computations: "3+5=8"

    @property
    def question(self) -> str:
        return f"{self.goal} from {','.join(map(str, self.numbers))}"

    @property
    def answer(self) -> int:
        return self.goal

    def target(self, cot: bool = True) -> str:
        """The demonstration response without end-of-turn (SFT, corpus, eval.response_budget)."""
        return ("{" + ";".join(self.steps) + "}" if cot else "") + self.solution


_NUM = re.compile(r"\d+")


def expression_of(response: str) -> str:
    """The answer expression of a response: after the last `}`, before `#` and any `=`."""
    text = response.split(EOT, 1)[0].rsplit(THINK_CLOSE, 1)[-1]
    return text.split("=", 1)[0].strip()


def score(response: str, numbers, target: int) -> tuple[float, float]:
    """(correct, format) of a response."""
    expr = expression_of(response)
    if not expr or sorted(int(x) for x in _NUM.findall(expr)) != sorted(numbers):
        return 0.0, 0.0
    try:
        value = safe_eval(expr)
    except ToolError:
        return 0.0, 0.0
    return float(value == target), 1.0


class CountdownTask(LineCorpus):
    name = "countdown"

    def __init__(self, config: CountdownConfig | None = None):
        self.config = c = config or CountdownConfig()
        if not (2 <= c.min_numbers <= c.max_numbers and c.max_value >= 1 and c.max_target >= 1):
            raise UsageError("task: need 2 <= min_numbers <= max_numbers, max_value >= 1 and max_target >= 1")

    def _draw(self, rng) -> CountdownProblem:
        c = self.config
        while True:
            numbers = tuple(rng.randint(1, c.max_value) for _ in range(rng.randint(c.min_numbers, c.max_numbers)))
            pool = [(n, str(n)) for n in numbers]
            steps = []
            while len(pool) > 1:
                (a, ea), (b, eb) = pool.pop(rng.randrange(len(pool))), pool.pop(rng.randrange(len(pool)))
                ops = ["+", "*"] + (["-"] if a >= b else []) + (["/"] if b and a % b == 0 else [])
                op = rng.choice(ops)
                v = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
                steps.append(f"{a}{op}{b}={v}")
                pool.append((v, f"({ea}{op}{eb})"))
            value, expr = pool[0]
            if 1 <= value <= c.max_target:
                return CountdownProblem(numbers, value, expr[1:-1] if expr.startswith("(") else expr, tuple(steps))

    def items(self, n: int, split: str = "train", seed=0) -> list[CountdownProblem]:
        return split_draws(self._draw, lambda p: p.question, split, self.config.heldout_frac, n, f"{self.name}/{seed}")

    def prompt(self, item: CountdownProblem) -> str:
        return item.question

    def gold(self, item: CountdownProblem) -> int:
        return item.goal

    def final_answer(self, response: str) -> int | None:
        """The value the response's expression reaches (majority vote), None when it does not parse."""
        try:
            value = safe_eval(expression_of(response))
        except ToolError:
            return None
        return int(value) if value.denominator == 1 else None

    def reward(self, item: CountdownProblem, response: str) -> RewardResult:
        correct, fmt = score(response, item.numbers, item.goal)
        return compose({"correct": correct, "format": fmt}, {"format": self.config.format_weight})

    def corpus_line(self, item) -> str:
        """`question=CoT solution` lines of train problems. (LineCorpus)"""
        return _line(item)


def _line(p: CountdownProblem) -> str:
    return f"{p.question}={p.target(True)}"
