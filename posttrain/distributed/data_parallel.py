"""The trainer as a torch.distributed group: data-parallel, gradients reduced exactly once.

    dist.init_process_group("gloo" on CPU | "nccl" on GPU)     # torchrun, or tests' mp.spawn
    trainer.dp = DataParallel()                                 # every rank: same model, same batch
    trainer.step(batch, loss_fn)                                # each rank trains on its rows

Either every rank is handed the same global batch (SFT, DPO, RM, distillation: `Trainer.step`
computes the normalisers of the WHOLE batch first, core.batch_norm's token and sequence counts, then
keeps only this rank's rows, `shard`), or (RL, `local=True`) each rank holds only the rows it sampled
and the normalisers are summed over the ranks (`local`). Each rank's loss is therefore its additive share of the global loss,
and the global gradient is the plain SUM of the ranks' gradients: `reduce_grads` all-reduces
once with SUM, after every micro-batch has been accumulated. No averaging over ranks is
needed and none is done — DDP's default (mean over ranks of per-rank means) would be the
wrong normaliser for token-mean losses with uneven shards, and a second all-reduce would
double the gradient (tests/test_distributed.py compares 2 ranks to 1 to 1e-6).

Parameters are replicated here (DDP-style); fsdp.py shards them with FSDP2 `fully_shard`
(which runs on gloo too) and lets FSDP's reduce-scatter be the one reduction instead.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from posttrain.errors import UsageError
from posttrain.framework.batch import Batch, map_batch, view

BUCKET_BYTES = 25 * 2**20  # gradients per all-reduce call (DDP's default bucket size)


class DataParallel:
    def __init__(self, group=None, local: bool = False):
        if not dist.is_initialized():
            raise UsageError("DataParallel needs torch.distributed initialised (torchrun, or init_process_group)")
        self.group, self.local_rows = group, local
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)

    def local(self, batch: Batch, norm: dict, unit: int = 1) -> tuple[Batch, dict]:
        """(this rank's rows, the WHOLE batch's normalisers): a global batch is cut here (`shard`); a
        batch of this rank's own rows stays whole and its token and sequence counts are summed over the
        ranks (max_len is the same everywhere)."""
        if not self.local_rows:
            return self.shard(batch, unit), norm
        counts = torch.tensor([norm["tokens"], norm["seqs"]], dtype=torch.float64, device=_device())
        dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=self.group)
        return batch, {**norm, "tokens": float(counts[0]), "seqs": float(counts[1])}

    def counts(self, values: dict) -> dict:
        """A step's token counts summed over ranks, its micro-batch count the largest of any rank."""
        keys = sorted(values)
        sums = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=_device())
        most = sums.clone()
        dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=self.group)
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=self.group)
        return {k: float(most[i] if k == "train/micro_batches" else sums[i]) for i, k in enumerate(keys)}

    def shard(self, batch: Batch, unit: int = 1) -> Batch:
        """This rank's contiguous block of rows, in whole units (2 keeps preference pairs
        together); block sizes differ by at most one unit."""
        U = view(batch)["loss_mask"].shape[0] // unit
        a, b = (round(r * U / self.world) * unit for r in (self.rank, self.rank + 1))
        return map_batch(batch, lambda v: v[a:b])

    def even_out(self, micro: list) -> list:
        """Micro-batches as this rank runs them: replicas need no padding (fsdp.py's shards do)."""
        return micro

    @torch.no_grad()
    def reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Σ over ranks of every gradient, in buckets of flat tensors: the ONE reduction of a step.
        A parameter without a gradient on this rank (no rows) contributes zeros, so every rank
        takes part in the same calls."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        bucket, size = [], 0
        for p in params:
            bucket.append(p)
            size += p.grad.numel() * p.grad.element_size()
            if size >= BUCKET_BYTES:
                self._all_reduce(bucket)
                bucket, size = [], 0
        if bucket:
            self._all_reduce(bucket)

    def _all_reduce(self, params) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in params])  # [Σ numel]
        if _device() == "cpu" and flat.device.type != "cpu":  # gloo reduces CPU tensors only
            flat = flat.cpu()
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))  # back on the gradient's device

    def reduce_metrics(self, total_loss: float, sums: dict, maxes: dict):
        """Loss and token-weighted metric shares add over ranks; `*/max` take the max."""
        parts = [None] * self.world
        dist.all_gather_object(parts, (total_loss, sums, maxes), group=self.group)
        loss, s, m = 0.0, {}, {}
        for part_loss, part_sums, part_maxes in parts:
            loss += part_loss
            for k, v in part_sums.items():
                s[k] = s.get(k, 0.0) + v
            for k, v in part_maxes.items():
                m[k] = max(m.get(k, v), v)
        return loss, s, m


def _device() -> str:
    """NCCL reduces CUDA tensors only, gloo CPU ones."""
    return "cuda" if dist.get_backend() == "nccl" else "cpu"
