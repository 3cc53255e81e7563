"""Any local Hugging Face causal LM as a posttrain model: policy, reference, critic or RM trunk.

    model, tok = load_hf("path/to/dir", device)    # config.json + safetensors + tokenizer
    model, tok = load_hf("Qwen/Qwen2.5-0.5B-Instruct")  # a hub id: its snapshot (models/hub.py)
    engine = Engine(model, tok)                     # the same sampler and KV cache as gpt_mini
    model.save(out_dir); tok.save(out_dir)          # a directory transformers opens again

`HFCausalLM` gives a transformers model the interface gpt_mini gives the framework:
`model(ids, cache=None) -> logits [B, T, V]`, `model.hidden(ids) -> [B, T, d]` (value and
reward heads), `.head`, `.config` (the shape fields the KV cache and heads read), and
`num_params()`. The tokenizer adapter `HFTokenizer` (models/hf_tokenizer.py) gives `encode`/`decode`, `pad_id`,
`eot_id` and the chat template as `chat_prompt(question)` / `chat_response(answer)`.

**How the engine's KV cache drives a transformers model.** The rollout engine owns the
cache (gpt_mini's `KVCache`: slots, per-row lengths, shared prompts copied into slots). The
protocol is: `cache.positions` [B, T] are the absolute positions of the new tokens,
`cache.update(layer, k, v)` stores them and returns the keys/values to attend over,
`cache.advance(T)` closes the forward. Transformers' attention layers call
`past_key_values.update(k, v, layer_idx)` after applying rotary embeddings, so a two-line
bridge object (`_CacheBridge`) is all the model sees; rotary positions come from
`position_ids = cache.positions`, and the attention mask is passed ready-made as a 4-D
boolean tensor [B, 1, T, S] (key s visible to query t iff s ≤ its position), which
transformers uses as it is. Attention runs through `sdpa` (a boolean mask is what
`F.scaled_dot_product_attention` reads), installed as "posttrain" (models/attention.py: packed
rows' flex BlockMasks go to flex attention, their Varlens to varlen attention). tests/test_hf.py checks that the engine's
behaviour logprobs equal a plain transformers forward over the finished sequences (≤1e-5, fp32).

This bridge is the engine's slow path, for any architecture; the Llama-like families decode
through models/decode.py instead (same logits, fewer ops: benchmarks/decode_paths.py).

Limits, each refused at load with a one-line error naming the class rather than sampled
wrongly: a sliding window shorter than the context (the mask above is full-causal; a window
at least as long never binds), bidirectional attention (`is_causal=false`), encoder–decoders,
and any architecture whose attention does not go through `past_key_values.update`
(`check_cache_path` decodes one token through the cache at load and compares it with a plain
forward).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from posttrain.errors import UsageError
from posttrain.models import hub, lora
from posttrain.models.attention import hf_mask, use_in_hf
from posttrain.models.export import _tokenizer_config
from posttrain.models.gpt_mini import KVCache
from posttrain.models.hf_tokenizer import HFTokenizer  # noqa: F401  (callers import it from here)
from posttrain.models.tokenizer import CharTokenizer


@dataclass
class HFShape:
    """The fields of gpt_mini's ModelConfig that the engine, the KV cache and the heads read."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    max_seq_len: int
    tie_embeddings: bool


def shape_of(c) -> HFShape:
    heads = c.num_attention_heads
    return HFShape(
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=heads,
        n_kv_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
        d_ff=getattr(c, "intermediate_size", 0),
        max_seq_len=c.max_position_embeddings,
        tie_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
    )


def sliding_window(c) -> int | None:
    """The attention window of a config whose attention is windowed somewhere inside its context,
    else None. HF masks key j for query i when i - j >= window, so a window at least as long as
    max_position_embeddings never binds (Mistral v0.2+ configs carry one)."""
    w = getattr(c, "sliding_window", None)
    types = getattr(c, "layer_types", None)
    if not w or w >= c.max_position_embeddings or (types is not None and "sliding_attention" not in types):
        return None
    return int(w)


def _cache_keyword(hf) -> str:
    """The forward's name for the KV cache: `cache` from transformers 5.24, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"


class _CacheBridge:
    """What a transformers attention layer sees of our KVCache: `update(k, v, layer_idx)`."""

    def __init__(self, cache):
        self.cache = cache

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        k, v, _ = self.cache.update(layer_idx, key_states, value_states)  # [B, Hkv, S, hd] each
        return k, v


# config keys by which a transformers forward changes what the LM head gives (Gemma 2/3's logit
# cap, Cohere's scale, Granite's divisor); 1 or None leaves it unchanged
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


class HFCausalLM(nn.Module):
    """A transformers causal LM behind gpt_mini's interface (see the module docstring).

    `head_exact`: the forward's logits are `head(hidden(ids))`, so they can be made from the hidden
    states a chunk of tokens at a time (models/heads.lm_parts); False for a model that transforms
    the head's output (`_LOGIT_TRANSFORMS`, or a probe at load that disagrees: `check_head`).
    """

    def __init__(self, hf_model):
        super().__init__()
        c, name = hf_model.config, type(hf_model).__name__
        window = sliding_window(c)
        if window:
            fix = "use_sliding_window=false" if hasattr(c, "use_sliding_window") else '"sliding_window": null'
            raise UsageError(
                f"{name}: sliding-window attention ({window} tokens, within its {c.max_position_embeddings}-token "
                f"context) is not supported by the posttrain engine, which attends over the whole sequence; "
                f"set {fix} in config.json (the same model for sequences up to {window} tokens)"
            )
        if c.is_encoder_decoder:
            raise UsageError(f"{name} is an encoder-decoder; posttrain needs a decoder-only causal LM")
        if getattr(c, "is_causal", True) is False:
            raise UsageError(
                f"{name}: config.json sets is_causal=false (bidirectional attention); posttrain samples and "
                "trains causal LMs only: use one, or drop is_causal if this model was trained causal"
            )
        use_in_hf(hf_model)  # sdpa; flex / varlen for packed rows' BlockMasks / Varlens (models/attention.py)
        self.hf = hf_model
        self.config = shape_of(c)
        self._cache_key = _cache_keyword(hf_model)  # inspect.signature took ~1 ms a decode step
        self.head_exact = all(getattr(c, k, None) in (None, 1, 1.0) for k in _LOGIT_TRANSFORMS)

    def forward(self, input_ids: torch.Tensor, cache=None) -> torch.Tensor:
        """Logits [B, T, V]; logits[:, t] predicts input_ids[:, t + 1]."""
        if cache is None:
            return self.hf(input_ids=input_ids, use_cache=False).logits
        logits = self.hf(input_ids=input_ids, **self._cache_kwargs(cache)).logits
        cache.advance(input_ids.shape[1])  # the new tokens are now history
        return logits

    def hidden(self, input_ids: torch.Tensor, cache=None, positions=None, attn_mask=None) -> torch.Tensor:
        """Final normed hidden states [B, T, d]; value and reward heads read these. `positions` [B, T]
        and `attn_mask` (bool [B, 1, T, T], True = attend, a flex BlockMask or a Varlen) run packed rows
        (framework/packing.py): transformers takes a 4-D mask as it is and rotates by `position_ids`."""
        body = self.hf.base_model
        if cache is None:
            packed = (
                {} if positions is None else {"position_ids": positions, "attention_mask": hf_mask(self.hf, attn_mask)}
            )
            return body(input_ids=input_ids, use_cache=False, **packed).last_hidden_state
        h = body(input_ids=input_ids, **self._cache_kwargs(cache)).last_hidden_state
        cache.advance(input_ids.shape[1])
        return h

    def _cache_kwargs(self, cache) -> dict:
        """The cache's positions [B, T] and its mask [B, 1, T, S] (True = attend), both made once
        by `cache.begin`; the forward's keyword for the cache is looked up once, at construction."""
        return {
            "position_ids": cache.positions,
            "attention_mask": cache.mask,
            self._cache_key: _CacheBridge(cache),
            "use_cache": True,
        }

    @property
    def head(self):
        return self.hf.get_output_embeddings()

    @head.setter
    def head(self, module):
        # ActorCritic drops a separate critic trunk's LM head (it reads hidden states only)
        self.hf.set_output_embeddings(module)

    @property
    def grad_checkpointing(self) -> bool:
        return getattr(self, "_grad_ckpt", False)

    @grad_checkpointing.setter
    def grad_checkpointing(self, on: bool) -> None:
        hf = self.hf  # transformers 5 renamed gradient_ to activation_checkpointing_*
        if on:  # non-reentrant: gradients reach LoRA adapters even when the inputs are frozen
            if hasattr(hf, "activation_checkpointing_enable"):
                hf.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif self.grad_checkpointing:
            (getattr(hf, "activation_checkpointing_disable", None) or hf.gradient_checkpointing_disable)()
        self._grad_ckpt = bool(on)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def save(self, directory: str | Path) -> None:
        """config.json + model.safetensors that `AutoModelForCausalLM.from_pretrained` opens.
        With LoRA adapters the merged weights W + (α/r)·B·A are written (models/lora.py)."""
        self.hf.save_pretrained(directory, state_dict=lora.merged_state_dict(self.hf))


def is_hf_dir(path: str | Path) -> bool:
    """An HF model directory (config.json) that is not a posttrain gpt_mini checkpoint (model.json)."""
    p = Path(path)
    return (p / "config.json").exists() and not (p / "model.json").exists()


def load_hf(path: str | Path, device="cpu") -> tuple[HFCausalLM, HFTokenizer]:
    """An HF causal-LM directory, or a hub id's snapshot (fetched once into the hub cache by
    models/hub.resolve_model), as (HFCausalLM in fp32 on `device`, HFTokenizer). The tokenizer
    stops a response at every end-of-sequence id of the model's generation_config.json too (Qwen2.5
    Instruct: <|im_end|> and <|endoftext|>; Llama 3 Instruct: <|eot_id|> and <|end_of_text|>), as
    transformers' `generate` does."""
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise UsageError("loading a Hugging Face model needs transformers: pip install 'posttrain[hf]'") from None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line per stage, not a bar per load
    d = hub.resolve_model(path).local_dir
    try:  # fp32 master weights always; autocast picks the compute dtype (runtime.py)
        hf = AutoModelForCausalLM.from_pretrained(
            d, dtype=torch.float32, attn_implementation="sdpa", local_files_only=True
        )
        tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(
            f"{d} is not a loadable Hugging Face causal-LM directory "
            f"({type(e).__name__}: {str(e).splitlines()[0][:160]}); it needs config.json, "
            "safetensors weights and a tokenizer"
        ) from None
    model = HFCausalLM(hf.eval()).to(device)
    check_cache_path(model)
    check_head(model)
    return model, HFTokenizer(tok, generation_eos(hf))


def generation_eos(hf_model) -> list[int]:
    """The end-of-sequence ids of the model's generation config (an int or a list in
    generation_config.json; transformers fills it from config.json when the file is absent)."""
    ids = getattr(getattr(hf_model, "generation_config", None), "eos_token_id", None)
    return [] if ids is None else [int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids])]


@torch.inference_mode()
def check_head(model: HFCausalLM) -> None:
    """Keep `head_exact` only when head(hidden(ids)) equals the forward's logits on a 4-token probe:
    an architecture that transforms its logits in a way `_LOGIT_TRANSFORMS` does not list is then
    scored through its whole forward, never through a head that misses the transform."""
    if not model.head_exact:
        return
    p = next(model.parameters())
    ids = torch.arange(1, 5, device=p.device)[None] % model.config.vocab_size  # [1, 4]
    full = model(ids).float()  # [1, 4, V]
    model.head_exact = bool(torch.allclose(model.head(model.hidden(ids)).float(), full, rtol=1e-5, atol=1e-5))


@torch.inference_mode()
def check_cache_path(model: HFCausalLM) -> None:
    """Refuse an architecture whose attention ignores the KV-cache bridge: the last logits of
    a 3-token prefill + 1 decoded token through our cache must equal one plain forward."""
    p = next(model.parameters())
    ids = torch.arange(1, 5, device=p.device)[None] % model.config.vocab_size  # [1, 4]
    cache = KVCache(model.config, 1, 4, device=p.device, dtype=p.dtype)
    full = model(ids)[0, -1].float()  # [V]
    try:
        cache.begin(3)
        model(ids[:, :3], cache=cache)
        cache.begin(1)
        step = model(ids[:, 3:], cache=cache)[0, -1].float()  # [V]
        why = (
            "decoding differs from a full forward" if (step - full).abs().max() > 1e-3 * (1 + full.abs().max()) else ""
        )
    except (RuntimeError, TypeError, ValueError, AttributeError) as e:
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
    if why:
        raise UsageError(
            f"{type(model.hf).__name__}: the posttrain engine cannot decode it ({why}): its attention must be "
            "causal and go through transformers' KV cache; use a decoder-only causal LM such as Llama, "
            "Mistral, Qwen2/3, Granite, Phi3, SmolLM3, Gemma or OLMo2"
        )


def write_tiny(
    out_dir: str | Path,
    arch: str = "llama",
    d_model: int = 64,
    n_layers: int = 2,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    d_ff: int = 128,
    max_len: int = 256,
    seed: int = 0,
    vocab_size: int = 0,
    **config,
) -> Path:
    """A random-weight HF model directory (`arch` is a transformers model_type: llama, qwen2,
    qwen3, mistral, …; `config` sets any other field of its config) with posttrain's character
    vocabulary as a `tokenizers` WordLevel tokenizer and its chat template: tests and
    benchmarks use it instead of a download. `vocab_size` > the tokenizer's gives the model a real
    model's output width (151,936 for Qwen2.5) over the same characters: ids past the tokenizer's
    decode to nothing, as a real vocabulary's unused rows do."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    ct = CharTokenizer()
    if vocab_size and vocab_size < ct.vocab_size:
        raise UsageError(f"vocab_size={vocab_size} is below the tokenizer's {ct.vocab_size} tokens")
    fields = dict(
        vocab_size=vocab_size or ct.vocab_size,
        hidden_size=d_model,
        intermediate_size=d_ff,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=max_len,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=ct.eot_id,
        pad_token_id=ct.pad_id,
    )
    try:
        cfg = AutoConfig.for_model(arch, **{**fields, **config})
    except ValueError:
        raise UsageError(f"arch={arch!r} is not a transformers model_type; use e.g. llama, qwen2, qwen3") from None
    torch.manual_seed(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(out)
    (out / "tokenizer.json").write_text(json.dumps(ct.to_hf_json()))
    (out / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(ct, max_len)))
    AutoTokenizer.from_pretrained(out).save_pretrained(out)  # normalise to the installed version's files
    return out
