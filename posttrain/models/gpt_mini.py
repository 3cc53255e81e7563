"""gpt_mini: the built-in tiny GPT, Llama-shaped.

The course's MiniGPT is GPT-2-shaped (learned positions, LayerNorm, GELU, biases). Ours
keeps its size and role but takes the Llama shape — RMSNorm, rotary positions, SwiGLU MLP,
no biases, optional tied embeddings — so a checkpoint exports to a Hugging Face
`LlamaForCausalLM` directory and gives the same logits there (tests/test_export.py).

Deviations from a textbook Llama, all for speed on small CPUs and all invisible to the
export: q/k/v are one fused Linear, gate/up are one fused Linear (split on export).

Decoding goes through a KV cache whose protocol is three methods, so the rollout engine can
bring its own (slots, continuous batching) without touching this file:

    cache.positions                  # [B, T] absolute positions of the new tokens
    cache.update(layer, k, v)        # store k, v [B, Hkv, T, hd]; return (K, V, mask)
    cache.advance(T)                 # after the forward: the new tokens are now history
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from posttrain.errors import UsageError
from posttrain.models.attention import attend

# name -> (d_model, n_layers, n_heads, d_ff). Head size 32 throughout.
PRESETS = {
    "nano": (128, 4, 4, 344),  # ≈0.80M params: the course's MiniGPT size
    "micro": (256, 6, 8, 688),  # ≈4.8M params: the size of the 4.5M HF Llama benchmarks
    "mini": (384, 8, 12, 1024),  # ≈14M params
}


@dataclass
class ModelConfig:
    preset: str = "nano"  # named size (nano ≈0.8M, micro ≈4.8M, mini ≈14M); explicit fields below override it when > 0
    vocab_size: int = 0  # set from the tokenizer when 0
    d_model: int = 0  # residual width
    n_layers: int = 0  # transformer blocks
    n_heads: int = 0  # query heads
    n_kv_heads: int = 0  # key/value heads (< n_heads = grouped-query attention); 0 = n_heads
    d_ff: int = 0  # SwiGLU hidden width
    max_seq_len: int = 256  # longest sequence (prompt + response) the rotary table covers
    rope_theta: float = 10000.0  # rotary base frequency
    norm_eps: float = 1e-5  # RMSNorm epsilon
    tie_embeddings: bool = False  # share the input embedding with the output head

    def resolved(self, vocab_size: int | None = None) -> ModelConfig:
        if self.preset not in PRESETS:
            raise UsageError(f"model.preset={self.preset!r} is unknown; use one of {sorted(PRESETS)}")
        d, n_l, n_h, d_ff = PRESETS[self.preset]
        c = ModelConfig(**asdict(self))
        c.d_model = c.d_model or d
        c.n_layers = c.n_layers or n_l
        c.n_heads = c.n_heads or n_h
        c.n_kv_heads = c.n_kv_heads or c.n_heads
        c.d_ff = c.d_ff or d_ff
        c.vocab_size = c.vocab_size or (vocab_size or 0)
        if c.d_model % c.n_heads or c.n_heads % c.n_kv_heads:
            raise UsageError("model: d_model must divide by n_heads and n_heads by n_kv_heads")
        return c

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def count_params(c: ModelConfig) -> int:
    """Parameters by formula (the test checks it against the module)."""
    hd = c.head_dim
    attn = c.d_model * (c.n_heads * hd + 2 * c.n_kv_heads * hd) + c.n_heads * hd * c.d_model
    mlp = 3 * c.d_model * c.d_ff
    block = attn + mlp + 2 * c.d_model  # two RMSNorm weights
    emb = c.vocab_size * c.d_model
    head = 0 if c.tie_embeddings else c.vocab_size * c.d_model
    return emb + c.n_layers * block + c.d_model + head


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig, layer: int):
        super().__init__()
        self.layer, self.n_heads, self.n_kv, self.hd = layer, c.n_heads, c.n_kv_heads, c.head_dim
        self.qkv = nn.Linear(c.d_model, (c.n_heads + 2 * c.n_kv_heads) * self.hd, bias=False)
        self.o = nn.Linear(c.n_heads * self.hd, c.d_model, bias=False)

    def forward(self, x, cos, sin, cache=None, mask=None):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split([self.n_heads * self.hd, self.n_kv * self.hd, self.n_kv * self.hd], -1)
        q = q.view(B, T, self.n_heads, self.hd).transpose(1, 2)  # [B, H, T, hd]
        k = k.view(B, T, self.n_kv, self.hd).transpose(1, 2)  # [B, Hkv, T, hd]
        v = v.view(B, T, self.n_kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin  # rotary positions (HF convention)
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            k, v, mask = cache.update(self.layer, k, v)  # [B, Hkv, S, hd], mask [B, 1, T, S]
        # causal (mask None), a bool mask, or the packed rows' document mask (dense, flex or varlen)
        y = attend(q, k, v, mask)  # [B, H, T, hd]
        return self.o(y.transpose(1, 2).reshape(B, T, self.n_heads * self.hd))


class MLP(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.gate_up = nn.Linear(c.d_model, 2 * c.d_ff, bias=False)
        self.down = nn.Linear(c.d_ff, c.d_model, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)  # SwiGLU


class Block(nn.Module):
    def __init__(self, c: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.attn = Attention(c, layer)
        self.mlp_norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, cache=None, mask=None):
        x = x + self.attn(self.attn_norm(x), cos, sin, cache, mask)  # pre-norm residual
        return x + self.mlp(self.mlp_norm(x))


class GPTMini(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        assert config.vocab_size > 0 and config.d_model > 0, "pass a resolved ModelConfig"
        self.config = c = config
        self.grad_checkpointing = False  # recompute block activations in backward (training only)
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.blocks = nn.ModuleList(Block(c, i) for i in range(c.n_layers))
        self.norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.head.weight = self.embed.weight
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim))
        freqs = torch.outer(torch.arange(c.max_seq_len).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # [Tmax, hd]
        self.register_buffer("rope_cos", emb.cos(), persistent=False)
        self.register_buffer("rope_sin", emb.sin(), persistent=False)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2 scaled residual init
            if name.endswith("attn.o.weight") or name.endswith("mlp.down.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * c.n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def hidden(self, input_ids: torch.Tensor, cache=None, positions=None, attn_mask=None) -> torch.Tensor:
        """Final normed hidden states [B, T, d]; value and reward heads read these. `positions`
        [B, T] and `attn_mask` (bool [B, 1, T, T], True = attend, a flex BlockMask or a Varlen: models/attention.py)
        run packed rows, several sequences end to end (framework/packing.py); without them every
        row is one causal sequence."""
        T = input_ids.shape[1]
        if cache is None and T > self.config.max_seq_len:
            raise UsageError(f"sequence of {T} tokens exceeds model.max_seq_len={self.config.max_seq_len}; raise it")
        if cache is None and positions is None:
            cos, sin = self.rope_cos[:T], self.rope_sin[:T]  # [T, hd], broadcast over B, H
        else:
            pos = cache.positions if positions is None else positions  # [B, T]
            cos, sin = self.rope_cos[pos].unsqueeze(1), self.rope_sin[pos].unsqueeze(1)  # [B, 1, T, hd]
        x = self.embed(input_ids)
        for block in self.blocks:
            if self.grad_checkpointing and self.training and cache is None and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, cos, sin, None, attn_mask, use_reentrant=False)
            else:
                x = block(x, cos, sin, cache, attn_mask)
        if cache is not None:
            cache.advance(T)
        return self.norm(x)

    def forward(self, input_ids: torch.Tensor, cache=None) -> torch.Tensor:
        """Logits [B, T, V]; logits[:, t] predicts input_ids[:, t + 1]."""
        return self.head(self.hidden(input_ids, cache))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class KVCache:
    """A contiguous cache with one row per sequence and its own length per row.

    Rows may hold sequences of different lengths (left as they are, no padding tokens in
    the cache): each row's keys live at [0, lengths[b]) and the mask hides the rest. The
    rollout engine reuses rows (slots) as sequences finish: `reset_rows` forgets a row and
    `copy_row` clones a prompt's cache into the slots of its group.

    `rows` in `begin` may be None (all rows), a LongTensor of row indices, or a `slice` of
    contiguous rows. A slice is the fast path for decoding: keys and values come back as
    views of the cache, where an index tensor has to gather (copy) them every layer.
    """

    def __init__(self, config: ModelConfig, rows: int, max_len: int | None = None, device=None, dtype=torch.float32):
        self.max_len = max_len or config.max_seq_len
        shape = (config.n_layers, rows, config.n_kv_heads, self.max_len, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)
        self.rows = None  # which rows the current forward writes (set by begin)
        self.positions = None
        self.mask = None  # [B, 1, T, S] True = key s visible to new token t (set by begin)

    def begin(self, n_new: int, rows: torch.Tensor | slice | None = None) -> None:
        """Prepare a forward of `n_new` tokens per row for `rows` (default all rows)."""
        if rows is None:
            rows = slice(0, self.lengths.shape[0])
        self.rows = rows
        start = self.lengths[rows]  # [B]
        self.positions = start[:, None] + torch.arange(n_new, device=start.device)  # [B, T]
        span = int(start.max()) + n_new  # attend over the used span only
        if span > self.max_len:
            raise RuntimeError(f"KV cache overflow: {span} > {self.max_len} positions")
        keys = torch.arange(span, device=start.device)
        self.mask = (keys[None, None, :] <= self.positions[:, :, None]).unsqueeze(1)  # [B, 1, T, S]
        self._span = span
        # row index of each written token, computed once here rather than in every layer
        r = rows if isinstance(rows, torch.Tensor) else torch.arange(rows.start, rows.stop, device=start.device)
        self._write = (r[:, None].expand_as(self.positions), self.positions)  # [B, T] each

    def update(self, layer, k, v):
        rows, span = self.rows, self._span
        kc, vc = self.k[layer], self.v[layer]  # [R, Hkv, Tmax, hd]
        r, pos = self._write
        kc[r, :, pos] = k.transpose(1, 2).to(kc.dtype)  # scatter [B, T, Hkv, hd]
        vc[r, :, pos] = v.transpose(1, 2).to(vc.dtype)  # (autocast may hand bf16 to an fp32 cache)
        return kc[rows, :, :span], vc[rows, :, :span], self.mask  # views for a slice, gathers for a tensor

    def advance(self, n_new: int) -> None:
        self.lengths[self.rows] += n_new

    def copy_row(self, src, dst, source: KVCache | None = None) -> None:
        """Copy row(s) `src` of `source` (default: this cache) into rows `dst`, lengths too.

        `src` is one row (broadcast to every `dst` row: a prompt into its group's slots) or
        a LongTensor matching `dst` (many rows at once). Only the used prefix is copied.
        """
        source = self if source is None else source
        if isinstance(src, int):
            src = slice(src, src + 1)
        if isinstance(dst, int):
            dst = slice(dst, dst + 1)
        n = int(source.lengths[src].max())
        one = isinstance(src, slice) and src.stop - src.start == 1
        if self.k.device.type == "cpu" and torch.is_tensor(dst) and (torch.is_tensor(src) or one):
            # on a CPU, strided slice copies row by row run 1.3-4x faster than one gather/scatter
            # (the index kernels copy element by element); on a GPU one kernel beats many launches
            rows = [src.start] * dst.numel() if one else src.tolist()
            for s, d in zip(rows, dst.tolist()):
                self.k[:, d, :, :n].copy_(source.k[:, s, :, :n])
                self.v[:, d, :, :n].copy_(source.v[:, s, :, :n])
        else:
            self.k[:, dst, :, :n] = source.k[:, src, :, :n]
            self.v[:, dst, :, :n] = source.v[:, src, :, :n]
        self.lengths[dst] = source.lengths[src]

    def reset_rows(self, rows) -> None:
        self.lengths[rows] = 0


def build_model(config: ModelConfig, vocab_size: int) -> GPTMini:
    return GPTMini(config.resolved(vocab_size))
