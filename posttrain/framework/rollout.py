"""Role 1, rollout: the sampling engine that turns prompts into `Sample`s.

    engine = Engine(model, tokenizer, max_slots=256)
    samples = engine.generate(prompt_ids, n=8, sampling=SamplingParams(temperature=1.0))

What the engine does, in the order a reader should study it:

1. **Shared prompt per group.** Each prompt is prefilled once (prompts are batched, right-
   padded, into a small prompt cache) and its keys/values are copied into the slots of its
   n samples (`KVCache.copy_row`). `stats["rollout/prefill_tokens"]` counts prompt tokens
   computed; `rollout/prompt_tokens` counts them as if every sample had its own prompt.
2. **Continuous batching.** A fixed pool of slots (rows of one contiguous KV cache). Each
   step decodes every active slot in ONE forward of one token per slot, through the
   incremental KV cache (the prefix is never re-encoded). A slot whose sequence ends (stop
   id or length cap) is refilled with the next waiting sample at the next read-back. Active
   slots are kept packed in rows [0, n): when the queue is empty a finished hole is filled
   by moving the last active row into it, so the forward reads a view of the cache, never
   a gathered copy, and attends over the used span only.
   The loop (framework/decode_loop.py) reads the device back once every k steps
   (`decode_window`: 1 on CPU, 8 on CUDA): in between, a step's shapes are static (rows
   rounded up to `decode_bucket`, the span known on the host) and a finished row is frozen
   and masked, so on CUDA those steps replay as CUDA graphs (framework/decode_graphs.py),
   kept with the loop's slot state from one call to the next (framework/decode_state.py).
   Every k samples the same tokens; k = 1 is the step-by-step loop, logprobs bit for bit.
3. **Behaviour logprobs at sampling time** (`sample_tokens`): the log-probability of the
   sampled token under the FULL temperature-scaled distribution, `token_logprobs` — the
   same function the trainer imports, so sampler and trainer apply temperature in exactly
   one way (the most common cause of a sampler/trainer mismatch otherwise). Top-k / top-p
   truncation is NOT reflected in the recorded logprob: the trainer cannot recompute a
   truncated distribution exactly from its own logits, so RL presets keep top_k=0,
   top_p=1, where the two are identical. Temperature 0 is greedy, recorded at T=1.
4. **Counter-based randomness.** Each draw uses a uniform hashed (splitmix64) from
   (seed, step, prompt, sample, t) and inverse-CDF sampling, so a sample's tokens do not
   depend on what else shares the batch, on `max_slots`, or on the order of admission
   (up to float-level differences in the logits of different batch shapes, which can flip
   a token only when the uniform lands within ~1e-7 of a CDF boundary). The prompt id is
   the group index plus `group_offset`, so a caller can make prompt ids global. A sample's
   uniforms for all its draws are hashed once, when it is admitted (`draw_uniforms`).

5. **A one-token decode path** (models/decode.py) for gpt_mini and the Llama-like HF
   families (models/decode_weights.py): attention as two batched matmuls over the used span,
   per-step index/rotary work done once instead of per layer. Same logits as `model.forward`
   within float noise; `engine.fast_decode = False` decodes through `model.forward`, as any
   other architecture or a LoRA-wrapped model does (a one-line note says which and why).

All work runs under `torch.inference_mode()`. Per step the Python overhead is constant in
the batch size: tokens, logprobs and per-slot state live in preallocated tensors and
samples are built once at the end. Every error this engine can raise (bad sizes, a failing
forward) concerns the whole call, so it raises; `finish_reason="error"` is left to engines
whose per-sample work can fail alone (e.g. tool calls in agent episodes).
"""

from __future__ import annotations

import contextlib
import time

import torch

from posttrain.framework.decode_loop import PREFILL_BATCH, PREFILL_CHUNK, DecodeLoop
from posttrain.framework.decode_state import SlotState
from posttrain.framework.sample import Sample
from posttrain.framework.sampler import (  # noqa: F401  (re-exported: callers import them from here)
    SamplingParams,
    check_request,
    draw_keys,
    draw_uniforms,
    sample_keys,
    sample_tokens,
    splitmix64,
    token_logprobs,
)
from posttrain.logging import note_once
from posttrain.models.decode import Decoder
from posttrain.models.decode_weights import class_name
from posttrain.models.gpt_mini import KVCache
from posttrain.models.lora import unadapted_copy

# ---- the engine --------------------------------------------------------------------------------


class Engine:
    """Continuous-batching sampler over a gpt_mini-style model (`model(ids, cache=KVCache)`).

    max_slots: sequences decoded together (rows of the KV cache); more slots = bigger
        matmuls per step (throughput) but more cache memory: rows × (prompt + max_new) ×
        2 · n_layers · n_kv_heads · head_dim floats.
    max_len: longest prompt + response the engine accepts (default: model.config.max_seq_len).
    runtime: a runtime.Runtime; its autocast (bf16 on CUDA) wraps sampling, as it wraps the
        trainer's forward, so both score tokens in the same precision; the KV caches hold its
        compute dtype (`cache_dtype`: every matmul reads them in it anyway). None = no autocast.
    """

    PREFILL_BATCH = PREFILL_BATCH  # prompts per prefill forward (framework/decode_loop.py)

    def __init__(self, model, tokenizer, max_slots: int = 256, max_len: int | None = None, runtime=None):
        self.model, self.tokenizer, self.runtime = model, tokenizer, runtime
        self.max_slots = int(max_slots)
        limit = model.config.max_seq_len
        self.max_len = int(max_len or limit)
        if self.max_slots < 1:
            raise ValueError(f"max_slots must be >= 1, got {max_slots}")
        if self.max_len > limit:
            raise ValueError(f"max_len={self.max_len} exceeds the model's max_seq_len={limit} (its rotary table)")
        self.policy_version = 0  # weight sync bumps it; stamped on every Sample
        self.owns_copy = False  # own_copy(): the model is a private copy, not the trainer's module
        self.on_decode_step = None  # partial rollouts: called before each decode forward (may load new weights)
        self.stats: dict = {}
        self._slots: KVCache | None = None  # reused across calls while big enough
        self._state: SlotState | None = None  # the decode loop's slot state and graphs (decode_state.py)
        self.fast_decode = True  # False: decode through model.forward (the reference path)
        self.decode_window: int | None = None  # decode steps between read-backs (None: 1 on CPU, 8 on CUDA)
        self.decode_bucket: int | None = None  # rows computed per step round up to this (None: 1 on CPU, 16 on CUDA)
        self.prefill_chunk = PREFILL_CHUNK  # padded prompt tokens per prefill forward; longer prompts in chunks
        self.capture_decode = True  # on CUDA, replay in-window decode steps as CUDA graphs (decode_graphs.py)
        self.decode_span_bucket: int | None = (
            None  # in-window attended span rounds up to this (None: 64 captured, else 1)
        )

    # -- public ----------------------------------------------------------------------------

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        sampling: SamplingParams,
        seed: int = 0,
        step: int = 0,
        items: list | None = None,
        group_offset: int = 0,
        keep: int | None = None,
    ) -> list[Sample]:
        """n samples of every prompt, group-major: all n samples of prompt 0, then prompt 1…

        Sample j of prompt g draws its randomness from (seed, step, group_offset + g, j, t).
        keep < n is the straggler cut-off (lesson 22b): n samples start, the first `keep` of
        each group to finish are returned and the rest are cancelled as soon as their group
        has its `keep` (`rollout/cancelled`). It favours short responses: a deliberate bias.
        """
        self._check(prompts, n, sampling, items)
        if keep is not None and not 1 <= keep <= n:
            raise ValueError(f"keep must be in [1, n={n}], got {keep}")
        t0 = time.perf_counter()
        training = self.model.training  # sample in eval mode (no dropout, no checkpointing), then restore
        self.model.eval()
        try:
            with torch.inference_mode(), self.runtime.autocast() if self.runtime else contextlib.nullcontext():
                out = DecodeLoop(self, prompts, n, sampling, seed, step, group_offset, keep).run()
        finally:
            self.model.train(training)
        res_tok, res_lp, res_len, res_stop, res_kept, res_ver, stats = out
        samples = self._samples(prompts, n, items, res_tok, res_lp, res_len, res_stop, res_kept, res_ver)
        dt = time.perf_counter() - t0
        stats["rollout/time_s"] = dt
        stats["rollout/tokens_per_s"] = stats["rollout/generated_tokens"] / max(dt, 1e-9)
        self.stats = stats
        return samples

    @torch.no_grad()
    def update_weights(self, weights, version: int | None = None) -> int:
        """Copy (name, tensor) pairs into the model's parameters, in place; a tensor that already is
        the parameter (the engine shares the trainer's module) moves nothing. Returns bytes copied."""
        own, copied = self.model.state_dict(keep_vars=True), 0
        for name, t in weights:
            p = own[name]
            if p.data_ptr() != t.data_ptr():
                p.copy_(t)  # in place, version counter bumped (the decoder refreshes on it)
                copied += p.numel() * p.element_size()
        if version is not None:
            self.policy_version = version
        return copied

    def own_copy(self) -> None:
        """Sample from a frozen plain copy of the model (LoRA merged) from now on, for a sync that
        copies weights in (`separate`); a no-op once the engine holds one."""
        if not self.owns_copy:
            self.model, self.owns_copy = unadapted_copy(self.model), True

    def close(self) -> None:
        """Release what outlives a call (the slot cache, the slot state and its CUDA graphs); the
        model stays. A later generate() makes them anew."""
        self._slots = self._state = None

    def decoder(self):
        """models/decode.Decoder for gpt_mini and the Llama-like HF families (None otherwise:
        decode via model.forward, said once per process and reason). Rebuilt when the model
        changed or a layer was wrapped since."""
        if not self.fast_decode:
            return None
        d = getattr(self, "_decoder", None)
        if getattr(self, "_decoder_of", None) is not self.model or (d is not None and not d.still_plain()):
            self._decoder, self._decoder_of = Decoder.for_model(self.model), self.model
            if self._decoder is None:
                note_once(
                    f"{class_name(self.model)} decodes through model.forward, the slow path "
                    f"({Decoder.why_not(self.model)})"
                )
        return self._decoder

    def window(self, device: torch.device) -> int:
        """k: decode steps between two read-backs of the device (admission and retirement)."""
        return max(1, self.decode_window or (8 if device.type == "cuda" else 1))

    def row_bucket(self, device: torch.device) -> int:
        """Rows per decode step round up to a multiple of this: few shapes, one captured graph each."""
        return max(1, self.decode_bucket or (16 if device.type == "cuda" else 1))

    # -- helpers ---------------------------------------------------------------------------

    def _check(self, prompts, n, sampling, items) -> None:
        check_request(prompts, n, sampling, items, self.max_len)

    def cache_dtype(self) -> torch.dtype:
        """The runtime's compute dtype under autocast (not an emulated SamplerRuntime's), else the weights'."""
        on = getattr(self.runtime, "autocast_on", False)
        return self.runtime.compute_dtype if on else next(self.model.parameters()).dtype  # type: ignore[union-attr]

    def _slot_cache(self, rows: int, length: int) -> KVCache:
        c = self._slots
        dtype = self.cache_dtype()
        if c is None or c.lengths.shape[0] < rows or c.max_len < length or c.k.dtype != dtype:
            p = next(self.model.parameters())
            self._slots = c = KVCache(self.model.config, rows, length, device=p.device, dtype=dtype)
        c.reset_rows(slice(None))
        return c

    def slot_state(self, S: int, M: int, V: int, dev: torch.device) -> SlotState:
        """The decode loop's slot state, kept across calls of the same slots, cap, vocabulary and device
        (a CUDA graph captured over it replays in later calls); a call of another size replaces it."""
        if self._state is None or self._state.key != (S, M, V, dev):
            self._state = None  # its graphs and buffers go before the new ones are made
            self._state = SlotState(S, M, V, dev)
        return self._state

    def _samples(self, prompts, n, items, res_tok, res_lp, res_len, res_stop, res_kept, res_ver) -> list[Sample]:
        toks, lps, vers = res_tok.tolist(), res_lp.tolist(), res_ver.tolist()  # one conversion for all samples
        lens, stops = res_len.tolist(), res_stop.tolist()
        out = []
        for s in res_kept.nonzero().squeeze(1).tolist():
            g, j, L = s // n, s % n, lens[s]
            ids = toks[s][:L]
            out.append(
                Sample(
                    prompt_ids=list(prompts[g]),
                    response_ids=ids,
                    response_logprobs=lps[s][:L],
                    response_mask=[1] * L,
                    finish_reason="stop" if stops[s] else "length",
                    policy_version=vers[s][0] if L else self.policy_version,
                    group=g,
                    index=j,
                    item=None if items is None else items[g],
                    text=self.tokenizer.decode(ids),
                    completion=self.tokenizer.completion_text(ids),
                    token_versions=vers[s][:L],
                )
            )
        return out
