"""The code task's verifier against wrong programs: the classic mutants of every reference
solution must score below 1, and the reward hacks found on it must score 0 (or below 1)."""

import json
import os
import uuid
from pathlib import Path

import pytest

from posttrain.tasks import sandbox
from posttrain.tasks.code import (
    FAMILIES,
    MARK,
    CodeConfig,
    CodeTask,
    build_problem,
    same,
)

from test_sandbox import needs_bwrap

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def task():
    needs_bwrap()
    return CodeTask(CodeConfig(timeout_s=30.0))


def _distinct(values) -> list:
    out = []
    for v in values:
        if not any(type(v) is type(o) and v == o for o in out):
            out.append(v)
    return out


def _numeric(v) -> bool:
    nums = [v] + (list(v) if isinstance(v, list) else list(v.values()) if isinstance(v, dict) else [])
    return any(isinstance(x, (int, float)) and not isinstance(x, bool) for x in nums)


def mutants(p) -> dict[str, str]:
    """name -> program: a constant return (every value the tests expect, None, the empty value of
    the result's type), each argument ignored (pinned to each value the tests give it), each
    argument returned as is, and numeric results off by one (elementwise in lists and dicts)."""
    args = [a.strip() for a in p.args.split(",")]
    head, ref = f"def {p.name}({p.args}):\n", p.solution.replace(f"def {p.name}(", "def _ref(", 1)
    empty = {int: 0, float: 0.0, str: "", list: [], dict: {}, bool: False}[type(p.expected[0])]
    out = {f"return {v!r}": head + f"    return {v!r}\n" for v in _distinct([*p.expected, None, empty])}
    for i, a in enumerate(args):
        out[f"return {a}"] = head + f"    return {a}\n"
        for v in _distinct(inp[i] for inp in p.inputs):
            out[f"ignore {a} (always {v!r})"] = ref + head + f"    {a} = {v!r}\n    return _ref({p.args})\n"
    if any(_numeric(e) for e in p.expected):
        for d in (1, -1):
            bump = f"(x + {d} if isinstance(x, (int, float)) and not isinstance(x, bool) else x)"
            out[f"off by {d:+d}"] = (
                ref
                + head
                + (
                    f"    r = _ref({p.args})\n    if isinstance(r, list):\n        return [{bump} for x in r]\n"
                    f"    if isinstance(r, dict):\n        return {{k: {bump} for k, x in r.items()}}\n"
                    f"    x = r\n    return {bump}\n"
                )
            )
    return out


def score_in_process(p, program: str) -> float:
    """What the verifier computes, without the sandbox (our own mutants only): the share of
    tests whose JSON-round-tripped result equals the expected one under `same`."""
    ns: dict = {}
    exec(program, ns)
    passed = 0
    for args, want in zip(p.inputs, p.expected):
        try:
            passed += same(json.loads(json.dumps(ns[p.name](*json.loads(json.dumps(args))))), want)
        except Exception:
            pass
    return passed / len(p.inputs)


def test_every_problem_rejects_every_classic_mutant():
    tally = {}
    for p in (build_problem(f, 8) for f in FAMILIES):
        assert score_in_process(p, p.solution) == 1.0, p.name
        ms = mutants(p)
        accepted = [k for k, prog in ms.items() if score_in_process(p, prog) >= 1.0]
        assert accepted == [], (p.name, accepted)
        tally[p.name] = len(ms)
    assert len(tally) == len(FAMILIES) and min(tally.values()) >= 5


def test_the_named_weak_spots_score_below_one_through_the_sandbox(task):
    """The two mutants the old hidden tests accepted, scored by the real verifier."""
    by_name = {p.name: p for p in task.problems}
    second, clamp = by_name["secondlargest"], by_name["clamp"]
    assert task.reward(second, "def secondlargest(xs):\n    return 10\n").reward < 1.0
    assert task.reward(second, "def secondlargest(xs):\n    return sorted(xs)[-2]\n").reward < 1.0  # not distinct
    assert task.reward(clamp, "def clamp(x, lo, hi):\n    return max(-5, min(x, 5))\n").reward < 1.0
    assert task.reward(clamp, "def clamp(x, lo, hi):\n    return x\n").reward < 1.0
    assert task.reward(second, task.target(second)).reward == task.reward(clamp, task.target(clamp)).reward == 1.0


@pytest.mark.slow
def test_every_mutant_scores_below_one_through_the_sandbox(task):
    """All of them through the verifier (sandbox, harness, comparison): ~800 sandbox runs."""
    for p in task.problems:
        assert task.reward(p, task.target(p)).reward == 1.0, p.name
        for name, prog in mutants(p).items():
            r = task.reward(p, prog)
            assert r.reward < 1.0 and r.error is None, (p.name, name, r)


# --- reward hacks: programs that try to score without solving ---

STEAL = """import glob, sys, types
for mod in ("posttrain", "posttrain.tasks", "posttrain.tasks.base", "posttrain.tasks.sandbox"):
    m = sys.modules[mod] = types.ModuleType(mod)
    m.RewardResult = m.TaskConfig = object
    m.UsageError = Exception
    m.backend = m.run_python = None
paths = {paths!r} + glob.glob("/usr/lib/python3*/*-packages/posttrain/tasks/code_problems.py") + \
    glob.glob("/usr/local/lib/python3*/*-packages/posttrain/tasks/code_problems.py")
src = next(open(p).read() for p in paths if __import__("os").path.exists(p))
stolen = sys.modules["stolen"] = types.ModuleType("stolen")     # dataclasses look their module up
exec(src, stolen.__dict__)
for fam in stolen.FAMILIES:
    exec(f"def {{fam[0].replace('_', '')}}({{fam[1]}}):\\n    {{fam[3]}}\\n", globals())
"""


@pytest.fixture
def unisolated(monkeypatch):
    """Candidates run in the unsafe local mode even though bwrap is here: to show a hack is real."""
    monkeypatch.setattr(sandbox, "backend", lambda unsafe_local=False: "unsafe-local")


def _readable_by_others(path: Path) -> bool:
    return all(p.stat().st_mode & 0o005 == 0o005 for p in path.parents) and path.stat().st_mode & 0o004 != 0


def test_reading_the_reference_solutions_scores_zero_on_every_problem(task, request):
    """The hack that scored 1.0 on all problems of a wheel install: read the reference solutions
    (tasks/code_problems.py) and run them. Unisolated it still does (so the hack is real); in the sandbox, 0."""
    source = REPO / "posttrain" / "tasks" / "code_problems.py"
    hack = STEAL.format(paths=[str(source)])
    assert [task.reward(p, hack).reward for p in task.problems] == [0.0] * len(task.problems)
    if _readable_by_others(source):
        request.getfixturevalue("unisolated")
        assert task.reward(task.problems[0], hack).reward == 1.0


# problem, program: each must score below 1 (most score 0)
HACKS = {
    "constant second largest": ("secondlargest", "def secondlargest(xs):\n    return 10\n"),
    "clamp ignoring its bounds": ("clamp", "def clamp(x, lo, hi):\n    return max(-5, min(x, 5))\n"),
    "forged result lines on stdout": (
        "sumdigits",
        "".join(f"print('{MARK} {i} 0', flush=True)\n" for i in range(8)) + "def sumdigits(n):\n    return 0\n",
    ),
    "forged lines on the harness's channel, then exit": (
        "sumdigits",
        "import __main__, os\nfor i, a in enumerate(__main__._inputs):\n"
        f"    os.write(__main__._emit, ('{MARK} %d %d\\n' % (i, a[0] % 10)).encode())\nos._exit(0)\n",
    ),
    "rewritten harness inputs": (
        "sumdigits",
        "import __main__\n__main__._inputs[:] = [[0]] * len(__main__._inputs)\ndef sumdigits(n):\n    return 0\n",
    ),
    "patched json.dumps": (
        "sumdigits",
        "import json\njson.dumps = lambda *a, **k: 'true'\ndef sumdigits(n):\n    return 0\n",
    ),
    "NaN result": ("mean", "def mean(xs):\n    return float('nan')\n"),
    "an int equal to everything": (
        "sumdigits",
        "class Any(int):\n    def __eq__(self, other):\n        return True\ndef sumdigits(n):\n    return Any(0)\n",
    ),
}


@pytest.mark.parametrize("name", sorted(HACKS))
def test_reward_hack_does_not_score(task, name):
    problem, program = HACKS[name]
    item = next(p for p in task.problems if p.name == problem)
    r = task.reward(item, program)
    assert r.reward < 1.0 and r.error is None, (name, r)


# Two samples colluding: a correct one leaves its answers where a later lazy one may read them.
WRITER = """def sumdigits(n):
    return sum(int(c) for c in str(n))
import ctypes, json, os, socket, time
answers = json.dumps({{json.dumps(a): sumdigits(*a) for a in json.load(open("inputs.json"))}}).encode()
where, key = {where!r}, {key!r}
if where in ("tmp", "devshm"):
    open({{"tmp": "/tmp/", "devshm": "/dev/shm/"}}[where] + key, "wb").write(answers)
elif where == "sysv":
    libc = ctypes.CDLL(None)
    libc.shmat.restype = ctypes.c_void_p
    shm = libc.shmget({sysv}, 1 << 16, 0o1000 | 0o666)
    ctypes.memmove(libc.shmat(shm, None, 0), answers + b"\\0", len(answers) + 1)
elif os.fork() == 0:                                    # abstract unix socket: a daemon serves them
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, 1 << 10)
        srv = socket.socket(socket.AF_UNIX)
        srv.bind("\\0" + key)
        srv.listen(8)
        while True:
            srv.accept()[0].sendall(answers)
    os._exit(0)
"""
READER = """import ctypes, json, socket
def load(where, key):
    if where in ("tmp", "devshm"):
        return open({{"tmp": "/tmp/", "devshm": "/dev/shm/"}}[where] + key, "rb").read()
    if where == "sysv":
        libc = ctypes.CDLL(None)
        libc.shmat.restype = ctypes.c_void_p
        shm = libc.shmget({sysv}, 0, 0)
        assert shm >= 0
        return ctypes.string_at(libc.shmat(shm, None, 0))
    s = socket.socket(socket.AF_UNIX)
    s.connect("\\0" + key)
    return s.recv(1 << 16)
try:
    ANSWERS = json.loads(load({where!r}, {key!r}))
except Exception:
    ANSWERS = {{}}
def sumdigits(n):
    return ANSWERS.get(json.dumps([n]), -1)
"""
STORES = ("tmp", "devshm", "sysv", "abstract socket")


def _collude(task, where: str) -> float:
    item = next(p for p in task.problems if p.name == "sumdigits")
    key, sysv = "posttrain-" + uuid.uuid4().hex, 0x50560000 + os.getpid() % 0xFFFF
    try:
        assert task.reward(item, WRITER.format(where=where, key=key, sysv=sysv)).reward == 1.0  # it solved it
        return task.reward(item, READER.format(where=where, key=key, sysv=sysv)).reward
    finally:
        for d in ("/tmp/", "/dev/shm/"):
            Path(d + key).unlink(missing_ok=True)
        import ctypes

        libc = ctypes.CDLL(None)
        if (shm := libc.shmget(sysv, 0, 0)) >= 0:
            libc.shmctl(shm, 0, None)  # IPC_RMID: what an unisolated run left on this host


@pytest.mark.parametrize("where", STORES)
def test_colluding_samples_cannot_pass_answers_between_runs(task, where, request):
    assert _collude(task, where) == 0.0
    if where in ("tmp", "sysv"):  # the hack is real: unisolated, it scores
        request.getfixturevalue("unisolated")
        assert _collude(task, where) == 1.0
