"""Model shapes for back-of-envelope math: the sizes a memory or FLOPs formula needs.

    s = resolve_model("qwen2.5-7b")     # or "7b" (the course's table), "nano", "config.json", "run.yaml"
    count_params(s)                     # 7,615,616,512
    lora_params(s, 16)                  # adapters on every linear

Also the sizes that follow from a shape alone: KV bytes per token, activation bytes of a
micro-batch (the course's formula and a measured Llama count), logits bytes.

The presets carry the published shapes (hidden, layers, heads, KV heads, MLP width, vocab);
the tests pin their parameter counts to the numbers on the model cards. The course's round
sizes ("7b" = exactly 7e9 params, d=4096, 32 layers, 8 KV heads) come from lesson 22's
memory widget, so the course's worked numbers can be reproduced. The course's own MiniGPT
(`course-minigpt`, GPT-2-shaped) counts 796,416 params exactly: the lesson's "≈793,000" and
gpt_mini 02's "~200k non-embedding" (it is 791,040) are slips (the course's rows 97, 100; docs/architecture.md §11).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from posttrain.errors import UsageError
from posttrain.models.tokenizer import CharTokenizer


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tie_embeddings: bool = False
    head_dim: int = 0  # 0 = hidden // heads
    qkv_bias: bool = False  # Qwen2 puts biases on q, k, v
    arch: str = "llama"  # llama | gpt2 (the course's MiniGPT: learned positions, LayerNorm, GELU MLP)
    positions: int = 0  # gpt2: rows of the learned position table
    params: float = 0  # fixed parameter count (the course's round sizes); 0 = count from the shape

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads


def _llama(name, d, n, h, kv, ff, v, tie=False, **kw):
    return ModelShape(name, d, n, h, kv, ff, v, tie, **kw)


PRESETS = {
    s.name: s
    for s in [
        _llama("llama-7b", 4096, 32, 32, 32, 11008, 32000),  # Llama-2: 6,738,415,616 params
        _llama("llama-13b", 5120, 40, 40, 40, 13824, 32000),
        _llama("llama-70b", 8192, 80, 64, 8, 28672, 32000),
        _llama("llama3-8b", 4096, 32, 32, 8, 14336, 128256),
        _llama("llama3-70b", 8192, 80, 64, 8, 28672, 128256),
        _llama("llama3-405b", 16384, 126, 128, 8, 53248, 128256),
        _llama("mistral-7b", 4096, 32, 32, 8, 14336, 32000),
        _llama("qwen2.5-0.5b", 896, 24, 14, 2, 4864, 151936, True, qkv_bias=True),
        _llama("qwen2.5-1.5b", 1536, 28, 12, 2, 8960, 151936, True, qkv_bias=True),
        _llama("qwen2.5-3b", 2048, 36, 16, 2, 11008, 151936, True, qkv_bias=True),
        _llama("qwen2.5-7b", 3584, 28, 28, 4, 18944, 152064, qkv_bias=True),
        _llama("qwen2.5-14b", 5120, 48, 40, 8, 13824, 152064, qkv_bias=True),
        _llama("qwen2.5-32b", 5120, 64, 40, 8, 27648, 152064, qkv_bias=True),
        _llama("qwen2.5-72b", 8192, 80, 64, 8, 29568, 152064, qkv_bias=True),
        # the course's MiniGPT (gpt_mini 01): d128, h4, L4, V29, T_max 11
        ModelShape("course-minigpt", 128, 4, 4, 4, 512, 29, True, arch="gpt2", positions=11),
    ]
}
MINI_PRESETS = ("nano", "micro", "mini")  # gpt_mini.PRESETS, named here so the planner needs no torch (test pins it)
ALIASES = {
    "llama-2-7b": "llama-7b",
    "llama-2-13b": "llama-13b",
    "llama-2-70b": "llama-70b",
    "llama-3-8b": "llama3-8b",
    "llama-3-70b": "llama3-70b",
    "llama-3.1-405b": "llama3-405b",
}
# lesson 22's memory widget: (params in B, d_model, n_layers); GQA with 8 KV heads of d/max(8, d/128)
COURSE_SIZES = [
    (1, 2048, 22),
    (3, 3200, 26),
    (7, 4096, 32),
    (13, 5120, 40),
    (34, 8192, 48),
    (70, 8192, 80),
    (180, 12288, 96),
    (405, 16384, 126),
    (700, 20480, 140),
]


def course_shape(params_b: float) -> ModelShape:
    """The widget's model for `params_b` billion params: d and layers from `COURSE_SIZES`,
    linearly interpolated between rows (d rounded to a multiple of 128: our choice, the
    spec does not say how the widget rounds), heads max(8, d/128), 8 KV heads."""
    if not 0.1 <= params_b <= 700:
        raise UsageError(f"model size {params_b}b is outside the course's table; use 0.1b .. 700b")
    lo = max([r for r in COURSE_SIZES if r[0] <= params_b], default=COURSE_SIZES[0])
    hi = min([r for r in COURSE_SIZES if r[0] >= params_b], default=COURSE_SIZES[-1])
    f = 0.0 if hi[0] == lo[0] else (params_b - lo[0]) / (hi[0] - lo[0])
    d = int(round((lo[1] + f * (hi[1] - lo[1])) / 128) * 128)
    n = int(round(lo[2] + f * (hi[2] - lo[2])))
    ff = -(-8 * d // 3 // 256) * 256  # Llama's 8d/3 rounded up to 256
    return ModelShape(f"{params_b:g}b", d, n, max(8, d // 128), 8, ff, 32000, params=params_b * 1e9)


def layer_params(s: ModelShape) -> int:
    """Parameters of one transformer block. llama: attention (+ Qwen2's q/k/v biases), SwiGLU
    MLP, two RMSNorm weights. gpt2 (the course's MiniGPT): bias-free qkv/proj 4d², 4d GELU
    MLP with biases 8d² + 5d, two LayerNorms (γ, β) 4d."""
    d, q, kv = s.hidden, s.heads * s.hd, s.kv_heads * s.hd
    if s.arch == "gpt2":
        return 4 * d * d + 8 * d * d + 5 * d + 4 * d
    attn = d * (q + 2 * kv) + q * d + (q + 2 * kv if s.qkv_bias else 0)
    return attn + 3 * d * s.intermediate + 2 * d


def count_params(s: ModelShape) -> int:
    """All parameters: embeddings (+ an untied head), blocks, final norm; gpt2 adds its
    learned position table and its final LayerNorm has γ and β."""
    if s.params:
        return int(s.params)
    if s.arch == "gpt2":
        return s.vocab * s.hidden + s.positions * s.hidden + s.layers * layer_params(s) + 2 * s.hidden
    return s.vocab * s.hidden * (1 if s.tie_embeddings else 2) + s.layers * layer_params(s) + s.hidden


def lora_params(s: ModelShape, rank: int) -> int:
    """Adapter params for rank `rank` on every linear of every block (peft "all-linear"):
    r·(in + out) per matrix. llama-7b r=16 → 39,976,960."""
    d, q, kv, ff = s.hidden, s.heads * s.hd, s.kv_heads * s.hd, s.intermediate
    mats = [(d, q), (d, kv), (d, kv), (q, d), (d, ff), (d, ff), (ff, d)]
    return rank * s.layers * sum(i + o for i, o in mats)


def head_free_params(s: ModelShape) -> int:
    """A value model or reward model built on `s`: the trunk without the LM head (kept when
    tied, it is the embedding) plus a scalar head d + 1."""
    return count_params(s) - (0 if s.tie_embeddings else s.vocab * s.hidden) + s.hidden + 1


def kv_bytes_per_token(s: ModelShape, bytes_per_value: int = 2) -> int:
    """layers × 2 (K and V) × kv_heads × head_dim × bytes. Llama-3-8B → 131,072 (row 51)."""
    return s.layers * 2 * s.kv_heads * s.hd * bytes_per_value


def course_activation_bytes(
    layers: int, hidden: int, seq_len: int, batch: int, checkpointing: bool = False, bytes_per_value: int = 2
) -> float:
    """Lesson 22: N·L·B·(12d + 2L)·bytes; checkpointing keeps 1/8 of it (the widget's factor).
    7B (32 layers, d=4096) at L=8192, B=4 → 137.4 GB (row 61)."""
    full = layers * seq_len * batch * (12 * hidden + 2 * seq_len) * bytes_per_value
    return full / 8 if checkpointing else full


def activation_bytes(s: ModelShape, seq_len: int, batch: int, checkpointing: bool = False) -> float:
    """Bytes autograd saves in the forward of a bf16 Llama (Hugging Face, SDPA attention),
    per token, as tests/test_memory.py measures them with saved-tensor hooks:
      each RMSNorm 8d + 4   fp32 upcast 4d, its rsqrt 4, bf16 normed 2d, the next linear's input 2d
      attention 4q + 4kv + 4h   q 2q, k 2kv, v 2kv (GQA: not repeated), output 2q, fp32 logsumexp 4/head
      SwiGLU MLP 8ff        gate, up, SiLU(gate), product
      once: final norm + head input 8d + 4.
    Checkpointing keeps each layer's bf16 input (2d) and, in backward, one layer recomputed."""
    q, kv = s.heads * s.hd, s.kv_heads * s.hd
    per_layer = 2 * (8 * s.hidden + 4) + 4 * q + 4 * kv + 4 * s.heads + 8 * s.intermediate  # bytes per token
    head = 8 * s.hidden + 4
    kept = s.layers * 2 * s.hidden + per_layer if checkpointing else s.layers * per_layer
    return seq_len * batch * (kept + head)


def logits_bytes(tokens: int, vocab: int, bytes_per_value: float = 2, vocab_chunk: int = 0) -> float:
    """Logits held at once; a vocab chunk computes the log-softmax `vocab_chunk` columns at a
    time. 32,768 tokens × 131,072 × 2 B = 8.6 GB; 1k chunk → 67 MB (row 86)."""
    return tokens * min(vocab, vocab_chunk or vocab) * bytes_per_value


def resolve_model(name: str | ModelShape) -> ModelShape:
    """A preset name ("qwen2.5-1.5b"), a bare size ("7b", "1.5b": always the course's table,
    never a preset), gpt_mini's nano/micro/mini, a HF config.json or a posttrain YAML config
    (its `model:` section, or ModelConfig keys at the top level)."""
    if isinstance(name, ModelShape):
        return name
    key = ALIASES.get(name.lower(), name.lower())
    if key in PRESETS:
        return PRESETS[key]
    if Path(name).is_file():
        return _from_file(Path(name))
    if key.endswith("b") and key[:-1].replace(".", "", 1).isdigit():
        return course_shape(float(key[:-1]))
    if key in MINI_PRESETS:
        from posttrain.models.gpt_mini import ModelConfig  # entry: no torch until called

        return mini_shape(ModelConfig(preset=key), key)
    raise UsageError(
        f"model {name!r} is unknown; use a preset ({', '.join(sorted(PRESETS))}, "
        f"{', '.join(MINI_PRESETS)}), a size like 7b, or a config.json / YAML file"
    )


def mini_shape(mc, name: str) -> ModelShape:
    """The shape of a gpt_mini ModelConfig (its vocabulary: the built-in tokenizer's when unset)."""
    c = mc.resolved(CharTokenizer().vocab_size)
    return ModelShape(name, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.d_ff, c.vocab_size, c.tie_embeddings)


def _from_file(path: Path) -> ModelShape:
    import yaml

    try:
        data = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
    except (ValueError, yaml.YAMLError) as e:
        raise UsageError(
            f"model file '{path}' is not valid JSON/YAML ({e}); give a config.json or YAML config"
        ) from None
    if not isinstance(data, dict):
        raise UsageError(f"model file '{path}' holds no mapping; give a config.json or YAML config")
    if "hidden_size" in data:  # Hugging Face config.json
        try:
            h = data["num_attention_heads"]
            return ModelShape(
                path.parent.name or path.stem,
                data["hidden_size"],
                data["num_hidden_layers"],
                h,
                data.get("num_key_value_heads") or h,
                data["intermediate_size"],
                data["vocab_size"],
                bool(data.get("tie_word_embeddings", False)),
                data.get("head_dim") or 0,
                data.get("model_type") == "qwen2" or bool(data.get("attention_bias", False)),
            )
        except KeyError as e:
            raise UsageError(f"model file '{path}' lacks {e.args[0]!r}; give a causal-LM config.json") from None
    from dataclasses import fields

    from posttrain.config import build  # entry: no torch until called
    from posttrain.models.gpt_mini import ModelConfig  # entry: no torch until called

    if "model" not in data and not set(data) <= {f.name for f in fields(ModelConfig)}:
        raise UsageError(
            f"model file '{path}' has no model: section (an RL config starts from a checkpoint); "
            "give a pretrain/SFT config, a config.json or a preset name"
        )
    return mini_shape(build(ModelConfig, data.get("model", data), "model."), path.stem)
