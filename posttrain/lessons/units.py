"""Units the widgets print memory in: binary, everywhere (KiB = 2^10, MiB = 2^20, GiB = 2^30,
TiB = 2^40 bytes), so a page never shows one size in GB and another in GiB.

posttrain's sizing/memory.py and the course count decimal GB (1e9); the widgets take its bytes and
print them here. Two H100 capacities, kept apart on purpose:
  H100_BYTES     the planner's budget per card, memory.GPUS["h100"] = 80e9 bytes = 74.5 GiB;
  H100_REPORTED  what nvidia-smi reports for an "H100 80GB HBM3": 81,559 MiB = 79.6 GiB
                 (modal-labs/modal-client PR #2797, NVIDIA/nccl issue #1264).
The 5.1 GiB between them is the planner's margin for the CUDA context, NCCL buffers and the
caching allocator's fragmentation (lessons 20 and 22 say so, with a measured example).
"""

from __future__ import annotations

from posttrain.sizing import memory

GIB = 2**30
H100_BYTES = memory.GPUS["h100"][1]
H100_GIB = H100_BYTES / GIB
H100_REPORTED_MIB = 81_559
H100_REPORTED_GIB = H100_REPORTED_MIB / 1024


def gib(nbytes: float) -> float:
    return nbytes / GIB


def size(nbytes: float, digits: int = 1) -> str:
    """'8.0 GiB', '64 MiB', '128 KiB', '1.13 TiB': the largest binary unit that keeps the number ≥ 1."""
    for unit, p in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 2**p:
            x = nbytes / 2**p
            return f"{x:.{digits if unit in ('GiB', 'TiB') else 0}f} {unit}"
    return f"{nbytes:.0f} B"
