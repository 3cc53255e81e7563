import pytest

from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask, Problem, is_heldout, verify
from posttrain.tasks.base import RewardResult, safe_reward


@pytest.mark.parametrize(
    "text,gold,want",
    [
        ("12#", 12, 1.0),
        ("let me think... 12#", 12, 1.0),
        ("11#", 12, 0.0),
        ("120#", 12, 0.0),
        ("no digits here#", 12, 0.0),
        ("", 12, 0.0),
        ("{3+4=7;7+5=12}12#", 12, 1.0),
        ("{3+4=7;7+5=12}13#", 12, 0.0),
        ("12 or 13#", 12, 0.0),
    ],
)
def test_verifier_course_cases(text, gold, want):
    assert verify(text, gold) == want


def test_trace_and_targets():
    p = Problem((3, 4, 5, 6))
    assert p.question == "3+4+5+6" and p.answer == 18 and p.k == 4
    assert p.target(True) == "{3+4=7;7+5=12;12+6=18}18"
    assert p.target(False) == "18"


def test_deterministic_and_disjoint_splits():
    task = ArithmeticTask(ArithmeticConfig(min_terms=2, max_terms=3))
    a = task.items(500, "train", seed=1)
    assert a == task.items(500, "train", seed=1)
    assert a != task.items(500, "train", seed=2)
    test = task.items(500, "test", seed=1)
    assert not {p.terms for p in a} & {p.terms for p in test}
    assert all(is_heldout(p, 0.1) for p in test) and not any(is_heldout(p, 0.1) for p in a)


def test_heldout_fraction_roughly_as_configured():
    import random

    rng = random.Random(0)
    probs = [Problem(tuple(rng.randint(0, 9) for _ in range(4))) for _ in range(5000)]
    frac = sum(is_heldout(p, 0.1) for p in probs) / len(probs)
    assert 0.08 < frac < 0.12


def test_term_counts_and_ranges():
    task = ArithmeticTask(ArithmeticConfig(min_terms=3, max_terms=5, min_value=10, max_value=99))
    items = task.items(200, "train", 0)
    assert {p.k for p in items} == {3, 4, 5}
    assert all(10 <= t <= 99 for p in items for t in p.terms)


def test_safe_reward_counts_errors():
    class Bad:
        def reward(self, item, response):
            raise ZeroDivisionError("boom")

    class NaN:
        def reward(self, item, response):
            return RewardResult(float("nan"))

    r = safe_reward(Bad(), None, "x")
    assert r.reward == 0.0 and "ZeroDivisionError" in r.error
    assert safe_reward(NaN(), None, "x").error.startswith("verifier returned a non-finite")
