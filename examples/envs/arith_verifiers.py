"""A `verifiers` environment: sums of integers, scored by a rubric (the last number must be the sum).

    posttrain rl task.name=verifiers:examples/envs/arith_verifiers.py task.env_args='{max_terms: 4}' ...

Written with the verifiers library alone (SingleTurnEnv, Rubric, a datasets.Dataset); the
problems are generated here, so nothing is downloaded. Prompts are the bare sums ("3+4+5"),
the form posttrain's built-in model reads; any chat model reads them too.
"""

import random
import re

import verifiers as vf
from datasets import Dataset


def last_number_is_the_sum(completion, answer) -> float:
    """1 when the last integer of the reply equals the answer, else 0."""
    numbers = re.findall(r"-?\d+", completion[-1]["content"] if completion else "")
    return float(bool(numbers) and numbers[-1] == answer)


def load_environment(n: int = 2000, min_terms: int = 2, max_terms: int = 4, max_value: int = 19, seed: int = 0,
                     eval_n: int = 200):
    def rows(count, rng):
        out = []
        for _ in range(count):
            terms = [rng.randint(0, max_value) for _ in range(rng.randint(min_terms, max_terms))]
            out.append({"question": "+".join(map(str, terms)), "answer": str(sum(terms))})
        return out
    train, test = rows(n, random.Random(seed)), rows(eval_n, random.Random(seed + 10_000))
    seen = {r["question"] for r in train}
    test = [r for r in test if r["question"] not in seen]           # held-out sums never seen in training
    return vf.SingleTurnEnv(dataset=Dataset.from_list(train), eval_dataset=Dataset.from_list(test),
                            rubric=vf.Rubric(funcs=[last_number_is_the_sum]))
