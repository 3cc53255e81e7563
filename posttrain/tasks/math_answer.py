"""Math answer verifier: pull the final answer out of a response, compare it to the gold.

    extract_answer("... so the answer is \\boxed{\\frac{1}{2}}.")   -> "\\frac{1}{2}"
    equivalent("\\frac{1}{2}", "0.5")                              -> True
    score(response, gold)                                          -> RewardResult

Extraction, first that applies: the last `\\boxed{...}` / `\\fbox{...}` (nested braces
matched), the last "answer is X", the last number in the text (integers, thousands
commas, decimals, a/b, a trailing %).

Equivalence backends (`BACKEND` says which one is in use):
  math-verify  Hugging Face's parser + sympy comparison (the `math` extra): LaTeX,
               symbolic expressions, sets, intervals; numbers agree to 6 decimals
  builtin      used when math-verify is not installed, or fails on an input: the LaTeX
               subset of final answers (\\frac \\dfrac \\tfrac \\sqrt \\sqrt[n] ^ \\cdot
               \\times \\pi, %, \\text units dropped) rewritten to a Python expression and
               evaluated by a whitelist AST walker, never `eval`; values agree to 6
               decimals (as in math-verify); anything that is not a number
               falls back to whitespace-insensitive string equality
A percentage gold "50%" accepts 50 and 0.5 in both backends.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from fractions import Fraction

from posttrain.tasks.base import RewardResult

try:
    import math_verify

    BACKEND = "math-verify"
except ImportError:  # optional: `pip install posttrain[math]`
    math_verify = None
    BACKEND = "builtin"

_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?\s*\\?%?|-?\.\d+")
_ANSWER_IS = re.compile(r"answer is\s*:?\s*(.+)", re.I)


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """The contents of the {...} group opening at text[start], and the index after it."""
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1 : i], i + 1
    return None


def last_boxed(text: str) -> str | None:
    i = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if i < 0:
        return None
    j = i + (6 if text.startswith("\\boxed", i) else 5)
    while j < len(text) and text[j] == " ":
        j += 1
    group = _braced(text, j)
    if group:
        return group[0].strip()
    m = re.match(r"[^\s$]+", text[j:])  # \boxed 5
    return m.group(0) if m else None


def extract_answer(text: str) -> str | None:
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    found = _ANSWER_IS.findall(text)
    if found:
        ans = found[-1].splitlines()[0].strip().rstrip(".").strip()
        ans = re.sub(r"^\$+|\$+$|^\\\(|\\\)$", "", ans).strip()
        if ans:
            return ans
    nums = _NUMBER.findall(text)
    return nums[-1].replace(" ", "") if nums else None


# --- the builtin backend: LaTeX subset -> Python expression -> whitelist evaluation ---


def _replace_command(s: str, cmd: str, arity: int, render) -> str:
    """Rewrite `\\cmd{a}{b}` (also `\\frac34`) with render(*args), innermost last-first."""
    while True:
        i = s.rfind(cmd)
        if i < 0:
            return s
        j, args = i + len(cmd), []
        for _ in range(arity):
            while j < len(s) and s[j] == " ":
                j += 1
            g = _braced(s, j)
            if g:
                args.append(g[0])
                j = g[1]
            elif j < len(s):  # a single character argument: \frac34, \sqrt2
                args.append(s[j])
                j += 1
        if len(args) < arity:
            return s
        s = s[:i] + render(*args) + s[j:]


def to_python(latex: str) -> tuple[str, bool]:
    """(python expression, percent?) for the LaTeX subset of final answers."""
    s = latex.strip().strip("$").strip()
    s = re.sub(r"\\(?:text|mathrm|textbf|mbox)\s*\{[^{}]*\}", "", s)  # units: "10\text{ cm}" -> "10"
    s = re.sub(r"\^\s*\{?\\circ\}?|\\(?:left|right|displaystyle|!|,|;|:| )|\\?\$", "", s)
    percent = bool(re.search(r"\\?%\s*$", s))
    s = re.sub(r"\\?%\s*$", "", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\sqrt\s*\[([^\]]+)\]\s*\{([^{}]*)\}", r"((\2)**(1/(\1)))", s)
    s = _replace_command(s, "\\frac", 2, lambda a, b: f"(({a})/({b}))")
    s = _replace_command(s, "\\sqrt", 1, lambda a: f"sqrt({a})")
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/").replace("\\pi", "pi")
    s = s.replace("{", "(").replace("}", ")").replace("^", "**")
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)  # 1,000 -> 1000
    s = re.sub(r"(?<=[\d)])\s*(?=[a-z(])", "*", s)  # 2sqrt(3), 2(3) -> 2*...
    return s, percent


_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _eval(node):
    """Numbers, + - * / **, sqrt, pi, e; Fractions while exact. Anything else raises ValueError."""
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return Fraction(str(node.value))
    if isinstance(node, ast.Name) and node.id in ("pi", "e"):
        return math.pi if node.id == "pi" else math.e
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "sqrt" and len(node.args) == 1:
        x = _eval(node.args[0])
        if isinstance(x, Fraction) and x >= 0:  # sqrt(4/9) stays exact: 2/3
            root = Fraction(math.isqrt(x.numerator), math.isqrt(x.denominator))
            if root * root == x:
                return root
        return math.sqrt(x)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            if abs(b) > 64 or abs(a) > 1e12:  # "9**9**9" must not hang the verifier
                raise ValueError("power too large")
            if isinstance(b, Fraction) and b.denominator == 1:
                return a ** int(b)
            return float(a) ** float(b)
        return _OPS[type(node.op)](a, b)
    raise ValueError(f"not a number: {ast.dump(node)[:60]}")


def numeric_values(latex: str) -> list | None:
    """The value(s) an answer may mean (a percentage: X and X/100), or None if not a number."""
    expr, percent = to_python(latex)
    try:
        v = _eval(ast.parse(expr, mode="eval"))
    except (SyntaxError, ValueError, TypeError, ZeroDivisionError, OverflowError, RecursionError):
        return None
    return [v, v / 100] if percent else [v]


def _close(a, b) -> bool:
    """Equal to 6 decimals (math-verify's rule: 1/3 = 0.3333333, pi != 3.14159), or to 1e-9 relative."""
    a, b = float(a), float(b)
    return round(a, 6) == round(b, 6) or math.isclose(a, b, rel_tol=1e-9)


def _builtin_equivalent(gold: str, answer: str) -> bool:
    g, a = numeric_values(gold), numeric_values(answer)
    if g is not None and a is not None:
        return any(_close(x, y) for x in g for y in a)
    return re.sub(r"\s+", "", gold.strip("$ ")) == re.sub(r"\s+", "", answer.strip("$ "))


def equivalent(gold: str, answer: str, backend: str | None = None) -> bool:
    backend = backend or BACKEND
    if backend == "math-verify" and math_verify is not None:
        try:
            pg, pa = math_verify.parse(f"${gold}$"), math_verify.parse(f"${answer}$")
            if pg and pa:
                return bool(math_verify.verify(pg, pa))
        except Exception:  # a parser bug is not a wrong answer: try ours
            pass
    return _builtin_equivalent(gold, answer)


def score(response: str, gold: str, backend: str | None = None) -> RewardResult:
    """1 when the extracted answer is equivalent to `gold`; components correct, extracted."""
    ans = extract_answer(response)
    if ans is None:
        return RewardResult(0.0, {"correct": 0.0, "extracted": 0.0}, reason="no answer found")
    ok = equivalent(gold, ans, backend)
    return RewardResult(
        float(ok),
        {"correct": float(ok), "extracted": 1.0},
        reason=None if ok else f"answer {ans[:80]!r} is not {gold!r}",
    )
