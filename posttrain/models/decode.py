"""One-token decoding for gpt_mini: the rollout engine's inner loop, written for speed.

    step = Decoder.for_model(model)          # None when the model is not a plain GPTMini
    logits = step(last_tokens, cache, n)     # [n] ids → [n, V]; rows [0, n) of the cache

`GPTMini.forward(ids, cache=...)` handles any number of new tokens on any rows; decoding
is the special case of ONE new token on the contiguous rows [0, n), done 64 times per
response, and there most of the time is not in the matmuls but in the small ops around
them. This path computes the same function (tests/test_decode.py: equal logits within
float noise) with fewer, cheaper ops:

1. **Attention as two batched matmuls.** A query of one token needs no flash kernel:
   scores = q·Kᵀ over the used span, + a 0/−inf bias for each row's own length, softmax,
   ·V. Grouped-query heads share their key rows by shaping q as [rows·Hkv, rep, hd]
   instead of repeating K and V.
2. **Per-step work done once, not per layer**: the rotary cos/sin of each row's position,
   the flat cache index each new key is written to, the length bias.
3. **Rotary in three ops**: x·cos + roll(x, hd/2)·sin±, where sin± carries rotate_half's
   sign, applied to q and k together; keys/values are written with one `index_copy_` each.

Plain `nn.Linear` layers only: a LoRA-wrapped or otherwise patched model (or an HF model)
returns None from `for_model`, and the engine decodes through `model.forward`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Decoder:
    """Single-token decode over a gpt_mini `KVCache`, rows [0, n), sharing the model's weights."""

    def __init__(self, model):
        c = model.config
        self.model, self.c = model, c
        self.H, self.Hkv, self.hd = c.n_heads, c.n_kv_heads, c.head_dim
        self.rep = self.H // self.Hkv
        self.scale = self.hd ** -0.5
        half = self.hd // 2
        sin = model.rope_sin
        self.cos = model.rope_cos                                     # [Tmax, hd]
        self.sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), -1)   # rotate_half's sign
        self.eps = c.norm_eps

    @classmethod
    def for_model(cls, model) -> "Decoder | None":
        from posttrain.models.gpt_mini import GPTMini
        if type(model) is not GPTMini:
            return None
        plain = all(type(m) is nn.Linear for b in model.blocks for m in (b.attn.qkv, b.attn.o, b.mlp.gate_up, b.mlp.down))
        return cls(model) if plain and type(model.head) is nn.Linear else None

    def __call__(self, last: torch.Tensor, cache, n: int) -> torch.Tensor:
        m, H, Hkv, hd, rep = self.model, self.H, self.Hkv, self.hd, self.rep
        pos = cache.lengths[:n]                                       # [n] position of the new token
        S = int(pos.max()) + 1                                        # attend over the used span only
        if S > cache.max_len:
            raise RuntimeError(f"KV cache overflow: {S} > {cache.max_len} positions")
        Tmax = cache.max_len
        cos = self.cos[pos].unsqueeze(1)                              # [n, 1, hd]
        sin = self.sin_signed[pos].unsqueeze(1)
        rows = torch.arange(n, device=pos.device)
        write = ((rows[:, None] * Hkv + torch.arange(Hkv, device=pos.device)) * Tmax + pos[:, None]).reshape(-1)
        bias = torch.zeros(n, 1, S, device=pos.device, dtype=cos.dtype)
        bias.masked_fill_(torch.arange(S, device=pos.device) > pos[:, None, None], float("-inf"))
        bias = bias.repeat_interleave(Hkv, dim=0)                     # [n·Hkv, 1, S]

        x = m.embed(last)                                             # [n, d]
        nq = (H + Hkv) * hd
        for i, b in enumerate(m.blocks):
            a = b.attn
            qkv = F.linear(F.rms_norm(x, x.shape[-1:], b.attn_norm.weight, self.eps), a.qkv.weight)
            qk = qkv[:, :nq].view(n, H + Hkv, hd)
            qk = torch.addcmul(qk * cos, qk.roll(hd // 2, -1), sin)  # rotary on q and k at once
            kc, vc = cache.k[i].view(-1, hd), cache.v[i].view(-1, hd)  # [R·Hkv·Tmax, hd]
            kc.index_copy_(0, write, qk[:, H:].reshape(-1, hd).to(kc.dtype))
            vc.index_copy_(0, write, qkv[:, nq:].reshape(-1, hd).to(vc.dtype))
            K = cache.k[i, :n, :, :S].reshape(n * Hkv, S, hd)         # views: rows are contiguous
            V = cache.v[i, :n, :, :S].reshape(n * Hkv, S, hd)
            q = qk[:, :H].reshape(n * Hkv, rep, hd)
            s = torch.baddbmm(bias, q, K.transpose(1, 2), alpha=self.scale) if rep == 1 else \
                torch.bmm(q, K.transpose(1, 2)).mul_(self.scale).add_(bias)
            y = torch.bmm(s.softmax(-1), V).view(n, H * hd)
            x = x + F.linear(y, a.o.weight)
            gu = F.linear(F.rms_norm(x, x.shape[-1:], b.mlp_norm.weight, self.eps), b.mlp.gate_up.weight)
            gate, up = gu.chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate).mul_(up), b.mlp.down.weight)
        cache.lengths[:n] += 1
        return F.linear(F.rms_norm(x, x.shape[-1:], m.norm.weight, self.eps), m.head.weight)
