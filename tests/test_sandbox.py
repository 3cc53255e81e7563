"""The sandbox contains hostile programs: each gets a reason, the test process goes on, and
nothing it started is left running. The code task scores every one of them 0. (More hostile
classes: test_sandbox_escape.py; the code verifier against wrong programs: test_code_verifier.py.)"""

import dataclasses
import os
import socket
import uuid
from pathlib import Path

import pytest

from posttrain import UsageError
from posttrain.tasks import sandbox
from posttrain.tasks.sandbox import Limits, run_python


def needs_bwrap():
    """Skip where bubblewrap cannot run, except in CI (POSTTRAIN_REQUIRE_BWRAP): never a silent skip there."""
    try:
        sandbox.backend()
    except UsageError as e:
        if os.environ.get("POSTTRAIN_REQUIRE_BWRAP"):
            raise
        pytest.skip(str(e))


@pytest.fixture(autouse=True)
def _bwrap(request):
    if not request.node.name.startswith("test_without_bwrap"):  # those hide it themselves
        needs_bwrap()


REPO = Path(__file__).resolve().parents[1]
SECRET = "hunter2-" + uuid.uuid4().hex
OUTSIDE = f"/tmp/posttrain-hostile-{uuid.uuid4().hex}"
IN_REPO = REPO / f"hostile-{uuid.uuid4().hex}.txt"
LIMITS = Limits(timeout_s=20.0, memory_mb=256, max_procs=16, max_output_bytes=20_000)
SHORT = 2.0  # the wall clock for programs that never end; the others get 20 s (slack for a loaded CI box)


def _limits(case: str) -> Limits:
    return dataclasses.replace(LIMITS, timeout_s=SHORT if HOSTILE[case][1] == "timed out" else LIMITS.timeout_s)


def _listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    return srv


# name -> (program, a substring the reason must contain; None: it runs to the end and learns
# nothing). {port} is a socket the test listens on.
HOSTILE = {
    "infinite_loop": ("while True:\n    pass\n", "timed out"),
    "fork_bomb": (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "timed out",
    ),
    "memory_bomb": ("chunks = []\nwhile True:\n    chunks.append(bytearray(50 << 20))\n", "MemoryError"),
    "network_connect": (
        "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "socket.create_connection(('1.1.1.1', 80), timeout=1)\nprint('connected')\n",
        "exit code 1",
    ),
    "write_outside": (f"open({OUTSIDE!r}, 'w').write('x')\nopen({str(IN_REPO)!r}, 'w').write('x')\n", "exit code 1"),
    "read_parent_env": (
        "import os\nprint(dict(os.environ))\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n"
        "        print(open(f'/proc/{{p}}/environ').read())\n",
        None,
    ),  # its own PID namespace only
    "kill_parent": (
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)\n",
        "ProcessLookupError",
    ),  # its parent is the namespace's init; kill(-1) finds nobody else
    "read_reference_solutions": (
        f"print(open({str(REPO / 'posttrain' / 'tasks' / 'code.py')!r}).read())\n",
        "FileNotFoundError",
    ),
    "fill_disk": ("for i in range(100):\n    open(f'f{{i}}', 'wb').write(b'x' * (10 << 20))\n", "No space left"),
    "huge_output": ("while True:\n    print('x' * 10000)\n", "output exceeded"),
    "missing_module": ("import no_such_module_posttrain\n", "ModuleNotFoundError"),
}


# Children the test process had before any sandbox run (e.g. multiprocessing's resource
# tracker or Ray helpers started by earlier tests in the same session) are not the sandbox's.
_BEFORE: set[int] = set()


@pytest.fixture(autouse=True)
def _known_children():
    _BEFORE.clear()
    _BEFORE.update(sandbox.descendants(os.getpid()))
    yield


def _alive_children() -> list[int]:
    """Live descendants of the test process that appeared during this test."""
    return [p for p in sandbox.descendants(os.getpid()) if p not in _BEFORE]


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_program_is_contained(case, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_SECRET", SECRET)
    srv = _listener()
    try:
        code, want = HOSTILE[case]
        r = run_python(code.format(port=srv.getsockname()[1]), limits=_limits(case))
    finally:
        srv.close()
    assert r.ok if want is None else want in (r.reason or ""), (case, r.reason, r.stderr[-300:])
    assert sandbox.leftovers(r) == []  # nothing of it still runs
    assert _alive_children() == []
    assert SECRET not in r.stdout + r.stderr and "connected" not in r.stdout
    assert not os.path.exists(OUTSIDE) and not IN_REPO.exists()
    assert len(r.stdout) + len(r.stderr) <= 2 * LIMITS.max_output_bytes
    assert run_python("print(6 * 7)").stdout == "42\n"  # and the next run works


def test_fork_bomb_stops_at_the_process_cap():
    if sandbox.isolation()["user"] != "uid":
        pytest.skip("RLIMIT_NPROC counts the caller's own processes unless the sandbox has its own uid")
    code = (
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(60)\n"
        "            os._exit(0)\n        n += 1\nexcept OSError:\n    print(n)\n"
    )
    r = run_python(code, limits=LIMITS)
    assert r.ok and 0 < int(r.stdout) < LIMITS.max_procs  # the cap, not the timeout, stopped it
    assert sandbox.leftovers(r) == [] and _alive_children() == []


def test_isolation_in_force():
    info = sandbox.isolation()
    assert (info["backend"], info["network"], info["filesystem"], info["pid"]) == ("bwrap", "netns", "private", "pidns")
    assert sandbox.network_blocked() is True


def test_cleared_environment_cwd_and_stdin():
    r = run_python(
        "import os, sys\nprint(sorted(os.environ))\nprint(os.getcwd() == os.environ['HOME'])\n"
        "print(sys.flags.isolated, sys.stdin.read())\nprint(open('data.txt').read())",
        stdin="hello",
        files={"data.txt": "given"},
    )
    assert r.ok, r.reason
    assert r.stdout.splitlines() == ["['HOME', 'LANG', 'PATH', 'PWD', 'TMPDIR']", "True", "1 hello", "given"]


def test_exit_codes_and_cpu_limit():
    assert run_python("import sys; sys.exit(3)").reason == "exit code 3: no stderr"
    r = run_python("raise ValueError('bad input')")
    assert r.exit_code == 1 and r.reason == "exit code 1: ValueError: bad input"
    r = run_python(
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (1, 2))\nwhile True:\n    pass",
        limits=Limits(timeout_s=60.0),
    )  # 1 s of CPU can take long on a loaded box
    assert r.exit_code == -24 and r.reason == "killed by SIGXCPU (CPU time limit)"


# --- the code task on top of the sandbox ---


@pytest.fixture(scope="module")
def code_tasks():
    from posttrain.tasks.code import CodeConfig, CodeTask

    return {t: CodeTask(CodeConfig(timeout_s=t)) for t in (SHORT, LIMITS.timeout_s)}


def test_every_reference_solution_scores_one_and_splits_are_disjoint(code_tasks):
    code_task = code_tasks[LIMITS.timeout_s]
    from posttrain.models.tokenizer import CharTokenizer

    tok = CharTokenizer()
    train, test = code_task.splits["train"], code_task.splits["test"]
    assert len(code_task.problems) >= 30 and test and not {p.name for p in train} & {p.name for p in test}
    for p in code_task.problems:
        tok.encode(tok.chat_prompt(code_task.prompt(p)))  # gpt_mini can read every prompt
        r = code_task.reward(p, code_task.target(p))
        assert (r.reward, r.reason, r.components) == (1.0, None, {"passed": 8.0, "total": 8.0}), p.name


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_candidate_scores_zero_with_a_reason(code_tasks, case, monkeypatch):
    code_task = code_tasks[_limits(case).timeout_s]
    monkeypatch.setenv("POSTTRAIN_SECRET", SECRET)
    item = next(p for p in code_task.problems if p.name == "sumdigits")
    code = HOSTILE[case][0].format(port=1)
    r = code_task.reward(item, f"```python\n{code}\ndef sumdigits(n):\n    return 0\n```")
    assert r.reward == 0.0 and r.reason and r.error is None, (case, r)
    assert _alive_children() == [] and not os.path.exists(OUTSIDE) and not IN_REPO.exists()


def test_partial_credit_and_forged_result_lines(code_tasks):
    code_task = code_tasks[LIMITS.timeout_s]
    from posttrain.tasks.code import MARK, extract_code

    item = next(p for p in code_task.problems if p.name == "sumdigits")
    odd_only = "def sumdigits(n):\n    return sum(int(c) for c in str(n)) if n % 2 else -1\n"
    r = code_task.reward(item, odd_only)
    n_odd = sum(a[0] % 2 for a in item.inputs)
    assert r.reward == n_odd / 8 and r.components["passed"] == n_odd and r.reason.startswith(f"{n_odd}/8 tests passed")
    # a candidate that prints result lines for every index: each index is then reported twice -> failed
    forged = "".join(f"print('{MARK} {i} {e}', flush=True)\n" for i, e in enumerate(item.expected))
    assert code_task.reward(item, forged + item.solution).reward == 0.0
    assert extract_code("Here:\n```python\nx = 1\n```\nbye") == "x = 1\n" and extract_code("x = 2") == "x = 2"


def test_without_bwrap_untrusted_code_is_refused_unless_opted_in(monkeypatch, tmp_path):
    """No bwrap on PATH: one line naming the Debian package, at the code task's construction;
    `task.unsafe_local_sandbox=true` runs programs anyway (rlimits, cleared environment)."""
    from posttrain.config import RLConfig, load_config
    from posttrain.tasks import make

    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no bwrap
    with pytest.raises(UsageError, match="install the Debian package `bubblewrap`") as e:
        run_python("print(1)")
    assert "\n" not in str(e.value) and "task.unsafe_local_sandbox=true" in str(e.value)
    with pytest.raises(UsageError, match="bubblewrap"):
        make(load_config(RLConfig, None, ["task.name=code"]).task)
    task = make(load_config(RLConfig, None, ["task.name=code", "task.unsafe_local_sandbox=true"]).task)
    assert task.config.unsafe_local_sandbox is True
    item = next(p for p in task.problems if p.name == "sumdigits")
    assert task.reward(item, task.target(item)).reward == 1.0
    r = run_python("import os\nprint(sorted(os.environ), 6 * 7)", unsafe_local=True)
    assert r.ok and r.stdout == "['HOME', 'LANG', 'PATH', 'TMPDIR'] 42\n" and r.pidns is None
    assert sandbox.leftovers(r) == []
