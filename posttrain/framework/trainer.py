"""Role 4, the trainer: micro-batches, loss, backward, clip, optimizer step.

The trainer takes the loss as a function; it knows nothing about any algorithm:

    metrics = trainer.step(batch, loss_fn)      # loss_fn(model, micro_batch, norm) -> (loss, metrics)

`batch` is a `RolloutBatch` (framework/batch.py, docs/architecture.md §3) or, for the other
stages, a dict of tensors with `[B, T]` or `[B]` leading dims; it is split into micro-batches of at
most `micro_batch_tokens` computed tokens, rows of similar lengths together (`split_micro_batches`),
so the padding computed stays small, or none but the rows' tails with `optim.packing`
(framework/packing.py): `train/tokens` counts the real tokens of a step, `train/padded_tokens`
what the forwards computed. Every loss is normalised
by `norm`, the token and sequence counts of the WHOLE batch (algorithms/core.batch_norm),
so summing micro-batch gradients gives exactly the gradient of one big batch, for every
aggregation mode (tests/test_trainer.py). `.backward()` is called here and nowhere else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import warnings

import torch

from posttrain import checkpoint_shards
from posttrain.algorithms.core import batch_norm, masked_mean
from posttrain.errors import UsageError
from posttrain.framework.batch import Batch, RolloutBatch, budgets, map_batch, split_micro_batches, view
from posttrain.framework.compiled import SCOPES, compiling, resolve
from posttrain.framework.critic import logprobs_and_values, needs_critic
from posttrain.framework.logprobs import micro_logprobs
from posttrain.framework.packing import computed_tokens


def policy_loss_fn(algorithm, algo_cfg, temperature: float):
    """The RL loss as the trainer sees it: recompute logprobs (sampler's temperature), call the
    algorithm, and measure the sampler/trainer mismatch on the same tokens.

    `mismatch/logprob_abs` means one thing on every backend: the mean over loss tokens of |the
    sampler's recorded logprob − the trainer's|, the sampler's read from `behaviour_logprobs` when
    the off-policy correction moved them there (its `old_logprobs` are then the trainer's own, and
    the gap against them 0: a vLLM run read 0.0 every step, issue 43), else from `old_logprobs`.
    Trainer.train keeps the first optimizer step's, whose weights are the sampler's (in an async run
    a stale sample's gap also holds the updates since it was drawn: staleness/*).

    Critic hook (PPO, framework/critic.py): `model` is then a models.heads.ActorCritic; the
    same forward also gives V(s_t) [B, T], handed to the loss as `new_values` in a new
    micro-batch. Every other algorithm takes the unchanged path."""
    with_critic = needs_critic(algorithm, algo_cfg)

    def loss_fn(model, mb: RolloutBatch, norm: dict):
        ids = mb.input_ids  # [b, w]
        if ids is None:
            raise UsageError("the RL loss needs batch.input_ids: build the batch with framework.batch.collate_samples")
        if with_critic:  # ← critic hook (PPO only)
            lp, ent, values = logprobs_and_values(model, ids, temperature, mb.pack_index)
            mb = dataclasses.replace(mb, new_values=values)
        else:
            lp, ent = micro_logprobs(model, mb, temperature, with_entropy=True)  # packed if mb says so
        loss, metrics = algorithm.loss(lp, mb, algo_cfg, norm, ent)
        sampled = mb.behaviour_logprobs if mb.behaviour_logprobs is not None else mb.old_logprobs
        assert sampled is not None  # the loss above has read old_logprobs
        metrics["mismatch/logprob_abs"] = masked_mean((lp.detach() - sampled).abs(), mb.loss_mask)
        return loss, metrics

    return loss_fn


class Trainer:
    def __init__(self, model: torch.nn.Module, optim, total_steps: int, runtime=None):
        self.model, self.cfg, self.runtime = model, optim, runtime
        self.device = next(model.parameters()).device
        decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
        groups = [{"params": decay, "weight_decay": optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=optim.lr, betas=tuple(optim.betas), foreach=True)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, optim, total_steps))
        self.nonfinite_in_a_row = 0
        self.nonfinite_total = 0
        self.dp = None  # a distributed.data_parallel.DataParallel: this rank trains on its rows only
        scope = getattr(optim, "compile_scope", SCOPES[0])
        self.compile = resolve(getattr(optim, "compile", False), self.device, scope)  # framework/compiled.py

    @property
    def budgets(self):
        """The micro-batch budgets this trainer splits by (optim.micro_batch_tokens; auto: what the
        run resolved for its device, runtime.MicroBatches): `train` for its steps, `score` for its
        model's passes without gradient (PPO's V_old, the off-policy correction)."""
        return budgets(self.cfg.micro_batch_tokens, self.runtime)

    def step(self, batch: Batch, loss_fn, max_len: float | None = None, unit: int = 1) -> dict:
        """One optimizer step on `batch` (accumulating over micro-batches of whole `unit`s of
        rows: 2 for preference pairs)."""
        self.model.train()
        mask = view(batch)["loss_mask"]  # [B, T]
        norm = batch_norm(mask, max_len if max_len is not None else mask.shape[1])
        if self.dp is not None:  # this rank's rows; norm that of the WHOLE batch (distributed/data_parallel.py)
            batch, norm = self.dp.local(batch, norm, unit)
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        maxes: dict[str, float] = {}
        total_loss = 0.0
        micro = split_micro_batches(batch, self.budgets.train, unit, self.cfg.packing, self.cfg.packing_width)
        if self.dp is not None:  # FSDP: as many forwards on every rank
            micro = self.dp.even_out(micro)
        kept, keys = [], []  # per micro-batch: its loss, loss tokens, real tokens and metrics, read after the loop
        for mb in micro:
            ctx = self.runtime.autocast() if self.runtime else torch.autocast("cpu", enabled=False)
            with ctx, compiling(self.compile):
                loss, metrics = loss_fn(self.model, mb, norm)
            loss.backward()  # the one backward of the project
            fields = view(mb)
            kept.append([loss.detach(), fields["loss_mask"].sum(), fields["attention_mask"].sum(), *metrics.values()])
            keys.append(list(metrics))
        # one host read for all of them (on CUDA each read waits for the queue: read inside the loop,
        # the card idled between micro-batches, issue 43); then the same float arithmetic as before
        real = 0.0  # this rank's tokens
        for (loss_v, tokens, attended, *metric_values), mb_keys in zip(host_floats(kept), keys):
            total_loss += loss_v
            real += attended
            share = tokens / max(norm["tokens"], 1.0)
            for k, v in zip(mb_keys, metric_values):
                if k.endswith("/max"):
                    maxes[k] = max(maxes.get(k, -math.inf), v)
                else:
                    sums[k] = sums.get(k, 0.0) + share * v  # token-weighted mean over micro-batches
        if self.dp is not None:  # Σ over ranks, once
            self.dp.reduce_grads([p for p in self.model.parameters() if p.requires_grad])
            total_loss, sums, maxes = self.dp.reduce_metrics(total_loss, sums, maxes)
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        padded = float(sum(computed_tokens(view(mb)) for mb in micro))
        counts: dict[str, float] = {
            "train/micro_batches": len(micro),
            "train/tokens": real,
            "train/padded_tokens": padded,
        }
        if self.dp is not None:  # every rank's tokens; the most micro-batches of any rank
            counts = self.dp.counts(counts)
        real, padded = counts["train/tokens"], counts["train/padded_tokens"]
        out = {
            **sums,
            **maxes,
            "loss": total_loss,
            "grad/norm": grad_norm,
            "lr": self.scheduler.get_last_lr()[0],
            "train/micro_batches": counts["train/micro_batches"],
            "train/tokens": real,
            "train/padded_tokens": float(padded),  # real ones; as computed
            "train/pad_frac": 1.0 - real / max(padded, 1),
        }
        if not (math.isfinite(total_loss) and math.isfinite(grad_norm)):
            # A non-finite step is skipped and counted, never applied (and never silent).
            self.optimizer.zero_grad(set_to_none=True)
            self.nonfinite_in_a_row += 1
            self.nonfinite_total += 1
            out["train/nonfinite_skipped"] = 1.0
        else:
            self.optimizer.step()
            self.nonfinite_in_a_row = 0
            out["train/nonfinite_skipped"] = 0.0
        with warnings.catch_warnings():  # a skipped step still advances the schedule
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()
        out["train/nonfinite_total"] = float(self.nonfinite_total)
        return out

    def train(self, batch: Batch, loss_fn, epochs: int = 1, minibatches: int = 1, max_len: float | None = None) -> dict:
        """`epochs` passes over `batch` split into `minibatches` optimizer steps (PPO-style reuse).

        Only the first step sees weights equal to the sampler's, so `mismatch/*` is taken from
        it; other metrics are averaged over steps (`*/max` takes the max).
        """
        B = view(batch)["loss_mask"].shape[0]
        if minibatches > B:
            raise UsageError(f"minibatches={minibatches} exceeds the {B} samples of a step; lower it")
        bounds = [round(i * B / minibatches) for i in range(minibatches + 1)]
        steps = []
        for _ in range(epochs):
            for a, b in zip(bounds[:-1], bounds[1:]):
                rows = slice(a, b)
                steps.append(self.step(map_batch(batch, functools.partial(_rows, rows=rows)), loss_fn, max_len))
        out = {}
        for k in steps[0]:
            vals = [m[k] for m in steps if k in m]
            out[k] = (
                max(vals) if k.endswith("/max") else (vals[0] if k.startswith("mismatch/") else sum(vals) / len(vals))
            )
        out["train/optimizer_steps"] = float(len(steps))
        return out

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "nonfinite_total": self.nonfinite_total,
        }

    sharded = False  # a ShardedTrainer (distributed/ranks.py): every rank saves its optimizer shard

    def master_weights(self):
        """What a checkpoint writes as the weights: here the model's own (distributed/ranks.ShardedTrainer
        gathers its shards' fp32 weights into the sampler's bf16 copy for the save)."""
        return contextlib.nullcontext()

    def save_shards(self, path) -> None:
        """The optimizer state through torch.distributed.checkpoint (checkpoint_shards.py)."""
        checkpoint_shards.save(self.model, self.optimizer, path)

    def load_shards(self, path) -> None:
        """The optimizer state of a sharded run's checkpoint, read whole (DCP reshards to one rank)."""
        checkpoint_shards.load(self.model, self.optimizer, path)

    def load_state_dict(self, state: dict) -> None:
        if state.get("optimizer") is not None:  # None: a sharded run's checkpoint, loaded by load_shards
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.nonfinite_total = state.get("nonfinite_total", 0)


def host_floats(rows: list[list]) -> list[list[float]]:
    """`rows` of 0-dim tensors and numbers as Python floats, each the `float(x)` it would be alone,
    with one device-to-host read per device (not one per value: each is a sync on CUDA)."""
    tensors: dict[torch.device, list[torch.Tensor]] = {}
    for row in rows:
        for x in row:
            if isinstance(x, torch.Tensor):
                tensors.setdefault(x.device, []).append(x.detach() if x.dim() == 0 else x.detach().reshape(()))
    read = {dev: iter(torch.stack(ts).tolist()) for dev, ts in tensors.items()}  # stack promotes: float32 stays exact
    return [[next(read[x.device]) if isinstance(x, torch.Tensor) else float(x) for x in row] for row in rows]


def _rows(v: torch.Tensor, rows: slice) -> torch.Tensor:
    return v[rows]


def lr_factor(step: int, cfg, total_steps: int) -> float:
    """Linear warm-up, then constant / cosine / linear decay to `min_lr_frac`."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
    if cfg.schedule == "cosine":
        decay = 0.5 * (1 + math.cos(math.pi * progress))
    elif cfg.schedule == "linear":
        decay = 1 - progress
    else:
        raise UsageError(f"optim.schedule={cfg.schedule!r} is unknown; use constant, cosine or linear")
    return cfg.min_lr_frac + (1 - cfg.min_lr_frac) * decay
