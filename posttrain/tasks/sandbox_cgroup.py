"""The sandbox's memory cgroup: one per run, created under the cgroup this process is in.

RLIMIT_AS caps each process's address space, but not the sum over a program's processes,
nor the kernel memory it makes the kernel hold (tmpfs pages, pipe buffers, socket buffers
on cgroup v1 with TCP accounting). A memory cgroup caps all of that together, and lists
every process of the run for the final sweep, whatever session or namespace it moved to.

Where the kernel lets us make one (root on cgroup v1; on v2 a delegated subtree with the
memory controller), every run gets `posttrain-sbx-<creator pid>-<random>` under our own
cgroup, with the limit set before the program joins it, and it is removed after the run.
Elsewhere `probe()` says why not and runs fall back to rlimits alone; the run's result
names which cap was in force (`SandboxResult.memory_cap`). A worker SIGKILLed in the middle
of a run leaves an empty cgroup behind: the next run of any process removes it.
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import time

PREFIX = "posttrain-sbx-"


def _own_cgroups() -> tuple[dict[str, str], str | None]:
    """(v1 controller -> path, v2 path) of this process, from /proc/self/cgroup."""
    v1, v2 = {}, None
    with open("/proc/self/cgroup") as f:
        for line in f:
            hier, controllers, path = line.rstrip("\n").split(":", 2)
            if hier == "0" and controllers == "":
                v2 = path
            for c in controllers.split(","):
                v1[c] = path
    return v1, v2


def _mounts() -> list[tuple[str, str, str, set]]:
    """(root, mount point, fs type, super options) of every cgroup mount."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            fields, rfields = left.split(), right.split()
            if rfields[0] in ("cgroup", "cgroup2"):
                out.append((fields[3], fields[4], rfields[0], set(rfields[2].split(","))))
    return out


def _join(mount_root: str, point: str, path: str) -> str | None:
    if not path.startswith(mount_root):
        return None
    return os.path.join(point, path[len(mount_root) :].lstrip("/"))


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


@functools.lru_cache(maxsize=1)
def probe() -> tuple[str | None, str, str]:
    """(directory our runs' cgroups go under, "v1" | "v2", "") or (None, "", why not)."""
    try:
        v1, v2 = _own_cgroups()
        mounts = _mounts()
    except OSError as e:
        return None, "", f"cannot read /proc/self/cgroup: {e}"
    why = "no memory cgroup controller is mounted"
    for root, point, fs, opts in mounts:
        if fs == "cgroup2" and v2 is not None:
            parent = _join(root, point, v2)
            try:
                if parent is None or "memory" not in _read(os.path.join(parent, "cgroup.controllers")).split():
                    continue
                if "memory" not in _read(os.path.join(parent, "cgroup.subtree_control")).split():
                    _write(os.path.join(parent, "cgroup.subtree_control"), "+memory")
                return _try(parent, "v2")
            except OSError as e:
                why = f"cgroup v2 memory controller not delegated to {parent}: {e.strerror}"
        elif fs == "cgroup" and "memory" in opts and "memory" in v1:
            parent = _join(root, point, v1["memory"])
            if parent is not None:
                got = _try(parent, "v1")
                if got[0]:
                    return got
                why = got[2]
    return None, "", why


def _try(parent: str, version: str) -> tuple[str | None, str, str]:
    """Create and remove one cgroup with a limit: what every run will do."""
    path = os.path.join(parent, f"{PREFIX}{os.getpid()}-probe-{secrets.token_hex(4)}")
    try:
        os.mkdir(path)
    except OSError as e:
        return None, "", f"cannot create a cgroup under {parent}: {e.strerror}"
    try:
        _write(os.path.join(path, "memory.max" if version == "v2" else "memory.limit_in_bytes"), str(64 << 20))
        return parent, version, ""
    except OSError as e:
        return None, "", f"cannot set a memory limit in {path}: {e.strerror}"
    finally:
        os.rmdir(path)


class Cgroup:
    """One run's memory cgroup: `limit_bytes` for all its processes together."""

    def __init__(self, parent: str, version: str, limit_bytes: int):
        _remove_stale(parent)
        self.version = version
        self.path = os.path.join(parent, f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}")
        os.mkdir(self.path)
        try:
            if version == "v2":
                _write(self._f("memory.max"), str(limit_bytes))
                for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                    _try_write(self._f(name), value)
            else:
                _write(self._f("memory.limit_in_bytes"), str(limit_bytes))
                # swap would let it hold more than the limit; TCP buffers are charged only when limited
                for name in ("memory.memsw.limit_in_bytes", "memory.kmem.tcp.limit_in_bytes"):
                    _try_write(self._f(name), str(limit_bytes))
        except OSError:
            self.remove()
            raise

    def _f(self, name: str) -> str:
        return os.path.join(self.path, name)

    def procs(self) -> list[int]:
        return _procs(self.path)

    def oom_kills(self) -> int:
        """Processes the kernel killed for the limit (0 where the counter is not kept)."""
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        try:
            with open(self._f(name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def kill(self) -> None:
        """SIGKILL every process in the cgroup until none is left."""
        kill(self.path)

    def remove(self) -> None:
        remove(self.path)


def _try_write(path: str, text: str) -> None:
    try:
        _write(path, text)
    except OSError:  # an optional knob this kernel lacks (no swap accounting, say)
        pass


def kill_until_gone(find) -> None:
    """SIGKILL the processes `find()` lists until it lists none (a fork racing the kill is
    caught on the next round); gives up after ~2 s."""
    for _ in range(400):
        pids = find()
        if not pids:
            return
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)


def _procs(path: str) -> list[int]:
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def kill(path: str) -> None:
    kill_until_gone(lambda: _procs(path))


def remove(path: str) -> None:
    """Kill what is left in the cgroup, then delete it (a dying process keeps it busy a moment)."""
    for _ in range(200):
        kill(path)
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.005)


def _remove_stale(parent: str) -> None:
    """Remove the cgroups of runs whose creating process is gone (killed mid-run)."""
    try:
        names = [n for n in os.listdir(parent) if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        try:
            creator = int(name[len(PREFIX) :].split("-")[0])
            os.kill(creator, 0)
        except ProcessLookupError:
            remove(os.path.join(parent, name))
        except (ValueError, PermissionError):
            continue
