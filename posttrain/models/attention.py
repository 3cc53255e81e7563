"""Attention over packed rows: the one seam between a packed micro-batch and a model's attention.

A packed row holds several sequences end to end (framework/packing.py); each token may attend
only to earlier tokens of its own sequence. That is a document-causal mask, and there are two
ways to hand it to the attention kernel, chosen by `optim.packing_attention`:

    dense   a bool mask [R, 1, W, W] through F.scaled_dot_product_attention: every row costs
            W² scores, the masked ones included (what a padded causal row of w tokens costs is w²/2)
    flex    a flex-attention BlockMask (torch.nn.attention.flex_attention): the mask in tiles of
            `block` × `block`; tiles with no visible key are skipped, so a row of k short
            sequences costs about Σ wᵢ² / 2 plus the tiles the diagonal crosses

`auto` is flex on CUDA and dense elsewhere: torch's flex attention has no backward on the CPU
(its forward there is a reference that computes every score), so training on the CPU stays
dense. On CUDA the kernel is `torch.compile(flex_attention)`, compiled once per process at its
first use (the Triton template; eager flex would materialise the scores).

The interface: framework/packing.py makes the mask, gpt_mini's Attention calls `attend`, and
transformers models call `hf_attention` (models/hf.py installs it as their attention function
"posttrain": transformers' own sdpa function for every other mask):

    chosen(model)                   -> "auto" | "dense" | "flex"  (the model's packing_attention)
    kernel(choice, device)          -> "dense" | "flex"       ("auto" resolved for a device)
    check(choice, device)           -> choice, or UsageError for flex off CUDA (recipes/common.Run)
    document_mask(seq_id, kernel)   -> bool [R, 1, W, W] | BlockMask   (seq_id [R, W]: one id
                                       per sequence; a row's tail is one more sequence of its own;
                                       the BlockMask's tiles from `document_tiles`, O(R·(W/128)²))
    attend(q, k, v, mask)           -> [B, H, T, hd]         (mask None: causal; GQA: k, v have
                                       Hkv heads, H a multiple of them)
    use_in_hf(hf_model)             installs `hf_attention` in a transformers model loaded with sdpa
    hf_mask(hf_model, mask)         -> mask, or UsageError for a BlockMask its attention cannot read
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from posttrain import UsageError

KERNELS = ("auto", "dense", "flex")
BLOCK = 128  # flex's tile (queries × keys); its Triton kernels are tuned for 128
_compiled = None  # torch.compile(flex_attention): made once, at the first CUDA call


def kernel(choice: str, device: torch.device | str) -> str:
    """The kernel `choice` (optim.packing_attention) names on `device`: auto = flex on CUDA."""
    if choice not in KERNELS:
        raise UsageError(f"optim.packing_attention={choice!r} is unknown; use one of {list(KERNELS)}")
    if choice == "auto":
        return "flex" if torch.device(device).type == "cuda" else "dense"
    return choice


def check(choice: str, device: torch.device | str) -> str:
    """`choice` when a run on `device` can train with it: flex needs CUDA (no backward on the CPU)."""
    if kernel(choice, device) == "flex" and torch.device(device).type != "cuda":
        raise UsageError(
            "optim.packing_attention=flex needs CUDA (torch's flex attention has no backward on the CPU); use auto or dense"
        )
    return choice


def chosen(model) -> str:
    """The kernel choice a model carries (`model.packing_attention`, set from optim.packing_attention
    by recipes/common.init_model; deep copies such as the reference keep it): auto when unset."""
    return getattr(model, "packing_attention", "auto")


def document_mask(seq_id: torch.Tensor, kernel: str = "dense", block: int = BLOCK) -> torch.Tensor | BlockMask:
    """Key s visible to query t iff both belong to the same sequence and s ≤ t, from seq_id [R, W]:
    dense, a bool [R, 1, W, W]; flex, a BlockMask of `block`-sized tiles over the same mask."""
    R, W = seq_id.shape
    if kernel == "dense":
        causal = torch.ones(W, W, dtype=torch.bool, device=seq_id.device).tril()  # [W, W]
        return ((seq_id[:, :, None] == seq_id[:, None, :]) & causal).unsqueeze(1)  # [R, 1, W, W]

    def same_sequence_causal(b, h, q, kv):
        return (seq_id[b, q] == seq_id[b, kv]) & (kv <= q)

    partial, full = document_tiles(seq_id, block)  # [R, n, n] each
    kv_num, kv_index = _ordered(partial)
    full_num, full_index = _ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_index, full_num, full_index, block, same_sequence_causal, seq_lengths=(W, W)
    )


def document_tiles(seq_id: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """The tiles of document-causal rows seq_id [R, W] (each sequence contiguous), from the
    sequences' spans alone, never the [R, W, W] mask (create_block_mask evaluates every pair:
    gigabytes at rows of 32k tokens): (partial, full) bool [R, n, n], query tile × key tile, n = ⌈W /
    block⌉. With doc [R, W] the row's sequences numbered in order, key tile j < query tile i shows a
    key iff j's last doc is i's first; it is full iff j's first doc is i's last and both tiles are
    whole; a diagonal tile is always partial (causal inside it)."""
    R, W = seq_id.shape
    dev = seq_id.device
    doc = F.pad((seq_id[:, 1:] != seq_id[:, :-1]).long().cumsum(1), (1, 0))  # [R, W] non-decreasing
    n = -(-W // block)
    starts = torch.arange(n, device=dev) * block  # [n]
    ends = (starts + block).clamp(max=W) - 1
    lo, hi = doc[:, starts], doc[:, ends]  # [R, n] first and last doc of each tile
    i, j = torch.arange(n, device=dev)[:, None], torch.arange(n, device=dev)[None, :]  # query, key tile
    whole = (ends - starts + 1 == block)[:, None] & (ends - starts + 1 == block)[None, :]  # [n, n]
    below = j < i
    full = below & whole & (lo[:, None, :] == hi[:, :, None])  # [R, n, n]
    seen = (below & (hi[:, None, :] == lo[:, :, None])) | (i == j)
    return seen & ~full, full


def _ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A BlockMask's (num_blocks [R, 1, n], indices [R, 1, n, n]) of tile bools [R, n, n]: per query
    tile, how many key tiles, and which, those first."""
    num = tiles.sum(-1, dtype=torch.int32)  # [R, n]
    index = torch.argsort(tiles.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return num.unsqueeze(1), index.unsqueeze(1)


def repeat_kv(kv: torch.Tensor, heads: int) -> torch.Tensor:
    """k or v [B, Hkv, S, hd] repeated to `heads` query heads (grouped-query attention)."""
    rep = heads // kv.shape[1]
    return kv if rep == 1 else kv.repeat_interleave(rep, dim=1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None, scale: float | None = None) -> torch.Tensor:
    """Attention of q [B, H, T, hd] over k, v [B, Hkv, S, hd]: causal when `mask` is None, a bool
    mask [B, 1, T, S] (True = attend) through sdpa, or a BlockMask through flex attention."""
    if isinstance(mask, BlockMask):
        return flex(q, k, v, mask, scale)
    H = q.shape[1]
    return F.scaled_dot_product_attention(
        q, repeat_kv(k, H), repeat_kv(v, H), attn_mask=mask, is_causal=mask is None, scale=scale
    )


def flex(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: BlockMask, scale: float | None = None
) -> torch.Tensor:
    """flex_attention of q [B, H, T, hd] over k, v [B, Hkv, T, hd] under `mask`: compiled on CUDA
    (compiled with the model's forward when that is), torch's eager reference elsewhere (forward
    only: it has no backward on the CPU)."""
    global _compiled
    gqa = q.shape[1] != k.shape[1]
    if q.device.type != "cuda" or torch.compiler.is_compiling():  # inside a compiled forward: traced with it
        return flex_attention(q, k, v, block_mask=mask, scale=scale, enable_gqa=gqa)  # type: ignore[return-value]
    if _compiled is None:
        _compiled = torch.compile(flex_attention)  # shapes vary per micro-batch: dynamic after the second
    return _compiled(q, k, v, block_mask=mask, scale=scale, enable_gqa=gqa)


HF_NAME = "posttrain"  # the transformers attention function (and mask maker) models/hf.py installs


def hf_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers' attention function "posttrain": its sdpa function for every mask it makes or is
    given, flex attention for a packed micro-batch's BlockMask. Returns ([B, T, H, hd], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not isinstance(attention_mask, BlockMask):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    extra = [k for k in ("softcap", "s_aux", "position_bias") if kwargs.get(k) is not None]
    if extra or dropout > 0:
        what = extra[0] if extra else "dropout"
        raise UsageError(
            f"{type(module).__name__}: packed flex attention does not apply {what}; set optim.packing_attention=dense"
        )
    return flex(query, key, value, attention_mask, scaling).transpose(1, 2).contiguous(), None  # [B, T, H, hd]


def hf_mask(hf_model, mask):
    """`mask` as a transformers model's forward takes it: a BlockMask only where `hf_attention` reads it."""
    impl = hf_model.config._attn_implementation
    if isinstance(mask, BlockMask) and impl != HF_NAME:
        raise UsageError(
            f"{type(hf_model).__name__} runs attn_implementation={impl!r}, which cannot read flex masks: load it "
            "with sdpa, or set optim.packing_attention=dense"
        )
    return mask


def use_in_hf(hf_model) -> None:
    """Let a transformers model read packed rows' BlockMasks: a model loaded with sdpa attention
    switches to "posttrain" (`hf_attention`: the same sdpa call and masks for everything else)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(HF_NAME, hf_attention)
    AttentionMaskInterface.register(HF_NAME, sdpa_mask)
    if hf_model.config._attn_implementation == "sdpa":
        hf_model.config._attn_implementation = HF_NAME
