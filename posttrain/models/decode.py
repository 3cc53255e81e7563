"""One-token decoding for gpt_mini (and plain HF Llamas): the rollout engine's inner loop, written for speed.

    step = Decoder.for_model(model)          # None unless a plain GPTMini or HF Llama (below)
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

Two kinds of model take this path: a plain gpt_mini (its own fused weights, read live) and a
Hugging Face Llama behind models/hf.HFCausalLM (`LlamaForCausalLM`: SiLU, no biases, default
rotary), whose q/k/v and gate/up weights are fused into copies here and re-fused whenever the
trainer or a weight sync changes them (each tensor's in-place version counter is checked every
step). Plain `nn.Linear` layers only: a LoRA-wrapped or otherwise patched model, or another
architecture, returns None from `for_model`, and the engine decodes through `model.forward`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from posttrain.models.gpt_mini import GPTMini
from posttrain.models.hf import HFCausalLM


class Decoder:
    """Single-token decode over a gpt_mini `KVCache`, rows [0, n), sharing the model's weights."""

    def __init__(self, model, weights: _GPTMiniWeights | _LlamaWeights):
        c = model.config
        self.model, self.c, self.w = model, c, weights
        self.H, self.Hkv, self.hd = c.n_heads, c.n_kv_heads, c.head_dim
        self.rep = self.H // self.Hkv
        self.scale = self.hd**-0.5
        half = self.hd // 2
        cos, sin = weights.rope  # [Tmax, hd] each
        self.cos = cos
        self.sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), -1)  # rotate_half's sign
        self.eps = weights.eps

    @classmethod
    def for_model(cls, model) -> Decoder | None:
        weights = _GPTMiniWeights.of(model) or _LlamaWeights.of(model)
        return None if weights is None else cls(model, weights)

    def refresh(self) -> None:
        """Re-read the model's weight tensors. The engine calls it at the start of every
        generate() and after `on_decode_step` (which may load new weights): in between, the
        step reuses the list it holds, so a parameter replaced by a new tensor (not updated in
        place) is seen from the next refresh on."""
        self.w.refresh()

    def still_plain(self) -> bool:
        """False once a layer was wrapped after this decoder was built (e.g. LoRA adapters):
        the engine checks it at every generate() and falls back to model.forward."""
        return self.w.plain(self.model)

    def __call__(self, last: torch.Tensor, cache, n: int) -> torch.Tensor:
        H, Hkv, hd, rep = self.H, self.Hkv, self.hd, self.rep
        w = self.w.current()
        pos = cache.lengths[:n]  # [n] position of the new token
        S = int(pos.max()) + 1  # attend over the used span only
        if S > cache.max_len:
            raise RuntimeError(f"KV cache overflow: {S} > {cache.max_len} positions")
        Tmax = cache.max_len
        cos = self.cos[pos].unsqueeze(1)  # [n, 1, hd]
        sin = self.sin_signed[pos].unsqueeze(1)
        rows = torch.arange(n, device=pos.device)
        write = ((rows[:, None] * Hkv + torch.arange(Hkv, device=pos.device)) * Tmax + pos[:, None]).reshape(-1)
        bias = torch.zeros(n, 1, S, device=pos.device, dtype=cos.dtype)
        bias.masked_fill_(torch.arange(S, device=pos.device) > pos[:, None, None], float("-inf"))
        bias = bias.repeat_interleave(Hkv, dim=0)  # [n·Hkv, 1, S]

        x = F.embedding(last, w.embed)  # [n, d]
        nq = (H + Hkv) * hd
        for i, (attn_norm, qkv_w, o_w, mlp_norm, gate_up_w, down_w) in enumerate(w.layers):
            qkv = F.linear(F.rms_norm(x, x.shape[-1:], attn_norm, self.eps), qkv_w)
            qk = qkv[:, :nq].view(n, H + Hkv, hd)
            qk = torch.addcmul(qk * cos, qk.roll(hd // 2, -1), sin)  # rotary on q and k at once
            kc, vc = cache.k[i].view(-1, hd), cache.v[i].view(-1, hd)  # [R·Hkv·Tmax, hd]
            kc.index_copy_(0, write, qk[:, H:].reshape(-1, hd).to(kc.dtype))
            vc.index_copy_(0, write, qkv[:, nq:].reshape(-1, hd).to(vc.dtype))
            K = cache.k[i, :n, :, :S].reshape(n * Hkv, S, hd)  # views: rows are contiguous
            V = cache.v[i, :n, :, :S].reshape(n * Hkv, S, hd)
            q = qk[:, :H].reshape(n * Hkv, rep, hd)
            s = (
                torch.baddbmm(bias, q, K.transpose(1, 2), alpha=self.scale)
                if rep == 1
                else torch.bmm(q, K.transpose(1, 2)).mul_(self.scale).add_(bias)
            )
            y = torch.bmm(s.softmax(-1), V).view(n, H * hd)
            x = x + F.linear(y, o_w)
            gu = F.linear(F.rms_norm(x, x.shape[-1:], mlp_norm, self.eps), gate_up_w)
            gate, up = gu.chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate).mul_(up), down_w)
        cache.lengths[:n] += 1
        return F.linear(F.rms_norm(x, x.shape[-1:], w.norm, self.eps), w.head)


class _Weights:
    """What the decode step reads: per layer (attn_norm, qkv, o, mlp_norm, gate_up, down),
    then embed, the final norm and the head; `rope` = (cos, sin) tables [Tmax, hd]."""

    layers: list
    embed: torch.Tensor
    norm: torch.Tensor
    head: torch.Tensor
    eps: float
    rope: tuple

    def current(self) -> _Weights:
        return self

    def refresh(self) -> None:
        self.current()


class _GPTMiniWeights(_Weights):
    """gpt_mini's own parameters (already fused: nothing to copy), listed at each refresh and
    used live: the trainer's in-place updates are seen at once. Listing them through the
    modules' __getattr__ at every step cost ~4% of a step at batch 8."""

    @staticmethod
    def plain(model) -> bool:
        return (
            type(model) is GPTMini
            and type(model.head) is nn.Linear
            and all(
                type(m) is nn.Linear for b in model.blocks for m in (b.attn.qkv, b.attn.o, b.mlp.gate_up, b.mlp.down)
            )
        )

    @classmethod
    def of(cls, model) -> _GPTMiniWeights | None:
        return cls(model) if cls.plain(model) else None

    def __init__(self, model):
        self.model, self.eps, self.rope = model, model.config.norm_eps, (model.rope_cos, model.rope_sin)
        self.refresh()

    def refresh(self) -> None:
        m = self.model
        self.layers = [
            (
                b.attn_norm.weight,
                b.attn.qkv.weight,
                b.attn.o.weight,
                b.mlp_norm.weight,
                b.mlp.gate_up.weight,
                b.mlp.down.weight,
            )
            for b in m.blocks
        ]
        self.embed, self.norm, self.head = m.embed.weight, m.norm.weight, m.head.weight


class _LlamaWeights(_Weights):
    """A plain HF Llama's weights with q/k/v and gate/up fused into copies, re-fused when any
    source tensor is replaced or changed in place (its `_version` moves)."""

    @staticmethod
    def plain(model) -> bool:
        if not isinstance(model, HFCausalLM) or type(model.hf).__name__ != "LlamaForCausalLM":
            return False
        hf = model.hf
        c, rot = hf.config, hf.model.rotary_emb
        if c.hidden_act != "silu" or getattr(rot, "rope_type", None) != "default" or rot.attention_scaling != 1.0:
            return False
        mods = [m for layer in hf.model.layers for m in (*_attn(layer), *_mlp(layer))] + [hf.lm_head]
        return all(type(m) is nn.Linear and m.bias is None for m in mods)  # no biases, LoRA or patches

    @classmethod
    def of(cls, model) -> _LlamaWeights | None:
        return cls(model.hf) if cls.plain(model) else None

    def __init__(self, hf):
        self.hf, self.eps = hf, hf.config.rms_norm_eps
        rot, T = hf.model.rotary_emb, hf.config.max_position_embeddings
        inv = rot.inv_freq.float()
        freqs = torch.outer(torch.arange(T, device=inv.device, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)  # [Tmax, hd], HF's own table
        self.rope = (emb.cos(), emb.sin())
        self._seen = None

    def _sources(self) -> list[torch.Tensor]:
        hf = self.hf
        return [
            p
            for layer in hf.model.layers
            for p in (
                layer.input_layernorm.weight,
                *(m.weight for m in _attn(layer)),
                layer.post_attention_layernorm.weight,
                *(m.weight for m in _mlp(layer)),
            )
        ] + [hf.model.embed_tokens.weight, hf.model.norm.weight, hf.lm_head.weight]

    def current(self):
        src = self._sources()
        seen = [(id(t), t._version) for t in src]
        if seen != self._seen:  # changed since the last fusion
            with torch.no_grad():
                self._fuse(src)
            self._seen = [(id(t), t._version) for t in src]
        return self

    def _fuse(self, src) -> None:
        self.layers = []
        for i in range(len(self.hf.model.layers)):
            an, q, k, v, o, mn, gate, up, down = src[9 * i : 9 * i + 9]
            self.layers.append(
                (an.detach(), torch.cat((q, k, v)), o.detach(), mn.detach(), torch.cat((gate, up)), down.detach())
            )
        self.embed, self.norm, self.head = (t.detach() for t in src[-3:])


def _attn(layer):
    a = layer.self_attn
    return a.q_proj, a.k_proj, a.v_proj, a.o_proj


def _mlp(layer):
    m = layer.mlp
    return m.gate_proj, m.up_proj, m.down_proj
