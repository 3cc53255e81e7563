"""The ranks of one run: who am I among N processes, and the few collectives the roles need.

    world = current()            # World(rank=0, size=1) in a plain process; torchrun's ranks after
                                 # distributed/launch.join (one GPU each, cuda:LOCAL_RANK; gloo on a CPU)
    mine = world.span(16)        # range of the 16 prompt groups this rank samples (whole groups)
    every = world.gather(items)  # every rank's list, concatenated in rank order (on every rank)

A run of N ranks is the 1-rank run cut by prompt group: each rank samples, scores and trains on its
own groups (docs/architecture.md §8). What needs the whole batch is a collective here, never a batch
sent to rank 0: the normalisers (`sum`), the degenerate-group refill count and the step's metrics
(`gather` of per-sample records), the audit rows. Rank 0 alone writes files (`main`).

A collective waits at most the process group's timeout (distributed/launch.py: `POSTTRAIN_TIMEOUT_S`,
600 s): a rank that died makes the others fail there with an error, never hang.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes the run directory, logs and evaluates."""
        return self.rank == 0

    def span(self, n: int, rank: int | None = None) -> range:
        """The contiguous block of `n` items (prompt groups) of `rank` (this one by default): sizes
        differ by at most one, lower ranks first, so rank order is the 1-rank run's order."""
        r = self.rank if rank is None else rank
        return range(n * r // self.size, n * (r + 1) // self.size)

    def gather(self, items: list) -> list:
        """Every rank's `items`, concatenated in rank order, on every rank (picklable records)."""
        if self.size == 1:
            return list(items)
        parts: list = [None] * self.size
        dist.all_gather_object(parts, list(items))
        return [x for part in parts for x in part]

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sums over ranks, in float64 (counts, token totals, Σx and Σx² of a whitening)."""
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: list[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MAX)

    def _reduce(self, values: list[float], op) -> list[float]:
        if self.size == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=_device())
        dist.all_reduce(t, op=op)
        return t.cpu().tolist()

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank (a decision only rank 0 can make: evaluation's early stop)."""
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()


def _device() -> str:
    """Where a collective's tensor lives: NCCL reduces CUDA tensors only, gloo CPU ones."""
    return "cuda" if dist.get_backend() == "nccl" else "cpu"


def current() -> World:
    """This process's place among the run's ranks (one rank when torch.distributed is not initialised)."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size())
    return World()
