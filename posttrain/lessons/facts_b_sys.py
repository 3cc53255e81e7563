"""Facts of the systems lessons 20–22 (text engineer B), merged into facts_b.FACTS: the KV cache,
the engine's scheduler, memory math; lesson 19's topology is facts_b_topology, merged here. Memory is printed in binary units (GiB = 2^30
bytes), as the widgets print it; posttrain's sizing/memory.py counts bytes and the course writes decimal GB,
so wherever a course number is quoted the text gives both.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.lessons import facts_b_topology
from posttrain.models.gpt_mini import GPTMini, KVCache, ModelConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.sizing import memory, shapes, throughput

GIB, TIB = 2**30, 2**40
HBM_BYTES_PER_S = 3.35e12  # H100 SXM (course): every decode step streams weights + KV once


def gib(nbytes: float, digits: int = 1) -> str:
    return f"{nbytes / GIB:,.{digits}f} GiB"


# ---- 20 · the KV cache -------------------------------------------------------------------------


def course_shape(layers: int, d: int, kv_heads: int) -> shapes.ModelShape:
    return shapes.ModelShape("course", d, layers, d // 128, kv_heads, 0, 0)


def rl20_kv_table() -> dict:
    rows = []
    for name in ("llama3-8b", "qwen2.5-7b", "llama-7b", "llama3-70b"):
        s = shapes.PRESETS[name]
        per = shapes.kv_bytes_per_token(s)
        rows.append([name, s.layers, s.kv_heads, s.hd, f"{per:,}", f"{per / 1024:,.0f} KiB"])
    return {"columns": ["model", "layers", "KV heads", "head dim", "bytes per token (bf16)", ""], "rows": rows}


def kv_total(layers: int, d: int, kv_heads: int, seqs: int, length: int) -> float:
    return seqs * length * shapes.kv_bytes_per_token(course_shape(layers, d, kv_heads))


def rl20_decode_table() -> dict:
    """Per decode step at B = 32, L = 2048: bytes streamed and the time at HBM bandwidth."""
    w = 2 * 7e9
    rows = []
    for label, kv_heads in (("GQA, 8 KV heads", 8), ("MHA, 32 KV heads", 32)):
        kv = kv_total(32, 4096, kv_heads, 32, 2048)
        rows.append(
            [
                label,
                gib(kv),
                f"{kv / HBM_BYTES_PER_S * 1e3:.1f} ms",
                f"{w / HBM_BYTES_PER_S * 1e3:.1f} ms",
                f"{32 * HBM_BYTES_PER_S / (w + kv):,.0f}",
            ]
        )
    return {
        "columns": [
            "7B, 32 sequences × 2,048 tokens",
            "KV cache",
            "read KV",
            "read weights (13.0 GiB)",
            "decode ceiling, tokens/s",
        ],
        "rows": rows,
    }


def prefix_tokens(k: int, prompt: int, completion: int) -> tuple[int, int]:
    """Cached tokens for K samples of one prompt: each sample its own prompt copy vs. one shared prompt."""
    return k * (prompt + completion), prompt + k * completion


def nano_kv_bytes() -> int:
    """Bytes per cached token of posttrain's KVCache for the nano gpt_mini (fp32), measured on a cache."""
    cfg = ModelConfig(preset="nano").resolved(CharTokenizer().vocab_size)
    c = KVCache(cfg, rows=1, max_len=1)
    return c.k.numel() * c.k.element_size() + c.v.numel() * c.v.element_size()


# ---- 21 · scheduling ---------------------------------------------------------------------------


def _tiny_model():
    tok = CharTokenizer()
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=96).resolved(tok.vocab_size)
    return GPTMini(cfg).eval(), tok


@functools.lru_cache(maxsize=8)
def engine_run(slots: int, k: int, max_new: int = 32) -> dict:
    """posttrain's Engine on 4 prompts × K samples of a random 1-layer gpt_mini: its decode steps,
    the steps a static batcher would need for the same lengths, and the prefill counts."""
    model, tok = _tiny_model()
    prompts = [tok.encode(f"<{i}+{2 * i + 1}>") for i in range(4)]
    eng = Engine(model, tok, max_slots=slots)
    samples = eng.generate(prompts, k, SamplingParams(max_new_tokens=max_new), seed=0)
    lengths = [len(s.response_ids) for s in samples]
    return {
        "lengths": lengths,
        "engine": eng.stats["rollout/decode_steps"],
        "static": static_vs_continuous(lengths, slots)[0],
        "capped": sum(s.finish_reason == "length" for s in samples),
        "stats": eng.stats,
    }


def rl21_engine_table() -> dict:
    rows = []
    for slots, k in ((8, 4), (4, 8), (32, 8)):
        r = engine_run(slots, k)
        rows.append(
            [
                slots,
                f"4 × {k}",
                r["engine"],
                r["static"],
                round(r["static"] / r["engine"], 2),
                f"{r['capped']} of {len(r['lengths'])}",
                round(r["stats"]["rollout/slot_occupancy"], 2),
            ]
        )
    return {
        "columns": [
            "slots",
            "prompts × K",
            "decode steps (engine)",
            "static batching",
            "static / engine",
            "hit the 32-token cap",
            "slot occupancy",
        ],
        "rows": rows,
    }


def static_vs_continuous(lengths: list[int], slots: int) -> tuple[int, int]:
    """Decode forwards for these response lengths, counted as the engine counts them (a response
    of ℓ tokens needs ℓ − 1 forwards: its first token comes from the prompt's prefill): static
    batches of `slots` (each runs until its longest is done) and a perfect refill (the work spread
    evenly over the slots, but never less than the longest response)."""
    work = [n - 1 for n in lengths]
    static = sum(max(work[i : i + slots]) for i in range(0, len(work), slots))
    return static, max(max(work), math.ceil(sum(work) / slots))


def tail_lengths(n: int = 32) -> list[int]:
    """n response lengths with the course's long tail (log-normal, mean 800, cv 1) at their
    expected order statistics, in a fixed random admission order."""
    s = math.sqrt(math.log1p(1.0))
    mu = math.log(800) - s * s / 2
    q = torch.tensor([(i + 0.5) / n for i in range(n)], dtype=torch.float64)
    lengths = torch.exp(mu + s * math.sqrt(2) * torch.erfinv(2 * q - 1)).round().long().tolist()
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0)).tolist()
    return [lengths[i] for i in order]


def rl21_tail_table() -> dict:
    lengths = tail_lengths()
    static, cont = static_vs_continuous(lengths, 8)
    return {
        "columns": ["32 responses, 8 slots", "decode steps"],
        "rows": [
            ["static batches (each waits for its longest)", static],
            ["continuous refill (at best)", cont],
            ["static / continuous", round(static / cont, 2)],
            ["longest / mean response", round(max(lengths) / (sum(lengths) / len(lengths)), 1)],
        ],
    }


def rl21_batch_longest() -> str:
    lengths = tail_lengths()
    mean = sum(lengths) / len(lengths)
    ratios = [max(lengths[i : i + 8]) / mean for i in range(0, len(lengths), 8)]
    return f"{min(ratios):.1f} to {max(ratios):.1f}"


# ---- 22 · memory math --------------------------------------------------------------------------


def rl22_bytes_table() -> dict:
    names = {
        "mixed": "bf16 weights + fp32 master + fp32 grads + fp32 Adam",
        "no-master": "fp32 weights, no master copy",
        "bf16-adam": "fp32 weights, bf16 Adam moments",
    }
    return {
        "columns": ["recipe", "weights", "master", "grads", "Adam m, v", "bytes per param"],
        "rows": [[names[k], *memory.PRECISION[k], memory.train_bytes_per_param(k)] for k in memory.PRECISION],
    }


def rl22_state_table() -> dict:
    rows = []
    for p in (7e9, 70e9, 405e9):
        total = memory.train_bytes_per_param() * p
        rows.append(
            [
                f"{p / 1e9:g}B",
                f"{total / 1e12:.2f} TB" if total >= 1e12 else f"{total / 1e9:.0f} GB",
                f"{total / TIB:.2f} TiB" if total >= TIB else gib(total),
                memory.min_gpus(total),
                f"{throughput.train_tokens_per_s(p):,.0f}",
            ]
        )
    return {
        "columns": [
            "model",
            "training state (18 B/param)",
            "in binary units",
            "H100s to hold it (whole 8-GPU nodes past 8)",
            "train tokens/s per H100 (6P at 800 TFLOP/s)",
        ],
        "rows": rows,
    }


def rl22_example_table() -> dict:
    """The course's 7B GRPO on 8 H100s: trainer on 4 (FSDP), reference on 1, rollout on 3 (TP 1),
    256 sequences of 4,096 tokens decoding; per-GPU memory in GiB, computed with sizing/memory.py's rules."""
    p = 7e9
    act = shapes.course_activation_bytes(32, 4096, 4096, 8, checkpointing=True)
    kv = shapes.kv_bytes_per_token(course_shape(32, 4096, 8)) * 256 * 4096
    rows = [
        [
            "trainer (4 GPUs, FSDP)",
            "18 B × P / 4 + checkpointed activations (L 4,096, B 8)",
            gib(memory.train_bytes_per_param() * p / 4 + act),
        ],
        ["reference (1 GPU)", "2 B × P", gib(2 * p)],
        ["rollout (3 GPUs, TP 1)", "2 B × P + KV / 3", gib(2 * p + kv / 3)],
    ]
    return {"columns": ["pool", "what it holds", "per GPU"], "rows": rows}


def _act_7b(ckpt: bool) -> float:
    return shapes.course_activation_bytes(32, 4096, 8192, 4, checkpointing=ckpt)


def _plan(**kw) -> dict:
    return memory.plan("llama3-8b", suggest=False, **{"gpus": 8, **kw})


FACTS: dict[str, Callable[[], object]] = {
    **facts_b_topology.FACTS,  # 19 · topology
    "rl19_sync_70b": lambda: f"{2 * 70e9 / 1e9:.0f} GB ({gib(2 * 70e9, 0)})",
    # 20 · the KV cache
    "rl20_kv_table": rl20_kv_table,
    "rl20_decode_table": rl20_decode_table,
    "rl20_per_seq_gqa": lambda: round(HBM_BYTES_PER_S / (2 * 7e9 + kv_total(32, 4096, 8, 32, 2048))),
    "rl20_course_gqa": lambda: f"{shapes.kv_bytes_per_token(course_shape(32, 4096, 8)) // 1024} KiB",
    "rl20_course_mha": lambda: f"{shapes.kv_bytes_per_token(course_shape(32, 4096, 32)) // 1024} KiB",
    "rl20_70b_256_8k": lambda: gib(kv_total(80, 8192, 8, 256, 8192), 0),
    "rl20_70b_256_8k_gb": lambda: f"{kv_total(80, 8192, 8, 256, 8192) / 1e9:.0f} GB",
    "rl20_70b_h100s": lambda: math.ceil(kv_total(80, 8192, 8, 256, 8192) / memory.GPUS["h100"][1]),
    "rl20_h100_gib": lambda: gib(memory.GPUS["h100"][1]),
    "rl20_prefix_separate": lambda: f"{prefix_tokens(16, 1024, 200)[0]:,}",
    "rl20_prefix_shared": lambda: f"{prefix_tokens(16, 1024, 200)[1]:,}",
    "rl20_prefix_ratio": lambda: round(prefix_tokens(16, 1024, 200)[0] / prefix_tokens(16, 1024, 200)[1], 1),
    "rl20_nano_kv": lambda: nano_kv_bytes(),
    "rl20_engine_cache_occupancy": lambda: round(engine_run(8, 4)["stats"]["rollout/cache_occupancy"], 2),
    # 21 · scheduling
    "rl21_engine_table": rl21_engine_table,
    "rl21_tail_table": rl21_tail_table,
    "rl21_static_over_engine": lambda: round(engine_run(4, 8)["static"] / engine_run(4, 8)["engine"], 2),
    "rl21_capped_4x8": lambda: f"{engine_run(4, 8)['capped']} of {len(engine_run(4, 8)['lengths'])}",
    "rl21_batch_longest": rl21_batch_longest,
    "rl21_tail_ratio": lambda: rl21_tail_table()["rows"][2][1],
    "rl21_prefill_shared": lambda: engine_run(8, 4)["stats"]["rollout/prefill_tokens"],
    "rl21_prefill_separate": lambda: engine_run(8, 4)["stats"]["rollout/prompt_tokens"],
    # 22 · memory math
    "rl22_bytes_table": rl22_bytes_table,
    "rl22_state_table": rl22_state_table,
    "rl22_act_7b": lambda: gib(_act_7b(False), 0),
    "rl22_act_7b_ckpt": lambda: gib(_act_7b(True), 0),
    "rl22_act_7b_gb": lambda: f"{_act_7b(False) / 1e9:.1f} GB",
    "rl22_example_table": rl22_example_table,
    "rl22_example_kv": lambda: gib(shapes.kv_bytes_per_token(course_shape(32, 4096, 8)) * 256 * 4096, 0),
    "rl22_example_act": lambda: gib(shapes.course_activation_bytes(32, 4096, 4096, 8, checkpointing=True)),
    "rl22_4gpu_cap": lambda: f"{4 * throughput.train_tokens_per_s(7e9):,.0f}",
    "rl22_train_1m_4gpu_s": lambda: round(throughput.train_time_s(1e6, 7e9, gpus=4), 1),
    "rl22_plan_peak": lambda: gib(_plan()["peak_bytes"]),
    "rl22_plan_peak_ckpt": lambda: gib(_plan(checkpointing=True)["peak_bytes"]),
    "rl22_plan_act": lambda: gib(_plan()["notes"]["activations_without_checkpointing"]),
    "rl22_plan_act_ckpt": lambda: gib(_plan()["notes"]["activations_with_checkpointing"]),
    "rl22_h100_gib": lambda: gib(memory.GPUS["h100"][1]),
    "rl22_envelope_train": lambda: gib(memory.envelope(7)["train_gb"] * 1e9),
    "rl22_envelope_train_gb": lambda: f"{memory.envelope(7)['train_gb']:.1f} GB",
    "rl22_envelope_train_nockpt": lambda: gib(memory.envelope(7, checkpointing=False)["train_gb"] * 1e9),
}
