"""Attention over packed rows: the one seam between a packed micro-batch and a model's attention.

A packed row holds several sequences end to end (framework/packing.py); each token may attend
only to earlier tokens of its own sequence. That is a document-causal mask, and there are three
ways to hand it to the attention kernel, chosen by `optim.packing_attention`:

    dense   a bool mask [R, 1, W, W] through F.scaled_dot_product_attention: every row costs
            W² scores, the masked ones included (what a padded causal row of w tokens costs is w²/2)
    flex    a flex-attention BlockMask (torch.nn.attention.flex_attention): the mask in tiles of
            `block` × `block`; tiles with no visible key are skipped, so a row of k short
            sequences costs about Σ wᵢ² / 2 plus the tiles the diagonal crosses
    varlen  the rows flattened to R·W tokens cut at each sequence (`Varlen`: cu_seqlens, max_len)
            through torch's Flash Attention for variable lengths (torch.nn.attention.varlen: what
            TRL's padding_free and verl's use_remove_padding run as flash-attn's varlen kernel):
            Σ wᵢ² / 2, no tiles across sequences; CUDA, bf16/fp16 only

`auto` never picks a kernel slower than padded rows: flex on CUDA when the trunk is compiled
(`optim.compile`: the flex call is traced with the trunk's graph), dense everywhere else. Measured on
one H200 (issue 43, ../shared/gpu/h200_2026-11-28, the 0.5B GRPO step's trainer): packed rows through
flex with the trunk eager (the flex call alone compiled) took 8.52 s and peaked at 79.0 GiB where
padded dense rows took 3.60 s and 31.4 GiB (mbt64k_*.json); with the trunk compiled, 4.62 s. Torch's
flex attention has no backward on the CPU (its forward there is a reference that computes every
score), so the CPU stays dense. varlen is chosen by name only, until a GPU has measured it against
dense and flex (benchmarks/gpu_part3.py, part varlen). Off CUDA a Varlen mask runs
`segments_reference` (causal sdpa per sequence, the same reshapes around it: the tests' CPU
stand-in for the kernel), but a run there is refused.

torch's `varlen_attn` changed its keywords between the versions pyproject allows (torch>=2.4):
2.10 takes `is_causal`, 2.11 a `window_size` ((-1, 0) is causal) and no `enable_gqa`, 2.13 both
`window_size` and `enable_gqa`. `flash_varlen` reads the signature: a torch without `enable_gqa`
gets k and v repeated to the query heads (what enable_gqa does inside the kernel), one without
`scale` a q scaled so that the kernel's default 1/√hd gives `scale`; a torch before 2.10 has no
varlen at all and `check` refuses it in one line.

The interface: framework/packing.py makes the mask, gpt_mini's Attention calls `attend`, and
transformers models call `hf_attention` (models/hf.py installs it as their attention function
"posttrain": transformers' own sdpa function for every other mask):

    chosen(model)                   -> "auto" | "dense" | "flex" | "varlen"  (the model's choice)
    kernel(choice, device, compiled=False) -> "dense" | "flex" | "varlen"  ("auto" resolved by
                                       `auto_kernel`; varlen off CUDA: UsageError)
    check(choice, device, dtype)    -> choice, or UsageError for flex or varlen off CUDA, varlen in
                                       fp32 compute (recipes/common.Run, before any work)
    document_mask(seq_id, kernel)   -> bool [R, 1, W, W] | BlockMask | Varlen  (seq_id [R, W]: one
                                       id per sequence; a row's tail is one more sequence of its
                                       own; BlockMask tiles and Varlen spans from the ids, never
                                       the [R, W, W] mask)
    attend(q, k, v, mask)           -> [B, H, T, hd]         (mask None: causal; GQA: k, v have
                                       Hkv heads, H a multiple of them)
    use_in_hf(hf_model)             installs `hf_attention` in a transformers model loaded with sdpa
    hf_mask(hf_model, mask)         -> mask, or UsageError for a BlockMask or Varlen its attention
                                       cannot read
"""

from __future__ import annotations

import functools
import inspect
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from posttrain.errors import UsageError

try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # a torch before it: optim.packing_attention=varlen is refused (check)
    varlen_attn = None

KERNELS = ("auto", "dense", "flex", "varlen")
HALF = (torch.bfloat16, torch.float16)  # what Flash Attention computes in
BLOCK = 128  # flex's tile (queries × keys); its Triton kernels are tuned for 128
_compiled = None  # torch.compile(flex_attention): made once, at the first CUDA call


def auto_kernel(device: torch.device | str, compiled: bool = False) -> str:
    """What optim.packing_attention=auto runs on `device`: flex on CUDA inside a compiled trunk (or
    its compiled blocks), dense otherwise, so auto is never slower than padded rows (module docstring)."""
    return "flex" if compiled and torch.device(device).type == "cuda" else "dense"


def kernel(choice: str, device: torch.device | str, compiled: bool = False) -> str:
    """The kernel `choice` (optim.packing_attention) names on `device`; `compiled`: the trunk runs
    compiled (framework/compiled.py), which auto reads (`auto_kernel`)."""
    if choice not in KERNELS:
        raise UsageError(f"optim.packing_attention={choice!r} is unknown; use one of {list(KERNELS)}")
    if choice == "varlen" and torch.device(device).type != "cuda":
        raise UsageError(
            "optim.packing_attention=varlen needs CUDA (torch's varlen_attn is Flash Attention, CUDA only); use auto or dense"
        )
    if choice == "auto":
        return auto_kernel(device, compiled)
    return choice


def check(choice: str, device: torch.device | str, dtype: torch.dtype | None = None) -> str:
    """`choice` when a run on `device` computing in `dtype` (its autocast dtype; None: unknown) can
    train with it: flex and varlen need CUDA (no flex backward on the CPU, no varlen kernel), varlen
    bf16 or fp16 and a torch that has it."""
    resolved = kernel(choice, device)
    if resolved == "flex" and torch.device(device).type != "cuda":
        raise UsageError(
            "optim.packing_attention=flex needs CUDA (torch's flex attention has no backward on the CPU); use auto or dense"
        )
    if resolved == "varlen" and dtype is not None and dtype not in HALF:
        raise UsageError(
            f"optim.packing_attention=varlen needs bf16 or fp16 compute (Flash Attention), the run computes in {dtype}: "
            "drop dtype=float32 (auto is bf16 on CUDA), or use optim.packing_attention=flex"
        )
    if resolved == "varlen":
        _flash_varlen()
    return choice


def chosen(model) -> str:
    """The kernel choice a model carries (`model.packing_attention`, set from optim.packing_attention
    by recipes/common.init_model; deep copies such as the reference keep it): auto when unset."""
    return getattr(model, "packing_attention", "auto")


class Varlen(NamedTuple):
    """Packed rows [R, W] as varlen attention reads them: the R·W tokens flattened row by row and
    cut at every sequence (a row's tail one more), so attention stays inside each cut."""

    cu_seqlens: torch.Tensor  # int32 [N + 1]: where each of the N sequences starts, then R·W
    max_len: int  # the longest sequence's tokens
    rows: int  # R
    width: int  # W

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The dense mask's shape [R, 1, W, W]: transformers' mask code reads `ndim` and `shape[-1]`
        (the keys' length) of a mask it is given before handing it to the mask function."""
        return (self.rows, 1, self.width, self.width)

    @property
    def ndim(self) -> int:
        return 4


def varlen_mask(seq_id: torch.Tensor) -> Varlen:
    """The Varlen of seq_id [R, W] (each sequence contiguous): a sequence starts at every column 0
    and wherever the id changes; from the ids alone, O(R·W)."""
    R, W = seq_id.shape
    start = F.pad(seq_id[:, 1:] != seq_id[:, :-1], (1, 0), value=True)  # [R, W]: column 0 starts one
    starts = start.view(-1).nonzero().squeeze(1)  # [N]
    cu = torch.cat([starts, starts.new_full((1,), R * W)]).to(torch.int32)  # [N + 1]
    return Varlen(cu, int((cu[1:] - cu[:-1]).max()), R, W)


def document_mask(seq_id: torch.Tensor, kernel: str = "dense", block: int = BLOCK) -> torch.Tensor | BlockMask | Varlen:
    """Key s visible to query t iff both belong to the same sequence and s ≤ t, from seq_id [R, W]:
    dense, a bool [R, 1, W, W]; flex, a BlockMask of `block`-sized tiles over the same mask;
    varlen, the sequences' spans (`varlen_mask`)."""
    R, W = seq_id.shape
    if kernel == "varlen":
        return varlen_mask(seq_id)
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
    mask [B, 1, T, S] (True = attend) through sdpa, a BlockMask through flex attention, or a
    Varlen through varlen attention."""
    if isinstance(mask, BlockMask):
        return flex(q, k, v, mask, scale)
    if isinstance(mask, Varlen):
        return varlen(q, k, v, mask, scale).transpose(1, 2)  # [B, H, T, hd]
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


def varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Varlen, scale: float | None = None) -> torch.Tensor:
    """Causal attention of q [B, H, T, hd] over k, v [B, Hkv, T, hd] inside each of `mask`'s
    sequences, as [B, T, H, hd] (transformers' layout): the tokens flattened to [B·T, heads, hd]
    in autocast's dtype (the kernel is no autocast op), Flash Attention's varlen kernel on CUDA,
    `segments_reference` elsewhere."""
    B, H, T, hd = q.shape
    dev = q.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else q.dtype

    def flat(x):  # [B, h, T, hd] -> [B·T, h, hd]
        return x.transpose(1, 2).reshape(B * T, x.shape[1], hd).to(dtype)

    run = flash_varlen if dev == "cuda" else segments_reference
    return run(flat(q), flat(k), flat(v), mask, scale).view(B, T, H, hd)


def flash_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Varlen, scale: float | None) -> torch.Tensor:
    """torch's varlen_attn, causal, of q [N, H, hd] over k, v [N, Hkv, hd] (bf16 or fp16): [N, H, hd]."""
    if q.dtype not in HALF:
        raise UsageError(
            f"optim.packing_attention=varlen: Flash Attention computes in bf16 or fp16, not {q.dtype}; "
            "run under bf16 autocast (dtype=auto on CUDA) or use optim.packing_attention=flex"
        )
    cu, n = mask.cu_seqlens, mask.max_len
    fn = _flash_varlen()
    takes = _keywords(fn)
    kw: dict = {"window_size": (-1, 0)} if "window_size" in takes else {"is_causal": True}  # causal: 2.11+ / 2.10
    if q.shape[1] != k.shape[1]:  # grouped-query attention
        if "enable_gqa" in takes:
            kw["enable_gqa"] = True
        else:  # torch 2.10-2.12: the kernel wants as many k, v heads as q has
            k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))  # [N, H, hd]
    if scale is not None and "scale" in takes:
        kw["scale"] = scale
    elif scale is not None:  # the kernel's own 1/√hd, times q's factor, is `scale`
        q = q * (scale * q.shape[-1] ** 0.5)
    return fn(q, k, v, cu, cu, n, n, **kw)


@functools.lru_cache(maxsize=4)
def _keywords(fn) -> frozenset[str]:
    """The keyword parameters of torch's varlen_attn, which differ between torch versions (module docstring)."""
    return frozenset(inspect.signature(fn).parameters)


def segments_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Varlen, scale: float | None
) -> torch.Tensor:
    """What `flash_varlen` computes, on any device and dtype: causal sdpa over each sequence of
    q [N, H, hd], k, v [N, Hkv, hd] in turn (a loop over sequences: the tests' stand-in)."""
    cu = mask.cu_seqlens.tolist()
    gqa = q.shape[1] != k.shape[1]
    q, k, v = (x.transpose(0, 1) for x in (q, k, v))  # [heads, N, hd]
    parts = [
        F.scaled_dot_product_attention(q[:, a:b], k[:, a:b], v[:, a:b], is_causal=True, scale=scale, enable_gqa=gqa)
        for a, b in zip(cu[:-1], cu[1:])
    ]
    return torch.cat(parts, 1).transpose(0, 1)  # [N, H, hd]


def _flash_varlen():
    """torch.nn.attention.varlen.varlen_attn, or a UsageError where this torch has none (or one that
    says causal neither way: a torch before 2.10's)."""
    if varlen_attn is None or not {"window_size", "is_causal"} & _keywords(varlen_attn):
        raise UsageError(
            f"optim.packing_attention=varlen needs torch.nn.attention.varlen, which torch {torch.__version__} lacks "
            "(it came with 2.10); upgrade torch or use optim.packing_attention=dense"
        )
    return varlen_attn


HF_NAME = "posttrain"  # the transformers attention function (and mask maker) models/hf.py installs


def hf_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers' attention function "posttrain": its sdpa function for every mask it makes or is
    given, flex attention for a packed micro-batch's BlockMask, varlen for its Varlen. Returns
    ([B, T, H, hd], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not isinstance(attention_mask, (BlockMask, Varlen)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    name = "flex" if isinstance(attention_mask, BlockMask) else "varlen"
    extra = [k for k in ("softcap", "s_aux", "position_bias") if kwargs.get(k) is not None]
    if extra or dropout > 0:
        what = extra[0] if extra else "dropout"
        raise UsageError(
            f"{type(module).__name__}: packed {name} attention does not apply {what}; set optim.packing_attention=dense"
        )
    if name == "varlen":
        return varlen(query, key, value, attention_mask, scaling), None  # [B, T, H, hd]
    return flex(query, key, value, attention_mask, scaling).transpose(1, 2).contiguous(), None  # [B, T, H, hd]


def hf_mask(hf_model, mask):
    """`mask` as a transformers model's forward takes it: a BlockMask or a Varlen only where
    `hf_attention` reads it."""
    impl = hf_model.config._attn_implementation
    if isinstance(mask, (BlockMask, Varlen)) and impl != HF_NAME:
        raise UsageError(
            f"{type(hf_model).__name__} runs attn_implementation={impl!r}, which cannot read flex or varlen masks: "
            "load it with sdpa, or set optim.packing_attention=dense"
        )
    return mask


def hf_mask_maker(*, attention_mask=None, **kwargs):
    """transformers' mask function "posttrain": a Varlen as it is (transformers hands a 4-D tensor or
    a BlockMask back before it gets here, any other mask object to this function), sdpa's for the rest."""
    from transformers.masking_utils import sdpa_mask

    return attention_mask if isinstance(attention_mask, Varlen) else sdpa_mask(attention_mask=attention_mask, **kwargs)


def use_in_hf(hf_model) -> None:
    """Let a transformers model read packed rows' BlockMasks and Varlens: a model loaded with sdpa
    attention switches to "posttrain" (`hf_attention`, `hf_mask_maker`: the same sdpa call and
    masks for everything else)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(HF_NAME, hf_attention)
    AttentionMaskInterface.register(HF_NAME, hf_mask_maker)
    if hf_model.config._attn_implementation == "sdpa":
        hf_model.config._attn_implementation = HF_NAME
