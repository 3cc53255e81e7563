"""The shared built-in task: sums of K integers, with chain-of-thought traces.

    prompt   <3+4+5+6>
    direct   18#
    CoT      {3+4=7;7+5=12;12+6=18}18#

The verifier rule (the course's): the reward is 1 when the LAST integer in the response
text (a maximal run of digits, with a leading '-' if present) equals the gold sum, else 0.
So `12#` and `let me think... 12#` score 1 for gold 12; `11#`, `120#` and a response with
no digits score 0. Traces contain partial sums, but the final answer comes after them.

Train and held-out problems are disjoint by construction: a problem (its ordered terms)
belongs to the held-out split when a stable hash of its text falls below
`heldout_frac`; generation draws from the requested split only.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from posttrain.errors import UsageError
from posttrain.tasks.base import RewardResult, TaskConfig, in_heldout

_INT = re.compile(r"-?\d+")


@dataclass
class ArithmeticConfig(TaskConfig):
    name: str = "arithmetic"
    min_terms: int = 2  # K: fewest numbers in a sum
    max_terms: int = 6  # K: most numbers in a sum
    min_value: int = 0  # smallest term
    max_value: int = 19  # largest term (9 = single digits; 19 makes the default SFT model imperfect: RL has signal)
    heldout_frac: float = 0.1  # fraction of all problems reserved for evaluation


@dataclass(frozen=True)
class Problem:
    terms: tuple[int, ...]

    @property
    def question(self) -> str:
        return "+".join(map(str, self.terms))

    @property
    def answer(self) -> int:
        return sum(self.terms)

    @property
    def k(self) -> int:
        return len(self.terms)

    def trace(self) -> str:
        """Running partial sums: {3+4=7;7+5=12;12+6=18}"""
        steps, acc = [], self.terms[0]
        for t in self.terms[1:]:
            steps.append(f"{acc}+{t}={acc + t}")
            acc += t
        return "{" + ";".join(steps) + "}"

    def target(self, cot: bool) -> str:
        """The response text without the end-of-turn token."""
        return (self.trace() if cot else "") + str(self.answer)


def last_integer(text: str) -> int | None:
    found = _INT.findall(text)
    return int(found[-1]) if found else None


def verify(response: str, gold: int) -> float:
    got = last_integer(response)
    return 1.0 if got is not None and got == gold else 0.0


def is_heldout(problem: Problem, frac: float) -> bool:
    return in_heldout(problem.question, frac)


class ArithmeticTask:
    name = "arithmetic"

    def __init__(self, config: ArithmeticConfig | None = None):
        self.config = c = config or ArithmeticConfig()
        if not (1 <= c.min_terms <= c.max_terms) or c.min_value > c.max_value or c.min_value < 0:
            raise UsageError("task: need 1 <= min_terms <= max_terms and 0 <= min_value <= max_value")

    def sample_problem(self, rng: random.Random, split: str, k: int | None = None) -> Problem:
        c = self.config
        want_heldout = split != "train"
        while True:  # rejection keeps the two splits disjoint; each split holds a fixed share of problems
            kk = k or rng.randint(c.min_terms, c.max_terms)
            p = Problem(tuple(rng.randint(c.min_value, c.max_value) for _ in range(kk)))
            if is_heldout(p, c.heldout_frac) == want_heldout:
                return p

    def items(self, n: int, split: str = "train", seed: int = 0, k: int | None = None) -> list[Problem]:
        rng = random.Random(f"{self.name}/{split}/{seed}/{k}")
        return [self.sample_problem(rng, split, k) for _ in range(n)]

    def prompt(self, item: Problem) -> str:
        return item.question

    def gold(self, item: Problem) -> int:
        return item.answer

    def reward(self, item: Problem, response: str) -> RewardResult:
        r = verify(response, item.answer)
        return RewardResult(r, {"correct": r})

    def validation_text(self, seed: int) -> str:
        """Pretraining validation text: traces of held-out sums, one per line."""
        return "".join(p.trace()[1:-1] + "\n" for p in self.items(400, "test", seed))

    def corpus(self, n_chars: int, seed: int) -> str:
        """Pretraining text: traces of train-split sums, one per line (no chat specials)."""
        rng = random.Random(f"{self.name}/corpus/{seed}")
        lines, size = [], 0
        while size < n_chars:
            p = self.sample_problem(rng, "train")
            line = p.trace()[1:-1] + "\n"
            lines.append(line)
            size += len(line)
        return "".join(lines)
