"""The bubblewrap command line of one sandbox run: what the program sees, and what it may call.

The filesystem is built from nothing (bwrap's root is an empty tmpfs, then made read-only):

  read-only     /usr, /bin, /sbin, /lib*, /etc/alternatives, /etc/ld.so.cache (what a
                Python interpreter and its shared libraries need), and the interpreter's
                prefixes when they lie elsewhere (a pyenv build, a user's own install)
  hidden        under those binds, an empty read-only tmpfs over every site-packages /
                dist-packages of the interpreter, over our package and the directory it is
                installed in, and over our source checkout: neither a wheel install nor a
                checkout lets a candidate read the reference solutions (tasks/code.py)
  private       /sandbox (cwd, HOME: the given files), /tmp, /var/tmp, /dev/shm: tmpfs of
                `max_file_mb` each; /dev holds only null, zero, random, urandom, tty, pts
  namespaces    new user (no capabilities, nested user namespaces disabled), PID (a fresh
                /proc shows only the run's processes), IPC (System V objects and POSIX
                message queues die with the run), network (loopback only), UTS, cgroup
  process       its own session (no TIOCSTI into our terminal), no_new_privs, and killed
                with SIGKILL when its parent dies (--die-with-parent)

A seccomp filter (classic BPF written below; x86_64 and aarch64) refuses the calls that
namespaces do not cover: the kernel keyrings (add_key, request_key, keyctl: keys are not
namespaced and outlive the run), sockets of any family but AF_UNIX (no network and no
TCP buffers to pin; no socket at all where no memory cgroup charges their buffers), ptrace, perf_event_open, bpf, userfaultfd and io_uring; a syscall of
another ABI (x32, i386) kills the process.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import struct
import subprocess
import sys

WORKDIR = "/sandbox"
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/alternatives", "/etc/ld.so.cache")
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../posttrain
_CHECKOUT = os.path.dirname(PACKAGE)
CHECKOUT = _CHECKOUT if os.path.exists(os.path.join(_CHECKOUT, "pyproject.toml")) else None


@functools.lru_cache(maxsize=4)
def interpreter(python: str) -> dict:
    """The sandbox interpreter's prefixes, standard library and site directories (it is asked:
    Debian's python3 adds dist-packages that sysconfig alone does not name)."""
    code = (
        "import json, site, sys, sysconfig\np = sysconfig.get_paths()\n"
        "print(json.dumps({'prefixes': [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix],"
        " 'stdlib': [p['stdlib'], p['platstdlib']],"
        " 'sites': site.getsitepackages() + [p['purelib'], p['platlib']]}))"
    )
    out = subprocess.run([python, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def _under(path: str, roots) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def binds(python: str) -> tuple[list[str], list[str]]:
    """(read-only roots, hidden directories under them), as real paths."""
    info = interpreter(python)
    roots = [p for p in SYSTEM_PATHS if os.path.lexists(p)]
    real_roots = [os.path.realpath(p) for p in roots]
    for prefix in map(os.path.realpath, info["prefixes"] + [os.path.dirname(os.path.dirname(python))]):
        if prefix != "/" and os.path.isdir(prefix) and not _under(prefix, real_roots):
            roots.append(prefix)
            real_roots.append(prefix)
    stdlib = [os.path.realpath(p) for p in info["stdlib"]] + [os.path.realpath(python)]
    hidden = set(map(os.path.realpath, info["sites"] + [PACKAGE] + ([CHECKOUT] if CHECKOUT else [])))
    installed_in = os.path.realpath(os.path.dirname(PACKAGE))
    if not any(_under(s, [installed_in]) for s in stdlib):  # never hide the interpreter itself
        hidden.add(installed_in)
    hidden = {
        h for h in hidden if os.path.isdir(h) and _under(h, real_roots) and not any(_under(s, [h]) for s in stdlib)
    }
    return roots, sorted(h for h in hidden if not _under(os.path.dirname(h), hidden))  # outermost only


def argv(bwrap: str, python: str, files: dict[str, int], tmpfs_mb: int, seccomp_fd: int | None) -> list[str]:
    """The command that runs `python -I -S main.py` in a fresh sandbox; `files` maps a file
    name in the work dir to an open descriptor bwrap copies it from."""
    a = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--mqueue",
        "/dev/mqueue",
    ]
    size = str(tmpfs_mb << 20)
    for d in PRIVATE_DIRS:  # first: a prefix under /tmp is bound inside it
        a += ["--perms", "1777", "--size", size, "--tmpfs", d]
    roots, hidden = binds(python)
    for p in roots:
        if os.path.islink(p) and p in SYSTEM_PATHS:  # merged /usr: /lib -> usr/lib
            a += ["--symlink", os.readlink(p), p]
        else:
            a += ["--ro-bind", p, p]
    for h in hidden:
        a += ["--perms", "0555", "--size", "4096", "--tmpfs", h, "--remount-ro", h]
    a += ["--perms", "0700", "--size", size, "--tmpfs", WORKDIR]
    for name, fd in files.items():
        a += ["--perms", "0600", "--file", str(fd), f"{WORKDIR}/{name}"]
    a += ["--remount-ro", "/dev", "--remount-ro", "/"]
    if seccomp_fd is not None:
        a += ["--seccomp", str(seccomp_fd)]
    a += [
        "--chdir",
        WORKDIR,
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--setenv",
        "HOME",
        WORKDIR,
        "--setenv",
        "TMPDIR",
        "/tmp",
        "--unsetenv",
        "PWD",
    ]
    return a + ["--", python, "-I", "-S", "main.py"]


# --- the seccomp filter ---

# AUDIT_ARCH value and syscall numbers (asm/unistd_64.h; asm-generic/unistd.h for aarch64)
SYSCALLS = {
    "x86_64": (
        0xC000003E,
        {
            "socket": 41,
            "socketpair": 53,
            "ptrace": 101,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "perf_event_open": 298,
            "bpf": 321,
            "userfaultfd": 323,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "socket": 198,
            "socketpair": 199,
            "ptrace": 117,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
            "perf_event_open": 241,
            "bpf": 280,
            "userfaultfd": 282,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
        },
    ),
}
DENIED = (
    "add_key",
    "request_key",
    "keyctl",
    "ptrace",
    "perf_event_open",
    "bpf",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
)
_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
_ALLOW, _KILL, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
EPERM, ENOSYS, EAFNOSUPPORT, AF_UNIX, X32_BIT = 1, 38, 97, 1, 0x40000000


def seccomp_filter(unix_sockets: bool = True, machine: str | None = None) -> bytes | None:
    """The filter as bwrap's --seccomp wants it (struct sock_filter[]); None on other machines.
    `unix_sockets=False` refuses every socket: without a memory cgroup nothing else bounds
    their kernel buffers (net.core.wmem_max, up to 4 MiB a socket, times every descriptor)."""
    machine = machine or platform.machine()
    if machine not in SYSCALLS:
        return None
    arch, nr = SYSCALLS[machine]
    arg0 = 16 if sys.byteorder == "little" else 20  # low word of seccomp_data.args[0]
    prog = [(_LD, 0, 0, 4), (_JEQ, 1, 0, arch), (_RET, 0, 0, _KILL), (_LD, 0, 0, 0)]
    if machine == "x86_64":  # x32 numbers carry bit 30
        prog += [(_JGE, 0, 1, X32_BIT), (_RET, 0, 0, _ERRNO | ENOSYS)]
    for name in DENIED:
        prog += [(_JEQ, 0, 1, nr[name]), (_RET, 0, 0, _ERRNO | EPERM)]
    if not unix_sockets:
        for name in ("socket", "socketpair"):
            prog += [(_JEQ, 0, 1, nr[name]), (_RET, 0, 0, _ERRNO | EAFNOSUPPORT)]
    else:  # socket(domain, ...): AF_UNIX only
        prog += [
            (_JEQ, 0, 4, nr["socket"]),
            (_LD, 0, 0, arg0),
            (_JEQ, 0, 1, AF_UNIX),
            (_RET, 0, 0, _ALLOW),
            (_RET, 0, 0, _ERRNO | EAFNOSUPPORT),
        ]
    prog.append((_RET, 0, 0, _ALLOW))
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)
