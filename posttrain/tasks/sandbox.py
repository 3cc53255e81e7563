"""A sandbox for untrusted Python (candidate programs, tool calls), built on bubblewrap.

    run_python(code, stdin="", timeout_s=5.0, memory_mb=256) -> SandboxResult

The verifier is the attack surface, so every limit is enforced by the kernel, not by the
program's good will. A run is `python -I -S main.py` (isolated mode, no site-packages:
the standard library only) inside bubblewrap (Debian `bubblewrap`; the layout and the
seccomp filter are in sandbox_bwrap.py):

  namespaces    new PID, IPC, network, mount, UTS, cgroup and user namespaces: it sees only
                its own processes, System V / POSIX IPC objects die with it, it has no
                network, it cannot create user namespaces of its own
  filesystem    read-only system paths; our package, its install dir and our checkout are
                hidden (wheel or checkout alike); a private tmpfs work dir (cwd, HOME: the
                given files), /tmp, /var/tmp and /dev/shm of `max_file_mb` each
  privileges    as root, a fresh unprivileged uid per run (the process cap counts only its
                own processes; it can signal nothing of ours); no capabilities; no_new_privs;
                seccomp: no kernel keyrings, no socket but AF_UNIX, no ptrace/bpf/io_uring
  environment   cleared: PATH, LANG, HOME, TMPDIR (and PWD) only: no secret of the parent leaks
  time          a wall-clock deadline, and RLIMIT_CPU as a second wall
  memory        RLIMIT_AS per process, plus a memory cgroup for all of them together
                (socket buffers, tmpfs and memfd pages included) where the kernel lets us
                make one (sandbox_cgroup.py); without it sockets are refused (their buffers
                would escape every rlimit), and memfd / System V memory is bounded only
                per file (RLIMIT_FSIZE) x descriptors (RLIMIT_NOFILE) x processes: the
                result's `memory_cap` says which; captured output capped
  lifetime      its own session; --die-with-parent: if the process that called run_python
                dies (a verifier pool worker killed at its deadline), the kernel kills the
                whole PID namespace; at the end we SIGKILL it and sweep its uid, namespace
                and cgroup until nothing is left

Without bwrap on PATH, `run_python` refuses (UsageError naming the package) unless the
caller opts into the unsafe local mode (`unsafe_local=True`, the code task's
`task.unsafe_local_sandbox`): rlimits, a fresh uid as root, a temp dir and a cleared
environment only; the program can read our files and reach the network.
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

from posttrain.errors import UsageError
from posttrain.tasks import sandbox_bwrap, sandbox_cgroup, sandbox_procs
from posttrain.tasks.sandbox_procs import descendants as descendants  # re-exported: pool and the tests use it

UID_RANGE = (1_000_000, 2_000_000_000)  # fresh uids: no user owns a file there
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_boot.py")) as _f:
    _BOOT = _f.read()
NO_BWRAP = (
    "running untrusted code needs bubblewrap: install the Debian package `bubblewrap` "
    "(apt-get install bubblewrap), or set task.unsafe_local_sandbox=true to run it unisolated"
)


@dataclass
class Limits:
    timeout_s: float = 5.0  # wall clock for the whole run
    memory_mb: int = 256  # address space per process (RLIMIT_AS); all processes together (cgroup)
    max_procs: int = 16  # processes/threads of the sandbox uid (RLIMIT_NPROC)
    max_open_files: int = 32  # descriptors per process (RLIMIT_NOFILE); bounds socket buffers too
    max_file_mb: int = 16  # largest file it may write (RLIMIT_FSIZE), and each private tmpfs
    max_output_bytes: int = 1 << 16  # stdout + stderr captured; more kills the run


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # negative = killed by that signal
    timed_out: bool
    reason: str | None  # None = ran to exit code 0; else why not (one line)
    wall_s: float
    pid: int = 0  # the first process (bwrap; the program in the unsafe mode), a session leader
    uid: int | None = None  # the uid it ran as (fresh per run as root)
    pidns: int | None = None  # inode of its PID namespace, while it ran: every process it started
    memory_cap: str = ""  # "cgroup v1" | "cgroup v2" | "rlimit only (why no cgroup)"

    @property
    def ok(self) -> bool:
        return self.reason is None


def run_python(
    code: str,
    stdin: str = "",
    timeout_s: float = 5.0,
    memory_mb: int = 256,
    files: dict[str, str] | None = None,
    limits: Limits | None = None,
    unsafe_local: bool = False,
) -> SandboxResult:
    """Run `code` as a script in a fresh sandbox; `files` are written next to it first."""
    lim = limits or Limits(timeout_s=timeout_s, memory_mb=memory_mb)
    return _run(backend(unsafe_local), code, stdin, files or {}, lim)


def backend(unsafe_local: bool = False) -> str:
    """ "bwrap" where bubblewrap works; "unsafe-local" where it does not and the caller opted
    in; otherwise a UsageError (one line) that names the package."""
    bwrap = shutil.which("bwrap")
    why = _bwrap_fails(bwrap) if bwrap else NO_BWRAP
    if why is None:
        return "bwrap"
    if unsafe_local:
        return "unsafe-local"
    raise UsageError(why)


def isolation(unsafe_local: bool = False) -> dict:
    """What is in force here; the network entry is "netns" only after a connect() from inside
    was seen to fail."""
    b = backend(unsafe_local)
    boxed = b == "bwrap"
    return {
        "backend": b,
        "user": "uid" if os.geteuid() == 0 else "same",
        "network": "netns" if boxed and network_blocked() else "none",
        "filesystem": "private" if boxed else "none",
        "pid": "pidns" if boxed else "session",
        "seccomp": os.uname().machine if boxed and sandbox_bwrap.seccomp_filter() else "none",
        "memory": _memory_cap(),
        "python": _python(),
    }


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


_SIGNALS = {s.value for s in signal.Signals}
_CGROUP_OFF: dict[str, str] = {}  # why the memory cgroup was given up after a failed start


def _memory_cap() -> str:
    parent, version, why = sandbox_cgroup.probe()
    why = _CGROUP_OFF.get("why", why)
    return f"cgroup {version}" if parent and not _CGROUP_OFF else f"rlimit only ({why})"


@functools.lru_cache(maxsize=2)
def _bwrap_fails(bwrap: str) -> str | None:
    """None when a trivial program runs under bwrap (with the memory cgroup, else without it),
    or why it does not."""
    r = _run("bwrap", "print('ok')", "", {}, Limits(timeout_s=30.0))
    if r.stdout.strip() != "ok" and r.memory_cap.startswith("cgroup"):
        _CGROUP_OFF["why"] = f"a run in it failed: {r.reason}"
        r = _run("bwrap", "print('ok')", "", {}, Limits(timeout_s=30.0))
    if r.stdout.strip() == "ok":
        return None
    return f"bubblewrap ({bwrap}) cannot create a sandbox here: {r.reason}"


def leftovers(r: SandboxResult) -> list[int]:
    """Live (non-zombie) processes of a run: in its session, of its uid or in its PID namespace."""
    return sandbox_procs.leftovers(r.pid, r.uid, r.pidns)


def _memfd(data: str | bytes) -> int:
    fd = os.memfd_create("posttrain-sandbox")
    os.write(fd, data.encode() if isinstance(data, str) else data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _run(mode: str, code: str, stdin: str, files: dict, lim: Limits) -> SandboxResult:
    contents = {**files, "main.py": code}
    if any(os.path.basename(n) != n or n.startswith(".") for n in contents):
        raise ValueError(f"sandbox file names must be plain names: {sorted(contents)}")
    uid = secrets.randbelow(UID_RANGE[1] - UID_RANGE[0]) + UID_RANGE[0] if os.geteuid() == 0 else None
    parent, version, _ = sandbox_cgroup.probe()
    cg = sandbox_cgroup.Cgroup(parent, version, lim.memory_mb << 20) if parent and not _CGROUP_OFF else None
    python, fds, workdir = _python(), [], None
    try:
        if mode == "bwrap":
            flt = sandbox_bwrap.seccomp_filter(unix_sockets=cg is not None)
            fds = [_memfd(t) for t in contents.values()] + ([_memfd(flt)] if flt else [])
            argv = sandbox_bwrap.argv(
                shutil.which("bwrap") or "bwrap",
                python,
                dict(zip(contents, fds)),
                lim.max_file_mb,
                fds[-1] if flt else None,
            )
            cwd, env = "/", {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        else:
            workdir = cwd = tempfile.mkdtemp(prefix="posttrain-sbx-")
            for name, text in contents.items():
                with open(os.path.join(workdir, name), "w") as f:
                    f.write(text)
            if uid is not None:
                for name in os.listdir(workdir) + [""]:
                    os.chown(os.path.join(workdir, name), uid, uid)
            os.chmod(workdir, 0o700)
            argv = [python, "-I", "-S", "main.py"]
            env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        nproc = lim.max_procs if uid is not None else sandbox_procs.user_tasks(os.getuid()) + lim.max_procs
        cpu = int(lim.timeout_s) + 2
        boot = {
            "cgroup": cg.path if cg else None,
            "cwd": cwd,
            "uid": uid,
            "argv": argv,
            "rlimits": {
                "RLIMIT_CPU": (cpu, cpu + 1),
                "RLIMIT_AS": (lim.memory_mb << 20,) * 2,
                "RLIMIT_FSIZE": (lim.max_file_mb << 20,) * 2,
                "RLIMIT_CORE": (0, 0),
                "RLIMIT_NPROC": (nproc, nproc),
                "RLIMIT_NOFILE": (lim.max_open_files,) * 2,
            },
        }
        fds.append(_memfd(stdin))
        t0 = time.perf_counter()
        try:  # stage 1 (sandbox_boot.py) joins the cgroup, sets the limits, drops the uid, execs
            proc = subprocess.Popen(
                [python, "-I", "-S", "-c", _BOOT, json.dumps(boot)],
                stdin=fds[-1],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd="/",
                start_new_session=True,
                close_fds=True,
                pass_fds=fds[:-1],
            )
        except OSError as e:
            return SandboxResult("", "", None, False, f"sandbox failed to start ({mode}): {e}", 0.0)
        for fd in fds:
            os.close(fd)
        fds = []
        out, err, timed_out, overflow = _collect(proc, lim)
        pidns = sandbox_procs.kill_all(proc, uid, cg)
        wall = time.perf_counter() - t0
        oom = cg.oom_kills() if cg else 0
    finally:
        for fd in fds:
            os.close(fd)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        if cg:
            cg.remove()
    rc = proc.returncode
    if mode == "bwrap" and rc is not None and rc - 128 in _SIGNALS:
        rc = -(rc - 128)  # bwrap reports a signal death as 128 + signal, like a shell
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    cap = f"cgroup {cg.version}" if cg else _memory_cap()
    return SandboxResult(
        stdout,
        stderr,
        rc,
        timed_out,
        _reason(rc, timed_out, overflow, stderr, lim, oom),
        wall,
        proc.pid,
        uid,
        pidns,
        cap,
    )


def _collect(proc: subprocess.Popen, lim: Limits):
    """Read stdout/stderr until both close, the deadline passes or the cap is hit. Once the
    first process itself has exited, stray children holding the pipes get a short grace only."""
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


def _reason(rc, timed_out: bool, overflow: bool, stderr: str, lim: Limits, oom_kills: int) -> str | None:
    if rc == 125 and stderr.startswith("sandbox setup failed"):
        return f"sandbox failed to start: {stderr.strip()[len('sandbox setup failed: ') :][:200]}"
    if rc == 1 and stderr.startswith("bwrap: "):
        return f"sandbox failed to start: {stderr.strip().splitlines()[0][:200]}"
    if timed_out:
        return f"timed out after {lim.timeout_s:g}s (wall clock)"
    if overflow:
        return f"output exceeded {lim.max_output_bytes} bytes"
    if rc is not None and rc < 0:
        sig = signal.Signals(-rc).name if -rc in _SIGNALS else f"signal {-rc}"
        why = {"SIGXCPU": " (CPU time limit)", "SIGXFSZ": " (file size limit)"}.get(sig, "")
        if sig == "SIGKILL" and oom_kills:
            why = f" (memory limit: {lim.memory_mb} MB for all its processes, cgroup)"
        return f"killed by {sig}{why}"
    if rc != 0:
        lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        return f"exit code {rc}: {lines[-1][:200] if lines else 'no stderr'}"
    return None
