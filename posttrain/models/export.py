"""Export gpt_mini to a Hugging Face `LlamaForCausalLM` directory, and import it back.

gpt_mini is a Llama with two fusions (docs/architecture.md §2): q/k/v are one Linear `attn.qkv`
holding [q; k; v] rows, gate/up are one Linear `mlp.gate_up` holding [gate; up] rows.
Export splits them along the output rows; import concatenates them again, so
`import_hf(export_hf(m))` gives back the same tensors bit for bit. Rotary positions already
use the HF `rotate_half` convention, so no q/k row permutation is needed (unlike Meta's
original Llama weights). tests/test_export.py checks that HF gives the same logits (≤1e-5,
fp32) and the same greedy continuations.

An exported directory holds:

    config.json               LlamaConfig (fp32, bos none, eos = end of turn, pad = `_`)
    model.safetensors         HF names; a tied head is written once (transformers re-ties it)
    generation_config.json    eos / pad ids, so `generate` stops at the end of turn
    tokenizer.json            the character vocabulary as a `tokenizers` WordLevel model
    tokenizer_config.json     PreTrainedTokenizerFast + the chat template below
    tokenizer.posttrain.json  our CharTokenizer, so `import_hf` round-trips

Only torch and safetensors are needed to export and import; `to_hf_config` and
`to_hf_model` (in-memory HF objects) import transformers where they are used.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from posttrain.chat import ASSISTANT, EOT, PAD, RESULT_CLOSE, RESULT_OPEN, SYSTEM, USER
from posttrain.errors import UsageError
from posttrain.models.gpt_mini import GPTMini, ModelConfig
from posttrain.models.tokenizer import CharTokenizer

# The course's chat format in Jinja. `>` opens the assistant turn, so it is the generation
# prompt: an assistant message renders as `>` + content + `#`, and add_generation_prompt
# appends `>` after a trailing user turn. A finished conversation therefore reads exactly
# like CharTokenizer.chat_prompt + chat_response, and `[user "3+4"]` with
# add_generation_prompt=True renders as `<3+4>`, which is CharTokenizer.chat_prompt("3+4").
CHAT_TEMPLATE = (  # posttrain/chat.py's render_builtin, as jinja: the same text for the same messages
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}" + SYSTEM + "{{ message['content'] }}"
    "{%- elif message['role'] == 'user' -%}" + USER + "{{ message['content'] }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{%- if loop.index0 > 0 and messages[loop.index0 - 1]['role'] == 'user' -%}" + ASSISTANT + "{%- endif -%}"
    "{{ message['content'] }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}" + EOT + "{%- endif -%}"
    "{%- elif message['role'] == 'tool' -%}"
    + RESULT_OPEN
    + "{{ message['content'] }}"
    + RESULT_CLOSE
    + "{%- else -%}{{ raise_exception('unknown role ' + message['role']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt and messages and messages[-1]['role'] == 'user' -%}" + ASSISTANT + "{%- endif -%}"
)

WEIGHTS_FILE = "model.safetensors"


# ---- config -------------------------------------------------------------------------------


def hf_config_dict(cfg: ModelConfig, tokenizer: CharTokenizer | None = None) -> dict:
    """The config.json of a LlamaForCausalLM equal to `cfg` (a resolved ModelConfig)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": "float32",
        "use_cache": True,
        # No BOS: our sequences start with the user marker. LlamaConfig's defaults (1, 2)
        # would point at `<` and `>` in our vocabulary, so they are overridden explicitly.
        "bos_token_id": None,
        "eos_token_id": tokenizer.eot_id if tokenizer else None,
        "pad_token_id": tokenizer.pad_id if tokenizer else None,
    }


def to_hf_config(cfg: ModelConfig, tokenizer: CharTokenizer | None = None):
    """A `transformers.LlamaConfig` with the same shape as `cfg` (a resolved ModelConfig)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        **{k: v for k, v in hf_config_dict(cfg, tokenizer).items() if k not in ("architectures", "model_type")}
    )


def from_hf_config(d: dict) -> ModelConfig:
    """The ModelConfig of a config.json dict; refuses Llama features gpt_mini lacks, since
    loading those weights anyway would give silently different logits."""
    if d.get("model_type") != "llama":
        raise UsageError(f"config.json: model_type={d.get('model_type')!r}; only 'llama' imports into gpt_mini")
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    unsupported = {
        "hidden_act": d.get("hidden_act", "silu") != "silu",
        "attention_bias": bool(d.get("attention_bias")),
        "mlp_bias": bool(d.get("mlp_bias")),
        "rope_scaling": rope.get("rope_type", rope.get("type", "default")) != "default",
    }
    if any(unsupported.values()):
        raise UsageError(f"config.json: gpt_mini cannot represent {[k for k, v in unsupported.items() if v]}")
    n_heads = d["num_attention_heads"]
    if d.get("head_dim", d["hidden_size"] // n_heads) * n_heads != d["hidden_size"]:
        raise UsageError("config.json: gpt_mini needs head_dim * num_attention_heads == hidden_size")
    return ModelConfig(
        vocab_size=d["vocab_size"],
        d_model=d["hidden_size"],
        n_layers=d["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=d.get("num_key_value_heads") or n_heads,
        d_ff=d["intermediate_size"],
        max_seq_len=d["max_position_embeddings"],
        rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 10000.0))),
        norm_eps=d["rms_norm_eps"],
        tie_embeddings=bool(d.get("tie_word_embeddings", False)),
    )


# ---- weights ------------------------------------------------------------------------------


def _layer_names(i: int) -> tuple[str, str]:
    return f"blocks.{i}.", f"model.layers.{i}."


_HF_NAMES = {  # gpt_mini's per-block names → HF Llama's (the fused ones are split below)
    "attn_norm.weight": "input_layernorm.weight",
    "attn.o.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.down.weight": "mlp.down_proj.weight",
}


def to_hf_tensors(named, cfg: ModelConfig):
    """gpt_mini (name, tensor) pairs → HF Llama (name, tensor) pairs, q/k/v and gate/up split
    (views, no copies); a tied head is left out, as in an HF checkpoint. A fused tensor yields
    its whole group, so a partial update never reaches a fused layer (vLLM's q/k/v, gate/up)."""
    hd = cfg.head_dim
    for name, t in named:
        if name == "embed.weight":
            yield "model.embed_tokens.weight", t
        elif name == "norm.weight":
            yield "model.norm.weight", t
        elif name == "head.weight":
            if not cfg.tie_embeddings:
                yield "lm_head.weight", t
        elif name.startswith("blocks.") and name.count(".") >= 3:
            _, i, rest = name.split(".", 2)
            b = f"model.layers.{i}."
            if rest == "attn.qkv.weight":
                parts = t.split([cfg.n_heads * hd, cfg.n_kv_heads * hd, cfg.n_kv_heads * hd])  # [H·hd | Hkv·hd ×2, d]
                yield from ((b + f"self_attn.{p}_proj.weight", x) for p, x in zip("qkv", parts))
            elif rest == "mlp.gate_up.weight":
                gate, up = t.chunk(2)  # [d_ff, d] each
                yield from ((b + "mlp.gate_proj.weight", gate), (b + "mlp.up_proj.weight", up))
            elif rest in _HF_NAMES:
                yield b + _HF_NAMES[rest], t
            else:
                raise KeyError(f"{name} has no HF Llama name")
        else:
            raise KeyError(f"{name} has no HF Llama name")


def to_hf_state_dict(model: GPTMini) -> dict[str, torch.Tensor]:
    """HF Llama names → fp32 CPU tensors (fresh copies, so nothing shares memory).

    A tied head is left out, as in an HF checkpoint: `lm_head.weight` is the embedding.
    """
    src = ((k, v.detach().to("cpu", torch.float32)) for k, v in model.state_dict().items())
    return {k: v.contiguous().clone() for k, v in to_hf_tensors(src, model.config)}


def from_hf_state_dict(sd: dict[str, torch.Tensor], cfg: ModelConfig) -> GPTMini:
    """A GPTMini (fp32, eval mode) holding the HF-named weights `sd`; the inverse of
    `to_hf_state_dict`. Every gpt_mini weight must be present and no HF weight left over."""
    left = dict(sd)
    take = left.pop
    try:
        ours = {"embed.weight": take("model.embed_tokens.weight")}
        for i in range(cfg.n_layers):
            a, b = _layer_names(i)
            ours |= {
                a + "attn_norm.weight": take(b + "input_layernorm.weight"),
                a + "attn.qkv.weight": torch.cat([take(b + f"self_attn.{p}_proj.weight") for p in "qkv"]),
                a + "attn.o.weight": take(b + "self_attn.o_proj.weight"),
                a + "mlp_norm.weight": take(b + "post_attention_layernorm.weight"),
                a + "mlp.gate_up.weight": torch.cat([take(b + "mlp.gate_proj.weight"), take(b + "mlp.up_proj.weight")]),
                a + "mlp.down.weight": take(b + "mlp.down_proj.weight"),
            }
        ours["norm.weight"] = take("model.norm.weight")
        head = left.pop("lm_head.weight", None)
        if head is None and not cfg.tie_embeddings:
            raise KeyError("lm_head.weight")
    except KeyError as e:
        raise UsageError(f"HF weights lack {e.args[0]} for a {cfg.n_layers}-layer gpt_mini") from None
    left = [k for k in left if "rotary_emb" not in k]  # old checkpoints saved inv_freq
    if left:
        raise UsageError(f"HF weights have {len(left)} tensors gpt_mini does not use, e.g. {left[0]}")
    # A tied model takes the embedding as its head (an explicit lm_head in a tied
    # checkpoint is the same tensor, as transformers ties it on load too).
    ours["head.weight"] = ours["embed.weight"] if cfg.tie_embeddings else head
    model = GPTMini(cfg)
    model.load_state_dict({k: v.to(torch.float32) for k, v in ours.items()})
    return model.eval()


def to_hf_model(model: GPTMini, tokenizer: CharTokenizer | None = None):
    """An in-memory `LlamaForCausalLM` (fp32, eval mode) with `model`'s weights."""
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM(to_hf_config(model.config, tokenizer)).to(torch.float32)
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(model), strict=False)
    tied_head = ["lm_head.weight"] if model.config.tie_embeddings else []
    if unexpected or sorted(missing) != tied_head:
        raise RuntimeError(f"HF Llama layout mismatch: missing {missing}, unexpected {unexpected}")
    if tied_head:
        hf.tie_weights()
    return hf.eval()


# ---- directories --------------------------------------------------------------------------


def _tokenizer_config(tokenizer: CharTokenizer, max_len: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "bos_token": None,
        "eos_token": EOT,
        "pad_token": PAD,
        "unk_token": PAD,  # tokenizer.json's WordLevel unk; CharTokenizer raises instead
        "model_max_length": max_len,
        "padding_side": "left",  # what batched HF `generate` needs
        "clean_up_tokenization_spaces": False,  # characters decode verbatim, spaces included
        "add_bos_token": False,
        "add_eos_token": False,
    }


def export_hf(model: GPTMini, tokenizer: CharTokenizer, out_dir: str | Path) -> Path:
    """Write `model` and `tokenizer` as an HF LlamaForCausalLM directory (see the module
    docstring). Atomic: everything goes into `out_dir.tmp`, which then replaces `out_dir`.
    An existing `out_dir` is replaced only if it is empty or a previous export."""
    out = Path(out_dir)
    c = model.config
    if tokenizer.vocab_size != c.vocab_size:
        raise UsageError(f"tokenizer has {tokenizer.vocab_size} tokens but the model {c.vocab_size}")
    if out.exists() and any(out.iterdir()) and not (out / WEIGHTS_FILE).exists():
        raise UsageError(f"{out} exists and is not an HF export; pick another directory")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    def write_json(name, obj):
        (tmp / name).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")

    write_json("config.json", hf_config_dict(c, tokenizer))
    write_json(
        "generation_config.json",
        {"bos_token_id": None, "eos_token_id": tokenizer.eot_id, "pad_token_id": tokenizer.pad_id},
    )
    save_file(to_hf_state_dict(model), tmp / WEIGHTS_FILE, metadata={"format": "pt"})
    write_json("tokenizer.json", tokenizer.to_hf_json())
    write_json("tokenizer_config.json", _tokenizer_config(tokenizer, c.max_seq_len))
    tokenizer.save(tmp)

    old = out.with_name(out.name + ".old")
    if out.exists():
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return out


def import_hf(directory: str | Path) -> tuple[GPTMini, CharTokenizer]:
    """Load an HF Llama directory (config.json + model.safetensors, e.g. from `export_hf`)
    into gpt_mini. The tokenizer is ours from tokenizer.posttrain.json, or the default
    CharTokenizer when the directory has none; its size must match the model's."""
    d = Path(directory)
    for name in ("config.json", WEIGHTS_FILE):
        if not (d / name).exists():
            raise UsageError(
                f"{d / name} not found; import_hf needs an HF directory with config.json and {WEIGHTS_FILE}"
            )
    cfg = from_hf_config(json.loads((d / "config.json").read_text()))
    tokenizer = CharTokenizer.load(d)
    if tokenizer.vocab_size != cfg.vocab_size:
        raise UsageError(f"{d}: the model has {cfg.vocab_size} tokens but the tokenizer {tokenizer.vocab_size}")
    return from_hf_state_dict(load_file(d / WEIGHTS_FILE), cfg), tokenizer
