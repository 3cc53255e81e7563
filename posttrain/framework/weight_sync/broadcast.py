"""Weight sync by collective broadcast: `placement: ray` with `sync_transport: broadcast`.

The trainer's process (rank 0) and the W rollout workers (ranks 1..W) form a process group
of their own, next to the run's own ranks (torchrun, `scale.gpus`), so it never touches the default
group. A sync sends each bucket of `state_buckets` as one flat byte tensor in one broadcast:

    trainer (rank 0)                          rollout worker k (rank k)
    layouts = [layout(b) for b in buckets] ─▶ receive(version, layouts)   (a Ray call, queued
    for b in buckets: broadcast(pack(b)) ───▶   for each layout: buffer ← broadcast; unpack
    ray.get(every receive)                  ◀─  load_buckets; policy_version = version

Only the layouts (names, dtypes, shapes) travel through Ray; the bytes go through the group.
The backend follows the members' `device`: gloo for "cpu", NCCL for "cuda" (the same calls;
vLLM/verl/OpenRLHF sync their GPU samplers this way). RayRollout's workers are CPU actors, so
the wired path is gloo; the NCCL branch has not been run (no GPU was available).

A group cannot take in a new member, so a restarted worker is first brought up to date
through the object store, and the next sync forms a fresh group (a new `generation`: a new
key prefix in the same rendezvous store).
"""

from __future__ import annotations

import datetime
import socket
from typing import Any

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=300)
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


def layout(bucket: dict[str, torch.Tensor]) -> list[tuple[str, torch.dtype, tuple, int]]:
    """(name, dtype, shape, bytes) of every tensor, in the order `pack` lays them out."""
    return [(k, t.dtype, tuple(t.shape), t.numel() * t.element_size()) for k, t in bucket.items()]


def pack(bucket: dict[str, torch.Tensor]) -> torch.Tensor:
    """The bucket's tensors as one contiguous uint8 tensor (any mix of dtypes)."""
    return torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in bucket.values()])


def unpack(flat: torch.Tensor, spec: list[tuple[str, torch.dtype, tuple, int]]) -> dict[str, torch.Tensor]:
    out, at = {}, 0
    for name, dtype, shape, nbytes in spec:
        out[name] = flat[at : at + nbytes].view(dtype).reshape(shape)
        at += nbytes
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class SyncGroup:
    """One member of the weight-sync group. Rank 0 hosts the rendezvous store; constructing
    a member blocks until all `world` members have joined (so the members join concurrently)."""

    def __init__(self, host: str, port: int, rank: int, world: int, generation: int, device: str = "cpu", store=None):
        self.rank, self.device = rank, torch.device(device)
        backend = BACKENDS[self.device.type]
        self.store = store or dist.TCPStore(host, port, world, rank == 0, timeout=TIMEOUT, wait_for_workers=False)
        prefixed = dist.PrefixStore(f"weights/{generation}", self.store)
        self.group: Any  # a c10d Backend; torch's stubs lack its `broadcast` and make NCCL's options required
        if backend == "gloo":
            self.group = dist.ProcessGroupGloo(prefixed, rank, world, TIMEOUT)
        else:
            self.group = dist.ProcessGroupNCCL(prefixed, rank, world)  # type: ignore[call-arg]

    def broadcast(self, flat: torch.Tensor) -> torch.Tensor:
        """Rank 0's `flat` into every member's `flat` (same size), in place."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([flat], opts).wait()
        return flat

    def send(self, buckets: list[dict[str, torch.Tensor]]) -> int:
        sent = 0
        for b in buckets:
            sent += self.broadcast(pack(b).to(self.device)).numel()
        return sent

    def receive(self, layouts: list[list[tuple]]) -> list[dict[str, torch.Tensor]]:
        buckets = []
        for spec in layouts:
            flat = torch.empty(sum(n for *_, n in spec), dtype=torch.uint8, device=self.device)
            buckets.append(unpack(self.broadcast(flat), spec))
        return buckets
