"""`trainer_ranks: N`: the RL trainer as N local processes (torch.distributed, gloo); rank 0
is the `posttrain rl` process itself and still runs every other role.

    rank 0 (controller)                                   ranks 1 … N−1 (spawned: `_follow`)
    ───────────────────                                   ──────────────────────────────────
    ❶–❻ rollout, reward, reference, advantages
    ❼ trainer.train(batch) ── broadcast ("train", batch) ──▶ trainer.train(batch)
         each rank: its block of rows, the GLOBAL normalisers (data_parallel.py)
         gradients all-reduced with SUM, once per optimizer step ◀──▶
         the same optimizer step on every replica
    ❽ sync, eval, metrics.jsonl, checkpoints (rank 0 only: its replica is the whole state)
    close ──────────────── broadcast ("stop",) ──────────▶ exit

Why one controller and a broadcast batch, not a rollout per rank: advantages need every
sample of a group (group baselines, dynamic sampling), the reference and the audit see the
whole batch, and rollouts already scale on their own axis (`placement: ray`). So rank 0
builds the global batch exactly as a 1-rank run does and every rank receives the same batch;
the data parallelism is then exactly the path tested in tests/test_distributed.py, and a
2-rank run reproduces the 1-rank run (tests/test_trainer_group.py: same weights after two
steps). Cost: one pickled batch per step over the group (small beside forward + backward).

State: the first `train` call sends rank 0's trainer module and trainer state (after the
init checkpoint or `--resume` has been loaded), so followers never read a checkpoint. From
then on every replica takes identical steps: the summed gradient is the same on every rank,
so are clip, AdamW and the schedule. Metrics are reduced inside Trainer.step (loss and
token-weighted means add over ranks); `train/micro_batches` is rank 0's own count.

`trainer_shard: fsdp` (fsdp.py): the ranks, rank 0 included, train an FSDP2-sharded copy
instead of replicas; after every update the full weights are gathered into rank 0's plain
module, which every other role reads, and `state_dict` gathers the sharded optimizer state
into the 1-rank format (a "state" message, so the followers join the collective).

CPU only (gloo): the spawned ranks share this machine's cores with rank 0's rollout.
"""

from __future__ import annotations

import copy
import datetime
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from posttrain import algorithms, runtime
from posttrain.distributed import fsdp
from posttrain.distributed.data_parallel import DataParallel
from posttrain.distributed.fsdp import full_state, gather_into
from posttrain.errors import UsageError
from posttrain.framework.batch import Batch, map_batch, to_device
from posttrain.framework.critic import needs_critic
from posttrain.framework.trainer import Trainer, policy_loss_fn

TIMEOUT = datetime.timedelta(minutes=30)  # one collective; a step's forward + backward fits in it
SHARDS = ("replicate", "fsdp")


def check_trainer_config(cfg) -> None:
    if cfg.scale.trainer_ranks < 1:
        raise UsageError(f"trainer_ranks must be ≥ 1 (got {cfg.scale.trainer_ranks}); 1 = the trainer in this process")
    if cfg.scale.trainer_shard not in SHARDS:
        raise UsageError(f"trainer_shard={cfg.scale.trainer_shard!r} is unknown; use {' or '.join(SHARDS)}")
    cuda = cfg.device.startswith("cuda") or (cfg.device == "auto" and torch.cuda.is_available())
    if cfg.scale.trainer_ranks > 1 and cuda:
        raise UsageError(
            "trainer_ranks > 1 runs the trainer group on CPU (gloo) only; use device=cpu, or trainer_ranks=1 on a GPU"
        )
    if cfg.scale.trainer_shard == "fsdp" and cfg.scale.trainer_ranks > 1:
        algorithm = algorithms.get(cfg.algo.name)
        if needs_critic(algorithm, cfg.algo):
            raise UsageError(
                f"trainer_shard=fsdp does not shard a critic ({cfg.algo.name}); use trainer_shard=replicate"
            )


class TrainerGroup:
    """Rank 0's trainer: a `Trainer` whose `train` the other ranks join. Everything else
    (model, device, cfg, state_dict, …) is the wrapped trainer's, rank 0's full replica."""

    def __init__(self, trainer, cfg):
        self.inner, self.model, self.world, self.cfg = trainer, trainer.model, cfg.scale.trainer_ranks, cfg
        self.fsdp = cfg.scale.trainer_shard == "fsdp"
        init = f"tcp://127.0.0.1:{_free_port()}"
        ctx = mp.get_context("spawn")  # never fork a process holding threads
        self.procs = [
            ctx.Process(target=_follow, args=(r, self.world, init, cfg), daemon=True, name=f"trainer-rank-{r}")
            for r in range(1, self.world)
        ]
        for p in self.procs:
            p.start()
        dist.init_process_group("gloo", init_method=init, rank=0, world_size=self.world, timeout=TIMEOUT)
        trainer.dp = DataParallel()
        self.started = False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def train(self, batch: Batch, loss_fn, epochs: int = 1, minibatches: int = 1, max_len=None) -> dict:
        """Trainer.train on every rank. `loss_fn` is rank 0's; the followers build the same one
        from the config (a closure does not travel)."""
        for p in self.procs:
            if not p.is_alive():
                raise RuntimeError(f"{p.name} exited (code {p.exitcode}); its error is printed above")
        if not self.started:
            state = self.inner.state_dict()
            _send(("init", self.model, state))
            if self.fsdp:  # rank 0 trains a shard too, like the others
                self.inner = _trainer(self.model, state, self.cfg, self.inner.runtime)
            self.started = True
        _send(("train", map_batch(batch, torch.Tensor.cpu), epochs, minibatches, max_len))
        out = self.inner.train(batch, loss_fn, epochs, minibatches, max_len)
        if self.fsdp:
            gather_into(self.inner.model, self.model)  # the sampler and the checkpoint read this one
        return out

    def state_dict(self) -> dict:
        if not (self.fsdp and self.started):
            return self.inner.state_dict()

        _send(("state",))
        return full_state(self.inner)

    def load_state_dict(self, state: dict) -> None:
        if self.started:  # the followers already have theirs
            raise RuntimeError("TrainerGroup: load the trainer state before the first step (--resume does)")
        self.inner.load_state_dict(state)

    def close(self) -> None:
        if dist.is_initialized():
            if all(p.is_alive() for p in self.procs):
                _send(("stop",))
            dist.destroy_process_group()
        for p in self.procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


def _send(msg) -> None:
    dist.broadcast_object_list([msg], src=0)


def _recv():
    box = [None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _follow(rank: int, world: int, init: str, cfg) -> None:
    """Ranks 1 … N−1: wait for a batch, train on this rank's rows, repeat until "stop"."""
    rt = runtime.resolve(cfg.device, cfg.dtype, cfg.threads)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT)
    try:
        algorithm = algorithms.get(cfg.algo.name)
        loss_fn = policy_loss_fn(algorithm, cfg.algo, cfg.rollout.temperature)
        msg = _recv()
        if msg[0] == "stop":
            return
        trainer = _trainer(msg[1], msg[2], cfg, rt)
        while (msg := _recv())[0] != "stop":
            if msg[0] == "state":  # rank 0 checkpoints: join the gather
                fsdp.full_state(trainer)
                continue
            _, batch, epochs, minibatches, max_len = msg
            trainer.train(to_device(batch, trainer.device), loss_fn, epochs, minibatches, max_len)
            if cfg.scale.trainer_shard == "fsdp":
                fsdp.gather_into(trainer.model, None)
    finally:
        dist.destroy_process_group()


def _trainer(model, state: dict, cfg, rt):
    """A rank's trainer: on the replica it was sent, or (fsdp) on a sharded copy of it."""
    if cfg.scale.trainer_shard == "fsdp":
        model = fsdp.shard_module(copy.deepcopy(model))  # rank 0 keeps its plain module
    trainer = Trainer(model, cfg.optim, cfg.steps * cfg.optim.epochs * cfg.optim.minibatches, rt)
    if cfg.scale.trainer_shard == "fsdp":
        fsdp.load_full_state(trainer, state)
        trainer.dp = fsdp.FSDPShard()
    else:
        trainer.load_state_dict(state)
        trainer.dp = DataParallel()
    return trainer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
