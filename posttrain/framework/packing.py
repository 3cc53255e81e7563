"""Packed micro-batches: the trainer's and the reference's forward on real tokens (issue 33).

A padded micro-batch [b, w] computes b·w tokens, most of them padding when answers vary in
length. Packed, its sequences are laid end to end in R rows of capacity C (the longest sequence
w, or `optim.packing_width` when wider), first fit by decreasing length, so only each row's tail
is padding:

    padded [b, w]                     packed [R, W]      (R ≤ b, W ≤ C: the fullest row)
    a a a a a a . .                   a a a a a a c c
    b b b . . . . .                   b b b d d d d .
    c c . . . . . .
    d d d d . . . .

Attention stays inside a sequence (a block-diagonal causal mask built from sequence ids,
`seq_id` [R, W]: dense [R, 1, W, W], flex's BlockMask or varlen's spans, models/attention.py) and rotary positions
restart at 0 for each sequence, so every token sees what it saw padded; the row tail is its own
block (a fully masked query row would give NaN). The
model runs on the packed rows (`model.hidden(ids, positions=, attn_mask=)`), and its per-token
outputs are gathered back into the micro-batch's padded [b, w] layout (`Packed.unpack`), so
the losses, the masks and everything downstream read the batch as before. Per token the same
numbers as padded, up to float rounding (≤1e-5 in fp32: tests/test_packing.py).

The plan lives in ONE tensor the micro-batch carries, `pack_index` [b, w, 2]: the packed (row,
column) of token (i, t), -1 on padding. `split_micro_batches(..., packed=True)`
(framework/batch.py) cuts a batch into micro-batches of at most `max_tokens` COMPUTED tokens
(R·W) and sets it; every forward that receives a micro-batch with a `pack_index` runs packed
(framework/logprobs.micro_logprobs), one without runs padded.

What it buys. The padded split already groups rows of similar lengths (framework/batch.py), so on
a realistic GRPO batch it computes only ~3% padding at the CPU's many narrow micro-batches, and
packed rows as wide as the longest sequence barely improve on that: two sequences longer than
half the row never share it (benchmarks/results/packing.json). Rows wider than the longest
sequence (`optim.packing_width`) fill up, at an attention cost with the dense mask: each row
attends over W² where a padded causal row costs w²/2. Flex attention (`optim.packing_attention`,
auto on CUDA) skips the 128 × 128 tiles the mask hides, so a row of short sequences costs about
what they cost padded plus the tiles their diagonals cross (benchmarks/packing.py counts both);
torch has no flex backward on the CPU, where training stays dense. Varlen (`optim.packing_attention=
varlen`: torch's Flash Attention over the rows flattened and cut at each sequence, cu_seqlens as
flash-attn's) computes no score across sequences at all; CUDA and bf16 only, chosen by name.
Others: TRL's `padding_free` and verl's `use_remove_padding` pack a micro-batch into one row
(flash varlen on CUDA); prime-rl packs samples into fixed-length rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.attention.flex_attention import BlockMask

from posttrain.models.attention import Varlen, auto_kernel, document_mask, kernel


def _place(fill: list[int], n: int, width: int) -> tuple[int, int]:
    """Put a sequence of n tokens in the first row of `fill` (tokens used per row) with room,
    or a new row: its (row, offset)."""
    row = next((r for r, f in enumerate(fill) if f + n <= width), len(fill))
    if row == len(fill):
        fill.append(0)
    fill[row] += n
    return row, fill[row] - n


def first_fit(lengths: list[int], width: int) -> list[tuple[int, int]]:
    """(row, offset) of each length, placed first fit in that order into rows of `width`
    (lengths in decreasing order: first-fit decreasing, within 11/9 of the fewest rows + 1)."""
    fill: list[int] = []
    return [_place(fill, n, width) for n in lengths]


def _order(lengths: list[int], unit: int) -> list[int]:
    """Rows in packing order: units (`unit` consecutive rows, kept whole) by decreasing longest
    row, ties in batch order; within a unit, rows by decreasing length."""
    units = sorted(range(len(lengths) // unit), key=lambda u: -max(lengths[u * unit : (u + 1) * unit]))
    return [r for u in units for r in sorted(range(u * unit, (u + 1) * unit), key=lambda r: -lengths[r])]


def plan_groups(lengths: list[int], max_tokens: int, unit: int = 1, cost: int = 0, width: int = 0) -> list[list[int]]:
    """Micro-batches of packed rows: the units in packing order (`_order`) cut into consecutive
    groups, each first-fit into rows of capacity max(its first (longest) unit, `width`),
    minimising Σ R·W (rows × the fullest row) + `cost` per group (exact, by dynamic programming;
    `cost` is the fixed price of one more micro-batch), with R·W ≤ max_tokens unless a group is one
    unit. Returns each group's units. At `width` 0 every padded grouping is a candidate and packs
    into no more rows, so the plan never computes more than the padded one (batch._length_groups)."""
    rows = _order(lengths, unit)
    U = len(rows) // unit
    best, cut = [0.0] + [float("inf")] * U, [0] * (U + 1)
    for a in range(U):  # best[a] is final: every group ending at a starts further left
        capacity, fill = max(lengths[rows[a * unit]], width), list[int]()
        for b in range(a + 1, U + 1):  # group [a, b): units a..b-1 placed in order
            for r in rows[(b - 1) * unit : b * unit]:
                _place(fill, lengths[r], capacity)
            size = len(fill) * max(fill)
            if b - a > 1 and size > max_tokens:
                break  # longer groups only add rows
            if best[a] + size + cost < best[b]:
                best[b], cut[b] = best[a] + size + cost, a
    groups, b = [], U
    while b > 0:
        groups.append([rows[u * unit] // unit for u in range(cut[b], b)])
        b = cut[b]
    return groups[::-1]


def pack_index(attention_mask: torch.Tensor, unit: int = 1, width: int = 0) -> torch.Tensor:
    """pack_index [b, w, 2] of a right-padded micro-batch: the packed (row, column) of each token,
    its rows first-fit in packing order (`_order`: as `plan_groups` counted them) into rows of
    capacity max(w, width); -1 on padding."""
    b, w = attention_mask.shape
    lengths = attention_mask.sum(1).long().tolist()  # the plan lives on the CPU
    order = _order(lengths, unit)
    index = torch.full((b, w, 2), -1, dtype=torch.long)
    for i, (row, offset) in zip(order, first_fit([lengths[i] for i in order], max(w, width))):
        index[i, : lengths[i], 0] = row
        index[i, : lengths[i], 1] = offset + torch.arange(lengths[i])
    return index.to(attention_mask.device)


def packed_shape(index: torch.Tensor) -> tuple[int, int]:
    """(R, W) of a pack_index: the rows, and the fullest row's tokens."""
    R, W = (index.reshape(-1, 2).amax(0) + 1).tolist()
    return R, W


def computed_tokens(fields: dict) -> int:
    """The tokens a micro-batch's forward computes (its fields by name): R·W packed, b·w padded."""
    index = fields.get("pack_index")
    if index is None:
        return fields["attention_mask"].numel()
    R, W = packed_shape(index)
    return R * W


def sequence_ids(index: torch.Tensor) -> torch.Tensor:
    """seq_id [R, W] of a pack_index [b, w, 2]: the micro-batch row each packed token comes from,
    -1 in the rows' tails (each tail its own sequence: a fully masked query row would give NaN)."""
    R, W = packed_shape(index)
    real = index[..., 0] >= 0  # [b, w]
    seq_id = torch.full((R, W), -1, dtype=torch.long, device=index.device)
    rows = torch.arange(index.shape[0], device=index.device)[:, None].expand(index.shape[:2])  # [b, w]
    seq_id[index[..., 0][real], index[..., 1][real]] = rows[real]
    return seq_id


@dataclass(frozen=True)
class Packed:
    """The packed forward's inputs, made from a micro-batch's ids [b, w] and pack_index [b, w, 2]."""

    ids: torch.Tensor  # [R, W] the sequences end to end, 0 in the row tails
    positions: torch.Tensor  # [R, W] long, restarting at 0 per sequence (and in the tail)
    mask: torch.Tensor | BlockMask | Varlen  # key s visible to query t (same sequence, s ≤ t): models/attention.py
    seq_id: torch.Tensor  # [R, W] long: each token's row in the micro-batch, -1 in the row tails
    gather: torch.Tensor  # [b, w] long: where token (i, t)'s output sits in [R·W] (0 on padding)
    first: torch.Tensor  # [b, w] bool: column 0 of each row and its padding, where outputs are 0

    @classmethod
    def build(
        cls, input_ids: torch.Tensor, index: torch.Tensor, attention: str = "dense", compiled: bool = False
    ) -> Packed:
        """`attention`: the mask's kernel, dense, flex or varlen (models/attention.py); "auto" by the
        device and `compiled`, whether the trunk that reads the mask runs compiled (flex only then)."""
        b, w = input_ids.shape
        R, W = packed_shape(index)
        real = index[..., 0] >= 0  # [b, w]
        dev = input_ids.device
        flat = (index[..., 0] * W + index[..., 1])[real]  # [n] real tokens' packed slots
        ids = torch.zeros(R * W, dtype=input_ids.dtype, device=dev)
        ids[flat] = input_ids[real]
        pos = torch.arange(w, device=dev).expand(b, w)  # [b, w] position within the sequence
        seq_id = sequence_ids(index)  # [R, W]
        tail = (seq_id >= 0).sum(1, keepdim=True)  # [R, 1] where each row's tail starts
        positions = (torch.arange(W, device=dev) - tail).clamp(min=0).view(-1)  # the tail from 0
        positions[flat] = pos[real]
        positions = positions.view(R, W)
        choice = auto_kernel(dev, compiled) if attention == "auto" else attention
        mask = document_mask(seq_id, kernel(choice, dev))  # [R, 1, W, W], its BlockMask or Varlen
        gather = (index[..., 0] * W + index[..., 1]).clamp(min=0)  # [b, w]
        return cls(ids.view(R, W), positions, mask, seq_id, gather, ~real | (pos == 0))

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """Per-position outputs [R, W] aligned as logprobs (column c: the prediction of the packed
        token c) → [b, w] in the padded layout: column 0 of each sequence (no prediction inside
        it) and its padding hold 0, as sequence_logprobs gives them padded."""
        out = x.reshape(-1)[self.gather]  # [b, w]
        return out.masked_fill(self.first, 0.0)
