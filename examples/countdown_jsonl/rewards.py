"""TinyZero's countdown score as two TRL reward functions: correct (weight 1) and fmt (weight 0.1).

    task.reward=examples/countdown_jsonl/rewards.py:correct,examples/countdown_jsonl/rewards.py:fmt
    task.reward_weights=[1.0,0.1]  task.correct=examples/countdown_jsonl/rewards.py:correct

The expression is the text after the last `}` and before `#` (an `=` and what follows it are
ignored); it must use each given number exactly once. Scored by the same parser the built-in task
uses, so rewards match it value for value.
"""

from posttrain.tasks.countdown import score


def correct(prompts, completions, numbers, answer, **kwargs):
    """1 when the expression reaches the target with each number once."""
    return [score(c, n, a)[0] for c, n, a in zip(completions, numbers, answer)]


def fmt(prompts, completions, numbers, answer, **kwargs):
    """1 when the expression parses and uses exactly the given numbers."""
    return [score(c, n, a)[1] for c, n, a in zip(completions, numbers, answer)]
