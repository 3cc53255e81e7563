"""Role 4, the trainer: micro-batches, loss, backward, clip, optimizer step.

The trainer takes the loss as a function; it knows nothing about any algorithm:

    metrics = trainer.step(batch, loss_fn)      # loss_fn(model, micro_batch, norm) -> (loss, metrics)

`batch` is a dict of tensors with `[B, T]` or `[B]` leading dims (DESIGN.md §3); it is split
into micro-batches of at most `micro_batch_tokens` padded tokens, rows of similar lengths
together (`split_micro_batches`), so the padding computed stays small: `train/tokens` counts
the real tokens of a step, `train/padded_tokens` what the forwards computed. Every loss is normalised
by `norm`, the token and sequence counts of the WHOLE batch (algorithms/core.batch_norm),
so summing micro-batch gradients gives exactly the gradient of one big batch, for every
aggregation mode (tests/test_trainer.py). `.backward()` is called here and nowhere else.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from posttrain.algorithms.core import batch_norm
from posttrain.framework.rollout import token_logprobs


def sequence_logprobs(model, input_ids: torch.Tensor, temperature: float = 1.0,
                      with_entropy: bool = False):
    """logprobs[:, t] = log π(input_ids[:, t] | input_ids[:, :t]) at the sampler's temperature.

    Position 0 has no prediction and holds 0. Returns (logprobs [B, T], entropy [B, T] | None).
    """
    return logits_logprobs(model(input_ids), input_ids, temperature, with_entropy)


def logits_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0,
                    with_entropy: bool = False):
    """sequence_logprobs from logits [B, T, V] already computed (a forward that also gave values)."""
    logits = logits[:, :-1]                                          # [B, T-1, V]
    lp = token_logprobs(logits, input_ids[:, 1:], temperature)       # [B, T-1]
    lp = F.pad(lp, (1, 0))                                           # [B, T]
    ent = None
    if with_entropy:
        from posttrain.algorithms.core import entropy_from_logits
        t = temperature if temperature > 0 else 1.0
        ent = F.pad(entropy_from_logits(logits.float() / t), (1, 0))
    return lp, ent


# The fixed cost of one more micro-batch (one more forward and backward: hundreds of kernel
# launches) in token-equivalents: split_micro_batches cuts rows into another micro-batch only
# where that saves more padded tokens than this. ~5 ms of launches on a CPU ≈ 100-200 tokens of
# the nano model; on bigger models and GPUs a token costs more and the constant matters less.
MICRO_BATCH_COST_TOKENS = 128


def split_micro_batches(batch: dict, max_tokens: int, unit: int = 1) -> list[dict]:
    """Micro-batches of at most `max_tokens` padded tokens (at least one unit), rows grouped by
    length so that little padding is computed.

    Rows go in units of `unit` (2 keeps a preference pair's chosen and rejected together).
    Units are sorted by length, longest first, and cut into consecutive groups minimising
    Σ rows·width + MICRO_BATCH_COST_TOKENS per group (exact, by dynamic programming), with
    rows·width <= max_tokens. Within a micro-batch rows keep their batch order, and columns
    past its last real token are trimmed. Each micro-batch carries `row_index` [b], the
    positions of its rows in `batch`, for callers that write results back by row. Losses are
    normalised by the whole batch (batch_norm), so the grouping changes float rounding only.
    """
    mask = batch["attention_mask"]
    B = mask.shape[0]
    if B % unit:
        raise ValueError(f"batch of {B} rows does not split into units of {unit}")
    lengths = mask.sum(1).view(-1, unit).amax(1).long().cpu()        # [B / unit]; the plan lives on the CPU
    order = torch.sort(lengths, descending=True, stable=True).indices  # longest unit first
    out = []
    for a, b in _length_groups(lengths[order].tolist(), max_tokens, unit):
        units = order[a:b].sort().values                              # batch order within the group
        rows = (units[:, None] * unit + torch.arange(unit)).flatten()  # [b]
        width = int(lengths[order[a]])
        mb = {k: _take(v, rows, width, mask.shape[1]) for k, v in batch.items()}
        mb["row_index"] = rows.to(mask.device)
        out.append(mb)
    return out


def _length_groups(widths: list[int], max_tokens: int, unit: int) -> list[tuple[int, int]]:
    """[a, b) cuts of units sorted by decreasing width: minimum Σ (b-a)·unit·widths[a] +
    MICRO_BATCH_COST_TOKENS over groups, each within max_tokens unless it is a single unit."""
    U = len(widths)
    best, cut = [0.0] + [float("inf")] * U, [0] * (U + 1)
    for b in range(1, U + 1):
        for a in range(b - 1, -1, -1):                                # group [a, b): widest is a
            size = (b - a) * unit * widths[a]
            if b - a > 1 and size > max_tokens:
                break                                                 # wider and longer further left
            cost = best[a] + size + MICRO_BATCH_COST_TOKENS
            if cost < best[b]:
                best[b], cut[b] = cost, a
    groups, b = [], U
    while b > 0:
        groups.append((cut[b], b))
        b = cut[b]
    return groups[::-1]


def _take(v, rows, width, T):
    if not torch.is_tensor(v):
        return v
    v = v[rows.to(v.device)]
    return v[:, :width] if v.dim() >= 2 and v.shape[1] == T else v


def needs_critic(algorithm, algo_cfg) -> bool:
    """True for an algorithm with a learned value function (PPO), which declares `needs_critic(cfg)`."""
    fn = getattr(algorithm, "needs_critic", None)
    return bool(fn is not None and fn(algo_cfg))


@torch.no_grad()
def critic_values(model, batch: dict, micro_batch_tokens: int = 16384) -> torch.Tensor:
    """V_old [B, T] of a batch before any update (PPO's GAE and value clip), zero where loss_mask
    is 0; `model` is a models.heads.ActorCritic. Micro-batched like Reference.score."""
    out = torch.zeros_like(batch["loss_mask"])
    for mb in split_micro_batches(batch, micro_batch_tokens):
        v = model.values(mb["input_ids"])                            # [b, w]
        out[mb["row_index"], :v.shape[1]] = v.to(out.dtype) * mb["loss_mask"]
    return out


@torch.no_grad()
def score_logprobs(model, batch: dict, temperature: float = 1.0, micro_batch_tokens: int = 16384) -> torch.Tensor:
    """logprobs [B, T] of a batch under `model` (no gradient), zero where loss_mask is 0 (the
    convention of old_logprobs), micro-batched by padded tokens: the reference's scores and the
    proximal logprobs of the off-policy correction."""
    out = torch.zeros_like(batch["loss_mask"])
    for mb in split_micro_batches(batch, micro_batch_tokens):
        lp, _ = sequence_logprobs(model, mb["input_ids"], temperature)
        out[mb["row_index"], :lp.shape[1]] = lp * mb["loss_mask"]
    return out


def correct_off_policy(model, batch: dict, mode: str, cap: float, temperature: float,
                       micro_batch_tokens: int = 16384) -> dict:
    """Decoupled off-policy correction (verl's 3-policy form), in place on `batch`:

    the samples were drawn by μ (behaviour logprobs, possibly `policy_version`s old). The
    trainer's current weights π_prox score them once (no gradient); the PPO ratio is then taken
    against π_prox (`old_logprobs` ← π_prox, so the clip acts on this update only) and the
    policy term is reweighted by w = π_prox/μ (algorithms/core.off_policy_weights), folded
    into the advantages: every loss here is homogeneous of degree 1 in A and w ≥ 0, so
    −min(r·wA, clip(r)·wA) = w·(−min(rA, clip(r)A)). KL and entropy terms are not reweighted.
    The behaviour logprobs stay in `behaviour_logprobs`.
    """
    from posttrain.algorithms.core import off_policy_weights
    prox = score_logprobs(model, batch, temperature, micro_batch_tokens)            # [B, T]
    w, metrics = off_policy_weights(prox, batch["old_logprobs"], batch["loss_mask"], mode, cap)
    batch["behaviour_logprobs"] = batch["old_logprobs"]
    batch["old_logprobs"] = prox
    batch["advantages"] = batch["advantages"] * w                                   # [B, T]
    return {k: float(v) for k, v in metrics.items()}


def policy_loss_fn(algorithm, algo_cfg, temperature: float):
    """The RL loss as the trainer sees it: recompute logprobs (sampler's temperature), call the
    algorithm, and measure the sampler/trainer mismatch on the same tokens.

    Critic hook (PPO, `needs_critic`): `model` is then a models.heads.ActorCritic; the same
    forward also gives V(s_t) [B, T], handed to the loss as `new_values` in a copy of the
    micro-batch. Every other algorithm takes the unchanged path."""
    from posttrain.algorithms.core import masked_mean
    with_critic = needs_critic(algorithm, algo_cfg)

    def loss_fn(model, mb, norm):
        if with_critic:                                              # ← critic hook (PPO only)
            if not hasattr(model, "logits_and_values"):
                from posttrain import UsageError
                raise UsageError("this algorithm learns a critic: train a models.heads.ActorCritic "
                                 "(recipes/rl.py builds one), not the bare policy")
            logits, values = model.logits_and_values(mb["input_ids"])
            lp, ent = logits_logprobs(logits, mb["input_ids"], temperature, with_entropy=True)
            mb = {**mb, "new_values": values}
        else:
            lp, ent = sequence_logprobs(model, mb["input_ids"], temperature, with_entropy=True)
        loss, metrics = algorithm.loss(lp, mb, algo_cfg, norm, ent)
        metrics["mismatch/logprob_abs"] = float(masked_mean((lp.detach() - mb["old_logprobs"]).abs(), mb["loss_mask"]))
        return loss, metrics
    return loss_fn


class Trainer:
    def __init__(self, model: torch.nn.Module, optim, total_steps: int, runtime=None):
        self.model, self.cfg, self.runtime = model, optim, runtime
        self.device = next(model.parameters()).device
        decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
        groups = [{"params": decay, "weight_decay": optim.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=optim.lr, betas=tuple(optim.betas), foreach=True)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, optim, total_steps))
        self.nonfinite_in_a_row = 0
        self.nonfinite_total = 0
        self.dp = None            # a distributed.data_parallel.DataParallel: this rank trains on its rows only

    def step(self, batch: dict, loss_fn, max_len: float | None = None, unit: int = 1) -> dict:
        """One optimizer step on `batch` (accumulating over micro-batches of whole `unit`s of
        rows: 2 for preference pairs)."""
        self.model.train()
        norm = batch_norm(batch["loss_mask"], max_len if max_len is not None else batch["loss_mask"].shape[1])
        if self.dp is not None:                                      # norm stays that of the GLOBAL batch
            batch = self.dp.shard(batch, unit)
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        maxes: dict[str, float] = {}
        total_loss = 0.0
        micro = split_micro_batches(batch, self.cfg.micro_batch_tokens, unit)
        if self.dp is not None:                                      # FSDP: as many forwards on every rank
            micro = self.dp.even_out(micro)
        for mb in micro:
            ctx = self.runtime.autocast() if self.runtime else torch.autocast("cpu", enabled=False)
            with ctx:
                loss, metrics = loss_fn(self.model, mb, norm)
            loss.backward()                                          # the one backward of the project
            total_loss += float(loss.detach())
            share = float(mb["loss_mask"].sum()) / max(norm["tokens"], 1.0)
            for k, v in metrics.items():
                v = float(v)
                if k.endswith("/max"):
                    maxes[k] = max(maxes.get(k, -math.inf), v)
                else:
                    sums[k] = sums.get(k, 0.0) + share * v          # token-weighted mean over micro-batches
        if self.dp is not None:                                      # Σ over ranks, once
            self.dp.reduce_grads([p for p in self.model.parameters() if p.requires_grad])
            total_loss, sums, maxes = self.dp.reduce_metrics(total_loss, sums, maxes)
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        real = sum(float(mb["attention_mask"].sum()) for mb in micro)  # this rank's tokens
        padded = sum(mb["attention_mask"].numel() for mb in micro)
        out = {**sums, **maxes, "loss": total_loss, "grad/norm": grad_norm,
               "lr": self.scheduler.get_last_lr()[0], "train/micro_batches": len(micro),
               "train/tokens": real, "train/padded_tokens": float(padded),   # real ones; as computed
               "train/pad_frac": 1.0 - real / max(padded, 1)}
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
        with warnings.catch_warnings():   # a skipped step still advances the schedule
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()
        out["train/nonfinite_total"] = float(self.nonfinite_total)
        return out

    def train(self, batch: dict, loss_fn, epochs: int = 1, minibatches: int = 1,
              max_len: float | None = None) -> dict:
        """`epochs` passes over `batch` split into `minibatches` optimizer steps (PPO-style reuse).

        Only the first step sees weights equal to the sampler's, so `mismatch/*` is taken from
        it; other metrics are averaged over steps (`*/max` takes the max).
        """
        B = batch["loss_mask"].shape[0]
        if minibatches > B:
            from posttrain import UsageError
            raise UsageError(f"minibatches={minibatches} exceeds the {B} samples of a step; lower it")
        bounds = [round(i * B / minibatches) for i in range(minibatches + 1)]
        steps = []
        for _ in range(epochs):
            for a, b in zip(bounds[:-1], bounds[1:]):
                steps.append(self.step({k: v[a:b] for k, v in batch.items()}, loss_fn, max_len))
        out = {}
        for k in steps[0]:
            vals = [m[k] for m in steps if k in m]
            out[k] = max(vals) if k.endswith("/max") else (vals[0] if k.startswith("mismatch/") else sum(vals) / len(vals))
        out["train/optimizer_steps"] = float(len(steps))
        return out

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "nonfinite_total": self.nonfinite_total}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.nonfinite_total = state.get("nonfinite_total", 0)


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
        from posttrain import UsageError
        raise UsageError(f"optim.schedule={cfg.schedule!r} is unknown; use constant, cosine or linear")
    return cfg.min_lr_frac + (1 - cfg.min_lr_frac) * decay
