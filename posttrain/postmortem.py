"""A run that dies says where: the step, what it was doing (which verifier it had called), and the
Python traceback of a fatal signal, on stderr and in RUN_DIR/crash.log (issue 30).

A verifier scored in the training process (`verifier.workers=0`) can take the process down with
it: a segfault in a C extension, `os._exit`, the kernel's OOM killer. Python then runs nothing of
ours (no `finally`, no `atexit`), so the word must come from outside. Each run starts a watcher,
a small Python process (no torch) holding the read end of a pipe. The run writes a line to the
pipe when a step starts (`step`) and around every call into code it did not write (`doing`:
"scoring 128 responses in-process with rewards.py:correct"); `faulthandler` writes its traceback
of a fatal signal (SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL) into the same pipe. A run that ends as
Python ends (normally, or by an exception, which Python prints itself) says bye and the watcher
leaves in silence; a pipe that closes without it means the process died, and the watcher writes
what it knew. A line is one write(2) into a pipe: microseconds.

Forked children (verifier pool workers) close their copy of the pipe at fork and run without
faulthandler: their deaths are the pool's to count (tasks/pool.py), and the pipe must close
when the run dies, not when its last worker does.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import subprocess
import sys
from contextlib import contextmanager

_MARK = "\x1e"  # starts each of our lines; faulthandler's own text never does
_WATCHER = r"""
import os, sys, time
run_dir = stage = where = doing = ""
dump = []
for raw in sys.stdin.buffer:
    line = raw.decode("utf-8", "replace")
    if not line.startswith("\x1e"):
        dump.append(line)  # faulthandler's traceback
        continue
    tag, _, text = line[1:].rstrip("\n").partition("\t")
    if tag == "B":
        sys.exit(0)
    if tag == "R":
        run_dir, _, stage = text.partition("\t")
        where = doing = ""
        dump = []
    elif tag == "S":
        where = text
    elif tag == "D":
        doing = text
msg = f"posttrain: the {stage} run died" + (f" during {where}" if where else "") + (f", {doing}" if doing else "")
if not dump:
    msg += (" (no Python traceback: it exited from native or verifier code, e.g. os._exit, or was killed by a "
            "signal Python cannot catch, e.g. SIGKILL from the out-of-memory killer)")
root = os.path.join(run_dir, "checkpoints")
done = sorted(d for d in (os.listdir(root) if os.path.isdir(root) else []) if d.startswith("step_") and not d.endswith(".tmp"))
tail = (f"last checkpoint: {os.path.join(root, done[-1])}; continue with posttrain {stage} ... --resume {run_dir}"
        if done else "no checkpoint was written yet")
text = msg + "\n" + "".join(dump) + tail + "\n"
try:
    with open(os.path.join(run_dir, "crash.log"), "a") as f:
        f.write(time.strftime("%Y-%m-%d %H:%M:%S ") + text)
    text += f"(also in {os.path.join(run_dir, 'crash.log')})\n"
except OSError:
    pass
sys.stderr.write(text)
"""

_fd: int | None = None  # the pipe's write end, while a watcher runs
_proc: subprocess.Popen | None = None
_doing = ""
_faulthandler_before = False  # was faulthandler on (e.g. pytest's) before ours: restored after


def watch(run_dir, stage: str) -> None:
    """Start this process's watcher (or aim the running one) at `run_dir`, and send faulthandler's
    traceback of a fatal signal to it."""
    global _fd, _proc, _faulthandler_before
    if _fd is None:
        r, w = os.pipe()
        try:
            _proc = subprocess.Popen(
                [sys.executable, "-S", "-c", _WATCHER],
                stdin=r,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in the terminal is the run's, not the watcher's
            )
        except OSError:  # no watcher (no processes left?): the run goes on without one
            os.close(w)
            return
        finally:
            os.close(r)
        _fd, _faulthandler_before = w, faulthandler.is_enabled()
    _send("R", f"{run_dir}\t{stage}")
    faulthandler.enable(file=_fd, all_threads=True)


def done() -> None:
    """The run ends as Python ends: the watcher leaves without a word."""
    global _fd, _proc
    if _fd is None:
        return
    _send("B", "")
    _release()
    if _proc is not None:
        try:
            _proc.wait(5)
        except subprocess.TimeoutExpired:
            _proc.kill()
        _proc = None


def step(text: str) -> None:
    """Where the run is (e.g. "step 12 of 100"), named if it dies."""
    _send("S", text)


@contextmanager
def doing(text: str):
    """Around a call into code the run did not write: named if the process dies inside it."""
    global _doing
    before, _doing = _doing, text
    _send("D", text)
    try:
        yield
    finally:
        _doing = before
        _send("D", before)


def _send(tag: str, text: str) -> None:
    if _fd is None:
        return
    line = f"{_MARK}{tag}\t{text.replace(chr(10), ' ')[:2000]}\n".encode()  # one write under PIPE_BUF: atomic
    try:
        os.write(_fd, line)
    except OSError:  # the watcher is gone: go on without it
        _release()


def _release() -> None:
    global _fd
    fd, _fd = _fd, None
    if fd is None:
        return
    faulthandler.disable()
    if _faulthandler_before and sys.__stderr__ is not None:  # e.g. pytest's, or PYTHONFAULTHANDLER
        faulthandler.enable(file=sys.__stderr__, all_threads=True)
    os.close(fd)


def _forget_in_child() -> None:
    global _fd, _proc
    if _fd is not None:
        faulthandler.disable()
        os.close(_fd)
        _fd, _proc = None, None


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(done)
