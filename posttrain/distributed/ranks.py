"""A stage's trainer over the run's N ranks: replicated (gradients all-reduced) or sharded with FSDP2.

    trainer = rank_trainer(Trainer(model, cfg.optim, steps, rt), model, shard="fsdp", local_rows=True)

Every rank keeps the plain module the stage built (`model`): its own rollout engine samples from it (RL),
evaluation and the checkpoint read it. With `replicate` the trainer trains that module itself and the
gradients are summed over the ranks once a step (data_parallel.py). With `fsdp` (the default) the trainer
trains an FSDP2-sharded copy, 1/N of every parameter, gradient and AdamW moment a rank (fsdp.py), and after
each update the new weights are gathered into the plain module one parameter at a time, so the sampler
always samples the weights just trained (docs/architecture.md §8).

`local_rows`: RL hands each rank only the groups it sampled (normalisers summed over ranks); the other
stages hand every rank the same global batch and each trains its block of rows.

A checkpoint is the 1-rank format whatever N: the plain module's weights (rank 0 writes them) and the
optimizer state gathered from the shards (`state_dict`, a collective); `--resume` with any N cuts each
rank's shard out of them again (`load_state_dict`).
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import torch

from posttrain import algorithms, checkpoint
from posttrain.distributed import fsdp
from posttrain.distributed.data_parallel import DataParallel
from posttrain.errors import UsageError
from posttrain.framework.critic import needs_critic
from posttrain.framework.trainer import Trainer
from posttrain.framework.world import World, current

SHARDS = ("fsdp", "replicate")


def check_rank_config(cfg, world: World) -> None:
    """The RL keys a run of N ranks cannot honour, refused before any work (one line each)."""
    s = cfg.scale
    if s.trainer_ranks != 1:
        raise UsageError(
            f"scale.trainer_ranks={s.trainer_ranks}: the trainer-only group is gone, every rank now samples and "
            f"trains; use scale.gpus={s.trainer_ranks} (or torchrun --nproc-per-node {s.trainer_ranks} -m posttrain rl ...)"
        )
    if s.trainer_shard not in SHARDS:
        raise UsageError(f"scale.trainer_shard={s.trainer_shard!r} is unknown; use {' or '.join(SHARDS)}")
    if world.size > 1 and s.gpus not in (1, world.size):
        raise UsageError(f"scale.gpus={s.gpus} under torchrun with {world.size} ranks; drop scale.gpus or match it")
    if world.size == 1:
        return
    if cfg.rollout.prompts_per_step < world.size:
        raise UsageError(
            f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} < {world.size} ranks: every rank samples whole "
            f"prompt groups; use rollout.prompts_per_step >= {world.size}"
        )
    if s.placement != "in-process" or s.async_ or cfg.rollout.backend == "vllm":
        raise UsageError(
            f"{world.size} ranks sample in-process and synchronously, each on its own card, with the built-in "
            "engine; use scale.placement=in-process, async off and rollout.backend=posttrain (or one rank)"
        )
    if s.weight_sync != "colocated":
        raise UsageError(
            "with several ranks each rank's sampler reads its own plain policy: use scale.weight_sync=colocated"
        )
    if s.trainer_shard == "fsdp" and needs_critic(algorithms.get(cfg.algo.name), cfg.algo):
        raise UsageError(
            f"scale.trainer_shard=fsdp does not shard a critic ({cfg.algo.name}'s value head sits outside the "
            "sharded blocks); use scale.trainer_shard=replicate"
        )


def rank_trainer(trainer: Trainer, model, world: World, shard: str = "fsdp", local_rows: bool = False):
    """`trainer` as one of `world.size` ranks (itself when there is one rank)."""
    if world.size == 1:
        return trainer
    if shard == "replicate":
        trainer.dp = DataParallel(local=local_rows)
        return trainer
    return ShardedTrainer(trainer, model, local_rows)


class ShardedTrainer(Trainer):
    """A Trainer on an FSDP2-sharded copy of `plain`, which it keeps up to date after every update."""

    def __init__(self, trainer: Trainer, plain, local_rows: bool):
        rt = trainer.runtime
        dtype = rt.compute_dtype if rt is not None else None
        sharded = fsdp.shard_module(copy.deepcopy(plain), *([dtype] if dtype is not None else []))
        super().__init__(sharded, trainer.cfg, 1, rt)
        # the wrapped trainer's schedule (warm-up and decay over the run's steps) on this optimizer
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, trainer.scheduler.lr_lambdas[0])
        self.plain = plain
        self.dp = fsdp.FSDPShard(local=local_rows)
        # The plain copy serves the sampler, the reference's copy and evaluation, all in the compute dtype: under
        # bf16 autocast it holds bf16 weights (2P bytes a rank, not 4P); the fp32 master weights are the shards'
        lora = any("lora_" in name for name, _ in plain.named_parameters())
        self.plain_dtype = dtype if dtype not in (None, torch.float32) and not lora else None
        if self.plain_dtype is not None:
            for q in plain.parameters():
                q.data = q.data.to(self.plain_dtype)

    def train(self, batch, loss_fn, epochs: int = 1, minibatches: int = 1, max_len=None) -> dict:
        out = super().train(batch, loss_fn, epochs, minibatches, max_len)
        fsdp.gather_into(self.model, self.plain)  # the rank's sampler reads the weights just trained
        return out

    sharded = True  # its optimizer state goes to the checkpoint's shards/, every rank its part (framework/loop.py)

    def state_dict(self) -> dict:
        """The schedule and counters; the optimizer state is written by every rank (`save_shards`)."""
        return {**super().state_dict(), "optimizer": None}

    @contextlib.contextmanager
    def master_weights(self):
        """Inside, rank 0's plain module holds the fp32 master weights gathered from the shards (a collective:
        every rank enters), what a checkpoint writes; outside again, the sampler's copy as it was."""
        if self.plain_dtype is None:  # the plain copy already holds the master weights' values
            yield
            return
        kept = {}
        for name, (q, p) in zip(
            dict(self.plain.named_parameters()), zip(self.plain.parameters(), self.model.parameters())
        ):
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            if current().main:
                kept[name] = q.data
                q.data = full.detach().float().cpu()
        try:
            yield
        finally:
            for name, q in self.plain.named_parameters():
                if name in kept:
                    q.data = kept[name]

    def load_state_dict(self, state: dict) -> None:
        """After the plain module's weights were restored (framework/loop.py): this rank's shard of them;
        the optimizer state from the checkpoint's shards/ (`load_shards`) or, a checkpoint of one rank or
        of replicas, its whole state cut the way the parameters are."""
        fsdp.scatter_from(self.plain, self.model)
        super().load_state_dict(state)
        if state.get("optimizer") is not None:
            fsdp.shard_loaded_state(self.optimizer)

    def load_shards(self, path) -> None:
        """A sharded checkpoint: the master weights exact from its fp32 model.safetensors (the plain copy may
        hold them in bf16), then every rank's part of the optimizer state."""
        if self.plain_dtype is not None:
            saved, _, _ = checkpoint.load_model(Path(path).parent)
            fsdp.scatter_from(saved, self.model)
            del saved
            fsdp.gather_into(self.model, self.plain)
        super().load_shards(path)
