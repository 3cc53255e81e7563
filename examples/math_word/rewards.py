"""Reward functions for the math word problems, in TRL's signature (posttrain calls them unchanged,
on the completions as TRL would hand them over: no end-of-turn marker to strip).

    posttrain rl ... task.reward=examples/math_word/rewards.py:correct,examples/math_word/rewards.py:fmt \
        task.reward_weights=[1.0,0.1]
"""

import re

_NUMBER = re.compile(r"-?\d+")
_FORMAT = re.compile(r"the answer is \$-?\d+\$\.?$")


def correct(prompts, completions, answer, **kwargs):
    """1 when the last number in the response is the answer, else 0."""
    out = []
    for completion, gold in zip(completions, answer):
        numbers = _NUMBER.findall(completion)
        out.append(1.0 if numbers and int(numbers[-1]) == int(gold) else 0.0)
    return out


def fmt(completions, **kwargs):
    """1 when the response ends the way the worked solutions do: `the answer is $N$.`"""
    return [1.0 if _FORMAT.search(c.strip()) else 0.0 for c in completions]
