"""One launch, N processes: torchrun's ranks join the run here (docs/architecture.md §8).

    torchrun --nproc-per-node N -m posttrain rl CONFIG [key=value ...]    N ranks on this machine
    posttrain rl CONFIG scale.gpus=N [key=value ...]                      the same, torchrun started for you
    torchrun --nnodes M --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
             --nproc-per-node N -m posttrain rl CONFIG ...                 M machines (a shared out= directory)

`join(device)` reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) and starts the
default process group once: NCCL with one GPU a rank, cuda:LOCAL_RANK, where the run's device is CUDA;
gloo on the CPU. Every later collective waits at most `TIMEOUT_S` (POSTTRAIN_TIMEOUT_S, 600 s): a rank that
dies makes the others fail there, never hang; torchrun then stops every rank and `relaunch` (scale.gpus)
names the one that died in one line.
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys

import torch
import torch.distributed as dist

from posttrain.errors import UsageError
from posttrain.framework.world import World

TIMEOUT_S = int(os.environ.get("POSTTRAIN_TIMEOUT_S", "600"))


def launched() -> bool:
    """Started by torchrun (or another launcher that sets its variables)."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def env_world() -> World:
    """This process's rank and the run's size as torchrun's environment says, before `join`."""
    if not launched():
        return World()
    return World(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))


def join(device: str = "auto") -> str:
    """Join the run's process group (once per process) and return this rank's device: `device` as given
    in a plain process; cuda:LOCAL_RANK (NCCL) or cpu (gloo) under torchrun."""
    if not launched():
        return device
    local, size = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ["WORLD_SIZE"])
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        visible = torch.cuda.device_count()
        if device not in ("auto", "cuda", f"cuda:{local}"):
            raise UsageError(
                f"device={device} under torchrun: each rank takes one GPU, cuda:LOCAL_RANK; use device=auto or cuda"
            )
        if local >= visible:
            raise UsageError(
                f"LOCAL_RANK={local} but {visible} CUDA GPU(s) are visible: use --nproc-per-node {visible} "
                "(one rank per GPU)"
            )
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    elif device not in ("auto", "cpu"):  # another accelerator (the tests' fakegpu): one device a rank too
        device = f"{torch.device(device).type}:{local}"
    if not dist.is_initialized():
        backend = "nccl" if cuda else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=TIMEOUT_S))
        if dist.get_world_size() != size:
            raise UsageError(f"WORLD_SIZE={size} but the process group has {dist.get_world_size()} ranks")
    return device


def leave() -> None:
    """Close the process group at the end of a run (every rank), after a barrier: a rank that closes its
    gloo pairs while another still reads them can abort that one ("terminate called without an active
    exception")."""
    if launched() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def relaunch(argv: list[str], gpus: int, command: str) -> int:
    """`posttrain STAGE ... scale.gpus=N` outside torchrun: start torchrun with N ranks on this machine
    (`--standalone`) running the same command line, stream its output, and end a failure with one line
    naming the rank that died first (torchrun's error summary says which)."""
    if gpus > 1 and torch.cuda.is_available() and torch.cuda.device_count() < gpus:
        raise UsageError(
            f"scale.gpus={gpus} but {torch.cuda.device_count()} CUDA GPU(s) are visible; use scale.gpus<="
            f"{torch.cuda.device_count()}, or torchrun --nnodes for several machines"
        )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}"]
    cmd += ["-m", "posttrain", *argv]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, bufsize=1)
    tail: list[str] = []
    assert proc.stderr is not None
    for line in proc.stderr:
        sys.stderr.write(line)
        tail = (tail + [line])[-200:]
    code = proc.wait()
    if code == 0:
        return 0
    line = dead_rank("".join(tail), gpus)
    if line is None:  # a rank refused the input (exit 2) and said why in its own line
        return 2
    print(f"posttrain {command}: error: {line}", file=sys.stderr)
    return 1


def dead_rank(text: str, gpus: int) -> str | None:
    """The one line for torchrun's failure summary: the first rank that failed, its exit code or signal
    (None when it exited 2: a usage error, already said in its own line)."""
    m = re.search(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", text, re.S)
    if m is None:
        return f"the run of {gpus} ranks failed (torchrun's output above); --resume RUN_DIR continues from its last checkpoint"
    rank, code = int(m[1]), int(m[2])
    if code == 2:
        return None
    why = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return (
        f"rank {rank} of {gpus} {why}; every other rank was stopped; "
        "--resume RUN_DIR continues from its last checkpoint"
    )
