"""Facts of the systems lessons 19–22 (text engineer B), merged into facts_b.FACTS: topology,
the KV cache, the engine's scheduler, memory math. Memory is printed in binary units (GiB = 2^30
bytes), as the widgets print it; posttrain's sizing/memory.py counts bytes and the course writes decimal GB,
so wherever a course number is quoted the text gives both.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.lessons.facts_b_data import result
from posttrain.models.gpt_mini import GPTMini, KVCache, ModelConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.sizing import memory, shapes, throughput

GIB, TIB = 2**30, 2**40
HBM_BYTES_PER_S = 3.35e12  # H100 SXM (course): every decode step streams weights + KV once


def gib(nbytes: float, digits: int = 1) -> str:
    return f"{nbytes / GIB:,.{digits}f} GiB"


# ---- 19 · topology -----------------------------------------------------------------------------

COURSE_TIMES = {"rollout_s": 20, "train_s": 15, "sync_s": 2}  # lesson 19's widget defaults, each pool N GPUs
LABEL = {
    "colocated": "colocated, all 2N GPUs",
    "disaggregated": "disaggregated, on-policy",
    "one_step_off": "disaggregated, one step off",
    "async": "async (the sampler loads the weights)",
    "async_double_buffered": "async, double-buffered weights",
}


def rl19_topology_table() -> dict:
    """Each topology on the same 2N GPUs (throughput.compare_topologies): the course's role times
    are those of N-GPU pools; colocated gives every phase all 2N. Two cases: every phase twice
    as fast on twice the GPUs, and a rollout bound by its longest sequence (not shortened)."""
    lin = throughput.compare_topologies(**COURSE_TIMES)
    tail = throughput.compare_topologies(**COURSE_TIMES, rollout_parallel=0.0)
    return {
        "columns": [
            "placement",
            "samples",
            "step (s), phases ∝ 1/GPUs",
            "× colocated",
            "step (s), rollout not shortened",
            "× colocated",
        ],
        "rows": [
            [
                LABEL[t],
                {"0": "on-policy", "1": "one version stale", "≤ K": "up to K versions stale"}[throughput.STALENESS[t]],
                round(lin[t]["step_s"], 1),
                round(lin[t]["speedup_vs_colocated"], 2),
                round(tail[t]["step_s"], 1),
                round(tail[t]["speedup_vs_colocated"], 2),
            ]
            for t in throughput.TOPOLOGIES
        ],
    }


SCENARIOS = {"rollout ≈ training": (15, 15, 2), "rollout-bound": (40, 5, 2), "heavy sync": (15, 15, 10)}


def rl19_scenarios() -> dict:
    return {k: throughput.compare_topologies(rollout_s=r, train_s=t, sync_s=s) for k, (r, t, s) in SCENARIOS.items()}


def rl19_scenarios_table() -> dict:
    """Three shapes of step, each topology's speed-up over colocated on the same GPUs."""
    rows = []
    for label, out in rl19_scenarios().items():
        r, t, s = SCENARIOS[label]
        tail = throughput.compare_topologies(rollout_s=r, train_s=t, sync_s=s, rollout_parallel=0.0)
        rows.append(
            [
                label,
                r,
                t,
                s,
                round(out["one_step_off"]["speedup_vs_colocated"], 2),
                round(out["async"]["speedup_vs_colocated"], 2),
                round(out["async_double_buffered"]["speedup_vs_colocated"], 2),
                round(tail["one_step_off"]["speedup_vs_colocated"], 2),
            ]
        )
    return {
        "columns": [
            "step shape",
            "τ_R",
            "τ_T",
            "τ_S",
            "one step off ×",
            "async ×",
            "async double-buffered ×",
            "one step off ×, rollout not shortened",
        ],
        "rows": rows,
    }


def _async_bench() -> dict:
    return result("async_vs_sync")


def _measured_sync_times() -> dict:
    """Mean role times of the synchronous CPU runs (all seeds) as step_time arguments."""
    runs = [r for r in _async_bench()["runs"] if r["run"] == "sync"]
    mean = lambda k: sum(r["roles_s"][k] for r in runs) / len(runs)
    return {
        "rollout_s": mean("rollout_s"),
        "reward_s": mean("reward_s"),
        "reference_s": mean("reference_s"),
        "train_s": mean("train_s"),
        "sync_s": mean("sync_s"),
    }


def rl19_trainer_bound_idle() -> str:
    """Share of a one-step-off step the rollout pool waits, at τ_R 5 s, τ_T 20 s, τ_S 2 s."""
    r = throughput.step_time(rollout_s=5, train_s=20, sync_s=2, topology="one_step_off")
    return f"{100 * r['idle_s']['rollout'] / r['step_s']:.0f}%"


def rl19_cpu_train_share() -> str:
    t = _measured_sync_times()
    return f"{100 * (t['train_s'] + t['reference_s']) / sum(t.values()):.0f}%"


def rl19_cpu_predicted() -> float:
    """The synchronous run's role times, each side given a core of its own (the async run's two
    threads): colocated step / async step."""
    t = _measured_sync_times()
    return round(
        throughput.step_time(**t, topology="colocated")["step_s"]
        / throughput.step_time(**t, topology="async")["step_s"],
        2,
    )


def rl19_cpu_measured() -> float:
    s = _async_bench()["summary"]
    return round(s["async_tis"]["samples_per_s_mean"] / s["sync"]["samples_per_s_mean"], 2)


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
    # 19 · topology
    "rl19_topology_table": rl19_topology_table,
    "rl19_scenarios_table": rl19_scenarios_table,
    "rl19_trainer_bound_step": lambda: throughput.step_time(rollout_s=5, train_s=20, sync_s=2, topology="one_step_off")[
        "step_s"
    ],
    "rl19_trainer_bound_idle": rl19_trainer_bound_idle,
    "rl19_rollout_bound_split": lambda: round(
        rl19_scenarios()["rollout-bound"]["one_step_off"]["speedup_vs_colocated"], 2
    ),
    "rl19_rollout_bound_tail": lambda: rl19_scenarios_table()["rows"][1][7],
    "rl19_colo_step": lambda: throughput.compare_topologies(**COURSE_TIMES)["colocated"]["step_s"],
    "rl19_split_step": lambda: throughput.compare_topologies(**COURSE_TIMES)["one_step_off"]["step_s"],
    "rl19_onpolicy_step": lambda: throughput.compare_topologies(**COURSE_TIMES)["disaggregated"]["step_s"],
    "rl19_colo_tail_step": lambda: throughput.compare_topologies(**COURSE_TIMES, rollout_parallel=0.0)["colocated"][
        "step_s"
    ],
    "rl19_heavy_async": lambda: rl19_scenarios()["heavy sync"]["async"]["step_s"],
    "rl19_heavy_double": lambda: rl19_scenarios()["heavy sync"]["async_double_buffered"]["step_s"],
    "rl19_sync_70b": lambda: f"{2 * 70e9 / 1e9:.0f} GB ({gib(2 * 70e9, 0)})",
    "rl19_cpu_train_share": rl19_cpu_train_share,
    "rl19_cpu_predicted": rl19_cpu_predicted,
    "rl19_cpu_measured": rl19_cpu_measured,
    "rl19_cpu_steps": lambda: _async_bench()["steps"],
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
