"""`scale.trainer_shard: fsdp`: the policy sharded over the run's ranks with FSDP2 (`fully_shard`, torch ≥ 2.4).

Every rank holds 1/N of each parameter, gradient and AdamW moment (DTensors on a 1-D mesh over the
run's process group: NCCL on GPUs, gloo on the CPU, where FSDP2 runs too in this torch, 2.13). On a GPU
under bf16 autocast the blocks all-gather their weights in bf16 and reduce-scatter gradients in fp32
(MixedPrecisionPolicy), over fp32 master shards. A forward all-gathers
each block's parameters, a backward reduce-scatters its gradients. Three things make the
sharded step the same step as the 1-rank trainer's (tests/test_ranks.py):

1. the loss reduction happens once, inside FSDP's reduce-scatter, with SUM: each rank's
   loss is already its additive share of the global loss (global normalisers, see
   data_parallel.py), so the divide factor is set to 1 and `reduce_grads` does nothing;
2. FSDP's collectives run in every forward and backward, so every rank must make the same
   number of them: `even_out` pads a rank's micro-batches with copies whose loss mask is
   all zero (loss 0, gradient 0, metrics weighted 0), up to the largest count of any rank;
3. what leaves the group is plain: `gather_into` writes the full weights into each rank's
   unsharded module after every update, one parameter at a time (the rank's sampler, evaluation
   and checkpoint read that one: distributed/ranks.py), and `full_state`/`shard_loaded_state` turn
   the sharded optimizer state to and from the 1-rank format.

Not covered: a learned critic (PPO's value head sits outside the forward the blocks shard:
use trainer_shard=replicate).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from posttrain.distributed.data_parallel import DataParallel
from posttrain.framework.batch import Batch, map_batch, view, with_fields


def shard_module(module: torch.nn.Module, compute_dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """fully_shard every element of the module's ModuleLists (the transformer blocks), then the root.

    The mesh is named: CUDA over NCCL, else a CPU mesh over the gloo group. Left to its default,
    FSDP picks the process's accelerator, whatever registered one (a PrivateUse1 backend such as
    the tests' fakegpu included), and moves the parameters there. `compute_dtype` below fp32 (bf16
    autocast on a GPU): the blocks gather their weights in it and reduce gradients in fp32.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cuda" if dist.get_backend() == "nccl" else "cpu", (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    kw = {"mesh": mesh, **({"mp_policy": mp} if compute_dtype != torch.float32 else {})}
    for sub in list(module.modules()):
        if isinstance(sub, torch.nn.ModuleList):
            for block in sub:
                fully_shard(block, **kw)
    fully_shard(module, **kw)
    for sub in module.modules():  # SUM over ranks, not FSDP's default mean
        if hasattr(sub, "set_gradient_divide_factor"):
            sub.set_gradient_divide_factor(1.0)
            sub.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM
    return module


class FSDPShard(DataParallel):
    """DataParallel for an FSDP2 module: same row shards and metric reduction, but FSDP reduces."""

    def local(self, batch: Batch, norm: dict, unit: int = 1) -> tuple[Batch, dict]:
        first = map_batch(batch, lambda v: v[:unit])
        zero = {k: v * 0 for k, v in view(first).items() if k in ("loss_mask", "advantages")}
        self.template = with_fields(first, **zero)  # rows with nothing to learn, for padding
        return super().local(batch, norm, unit)

    def even_out(self, micro: list) -> list:
        n = torch.tensor([len(micro)])
        dist.all_reduce(n, op=dist.ReduceOp.MAX, group=self.group)
        return micro + [self.template] * (int(n) - len(micro))

    def reduce_grads(self, params) -> None:
        """Nothing: FSDP reduce-scattered (SUM) in every backward, the one reduction."""


def gather_into(sharded: torch.nn.Module, plain: torch.nn.Module | None) -> None:
    """The full weights of the sharded module into `plain`, one parameter at a time (a collective:
    every rank calls it; a rank that keeps no plain copy passes None)."""
    target = dict(plain.named_parameters()) if plain is not None else {}
    with torch.no_grad():
        for name, p in sharded.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            if plain is not None:
                target[name].copy_(full)


def full_state(state: dict) -> dict:
    """A sharded Trainer's state_dict with every optimizer tensor gathered (a collective): the 1-rank format."""
    opt = state["optimizer"]
    opt["state"] = {
        i: {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in s.items()}
        for i, s in sorted(opt["state"].items())
    }
    return state


def shard_loaded_state(optimizer) -> None:
    """After a 1-rank-format state was loaded into a sharded trainer's optimizer: each moment is cut
    into this rank's shard the way its parameter is (every rank holds the full state: no traffic)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for group in optimizer.param_groups:
        for p in group["params"]:
            for k, v in optimizer.state.get(p, {}).items():
                if isinstance(p, DTensor) and torch.is_tensor(v) and not isinstance(v, DTensor) and v.shape == p.shape:
                    optimizer.state[p][k] = distribute_tensor(v, p.device_mesh, p.placements, src_data_rank=None)


@torch.no_grad()
def scatter_from(plain: torch.nn.Module, sharded: torch.nn.Module) -> None:
    """The reverse of `gather_into`: every rank holds `plain`'s full weights (a resume restored them), so
    each cuts its own shard out of them, the way the parameter is sharded; no traffic."""
    from torch.distributed.tensor import distribute_tensor

    full = dict(plain.named_parameters())
    for name, p in sharded.named_parameters():
        src = full[name].detach().to(p.dtype)
        if hasattr(p, "device_mesh"):
            p.copy_(distribute_tensor(src.to(p.device), p.device_mesh, p.placements, src_data_rank=None))
        else:
            p.copy_(src)
