"""The sandbox's first stage, run as `python -I -S -c <this file's text> <json>`: enter the
namespaces, set the limits, drop to the sandbox uid, then exec the program in place.

Why a fresh process and not a `preexec_fn`: the fork of a process whose thread pools are
started (torch's OpenMP) comes up with a second thread, and then unshare(CLONE_NEWUSER)
fails with EINVAL (and Python warns that preexec_fn is unsafe with threads anyway). An
exec'd interpreter is single-threaded. Standard library only: no posttrain import here.
Exit code 125 with "sandbox setup failed: ..." on stderr means the setup itself failed.
"""

import ctypes
import json
import os
import resource
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 1, 2, 4, 16384, 1 << 18


def boot(cfg: dict) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]

    def check(rc, what):
        if rc != 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

    def write(path, text):
        with open(path, "w") as f:
            f.write(text)

    mode, workdir = cfg["mode"], cfg["workdir"]
    if mode != "plain":
        uid, gid = os.getuid(), os.getgid()
        check(libc.unshare(CLONE_NEWNET | CLONE_NEWNS | (CLONE_NEWUSER if mode == "userns" else 0)), "unshare")
        if mode == "userns":                      # root inside the namespace, our own uid outside
            write("/proc/self/setgroups", "deny")
            write("/proc/self/uid_map", f"0 {uid} 1")
            write("/proc/self/gid_map", f"0 {gid} 1")
        check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
        files = {}                                # the work dir moves onto a tmpfs of its own: disk use is capped
        for name in os.listdir(workdir):
            with open(os.path.join(workdir, name), "rb") as f:
                files[name] = f.read()
        tmpfs = f"size={cfg['tmpfs_mb']}m,mode=1777".encode()
        for d in cfg["private_dirs"]:
            if os.path.isdir(d) and not os.path.islink(d):
                check(libc.mount(b"tmpfs", d.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, tmpfs), f"mount tmpfs {d}")
        for d in cfg["hidden_dirs"]:
            if not os.path.isdir(d):              # under a private dir just mounted: hidden already
                continue
            check(libc.mount(b"tmpfs", d.encode(), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, b"size=4k"), f"hide {d}")
        os.makedirs(workdir, exist_ok=True)
        owner = "" if cfg["uid"] is None else f",uid={cfg['uid']},gid={cfg['uid']}"
        opts = f"size={cfg['tmpfs_mb']}m,mode=0700{owner}".encode()
        check(libc.mount(b"tmpfs", workdir.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts), "mount tmpfs work dir")
        for name, data in files.items():
            path = os.path.join(workdir, name)
            with open(path, "wb") as f:
                f.write(data)
            if cfg["uid"] is not None:
                os.chown(path, cfg["uid"], cfg["uid"])
    os.chdir(workdir)
    for name, value in cfg["rlimits"].items():
        resource.setrlimit(getattr(resource, name), tuple(value))
    if cfg["uid"] is not None:                    # last: after this no privilege is left
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
    os.execv(cfg["python"], [cfg["python"], "-I", "-S", "main.py"])


if __name__ == "__main__":
    try:
        boot(json.loads(sys.argv[1]))
    except Exception as e:
        sys.stderr.write(f"sandbox setup failed: {type(e).__name__}: {e}\n")
        sys.exit(125)
