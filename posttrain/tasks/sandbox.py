"""A sandbox for untrusted Python (candidate programs, tool calls): one subprocess per run.

    run_python(code, stdin="", timeout_s=5.0, memory_mb=256) -> SandboxResult

What a run gets, and what it cannot do (the verifier is the attack surface, so every
limit is enforced by the kernel, not by the program's good will):

  interpreter   `python -I -S main.py`: isolated mode (no PYTHON* variables, no user site,
                script dir not on sys.path), no site-packages: the standard library only
  filesystem    a fresh temp dir as cwd, HOME and TMPDIR; with namespaces, it and /tmp,
                /var/tmp, /dev/shm, /run/lock are private tmpfs mounts of max_file_mb each
                (disk use is capped; what the program writes vanishes with it); our source
                checkout (reference solutions) is hidden under an empty read-only tmpfs;
                as another uid, nothing of ours is writable
  environment   cleared: PATH, LANG, HOME, TMPDIR only (no secret of the parent leaks)
  time          a wall-clock deadline, and RLIMIT_CPU as a second wall
  memory        RLIMIT_AS per process;  RLIMIT_FSIZE per file;  captured output capped
  processes     RLIMIT_NPROC; as root the program runs under a fresh unprivileged uid, so
                the limit counts only its own processes (a fork bomb stops at the cap) and
                it may not signal the parent
  network       a new network namespace (no interfaces but a down loopback): connect()
                fails; `isolation()` says which mechanisms are in force, verified once
  cleanup       its own session; at the end the session is SIGKILLed, and (as root) every
                process of its uid, until none is left

The setup runs in a first stage, `sandbox_boot.py`, exec'd as a fresh interpreter that
enters the namespaces, sets the limits, drops the uid and then execs the program in place
(same pid, same session). Which of these the OS allows is probed once (`isolation()`):
mode "root" (euid 0: user, network and mount isolation), "userns" (unprivileged user
namespaces: network and mount isolation, same uid: killing the parent is not prevented),
"plain" (rlimits only; the work dir is on disk).
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")   # world-writable places on a usual Linux
UID_RANGE = (1_000_000, 2_000_000_000)                          # fresh uids: no user owns a file there
_BOOT = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_boot.py")).read()
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# our source checkout holds the reference solutions: a candidate must not read them
HIDDEN_DIRS = (_CHECKOUT,) if os.path.exists(os.path.join(_CHECKOUT, "pyproject.toml")) else ()


@dataclass
class Limits:
    timeout_s: float = 5.0          # wall clock for the whole run
    memory_mb: int = 256            # address space per process (RLIMIT_AS)
    max_procs: int = 16             # processes/threads of the sandbox uid (RLIMIT_NPROC)
    max_file_mb: int = 16           # largest file it may write (RLIMIT_FSIZE), and each private tmpfs
    max_output_bytes: int = 1 << 16  # stdout + stderr captured; more kills the run


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None           # negative = killed by that signal
    timed_out: bool
    reason: str | None              # None = ran to exit code 0; else why not (one line)
    wall_s: float
    pid: int = 0                    # the program's pid (= its session id): for leftover checks
    uid: int | None = None          # the uid it ran as (mode "root")

    @property
    def ok(self) -> bool:
        return self.reason is None


def run_python(code: str, stdin: str = "", timeout_s: float = 5.0, memory_mb: int = 256,
               files: dict[str, str] | None = None, limits: Limits | None = None) -> SandboxResult:
    """Run `code` as a script in a fresh sandbox; `files` are written next to it first."""
    lim = limits or Limits(timeout_s=timeout_s, memory_mb=memory_mb)
    return _run(_mode(), code, stdin, files or {}, lim)


def isolation() -> dict:
    """What is in force here: {"mode", "user", "network", "filesystem", "python", "passed_over"};
    the network entry is "netns" only after a connect() from inside was seen to fail, and
    `passed_over` says why a stronger mode failed to start."""
    mode = _mode()
    return {"mode": mode, "user": "uid" if mode == "root" else "none",
            "network": "netns" if mode != "plain" and network_blocked() else "none",
            "filesystem": "private-tmp" if mode != "plain" else "none", "python": _python(),
            "passed_over": dict(_MODE_ERRORS)}


@functools.lru_cache(maxsize=1)
def network_blocked() -> bool:
    """True when a sandboxed program cannot reach a socket the parent listens on."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    try:
        port = srv.getsockname()[1]
        r = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')")
        return "connected" not in r.stdout
    finally:
        srv.close()


# --- the parent side ---

@functools.lru_cache(maxsize=1)
def _python() -> str:
    """An interpreter the sandbox uid may execute (a venv under /root is not readable by it)."""
    for cand in (os.path.realpath(sys.executable), shutil.which("python3") or "", "/usr/bin/python3"):
        if cand and _world_executable(os.path.realpath(cand)):
            return os.path.realpath(cand)
    return os.path.realpath(sys.executable)


def _world_executable(path: str) -> bool:
    parts = path.split("/")
    dirs = ["/".join(parts[:i]) or "/" for i in range(1, len(parts))]
    try:
        return all(os.stat(d).st_mode & 0o001 for d in dirs) and os.stat(path).st_mode & 0o001 != 0
    except OSError:
        return False


_MODE_ERRORS: dict[str, str] = {}                # why a stronger mode was passed over (isolation() shows it)


@functools.lru_cache(maxsize=1)
def _mode() -> str:
    """The strongest mode whose setup succeeds here (probed once with a trivial program)."""
    for mode in (["root"] if os.geteuid() == 0 else []) + ["userns", "plain"]:
        r = _run(mode, "print('ok')", "", {}, Limits(timeout_s=10.0))
        if r.stdout.strip() == "ok":
            return mode
        _MODE_ERRORS[mode] = r.reason or "no output"
    return "plain"


def _user_tasks(uid: int) -> int:
    """Processes + threads of `uid` now: RLIMIT_NPROC counts them all, ours included."""
    n = 0
    for pid in _pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                n += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            pass
    return n


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, session id) of a process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid: int) -> list[int]:
    """Live (non-zombie) descendants of `pid`, children first."""
    stats = {p: st for p in _pids() if (st := _stat(p)) is not None}
    found, frontier = [], {pid}
    while frontier:
        kids = [p for p, st in stats.items() if st[1] in frontier]
        found += kids
        frontier = set(kids)
    return [p for p in found if stats[p][0] != "Z"]


def leftovers(pid: int, uid: int | None) -> list[int]:
    """Live (non-zombie) processes still in the run's session, or of its uid."""
    out = []
    for p in _pids():
        st = _stat(p)
        try:
            if st and st[0] != "Z" and (st[2] == pid or (uid is not None and os.stat(f"/proc/{p}").st_uid == uid)):
                out.append(p)
        except OSError:
            pass
    return out


def _kill_all(proc: subprocess.Popen, uid: int | None) -> None:
    """SIGKILL the session and (as root) every process of the uid, until none is left."""
    for _ in range(200):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        left = [p for p in leftovers(proc.pid, uid) if p != os.getpid()]
        if not left:
            break
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)
    proc.wait()


def _run(mode: str, code: str, stdin: str, files: dict, lim: Limits) -> SandboxResult:
    workdir = tempfile.mkdtemp(prefix="posttrain-sbx-")
    uid = secrets.randbelow(UID_RANGE[1] - UID_RANGE[0]) + UID_RANGE[0] if mode == "root" else None
    try:
        for name, text in {**files, "main.py": code, "stdin.txt": stdin}.items():
            with open(os.path.join(workdir, name), "w") as f:
                f.write(text)
        if uid is not None:
            for name in os.listdir(workdir) + [""]:
                os.chown(os.path.join(workdir, name), uid, uid)
        os.chmod(workdir, 0o700)
        nproc = lim.max_procs if uid is not None else _user_tasks(os.getuid()) + lim.max_procs
        cpu = int(lim.timeout_s) + 2
        boot = {"mode": mode, "workdir": workdir, "uid": uid, "python": _python(), "tmpfs_mb": lim.max_file_mb,
                "private_dirs": PRIVATE_DIRS, "hidden_dirs": HIDDEN_DIRS,
                "rlimits": {"RLIMIT_CPU": (cpu, cpu + 1), "RLIMIT_AS": (lim.memory_mb << 20,) * 2,
                            "RLIMIT_FSIZE": (lim.max_file_mb << 20,) * 2, "RLIMIT_CORE": (0, 0),
                            "RLIMIT_NPROC": (nproc, nproc)}}
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        t0 = time.perf_counter()
        with open(os.path.join(workdir, "stdin.txt")) as fin:
            try:     # stage 1 (sandbox_boot.py) sets everything up, then execs the program in place
                proc = subprocess.Popen([_python(), "-I", "-S", "-c", _BOOT, json.dumps(boot)], stdin=fin,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd="/",
                                        start_new_session=True, close_fds=True)
            except OSError as e:
                return SandboxResult("", "", None, False, f"sandbox failed to start ({mode}): {e}", 0.0)
        out, err, timed_out, overflow = _collect(proc, lim)
        _kill_all(proc, uid)
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    return SandboxResult(stdout, stderr, proc.returncode, timed_out,
                         _reason(proc.returncode, timed_out, overflow, stderr, lim), wall, proc.pid, uid)


def _collect(proc: subprocess.Popen, lim: Limits):
    """Read stdout/stderr until both close, the deadline passes or the cap is hit. Once the
    program itself has exited, stray children holding the pipes get a short grace only."""
    sel = selectors.DefaultSelector()
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    for f in bufs:
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    deadline, exited_at = time.monotonic() + lim.timeout_s, None
    timed_out = overflow = False
    while sel.get_map():
        now = time.monotonic()
        if now >= deadline:
            timed_out = True
            break
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > 0.2:
            break
        for key, _ in sel.select(timeout=min(0.05, deadline - now)):
            data = os.read(key.fd, 1 << 16)
            if not data:
                sel.unregister(key.fileobj)
                continue
            bufs[key.fileobj] += data
        if sum(map(len, bufs.values())) > lim.max_output_bytes:
            overflow = True
            break
    sel.close()
    for f in bufs:
        f.close()
    cap = lim.max_output_bytes
    return bytes(bufs[proc.stdout][:cap]), bytes(bufs[proc.stderr][:cap]), timed_out, overflow


def _reason(rc, timed_out: bool, overflow: bool, stderr: str, lim: Limits) -> str | None:
    if rc == 125 and stderr.startswith("sandbox setup failed"):
        return f"sandbox failed to start: {stderr.strip()[len('sandbox setup failed: '):][:200]}"
    if timed_out:
        return f"timed out after {lim.timeout_s:g}s (wall clock)"
    if overflow:
        return f"output exceeded {lim.max_output_bytes} bytes"
    if rc is not None and rc < 0:
        sig = signal.Signals(-rc).name
        why = {"SIGXCPU": " (CPU time limit)", "SIGXFSZ": " (file size limit)"}.get(sig, "")
        return f"killed by {sig}{why}"
    if rc != 0:
        lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        return f"exit code {rc}: {lines[-1][:200] if lines else 'no stderr'}"
    return None
