"""The sandbox's process bookkeeping, from /proc: a run's descendants, what of it is still alive
(its session, its uid, its PID namespace), and the kill loop that ends all of them. sandbox.run_python
calls kill_all after every run and user_tasks to size RLIMIT_NPROC when it runs under our own uid."""

from __future__ import annotations

import os
import signal
import subprocess

from posttrain.tasks import sandbox_cgroup


def user_tasks(uid: int) -> int:
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


def _pidns(pid: int | str) -> int | None:
    try:
        return int(os.readlink(f"/proc/{pid}/ns/pid").split("[")[1].rstrip("]"))
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


def leftovers(session: int, uid: int | None, pidns: int | None) -> list[int]:
    """Live (non-zombie) processes in `session`, of `uid` or in the PID namespace `pidns`."""
    out = []
    for p in _pids():
        st = _stat(p)
        if st is None or st[0] == "Z" or p == os.getpid():
            continue
        try:
            if (
                st[2] == session
                or (uid is not None and os.stat(f"/proc/{p}").st_uid == uid)
                or (pidns is not None and _pidns(p) == pidns)
            ):
                out.append(p)
        except OSError:
            pass
    return out


def _run_pidns(pid: int) -> int | None:
    """The PID namespace bwrap made (its child is that namespace's init), if it is still up."""
    ours = _pidns("self")
    for kid in descendants(pid):
        ns = _pidns(kid)
        if ns is not None and ns != ours:
            return ns
    return None


def kill_all(proc: subprocess.Popen, uid: int | None, cg) -> int | None:
    """SIGKILL the session, the PID namespace, (as root) every process of the uid and the
    cgroup, until none is left; returns the namespace's inode."""
    pidns = _run_pidns(proc.pid)

    def alive() -> list[int]:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap's death kills its namespace (--die-with-parent)
        except (ProcessLookupError, PermissionError):
            pass
        return leftovers(proc.pid, uid, pidns) + (cg.procs() if cg else [])

    sandbox_cgroup.kill_until_gone(alive)
    proc.wait()
    return pidns
