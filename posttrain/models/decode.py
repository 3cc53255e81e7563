"""One-token decoding for gpt_mini and the Llama-like HF families: the rollout engine's inner loop, written for speed.

    step = Decoder.for_model(model)          # None unless the fast path takes the model (below)
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

The models it takes and how their weights are read (a plain gpt_mini; HF Llama, Mistral,
Qwen2, Qwen3, Granite, Phi3, SmolLM3 behind models/hf.HFCausalLM: biases, per-head q/k norms,
multipliers, NoPE layers, the model's own rotary tables) are in models/decode_weights.py
(tests/test_decode_families.py holds each against transformers). Anything else, a LoRA-wrapped
or patched layer included, gets None from `for_model` (`why_not` says why in one line), and
the engine decodes through `model.forward`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from posttrain.models.decode_weights import Weights, weights_of, why_not


class Decoder:
    """Single-token decode over a gpt_mini `KVCache`, rows [0, n), sharing the model's weights."""

    def __init__(self, model, weights: Weights):
        c = model.config
        self.model, self.c, self.w = model, c, weights
        self.H, self.Hkv, self.hd = c.n_heads, c.n_kv_heads, c.head_dim
        self.rep = self.H // self.Hkv
        self.scale = weights.scale
        half = self.hd // 2
        cos, sin = weights.rope  # [Tmax, hd] each
        self.cos = cos
        self.sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), -1)  # rotate_half's sign
        self.eps = weights.eps

    @classmethod
    def for_model(cls, model) -> Decoder | None:
        weights = weights_of(model)
        return None if weights is None else cls(model, weights)

    @staticmethod
    def why_not(model) -> str:
        """One line on why the fast path does not take `model` ("" when it does)."""
        return why_not(model)

    def refresh(self) -> None:
        """Re-read the model's weight tensors. The engine calls it at the start of every
        generate() and after `on_decode_step` (which may load new weights): in between, the
        step reuses the list it holds, so a parameter replaced by a new tensor (not updated in
        place) is seen from the next refresh on."""
        self.w.refresh()

    def addresses(self) -> tuple:
        """Where the step reads its weights and rotary tables (address, shape, stride, dtype): a CUDA
        graph captured over them stays valid while this is unchanged (framework/decode_state.py)."""
        w = self.w.current()
        tensors = [t for layer in w.layers for t in layer[:-1]]  # the last field is the `rotary` flag
        return tensor_key([*tensors, w.embed, w.norm, w.head, self.cos, self.sin_signed])

    def still_plain(self) -> bool:
        """False once a layer was wrapped after this decoder was built (e.g. LoRA adapters):
        the engine checks it at every generate() and falls back to model.forward."""
        return not self.why_not(self.model)

    def __call__(
        self, last: torch.Tensor, cache, n: int, span: int | None = None, advance: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits [n, V] of one new token per row. `span` (positions attended, at least the longest
        row's new length; default: read back from the cache) and `advance` ([n] bool: rows whose
        length moves on; default all) let a caller run it with no read-back, as a captured graph does."""
        H, Hkv, hd, rep = self.H, self.Hkv, self.hd, self.rep
        w = self.w.current()
        pos = cache.lengths[:n]  # [n] position of the new token
        S = int(pos.max()) + 1 if span is None else span  # attend over the used span only
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
        rs = w.residual_scale  # Granite's multipliers; None elsewhere

        x = F.embedding(last, w.embed)  # [n, d]
        if w.embed_scale is not None:
            x = x * w.embed_scale
        nq = (H + Hkv) * hd
        for i, (an, qkv_w, qkv_b, qk_norm, o_w, o_b, mn, gate_up_w, gate_up_b, down_w, down_b, rotary) in enumerate(
            w.layers
        ):
            qkv = F.linear(F.rms_norm(x, x.shape[-1:], an, self.eps), qkv_w, qkv_b)
            qk = qkv[:, :nq].view(n, H + Hkv, hd)
            if qk_norm is not None:  # Qwen3: an RMSNorm over each head of q and k, before rotary
                qk = F.rms_norm(qk, (hd,), None, self.eps) * qk_norm
            if rotary:
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
            a = F.linear(y, o_w, o_b)  # [n, d]
            x = x + (a if rs is None else a * rs)
            gu = F.linear(F.rms_norm(x, x.shape[-1:], mn, self.eps), gate_up_w, gate_up_b)
            gate, up = gu.chunk(2, dim=-1)
            m = F.linear(F.silu(gate).mul_(up), down_w, down_b)  # [n, d]
            x = x + (m if rs is None else m * rs)
        cache.lengths[:n] += 1 if advance is None else advance
        logits = F.linear(F.rms_norm(x, x.shape[-1:], w.norm, self.eps), w.head)  # [n, V]
        return logits if w.logit_divisor is None else logits / w.logit_divisor


def tensor_key(tensors) -> tuple:
    """Where and how a kernel finds each tensor: address, shape, stride, dtype (None stays None)."""
    return tuple(None if t is None else (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device) for t in tensors)
