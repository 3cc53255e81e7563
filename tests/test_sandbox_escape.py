"""Hostile programs beyond test_sandbox.py: each class of escape a run without namespaces,
seccomp or a memory cgroup allowed, run through `run_python` with its concrete outcome
asserted (System V IPC, unix sockets, other processes, pinned kernel memory, kernel keys,
privileges, daemons, our own source in a checkout and in a wheel install)."""

import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from posttrain.tasks import sandbox, sandbox_bwrap, sandbox_cgroup
from posttrain.tasks.sandbox import Limits, run_python

from test_sandbox import needs_bwrap

REPO = Path(__file__).resolve().parents[1]
LIMITS = Limits(timeout_s=30.0)  # slack for a loaded machine: none of these waits for its deadline


@pytest.fixture(autouse=True)
def _bwrap():
    needs_bwrap()


def _tag() -> str:
    return "pt" + uuid.uuid4().hex[:13]  # a process name (comm: at most 15 characters)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _named(tag: str) -> list[int]:
    """Live processes called `tag` anywhere on the machine."""
    out = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            if _read(f"/proc/{p}/comm").strip() == tag and _read(f"/proc/{p}/stat").split(")")[1].split()[0] != "Z":
                out.append(int(p))
        except OSError:
            pass
    return out


def _wait(cond, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


# --- System V IPC: an IPC namespace per run ---

SYSV = """import ctypes, json, sys, time
libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT = 0o1000
def exists(key):
    return libc.shmget(key, 0, 0) >= 0 or libc.msgget(key, 0) >= 0
mine, other, linger = {mine}, {other}, {linger}
shm, msg = libc.shmget(mine, 4096, IPC_CREAT | 0o666), libc.msgget(mine, IPC_CREAT | 0o666)
buf = (ctypes.c_long * 2)(1, 42)
sent = libc.msgsnd(msg, buf, 8, 0)
created, seen, last = time.time(), [], time.time()
while time.time() - created < linger:
    seen.append(exists(other))
    last = time.time()
    time.sleep(0.02)
print(json.dumps({{"shm": shm, "msg": msg, "sent": sent, "created": created, "last": last, "saw_other": any(seen)}}))
"""


def test_sysv_ipc_objects_die_with_the_run_and_two_runs_cannot_share_them():
    a_key, b_key = 0x50540000 + os.getpid() % 0xFFFF, 0x50550000 + os.getpid() % 0xFFFF
    out = {}

    def run(name, mine, other, linger):
        out[name] = run_python(SYSV.format(mine=mine, other=other, linger=linger), limits=LIMITS)

    a = threading.Thread(target=run, args=("a", a_key, b_key, 4.0))
    a.start()
    time.sleep(0.5)
    run("b", b_key, a_key, 2.0)
    a.join()
    ra, rb = (json.loads(out[k].stdout) for k in "ab")
    assert ra["shm"] >= 0 and ra["msg"] >= 0 and ra["sent"] == 0 and rb["shm"] >= 0  # both made theirs
    assert max(ra["created"], rb["created"]) < min(ra["last"], rb["last"])  # and both lived at once
    assert not ra["saw_other"] and not rb["saw_other"]  # yet neither saw the other
    host = _read("/proc/sysvipc/shm") + _read("/proc/sysvipc/msg")
    assert str(a_key) not in host and str(b_key) not in host  # nothing reached the host
    after = run_python(
        f"import ctypes\nlibc = ctypes.CDLL(None)\nprint(libc.shmget({a_key}, 0, 0), libc.msgget({a_key}, 0))",
        limits=LIMITS,
    )
    assert after.stdout.split() == ["-1", "-1"]  # nor the next run


# --- unix sockets: paths outside the private dirs, and the abstract namespace ---


def test_unix_sockets_outside_the_sandbox_are_unreachable(tmp_path):
    name = uuid.uuid4().hex
    paths = [f"/tmp/posttrain-{name}.sock", str(REPO / f"posttrain-{name}.sock"), f"\0posttrain-{name}"]
    servers = []
    try:
        for p in paths:
            s = socket.socket(socket.AF_UNIX)
            s.bind(p)
            s.listen(4)
            s.setblocking(False)
            servers.append(s)
        listing = json.dumps(paths)
        code = (
            f"import json, socket\nout = []\nfor p in json.loads({listing!r}):\n    s = socket.socket(socket.AF_UNIX)\n"
            "    try:\n        s.connect(p)\n        out.append('connected')\n    except OSError as e:\n"
            "        out.append(type(e).__name__)\nprint(json.dumps(out))\n"
        )
        r = run_python(code, limits=LIMITS)
        assert r.ok, r.reason
        assert json.loads(r.stdout) == ["FileNotFoundError", "FileNotFoundError", "ConnectionRefusedError"]
        for s in servers:
            with pytest.raises(BlockingIOError):
                s.accept()  # nobody knocked
    finally:
        for s in servers:
            s.close()
        for p in paths[:2]:
            Path(p).unlink(missing_ok=True)


# --- other processes: a PID namespace per run ---


def test_other_processes_and_their_command_lines_are_invisible():
    secret = "secret-" + uuid.uuid4().hex
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", secret])
    try:
        code = (
            "import os\npids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\nprint(pids)\n"
            "for p in pids:\n    print(open(f'/proc/{p}/cmdline').read())\n"
            "print(os.getpid(), os.getppid())\n"
        )
        r = run_python(code, limits=LIMITS)
        assert r.ok, r.reason
        lines = r.stdout.splitlines()
        assert lines[0] == "[1, 2]" and lines[-1] == "2 1"  # bwrap's init and the program: no one else
        assert secret not in r.stdout and "pytest" not in r.stdout and str(os.getpid()) not in lines[0]
    finally:
        victim.kill()
        victim.wait()


# --- kernel memory: socket buffers pinned past the memory limit ---

PIN = """import os, socket, time
def fill():
    total, socks = 0, []
    while True:
        try:
            a, b = socket.socketpair()
        except OSError as e:
            return total, f"{type(e).__name__} {e.errno}"
        socks.append((a, b))
        for s in (a, b):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
            s.setblocking(False)
            while True:
                try:
                    total += s.send(b"x" * 65536)
                except OSError:
                    break
r, w = os.pipe()
kids = 0
for _ in range(64):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.write(w, ("%d\\n" % fill()[0]).encode())
        time.sleep(60)
        os._exit(0)
    kids += 1
total, why = fill()
f = os.fdopen(r)
total += sum(int(f.readline()) for _ in range(kids))
print(total, why)
"""


def test_socket_buffers_cannot_pin_memory_past_the_limit(monkeypatch):
    """~3 GB on this kernel unbounded (4 MiB net.core.wmem_max per socket x every descriptor of
    every process): with a memory cgroup the run dies at its limit; without one, no socket opens."""
    limit = 256
    r = run_python(PIN, limits=Limits(timeout_s=60.0, memory_mb=limit))
    if r.memory_cap.startswith("cgroup"):
        assert r.reason == f"killed by SIGKILL (memory limit: {limit} MB for all its processes, cgroup)", r.reason
    else:
        assert r.ok and int(r.stdout.split()[0]) < limit << 20
    monkeypatch.setitem(sandbox._CGROUP_OFF, "why", "forced off by the test")
    r = run_python(PIN, limits=Limits(timeout_s=60.0, memory_mb=limit))
    assert r.memory_cap == "rlimit only (forced off by the test)"
    assert r.ok and r.stdout.split() == ["0", "OSError", "97"]  # EAFNOSUPPORT: nothing pinned


# --- kernel keys, privileges ---


def test_kernel_keys_are_refused_and_none_is_left_behind():
    tag = "posttrain-" + uuid.uuid4().hex
    nr = sandbox_bwrap.SYSCALLS[platform.machine()][1]
    code = (
        f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nL = ctypes.c_long\nnr = {nr!r}\n"
        "def call(name, *args):\n    return libc.syscall(L(nr[name]), *args), ctypes.get_errno()\n"
        f"tag = {tag!r}.encode()\n"
        "print(call('add_key', b'user', tag, b'payload', L(7), L(-4)))\n"  # the user keyring
        "print(call('add_key', b'user', tag, b'payload', L(7), L(-3)))\n"  # the session keyring
        "print(call('keyctl', L(1), tag))\n"  # join a new session keyring
        "print(call('request_key', b'user', tag, None, L(0)))\n"
    )
    if platform.machine() not in sandbox_bwrap.SYSCALLS:
        pytest.skip(f"no seccomp filter written for {platform.machine()}")
    r = run_python(code, limits=LIMITS)
    assert r.ok and r.stdout.splitlines() == ["(-1, 1)"] * 4, r.stdout  # EPERM, each
    assert tag not in _read("/proc/keys")


def test_no_new_privs_no_capabilities_no_user_namespaces():
    code = (
        "import ctypes, os\nst = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines())\n"
        "print(st['NoNewPrivs'], st['Seccomp'], st['CapEff'], st['CapBnd'], os.getuid() != 0)\n"
        "libc = ctypes.CDLL(None, use_errno=True)\nprint(libc.unshare(0x10000000), ctypes.get_errno() != 0)\n"
    )
    r = run_python(code, limits=LIMITS)
    assert r.ok, r.reason
    assert r.stdout.splitlines() == ["1 2 0000000000000000 0000000000000000 True", "-1 True"]


# --- daemons: nothing survives the run, its deadline, or its caller ---

DAEMON = """import ctypes, os, time
libc = ctypes.CDLL(None)
libc.prctl(15, {tag!r}.encode(), 0, 0, 0)         # PR_SET_NAME: the test finds us by this name
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, 3)                        # hold none of the parent's pipes
        time.sleep(300)
    os._exit(0)
time.sleep({main_s})
print("main exits")
"""


def test_a_double_forked_setsid_daemon_dies_with_the_run():
    tag = _tag()
    r = run_python(DAEMON.format(tag=tag, main_s=0.5), limits=LIMITS)
    assert r.ok and r.stdout == "main exits\n", r.reason
    assert _named(tag) == [] and sandbox.leftovers(r) == []


class _DaemonTask:
    """A verifier whose sandbox outlives the pool's deadline: its program daemonizes and sleeps."""

    def __init__(self, tag):
        self.tag = tag

    def reward(self, item, response):
        from posttrain.tasks.base import RewardResult

        run_python(DAEMON.format(tag=self.tag, main_s=300), limits=Limits(timeout_s=120.0))
        return RewardResult(1.0)


@pytest.mark.slow
def test_nothing_survives_a_pool_deadline_shorter_than_the_sandbox_timeout():
    from posttrain.tasks.pool import VerifierPool

    tag = _tag()
    with VerifierPool(_DaemonTask(tag), workers=1, timeout_s=8.0) as pool:
        seen = []
        watch = threading.Thread(target=lambda: seen.append(_wait(lambda: len(_named(tag)) == 2, 8.0)))
        watch.start()
        results, stats = pool.score([(None, "")])
        watch.join()
    assert seen == [True]  # the program and its daemon both ran...
    assert stats["timeouts"] == 1 and results[0].reward == 0.0
    assert _wait(lambda: _named(tag) == [], 10.0)  # ...and neither outlived the worker


def test_killing_the_caller_of_run_python_leaves_no_survivor():
    tag = _tag()
    script = (
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\nfrom posttrain.tasks.sandbox import Limits, run_python\n"
        f"run_python({DAEMON.format(tag=tag, main_s=300)!r}, limits=Limits(timeout_s=300.0))\n"
    )
    caller = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        assert _wait(lambda: len(_named(tag)) == 2, 60.0), "the sandbox did not start"
        os.kill(caller.pid, signal.SIGKILL)
        caller.wait()
        assert _wait(lambda: _named(tag) == [], 10.0), _named(tag)  # --die-with-parent: all of it died
    finally:
        caller.kill()
        caller.wait()
    parent = sandbox_cgroup.probe()[0]
    if parent:  # its cgroup was left behind; the next run removes it
        run_python("pass", limits=LIMITS)
        assert not [n for n in os.listdir(parent) if n.startswith(f"{sandbox_cgroup.PREFIX}{caller.pid}-")]


# --- our own source: a checkout, and a wheel installed in a venv ---

WALK = """import json, os
targets, found, readable = json.load(open("targets.json")), [], []
for t in targets:
    try:
        open(t).read()
        readable.append(t)
    except OSError:
        pass
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/dev", "/sandbox")]
    for name in dirs + files:
        path = os.path.join(root, name)
        if "posttrain" in name:
            found.append(path)
        elif name.endswith((".py", ".json", ".toml", ".md")):
            try:
                if "def build_problem(" in open(path, errors="replace").read():
                    found.append(path)
            except OSError:
                pass
print(json.dumps({"readable": readable, "found": found}))
"""


@pytest.mark.slow
def test_nothing_of_the_checkout_is_visible_from_inside():
    """Names with "posttrain" and files holding code.py's text, anywhere but /proc, /sys and the
    program's own files: none."""
    targets = [str(REPO / "posttrain" / "tasks" / "code.py"), str(REPO / "pyproject.toml"), str(REPO / "README.md")]
    r = run_python(WALK, files={"targets.json": json.dumps(targets)}, limits=Limits(timeout_s=120.0))
    assert r.ok, r.reason
    assert json.loads(r.stdout) == {"readable": [], "found": []}


@pytest.mark.slow
def test_nothing_of_a_wheel_install_is_visible_from_inside(tmp_path):
    """posttrain built as a wheel and installed into a venv whose interpreter runs the sandbox:
    the venv's prefix is bound (it holds the interpreter), its site-packages is hidden."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "posttrain", src / "posttrain", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "wheels"),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    root = Path(tempfile.mkdtemp(prefix="ptwheel-"))
    try:
        root.chmod(0o755)  # the sandbox uid must reach the interpreter
        venv = root / "venv"
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--copies", "--without-pip", str(venv)], check=True)
        site = next(venv.glob("lib/python3*/site-packages"))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--no-deps",
                "-q",
                "--target",
                str(site),
                *map(str, (tmp_path / "wheels").glob("*.whl")),
            ],
            check=True,
            capture_output=True,
        )
        script = (
            "import json, os, sys, posttrain\nfrom posttrain.tasks import sandbox_bwrap\n"
            "from posttrain.tasks.sandbox import Limits, run_python\n"
            "code = os.path.join(os.path.dirname(posttrain.__file__), 'tasks', 'code.py')\n"
            "roots, hidden = sandbox_bwrap.binds(os.path.realpath(sys.executable))\n"
            f"r = run_python({WALK!r}, files={{'targets.json': json.dumps([code])}}, limits=Limits(timeout_s=120.0))\n"
            "print(json.dumps({'code': code, 'roots': roots, 'hidden': hidden, 'reason': r.reason, 'out': r.stdout}))\n"
        )
        res = subprocess.run(
            [str(venv / "bin" / "python3"), "-I", "-c", script],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert res.returncode == 0, res.stderr[-2000:]
        got = json.loads(res.stdout)
        assert got["code"].startswith(str(site)) and os.path.exists(got["code"])  # the wheel's copy was used
        assert str(venv) in got["roots"] and str(site) in got["hidden"]  # its venv bound, site hidden
        assert got["reason"] is None and json.loads(got["out"]) == {"readable": [], "found": []}
    finally:
        shutil.rmtree(root, ignore_errors=True)
