"""Code task: write a small Python function; the reward is the fraction of hidden tests passed.

    prompt    write a python function sumdigits(n) that returns the sum of the decimal
              digits of the non-negative integer n. reply with the code only.
    response  ```python\\ndef sumdigits(n):\\n    return sum(map(int, str(n)))\\n```

Prompts fit the built-in char tokenizer (lower case, no '_'), so `gpt_mini` can be run on
the task; its vocabulary has no quotes, '_', '%' or '/', so it can write only some of the
solutions (add3, maxoflist, ...): the task is meant for Hugging Face models.

The problems (about forty) are generated locally from the table in code_problems.py: a signature, a
description, a reference solution and an input generator. Expected outputs are computed
here by the reference solution and never enter the sandbox: the candidate runs in
`tasks/sandbox.py` with only the test *inputs*, a harness prints one result line per test
on a file descriptor of its own, and the comparison happens in this process. A candidate
that prints result lines itself gains nothing: an index reported twice counts as failed.
Train and held-out problems are disjoint by a stable hash of the function name.
"""

from __future__ import annotations

import json
import math
import random
import re
import zlib
from dataclasses import dataclass

from posttrain.errors import UsageError
from posttrain.tasks.base import RewardResult, TaskConfig
from posttrain.tasks.code_problems import FAMILIES
from posttrain.tasks.sandbox import backend, run_python

MARK = "__POSTTRAIN_RESULT__"
HARNESS = """import json, os
_emit = os.dup(1)                       # our own channel: the candidate may close or replace stdout
_inputs = json.load(open("inputs.json"))
_ns = {"__name__": "candidate"}
exec(compile(open("candidate.py").read(), "candidate.py", "exec"), _ns)
_f = _ns[FUNC]
for _i, _args in enumerate(_inputs):
    try:
        _r = json.dumps(_f(*_args))
    except BaseException as _e:
        _r = json.dumps({"error": type(_e).__name__})
    os.write(_emit, ("MARK %d %s\\n" % (_i, _r)).encode())
""".replace("MARK", MARK)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|$)", re.S)


@dataclass(frozen=True)
class CodeProblem:
    name: str
    args: str
    description: str
    solution: str  # the reference, a whole `def`
    inputs: tuple  # argument lists (visible to the candidate)
    expected: tuple  # reference outputs after a JSON round trip (hidden)

    @property
    def signature(self) -> str:
        return f"{self.name}({self.args})"


@dataclass
class CodeConfig(TaskConfig):
    name: str = "code"  # the task registry's key (`task.name=code`)
    tests_per_problem: int = 8  # hidden test inputs per problem
    heldout_frac: float = 0.2  # share of problems (by name) reserved for evaluation
    timeout_s: float = 5.0  # wall clock per candidate (all its tests together)
    memory_mb: int = 256  # address space of each candidate process, and of all of them (memory cgroup)
    # Candidates run under bubblewrap (Debian `bubblewrap`); without it the task refuses to start.
    # true: run them without it (rlimits and a temp dir only: a candidate can read your files,
    # the reference solutions included, and reach the network). Never on a shared machine.
    unsafe_local_sandbox: bool = False


def build_problem(family, n_tests: int) -> CodeProblem:
    name, args, desc, body, gen = family
    name = name.replace("_", "")  # the built-in char tokenizer has no '_' (see prompt())
    rng = random.Random(f"code/{name}")
    inputs = tuple(gen(rng) for _ in range(n_tests))
    solution = f"def {name}({args}):\n    {body}\n"
    ns: dict = {}
    exec(solution, ns)  # our own reference, trusted: expected outputs are computed here, never in the sandbox
    expected = tuple(json.loads(json.dumps(ns[name](*a))) for a in inputs)
    return CodeProblem(name, args, desc, solution, inputs, expected)


def extract_code(response: str) -> str:
    """The first fenced block (```python ... ```), else the whole response."""
    m = _FENCE.search(response)
    return m.group(1) if m else response


def same(a, b) -> bool:
    """Equality of JSON values, floats within 1e-6 relative; a bool never equals a number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) or isinstance(b, float):
        numbers = isinstance(a, (int, float)) and isinstance(b, (int, float))
        return numbers and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def results(stdout: str, n: int) -> list:
    """The harness's result per test index; a missing or duplicated index gives None."""
    seen: dict[int, list] = {}
    for line in stdout.splitlines():
        if line.startswith(MARK + " "):
            try:
                i, payload = line[len(MARK) + 1 :].split(" ", 1)
                seen.setdefault(int(i), []).append(json.loads(payload))
            except ValueError:
                continue
    return [seen[i][0] if len(seen.get(i, [])) == 1 else None for i in range(n)]


class CodeTask:
    name = "code"

    def __init__(self, config: CodeConfig | None = None):
        self.config = c = config or CodeConfig()
        if c.tests_per_problem < 1 or not 0 < c.heldout_frac < 1 or c.timeout_s <= 0:
            raise UsageError("code task: need tests_per_problem >= 1, 0 < heldout_frac < 1 and timeout_s > 0")
        backend(c.unsafe_local_sandbox)  # no bubblewrap: one line naming the package, before any work
        self.problems = [build_problem(f, c.tests_per_problem) for f in FAMILIES]
        held = lambda p: zlib.crc32(p.name.encode()) % 1000 < c.heldout_frac * 1000  # noqa: E731
        self.splits = {
            "train": [p for p in self.problems if not held(p)],
            "test": [p for p in self.problems if held(p)],
        }

    def items(self, n: int, split: str = "train", seed=0) -> list[CodeProblem]:
        pool = self.splits["train" if split == "train" else "test"]
        rng = random.Random(f"{self.name}/{split}/{seed}")
        return [rng.choice(pool) for _ in range(n)]

    def prompt(self, item: CodeProblem) -> str:
        """Lower case, no '_' or backticks: every prompt encodes with the built-in char tokenizer."""
        return f"write a python function {item.signature} that {item.description.lower()}. reply with the code only."

    def target(self, item: CodeProblem) -> str:
        return f"```python\n{item.solution}```"

    def reward(self, item: CodeProblem, response: str) -> RewardResult:
        c = self.config
        r = run_python(
            HARNESS.replace("FUNC", repr(item.name)),
            timeout_s=c.timeout_s,
            memory_mb=c.memory_mb,
            files={"candidate.py": extract_code(response), "inputs.json": json.dumps(item.inputs)},
            unsafe_local=c.unsafe_local_sandbox,
        )
        got = results(r.stdout, len(item.inputs))
        ok = [g is not None and same(g, e) for g, e in zip(got, item.expected)]
        passed, total = sum(ok), len(ok)
        reason = r.reason
        if reason is None and passed < total:
            i = ok.index(False)
            reason = (
                f"{passed}/{total} tests passed; {item.name}(*{item.inputs[i]}) gave {got[i]!r}, "
                f"expected {item.expected[i]!r}"
            )
        return RewardResult(passed / total, {"passed": float(passed), "total": float(total)}, reason=reason)
