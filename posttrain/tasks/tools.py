"""Tools for agent episodes, and the tool-use arithmetic task where calling one is the way up.

    <1234567+89012>⟦1234567+89012⟧⟨1323579⟩1323579#
                   ^ the policy's call  ^ injected result (response_mask 0)  ^ the policy's answer

Tools are plain functions `text -> text` that raise `ToolError` on bad input; a `ToolEnv`
turns a raise (or a `TimeoutError`) into a structured observation `error: ...`, so a failing
tool never kills an episode. The calculator parses with `ast` and walks a whitelist of
nodes (integers, + − × ÷, unary minus, parentheses): nothing is ever `eval`ed.

Tool-use arithmetic: the terms have 5–7 digits, too many for a ~1M-parameter char model to
add in its head, so the answer is right almost only when the calculator was called. The
verifier reads the LAST integer the policy wrote after the last tool result: a result copied
from the tool counts only once the policy writes it itself. Demonstrations (pretraining
corpus, SFT) call the tool on a fraction `demo_tool_frac` of problems and answer directly on
the rest, so the warm-up model calls it sometimes: inside the learnable band.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from fractions import Fraction

from posttrain.chat import CALL_CLOSE, CALL_OPEN, RESULT_CLOSE, RESULT_OPEN
from posttrain.errors import UsageError
from posttrain.tasks.arithmetic import Problem, last_integer
from posttrain.tasks.base import LineCorpus, RewardResult, TaskConfig, in_heldout, safe_reward, split_draws
from posttrain.tasks.sandbox import run_python


class ToolError(Exception):
    """Bad tool input; its message becomes the observation `error: <message>`."""


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
MAX_EXPR_CHARS = 200
MAX_MAGNITUDE = 10**30


def safe_eval(expr: str) -> Fraction:
    """The exact value of an arithmetic expression (integers, + - * /, parentheses).

    Raises ToolError for anything else: names, calls, powers, floats, huge values, ÷0."""
    if len(expr) > MAX_EXPR_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        raise ToolError(f"cannot parse {expr.strip()[:40]!r}") from None

    def walk(node) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            value = Fraction(node.value)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = -walk(node.operand) if isinstance(node.op, ast.USub) else walk(node.operand)
        elif isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ToolError("division by zero")
            value = _OPS[type(node.op)](left, right)
        else:
            raise ToolError(f"unsupported syntax {type(node).__name__}; use integers, + - * / and parentheses")
        if abs(value) > MAX_MAGNITUDE:
            raise ToolError("value too large")
        return value

    return walk(tree.body)


def format_number(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{float(x):.6g}"


def calculator(text: str) -> str:
    """The calculator tool: an expression in, its value out (`12+30` → `42`, `7/2` → `3.5`)."""
    return format_number(safe_eval(text))


def python_tool(code: str) -> str:
    """The Python tool: run `code` in the sandbox (tasks/sandbox.py: fresh temp dir, no network,
    CPU/memory/process limits, 5 s) and return its stdout; a timeout or a failure raises."""
    res = run_python(code, timeout_s=5.0)
    if res.timed_out:
        raise TimeoutError("after 5s")
    if not res.ok:
        raise ToolError(((res.stderr or "").strip().splitlines() or [res.reason or "failed"])[-1][:60])
    return res.stdout.strip()


def tool_calls(text: str) -> list[str]:
    """The argument of every complete call `⟦...⟧` in a turn's text."""
    calls, start = [], text.find(CALL_OPEN)
    while start >= 0:
        end = text.find(CALL_CLOSE, start + 1)
        if end < 0:
            break
        calls.append(text[start + 1 : end])
        start = text.find(CALL_OPEN, end + 1)
    return calls


class ToolEnv:
    """An episode on one task item with one tool (`Env` in tasks/base.py).

    A turn that ends in a call `⟦args⟧` runs the tool and returns its output (or `error: ...`)
    as the observation; any other turn ends the episode and is scored by the task's verifier
    on the whole transcript. Calls beyond `max_calls` end the episode too."""

    def __init__(self, task, item, tool, max_calls: int = 2):
        self.task, self.item, self.tool, self.max_calls = task, item, tool, max_calls

    def reset(self, item=None) -> str:
        self.item = self.item if item is None else item
        self.transcript, self.calls, self.errors = "", 0, 0
        return self.task.prompt(self.item)

    def step(self, action_text: str):
        self.transcript += action_text
        if action_text.endswith(CALL_CLOSE) and tool_calls(action_text) and self.calls < self.max_calls:
            self.calls += 1
            obs, error = self._run(tool_calls(action_text)[-1])
            self.errors += error is not None
            self.transcript += RESULT_OPEN + obs + RESULT_CLOSE
            return obs, 0.0, False, {"tool_error": error}
        res = safe_reward(self.task, self.item, self.transcript)
        return None, res.reward, True, {"components": res.components, "error": res.error}

    def _run(self, args: str) -> tuple[str, str | None]:
        try:
            return str(self.tool(args)), None
        except TimeoutError as e:
            return f"error: timeout {e}".strip(), "timeout"
        except ToolError as e:
            return f"error: {e}", "tool"
        except Exception as e:  # a tool bug is the episode's observation, never a crash of the step
            return f"error: {type(e).__name__}", "crash"


# ---- the tool-use arithmetic task ----------------------------------------------------------------


@dataclass
class ToolArithmeticConfig(TaskConfig):
    name: str = "tool_arith"
    min_terms: int = 2  # numbers in a sum
    max_terms: int = 2
    min_digits: int = 5  # digits of each term: 5–7 are beyond in-head addition for a ~1M model
    max_digits: int = 7
    heldout_frac: float = 0.1  # share of problems reserved for evaluation
    demo_tool_frac: float = 0.3  # demonstrations that call the tool (the rest answer directly)
    max_calls: int = 2  # tool calls an episode may make; the agent's turn limit is max_calls + 1
    tool: str = "calculator"  # calculator (the safe evaluator) | python (code in the sandbox: `print(a+b)`)


@dataclass(frozen=True)
class ToolProblem(Problem):
    """A sum (question, answer as in the built-in task) with how its demonstration answers."""

    demo_calls_tool: bool = False
    tool: str = "calculator"  # what a demonstration's call looks like

    def target(self, cot: bool = True) -> str:
        """The demonstration response without end-of-turn (tool result included, masked in SFT)."""
        a, call = str(self.answer), self.question if self.tool == "calculator" else f"print({self.question})"
        return f"{CALL_OPEN}{call}{CALL_CLOSE}{RESULT_OPEN}{a}{RESULT_CLOSE}{a}" if self.demo_calls_tool else a


def final_answer(text: str) -> int | None:
    """The last integer the policy wrote after the last tool result."""
    return last_integer(text.rsplit(RESULT_CLOSE, 1)[-1])


class ToolArithmeticTask(LineCorpus):
    name = "tool_arith"

    def __init__(self, config: ToolArithmeticConfig | None = None):
        self.config = c = config or ToolArithmeticConfig()
        if not (1 <= c.min_terms <= c.max_terms and 1 <= c.min_digits <= c.max_digits and c.max_calls >= 0):
            raise UsageError("task: need 1 <= min_terms <= max_terms, 1 <= min_digits <= max_digits, max_calls >= 0")
        if c.tool not in TOOLS:
            raise UsageError(f"task.tool={c.tool!r} is unknown; use one of {sorted(TOOLS)}")
        self.max_turns = c.max_calls + 1

    def _draw(self, rng) -> ToolProblem:
        c = self.config
        terms = tuple(
            rng.randint(10 ** (d - 1), 10**d - 1)
            for d in (rng.randint(c.min_digits, c.max_digits) for _ in range(rng.randint(c.min_terms, c.max_terms)))
        )
        q = "+".join(map(str, terms))
        return ToolProblem(terms, in_heldout("tool/" + q, c.demo_tool_frac), c.tool)

    def items(self, n: int, split: str = "train", seed=0) -> list[ToolProblem]:
        return split_draws(self._draw, lambda p: p.question, split, self.config.heldout_frac, n, f"{self.name}/{seed}")

    def prompt(self, item: ToolProblem) -> str:
        return item.question

    def gold(self, item: ToolProblem) -> int:
        return item.answer

    def reward(self, item: ToolProblem, response: str) -> RewardResult:
        correct = float(final_answer(response) == item.answer)
        return RewardResult(correct, {"correct": correct, "tool_called": float(bool(tool_calls(response)))})

    def make_env(self, item: ToolProblem) -> ToolEnv:
        return ToolEnv(self, item, TOOLS[self.config.tool], self.config.max_calls)

    def corpus_line(self, item) -> str:
        """`question=demonstration` lines of train problems. (LineCorpus)"""
        return _line(item)


def _line(p: ToolProblem) -> str:
    return f"{p.question}={p.target()}"


TOOLS = {"calculator": calculator, "python": python_tool}
