"""The batch of an RL step: `RolloutBatch`, the one collate function, and micro-batches
(docs/architecture.md §3).

`collate_samples` turns samples into a `RolloutBatch` of padded tensors:

    input_ids       [B, T]  prompt + response, right-padded
    attention_mask  [B, T]  1 on real tokens
    loss_mask       [B, T]  1 only on policy-generated response tokens (response_mask = 1)
    old_logprobs    [B, T]  behaviour logprobs recorded at sampling, 0 where loss_mask is 0
    rewards, group_index, policy_version, truncated   [B]

Each later role adds its fields to a NEW batch (`dataclasses.replace`): the reference
`ref_logprobs`, the critic hook `values`, the algorithm `advantages` (and `returns` with a
critic), the off-policy correction `behaviour_logprobs` with new `old_logprobs` and
`advantages`. The dataclass is frozen and nothing writes into its tensors, so a loss reads a
batch and leaves it as it was (tests/test_batch.py checks every registered algorithm).

Alignment: logprobs[:, t] = log π(input_ids[:, t] | input_ids[:, :t]), so response token j
of a sample with prompt length P sits at column P + j with its logprob in the same column.

The trainer also runs the batches of pretraining, SFT, reward models and DPO, which are plain
dicts of tensors; `split_micro_batches`, `view`, `map_batch` and `with_fields` take either kind.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, overload

import torch

from posttrain.framework.packing import pack_index, packed_shape, plan_groups
from posttrain.runtime import MicroBatches


@dataclass(frozen=True, kw_only=True, eq=False)
class RolloutBatch:
    """The tensors of one RL step, rows = samples. Only `loss_mask` is required: a loss reads
    `loss_mask`, `old_logprobs`, `advantages` and whatever its algorithm needs, so a batch
    built by hand for a loss (tests, lessons) holds just those; `collate_samples` fills every
    field of its table. Fields left out are None."""

    loss_mask: torch.Tensor  # [B, T] 1 on policy-sampled response tokens
    input_ids: torch.Tensor | None = None  # [B, T] long, prompt + response, right-padded
    attention_mask: torch.Tensor | None = None  # [B, T] 1 on real tokens
    old_logprobs: torch.Tensor | None = None  # [B, T] behaviour (or, corrected, proximal) logprobs
    rewards: torch.Tensor | None = None  # [B]
    group_index: torch.Tensor | None = None  # [B] long: the prompt a sample answers
    policy_version: torch.Tensor | None = None  # [B] long: the weights that sampled it
    truncated: torch.Tensor | None = None  # [B] bool: cut by the length cap (DAPO's mask_truncated)
    ref_logprobs: torch.Tensor | None = None  # [B, T] the reference's (KL term)
    values: torch.Tensor | None = None  # [B, T] V_old from the critic hook (PPO)
    advantages: torch.Tensor | None = None  # [B, T] (or [B] in a hand-built batch), 0 off the mask
    returns: torch.Tensor | None = None  # [B, T] the value target A + V_old (PPO)
    behaviour_logprobs: torch.Tensor | None = None  # [B, T] the sampler's, once the correction moved them
    new_values: torch.Tensor | None = None  # [b, w] V with gradient: the trainer's forward (PPO)
    row_index: torch.Tensor | None = None  # [b] a micro-batch's rows in the batch it came from
    pack_index: torch.Tensor | None = None  # [b, w, 2] long: a packed micro-batch's plan (framework/packing.py)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The fields that are present, by name."""
        return {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not None}

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> RolloutBatch:
        """A new batch with `fn` applied to every present field."""
        return dataclasses.replace(self, **{k: fn(v) for k, v in self.tensors().items()})


Batch = RolloutBatch | dict  # a RolloutBatch, or a dict batch of the other stages


def view(batch: Batch) -> dict[str, Any]:
    """The batch's values by name, to read (a RolloutBatch's present fields, or the dict itself)."""
    return batch.tensors() if isinstance(batch, RolloutBatch) else batch


@overload
def map_batch(batch: RolloutBatch, fn: Callable[[torch.Tensor], torch.Tensor]) -> RolloutBatch: ...
@overload
def map_batch(batch: dict, fn: Callable[[torch.Tensor], torch.Tensor]) -> dict: ...
def map_batch(batch: Batch, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
    """A new batch of the same kind with `fn` applied to every tensor (other dict values kept)."""
    if isinstance(batch, RolloutBatch):
        return batch.map(fn)
    return {k: fn(v) if torch.is_tensor(v) else v for k, v in batch.items()}


@overload
def to_device(batch: RolloutBatch, device) -> RolloutBatch: ...
@overload
def to_device(batch: dict, device) -> dict: ...
def to_device(batch: Batch, device) -> Batch:
    """The batch on the model's device: the one move of a stage's batches, made where the
    stage hands a batch built on the CPU to the model (docs/architecture.md §12, the device
    boundary). A tensor already there is not copied, so on the CPU this changes nothing."""
    return map_batch(batch, lambda v: v.to(device))


def with_fields(batch: Batch, **values: torch.Tensor) -> Batch:
    """A new batch of the same kind with these fields set (dataclasses.replace, or a new dict)."""
    return dataclasses.replace(batch, **values) if isinstance(batch, RolloutBatch) else {**batch, **values}


def collate(
    prompts: list[list[int]],
    responses: list[list[int]],
    pad_id: int,
    mask_prompt: bool = True,
    response_masks: list[list[int]] | None = None,
) -> dict:
    """Right-padded `input_ids`, `attention_mask` and `loss_mask` [B, T].

    loss_mask[:, t] = 1 when input_ids[:, t] is a token to learn: the response tokens whose
    response_mask is 1 (and, without prompt masking, the prompt after its first token).
    """
    T = max(len(p) + len(r) for p, r in zip(prompts, responses))
    B = len(prompts)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros(B, T)
    loss = torch.zeros(B, T)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        P, n = len(p), len(p) + len(r)
        ids[i, :n] = torch.tensor(p + r, dtype=torch.long)
        attn[i, :n] = 1
        if response_masks is not None:
            loss[i, P:n] = torch.tensor(response_masks[i], dtype=torch.float)
        else:
            loss[i, (P if mask_prompt else 1) : n] = 1
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}


def collate_samples(samples, pad_id: int) -> RolloutBatch:
    padded = collate(
        [s.prompt_ids for s in samples],
        [s.response_ids for s in samples],
        pad_id,
        response_masks=[s.response_mask for s in samples],
    )
    mask = padded["loss_mask"]  # [B, T]
    old = torch.zeros_like(mask)
    for i, s in enumerate(samples):
        P = len(s.prompt_ids)
        old[i, P : P + len(s.response_ids)] = torch.tensor(s.response_logprobs, dtype=torch.float)
    return RolloutBatch(
        input_ids=padded["input_ids"],
        attention_mask=padded["attention_mask"],
        loss_mask=mask,
        old_logprobs=old * mask,
        rewards=torch.tensor([s.reward for s in samples], dtype=torch.float),
        group_index=torch.tensor([s.group for s in samples], dtype=torch.long),
        policy_version=torch.tensor([s.policy_version for s in samples], dtype=torch.long),
        truncated=torch.tensor([s.finish_reason == "length" for s in samples], dtype=torch.bool),
    )


# ----------------------------------------------------------------------------- micro-batches

# The fixed cost of one more micro-batch (one more forward and backward: its kernel launches, the
# logit chunks' per-chunk work, the host reads between micro-batches) in token-equivalents, per
# device: split_micro_batches cuts rows into another micro-batch only where that saves more padded
# tokens than this. CPU: ~5 ms of launches ≈ 100-200 tokens of the nano model. CUDA: measured on one
# H200 (issue 43, ../shared/gpu/h200_2026-11-28, Qwen2.5-0.5B's shape in bf16): a micro-batch of
# ~3,100 tokens took ~250 ms where its matmuls take ~30 ms at 40% of the card's 800 TFLOP/s, so
# ~220 ms of it is fixed, ~23,000 token-equivalents at that rate; 16,384 after this removal
# of per-micro-batch host reads. At a budget below it the split cuts the fewest micro-batches that
# fit and pads them; benchmarks/gpu_part3.py (part cost) measures it again (train time against
# micro-batch count at equal tokens). Any other device (a test's fakegpu) is priced as the CPU.
MICRO_BATCH_COST_TOKENS = 128
CUDA_MICRO_BATCH_COST_TOKENS = 16384


def micro_batch_cost(device) -> int:
    """The fixed cost of one micro-batch on `device`, in token-equivalents (the constants above)."""
    return CUDA_MICRO_BATCH_COST_TOKENS if torch.device(device).type == "cuda" else MICRO_BATCH_COST_TOKENS


def budgets(setting: int | str, runtime=None) -> MicroBatches:
    """optim.micro_batch_tokens as the forwards read it: a number is the trainer's budget and its
    no-gradient passes' (the reference keeps its own, 16,384, as before); `auto` is what the run
    resolved for its device (`runtime.micro_batches`: sizing/run_memory.auto_budgets), the numbers
    from before auto (the CPU's) where nothing was resolved."""
    if setting == "auto":
        resolved = getattr(runtime, "micro_batches", None)
        return resolved if resolved is not None else MicroBatches()
    return MicroBatches(train=int(setting), score=int(setting))


@overload
def split_micro_batches(
    batch: RolloutBatch, max_tokens: int, unit: int = 1, packed: bool = False, pack_width: int = 0
) -> list[RolloutBatch]: ...
@overload
def split_micro_batches(
    batch: dict, max_tokens: int, unit: int = 1, packed: bool = False, pack_width: int = 0
) -> list[dict]: ...
def split_micro_batches(
    batch: Batch, max_tokens: int, unit: int = 1, packed: bool = False, pack_width: int = 0
) -> list[Any]:
    """Micro-batches of at most `max_tokens` computed tokens (at least one unit), rows grouped by
    length so that little padding is computed.

    `packed`: the sequences of a micro-batch are laid end to end in rows (framework/packing.py),
    groups chosen as below with the packed rows' tokens as the cost (`plan_groups`), rows of at
    least `pack_width` tokens; each micro-batch whose rows share packed rows carries its plan,
    `pack_index` [b, w, 2], and its forwards run packed (one whose rows do not runs padded: the
    same tokens, and causal attention without a mask). Otherwise:

    Rows go in units of `unit` (2 keeps a preference pair's chosen and rejected together).
    Units are sorted by length, longest first, and cut into consecutive groups minimising
    Σ rows·width + the device's cost of a micro-batch per group (`micro_batch_cost`: 128 tokens on
    the CPU, 16,384 on CUDA; exact, by dynamic programming), with
    rows·width <= max_tokens. Within a micro-batch rows keep their batch order, and columns
    past its last real token are trimmed. Each micro-batch carries `row_index` [b], the
    positions of its rows in `batch`, for callers that write results back by row. Losses are
    normalised by the whole batch (batch_norm), so the grouping changes float rounding only.
    A RolloutBatch gives RolloutBatches, a dict gives dicts.
    """
    mask = view(batch)["attention_mask"]
    B = mask.shape[0]
    if B % unit:
        raise ValueError(f"batch of {B} rows does not split into units of {unit}")
    lengths = mask.sum(1).view(-1, unit).amax(1).long().cpu()  # [B / unit]; the plan lives on the CPU
    order = torch.sort(lengths, descending=True, stable=True).indices  # longest unit first
    cost = micro_batch_cost(mask.device)
    if packed:
        plan = plan_groups(mask.sum(1).long().tolist(), max_tokens, unit, cost, pack_width)
        groups = [torch.tensor(g) for g in plan]
    else:
        groups = [order[a:b] for a, b in _length_groups(lengths[order].tolist(), max_tokens, unit, cost)]
    units = [group.sort().values for group in groups]  # batch order within each group
    rows = [(u[:, None] * unit + torch.arange(unit)).flatten() for u in units]  # [b] each
    # the row indices reach the device in one copy (a copy per field and micro-batch was a sync each on CUDA)
    on_device = torch.cat(rows).to(mask.device).split([len(r) for r in rows]) if rows else ()
    out: list[Any] = []
    for u, r, r_dev in zip(units, rows, on_device):
        width = int(lengths[u].max())
        mb = map_batch(batch, functools.partial(_take, rows=r, width=width, T=mask.shape[1], moved=r_dev))
        mb = with_fields(mb, row_index=r_dev)
        index = pack_index(view(mb)["attention_mask"], unit, pack_width) if packed else None
        if index is not None and packed_shape(index)[0] < len(r):  # rows shared: else padded is the same
            mb = with_fields(mb, pack_index=index)
        out.append(mb)
    return out


def _length_groups(widths: list[int], max_tokens: int, unit: int, cost: int) -> list[tuple[int, int]]:
    """[a, b) cuts of units sorted by decreasing width: minimum Σ (b-a)·unit·widths[a] + `cost` over
    groups, each within max_tokens unless it is a single unit."""
    U = len(widths)
    best, cut = [0.0] + [float("inf")] * U, [0] * (U + 1)
    for b in range(1, U + 1):
        for a in range(b - 1, -1, -1):  # group [a, b): widest is a
            size = (b - a) * unit * widths[a]
            if b - a > 1 and size > max_tokens:
                break  # wider and longer further left
            total = best[a] + size + cost
            if total < best[b]:
                best[b], cut[b] = total, a
    groups, b = [], U
    while b > 0:
        groups.append((cut[b], b))
        b = cut[b]
    return groups[::-1]


def _take(v: torch.Tensor, rows: torch.Tensor, width: int, T: int, moved: torch.Tensor | None = None) -> torch.Tensor:
    """Rows `rows` of one tensor, its time axis (dim 1 of length T) cut to `width` columns; `moved`:
    the same rows already on the batch's device."""
    v = v[moved if moved is not None and moved.device == v.device else rows.to(v.device)]
    return v[:, :width] if v.dim() >= 2 and v.shape[1] == T else v
