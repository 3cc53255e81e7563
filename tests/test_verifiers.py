"""Math answer verifier: extraction and equivalence on a table of tricky cases, both ways,
for both backends (math-verify and the builtin evaluator)."""

import pytest

from posttrain.tasks import math_answer as ma
from posttrain.tasks.math_answer import equivalent, extract_answer, score

# response text -> extracted answer
EXTRACT = [
    ("so \\boxed{\\frac{1}{2}} is it", "\\frac{1}{2}"),
    ("first \\boxed{3} then \\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt{2}}{2}"),  # last box, nested braces
    ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
    ("\\fbox{42}", "42"),
    ("\\boxed 7 done", "7"),
    ("Thus the answer is $\\dfrac{3}{4}$.", "\\dfrac{3}{4}"),
    ("The Answer is: 12\nbecause 5+7", "12"),
    ("we get 3, then 5, finally 1,000 apples", "1,000"),
    ("ratio 3/4 of them", "3/4"),
    ("it rose by 50%", "50%"),
    ("x = -2.5", "-2.5"),
    ("no digits here", None),
]

# gold, answer, equivalent?  (numbers and the LaTeX subset: both backends must agree)
EQUIV = [
    ("\\frac{1}{2}", "0.5", True),
    ("\\frac{1}{2}", "\\dfrac{1}{2}", True),
    ("\\dfrac{3}{4}", "\\tfrac34", True),
    ("3/4", "0.75", True),
    ("1/2", "2/4", True),
    ("\\frac{1}{3}", "0.3333333", True),
    ("0.333", "1/3", False),
    ("50\\%", "0.5", True),
    ("50\\%", "50", True),
    ("50\\%", "5", False),
    ("\\sqrt{2}", "2^{1/2}", True),
    ("\\sqrt{2}", "\\sqrt 2", True),
    ("2\\sqrt{3}", "\\sqrt{12}", True),
    ("\\sqrt[3]{8}", "2", True),
    ("2^{10}", "1024", True),
    ("1,000", "1000", True),
    ("2", "2.0", True),
    ("-3", "3", False),
    ("7", "7.5", False),
    ("12", "120", False),
    ("10", "10\\text{ cm}", True),
    ("90^\\circ", "90", True),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", True),
    ("\\pi", "3.14159", False),
    ("2\\pi", "2 \\cdot \\pi", True),
    ("3 \\times 4", "12", True),
    ("\\frac{7}{2}", "3.5", True),
    ("\\frac{7}{2}", "\\frac{2}{7}", False),
]

# symbolic answers only math-verify understands
SYMBOLIC = [
    ("x+1", "1+x", True),
    ("\\{1,2\\}", "\\{2,1\\}", True),
    ("(1,2)", "(2,1)", False),
    ("\\frac{\\sqrt{3}}{2}", "\\sin(\\pi/3)", True),
    ("x^2", "x^3", False),
]

BACKENDS = ["builtin"] + (["math-verify"] if ma.math_verify is not None else [])


@pytest.mark.parametrize("text,want", EXTRACT)
def test_extract(text, want):
    assert extract_answer(text) == want


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("gold,answer,want", EQUIV)
def test_equivalence_table(backend, gold, answer, want):
    assert equivalent(gold, answer, backend) is want
    assert equivalent(answer, gold, backend) is want or "%" in gold  # symmetric, but for percent golds


@pytest.mark.skipif(ma.math_verify is None, reason="math-verify not installed (extra `math`)")
@pytest.mark.parametrize("gold,answer,want", SYMBOLIC)
def test_symbolic_with_math_verify(gold, answer, want):
    assert equivalent(gold, answer, "math-verify") is want


def test_builtin_never_evaluates_code_and_survives_huge_powers():
    assert ma.numeric_values("__import__('os').system('true')") is None
    assert ma.numeric_values("9^{9^{9}}") is None
    assert equivalent("(1,2)", "(1, 2)", "builtin") is True and equivalent("(1,2)", "(2,1)", "builtin") is False


def test_score_components_and_reasons():
    r = score("Adding gives \\boxed{\\frac{6}{8}}", "3/4")
    assert (r.reward, r.components, r.reason) == (1.0, {"correct": 1.0, "extracted": 1.0}, None)
    r = score("I think it is 5", "3/4")
    assert r.reward == 0.0 and r.components["extracted"] == 1.0 and r.reason == "answer '5' is not '3/4'"
    assert score("no idea", "3/4").reason == "no answer found"
