"""Real model shapes without a hub: a randomly initialised Hugging Face directory of a named shape.

    write_shape("/tmp/q", "qwen2.5-0.5b")            # Qwen2ForCausalLM, 494,032,768 params
    write_shape("/tmp/l", "qwen2.5-0.5b", "llama")   # the same dimensions as a LlamaForCausalLM

Speed and memory at real size depend on the shape (width, depth, heads, KV heads, MLP width, the
vocabulary) and on the family's extras (Qwen2's q/k/v biases, Qwen3's q/k RMSNorm and its head_dim
wider than hidden/heads, Llama 3's rope scaling), not on trained weights: a seeded random init of
the published config measures the same work. `arch="llama"` builds the same dimensions as a plain
`LlamaForCausalLM`, to compare a family with the Llama path.

The tokenizer is a byte-level BPE learnt here, in a second, on made-up words (`words`), with the
chat template `user: ...\\nassistant: `. Byte-level BPE because transformers 5 loads a qwen2/qwen3
directory's tokenizer as Qwen2's BPE class, whatever tokenizer.json holds. Its vocabulary (at most
3,000) is smaller than the model's: the model's width and logits are the real ones, and ids past
the tokenizer's decode to nothing. The `tiny-*` shapes keep each family's extras at a size tests run.

Shapes (the published config.json values; `tests/test_bench_step.py` pins the parameter counts):
    qwen2.5-0.5b   hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864, vocab 151,936, tied,
                   q/k/v biases, rope θ 1e6
    qwen3-0.6b     hidden 1024, 28 layers, 16 heads, 8 KV heads, head_dim 128, MLP 3072,
                   vocab 151,936, tied, q/k RMSNorm, rope θ 1e6
    llama-3.2-1b   hidden 2048, 16 layers, 32 heads, 8 KV heads, MLP 8192, vocab 128,256, tied,
                   rope θ 5e5 with llama3 scaling (factor 32, low 1, high 4, original 8192)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from posttrain.errors import UsageError
from posttrain.sizing.shapes import PRESETS, ModelShape

PAD, EOS = "<pad>", "<eos>"  # ids 0 and 1 of the tokenizer
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@dataclass(frozen=True)
class Shape:
    dims: ModelShape  # the sizes, as posttrain.sizing counts them (its preset where it has one)
    family: str  # qwen2 | qwen3 | llama: the transformers class of the published model
    rope_theta: float = 1e6
    rms_eps: float = 1e-6
    max_positions: int = 32768
    rope_scaling: dict = field(default_factory=dict)  # {} = none

    @property
    def name(self) -> str:
        return self.dims.name


def _tiny(name: str, **kw) -> ModelShape:
    return ModelShape(name, 64, 2, 4, 2, 128, 512, True, **kw)


SHAPES = {
    s.name: s
    for s in [
        Shape(PRESETS["qwen2.5-0.5b"], "qwen2"),
        Shape(
            ModelShape("qwen3-0.6b", 1024, 28, 16, 8, 3072, 151936, True, head_dim=128), "qwen3", max_positions=40960
        ),
        Shape(
            ModelShape("llama-3.2-1b", 2048, 16, 32, 8, 8192, 128256, True, head_dim=64),
            "llama",
            rope_theta=5e5,
            rms_eps=1e-5,
            max_positions=131072,
            rope_scaling=LLAMA3_ROPE,
        ),
        # each family's extras at test size: biases, a head_dim wider than hidden/heads, llama3 rope
        Shape(_tiny("tiny-qwen2", qkv_bias=True), "qwen2", max_positions=1024),
        Shape(_tiny("tiny-qwen3", head_dim=32), "qwen3", max_positions=1024),
        Shape(_tiny("tiny-llama"), "llama", 5e5, 1e-5, 16384, LLAMA3_ROPE),
    ]
}
ARCHS = ("native", "llama")  # the shape's own family, or its dimensions as a LlamaForCausalLM


def shape_of(name: str) -> Shape:
    if name not in SHAPES:
        raise UsageError(f"--shape {name!r} is unknown; use one of {', '.join(SHAPES)}")
    return SHAPES[name]


def hf_config(shape: Shape, arch: str = "native"):
    """The transformers config of `shape`, as its own family or (`arch="llama"`) as a Llama."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    if arch not in ARCHS:
        raise UsageError(f"--arch {arch!r} is unknown; use {' or '.join(ARCHS)}")
    family, d = (shape.family if arch == "native" else "llama"), shape.dims
    keys = dict(
        vocab_size=d.vocab,
        hidden_size=d.hidden,
        num_hidden_layers=d.layers,
        num_attention_heads=d.heads,
        num_key_value_heads=d.kv_heads,
        intermediate_size=d.intermediate,
        max_position_embeddings=shape.max_positions,
        rms_norm_eps=shape.rms_eps,
        rope_theta=shape.rope_theta,
        tie_word_embeddings=d.tie_embeddings,
        bos_token_id=None,
        eos_token_id=1,
        pad_token_id=0,
    )
    if d.head_dim:  # Qwen2's class has no head_dim key: its shapes never set one
        keys["head_dim"] = d.head_dim
    if shape.rope_scaling:
        keys["rope_scaling"] = dict(shape.rope_scaling)
    return {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}[family](**keys)


def words(rng: random.Random, n: int) -> str:
    """`n` made-up lower-case words of 2–7 letters: the text of the benchmarks' prompts."""
    return " ".join(
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7))) for _ in range(n)
    )


def train_tokenizer(vocab: int, seed: int = 0):
    """A byte-level BPE (PreTrainedTokenizerFast) of at most min(vocab, 3000) tokens, learnt on
    made-up words; <pad> = 0, <eos> = 1, the chat template above."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab, 3000),
        special_tokens=[PAD, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator((words(rng, 40) for _ in range(2000)), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=EOS, pad_token=PAD)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def write_shape(out_dir: str | Path, shape: str | Shape, arch: str = "native", seed: int = 0) -> Path:
    """A Hugging Face directory (fp32 safetensors + tokenizer) of `shape`, randomly initialised
    with `seed`; transformers and `load_hf` open it without a network."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no bar for writing one shard
    s = shape if isinstance(shape, Shape) else shape_of(shape)
    cfg = hf_config(s, arch)
    torch.manual_seed(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(out)
    del model
    train_tokenizer(s.dims.vocab, seed).save_pretrained(out)
    return out


def spread_stops(vocab: int, cap: int, seed: int = 0) -> dict:
    """Stop ids that give a random-init model RL-like answer lengths (`bench step --length-spread`).

    A randomly initialised model's next-token distribution is nearly flat (logits of std ~0.6), so
    almost no answer meets the end-of-turn before the cap, and every batch is padding-free by
    accident. S = round(2·vocab / cap) ids drawn (seeded) from the vocabulary past <pad> and <eos>
    stop a sample with probability p ≈ S / vocab per token: lengths roughly geometric, mean
    (1 − (1 − p)^cap) / p ≈ 0.43·cap, and (1 − p)^cap ≈ 13% at the cap. The expectations assume a
    flat distribution; the run's own `length/mean` and `length/truncated_frac` say what happened."""
    count = max(1, min(vocab - 2, round(2 * vocab / cap)))
    ids = sorted(random.Random(f"stops/{seed}").sample(range(2, vocab), count))
    p = count / vocab
    return {
        "ids": ids,
        "count": count,
        "p_stop": p,
        "expected_mean_tokens": (1 - (1 - p) ** cap) / p,
        "expected_truncated_frac": (1 - p) ** cap,
        "rule": "round(2·vocab/cap) ids past <pad>,<eos>, seeded: rollout.stop_token_ids (hf_shapes.spread_stops)",
    }
