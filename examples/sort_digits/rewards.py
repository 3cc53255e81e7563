"""The exact-match reward for examples/sort_digits, in TRL's signature (posttrain calls it unchanged).

    posttrain rl ... task.reward=examples/sort_digits/rewards.py:exact task.correct=examples/sort_digits/rewards.py:exact

The rows' prompts are chat messages, so each completion arrives as TRL gives it there,
`[{"role": "assistant", "content": text}]`, the text without any end-of-turn marker: a response
is right when its words are the answer's words, spaces around them aside.
"""


def _text(completion) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else completion


def exact(prompts, completions, answer, **kwargs):
    """1 when the response is exactly the sorted digits, else 0."""
    return [1.0 if _text(c).strip().split() == a.split() else 0.0 for c, a in zip(completions, answer)]
