"""The sandbox's first stage, run as `python -I -S -c <this file's text> <json>`: join the
run's memory cgroup, set the rlimits, drop to the sandbox uid, then exec the command in
place (bubblewrap, or the program itself in the unsafe local mode).

Why a fresh process and not a `preexec_fn`: the fork of a process whose thread pools are
started (torch's OpenMP) is unsafe to run Python in before exec (Python warns that
preexec_fn is unsafe with threads); an exec'd interpreter is single-threaded. Standard
library only: no posttrain import here. Exit code 125 with "sandbox setup failed: ..." on
stderr means the setup itself failed.
"""

import json
import os
import resource
import sys


def boot(cfg: dict) -> None:
    if cfg["cgroup"]:  # first, so that every process it starts is in it
        with open(os.path.join(cfg["cgroup"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    os.chdir(cfg["cwd"])
    for name, value in cfg["rlimits"].items():
        resource.setrlimit(getattr(resource, name), tuple(value))
    if cfg["uid"] is not None:  # last: after this no privilege is left
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
    os.execv(cfg["argv"][0], cfg["argv"])


if __name__ == "__main__":
    try:
        boot(json.loads(sys.argv[1]))
    except Exception as e:
        sys.stderr.write(f"sandbox setup failed: {type(e).__name__}: {e}\n")
        sys.exit(125)
