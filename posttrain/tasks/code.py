"""Code task: write a small Python function; the reward is the fraction of hidden tests passed.

    prompt    write a python function sumdigits(n) that returns the sum of the decimal
              digits of the non-negative integer n. reply with the code only.
    response  ```python\\ndef sumdigits(n):\\n    return sum(map(int, str(n)))\\n```

Prompts fit the built-in char tokenizer (lower case, no '_'), so `gpt_mini` can be run on
the task; its vocabulary has no quotes, '_', '%' or '/', so it can write only some of the
solutions (add3, maxoflist, ...): the task is meant for Hugging Face models.

The problems (about forty) are generated locally from the table below: a signature, a
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

from posttrain import UsageError
from posttrain.tasks.base import RewardResult, TaskConfig
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


def _ints(lo, hi, n=(3, 8)):
    return lambda r: [r.randint(lo, hi) for _ in range(r.randint(*n))]


def _word(r):
    return "".join(r.choice("abcdeiou rst") for _ in range(r.randint(1, 12))).strip() or "a"


def _with_repeated_max(r):
    """Distinct values in a shuffled order, the largest twice: a second largest that is the
    largest again, or a fixed number, is wrong."""
    xs = r.sample(range(-30, 30), r.randint(2, 6))
    xs.append(max(xs))
    r.shuffle(xs)
    return xs


def _clamp_args(r):
    """Bounds that move: a clamp that ignores lo or hi, or pins them to constants, is wrong."""
    lo = r.randint(-20, 10)
    return [r.randint(-30, 30), lo, lo + r.randint(0, 20)]


# name, args, description, reference solution (body after the def line), input generator
FAMILIES = [
    *[(f"add_{k}", "x", f"returns x plus {k}", f"return x + {k}", lambda r: [r.randint(-50, 50)]) for k in (3, 7, 12)],
    *[
        (f"times_{k}", "x", f"returns x multiplied by {k}", f"return x * {k}", lambda r: [r.randint(-50, 50)])
        for k in (2, 5)
    ],
    (
        "sum_digits",
        "n",
        "returns the sum of the decimal digits of the non-negative integer n",
        "return sum(int(c) for c in str(n))",
        lambda r: [r.randint(0, 10**6)],
    ),
    ("reverse_string", "s", "returns the string s reversed", "return s[::-1]", lambda r: [_word(r)]),
    (
        "is_palindrome",
        "s",
        "returns True when the string s reads the same backwards, else False",
        "return s == s[::-1]",
        lambda r: [r.choice([_word(r), "abba", "racecar", "ab"])],
    ),
    (
        "count_vowels",
        "s",
        "returns how many characters of s are vowels (a, e, i, o, u)",
        "return sum(c in 'aeiou' for c in s)",
        lambda r: [_word(r)],
    ),
    (
        "max_of_list",
        "xs",
        "returns the largest number in the non-empty list xs",
        "return max(xs)",
        lambda r: [_ints(-99, 99)(r)],
    ),
    (
        "second_largest",
        "xs",
        "returns the second largest distinct value in xs (which has at least two)",
        "return sorted(set(xs))[-2]",
        lambda r: [_with_repeated_max(r)],
    ),
    (
        "factorial",
        "n",
        "returns n! for a non-negative integer n",
        "import math\n    return math.factorial(n)",
        lambda r: [r.randint(0, 12)],
    ),
    (
        "fibonacci",
        "n",
        "returns the n-th Fibonacci number, with fibonacci(0) = 0 and fibonacci(1) = 1",
        "a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
        lambda r: [r.randint(0, 30)],
    ),
    (
        "gcd",
        "a, b",
        "returns the greatest common divisor of the positive integers a and b",
        "import math\n    return math.gcd(a, b)",
        lambda r: [r.randint(1, 200), r.randint(1, 200)],
    ),
    (
        "is_prime",
        "n",
        "returns True when the integer n is prime, else False",
        "return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))",
        lambda r: [r.randint(0, 100)],
    ),
    (
        "sum_evens",
        "xs",
        "returns the sum of the even numbers in the list xs",
        "return sum(x for x in xs if x % 2 == 0)",
        lambda r: [_ints(-20, 20)(r)],
    ),
    (
        "running_sum",
        "xs",
        "returns the list of running totals of xs",
        "out, t = [], 0\n    for x in xs:\n        t += x\n        out.append(t)\n    return out",
        lambda r: [_ints(-9, 9)(r)],
    ),
    (
        "dedupe",
        "xs",
        "returns xs without repeated values, keeping the first occurrence of each, in order",
        "return list(dict.fromkeys(xs))",
        lambda r: [_ints(0, 5)(r)],
    ),
    (
        "rotate_left",
        "xs, k",
        "returns the list xs rotated left by k positions (k may exceed len(xs))",
        "k %= len(xs)\n    return xs[k:] + xs[:k]",
        lambda r: [_ints(0, 9)(r), r.randint(0, 12)],
    ),
    (
        "count_words",
        "s",
        "returns the number of whitespace-separated words in s",
        "return len(s.split())",
        lambda r: [" ".join(_word(r) for _ in range(r.randint(0, 5)))],
    ),
    (
        "capitalize_words",
        "s",
        "returns s with the first letter of each space-separated word upper-cased",
        "return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))",
        lambda r: [" ".join(_word(r) for _ in range(r.randint(1, 4)))],
    ),
    (
        "fizzbuzz",
        "n",
        "returns the string fizzbuzz if n is divisible by 15, fizz if by 3, buzz if by 5, else str(n)",
        "return 'fizzbuzz' if n % 15 == 0 else 'fizz' if n % 3 == 0 else 'buzz' if n % 5 == 0 else str(n)",
        lambda r: [r.randint(1, 60)],
    ),
    (
        "celsius_to_fahrenheit",
        "c",
        "converts c degrees celsius to fahrenheit (c times 9, divided by 5, plus 32)",
        "return c * 9 / 5 + 32",
        lambda r: [r.randint(-40, 100)],
    ),
    (
        "clamp",
        "x, lo, hi",
        "returns x limited to the range [lo, hi]",
        "return max(lo, min(x, hi))",
        lambda r: _clamp_args(r),
    ),
    (
        "count_char",
        "s, c",
        "returns how many times the character c occurs in s",
        "return s.count(c)",
        lambda r: [_word(r), r.choice("aeirst")],
    ),
    (
        "flatten",
        "xss",
        "returns the concatenation of the lists in xss",
        "return [x for xs in xss for x in xs]",
        lambda r: [[_ints(0, 9, (0, 3))(r) for _ in range(r.randint(0, 4))]],
    ),
    (
        "digits_to_int",
        "ds",
        "returns the integer whose decimal digits are the list ds (most significant first)",
        "return int(''.join(map(str, ds)))",
        lambda r: [[r.randint(1, 9)] + _ints(0, 9, (0, 5))(r)],
    ),
    (
        "square_all",
        "xs",
        "returns the list of the squares of xs",
        "return [x * x for x in xs]",
        lambda r: [_ints(-9, 9)(r)],
    ),
    (
        "min_max",
        "xs",
        "returns [min(xs), max(xs)] for a non-empty list xs",
        "return [min(xs), max(xs)]",
        lambda r: [_ints(-50, 50)(r)],
    ),
    (
        "is_power_of_two",
        "n",
        "returns True when the positive integer n is a power of two, else False",
        "return n & (n - 1) == 0",
        lambda r: [r.choice([1, 2, 3, 6, 8, 12, 16, 64, 96, 1024])],
    ),
    (
        "char_frequency",
        "s",
        "returns a dict mapping each character of s to how often it occurs",
        "out = {}\n    for c in s:\n        out[c] = out.get(c, 0) + 1\n    return out",
        lambda r: [_word(r)],
    ),
    (
        "merge_sorted",
        "a, b",
        "merges the sorted lists a and b into one sorted list",
        "return sorted(a + b)",
        lambda r: [sorted(_ints(0, 20, (0, 5))(r)), sorted(_ints(0, 20, (0, 5))(r))],
    ),
    (
        "binary_string",
        "n",
        "returns the binary representation of the non-negative integer n without a prefix",
        "return bin(n)[2:]",
        lambda r: [r.randint(0, 1000)],
    ),
    (
        "count_positive",
        "xs",
        "returns how many numbers in xs are greater than zero",
        "return sum(x > 0 for x in xs)",
        lambda r: [_ints(-9, 9)(r)],
    ),
    (
        "abs_diff",
        "a, b",
        "returns the absolute difference of a and b",
        "return abs(a - b)",
        lambda r: [r.randint(-50, 50), r.randint(-50, 50)],
    ),
    (
        "last_element",
        "xs",
        "returns the last element of the non-empty list xs",
        "return xs[-1]",
        lambda r: [_ints(0, 99)(r)],
    ),
    (
        "mean",
        "xs",
        "returns the arithmetic mean of the non-empty list xs",
        "return sum(xs) / len(xs)",
        lambda r: [_ints(0, 20)(r)],
    ),
    (
        "vowel_positions",
        "s",
        "returns the list of indices i where s[i] is a vowel (a, e, i, o, u)",
        "return [i for i, c in enumerate(s) if c in 'aeiou']",
        lambda r: [_word(r)],
    ),
]


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
