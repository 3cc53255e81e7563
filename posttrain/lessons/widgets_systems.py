"""Widgets of part III (systems), lessons 20–21: the KV cache, and the rollout engine's scheduler on a
simulated workload.

The arithmetic is posttrain's: shapes.kv_bytes_per_token and the engine's own counts. The memory and
throughput widgets of lesson 22 are widgets_sizing.py.
"""

from __future__ import annotations

import functools

from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.lessons import runs, units
from posttrain.lessons.registry import Knob, Widget, bar, figure, r, register
from posttrain.models.gpt_mini import KVCache, ModelConfig
from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
from posttrain.sizing import shapes
from posttrain.tasks.arithmetic import ArithmeticTask
from posttrain.tasks.base import safe_reward

# ---- 20 · KV cache footprint ---------------------------------------------------------------------

MODELS = {"7b": {"layers": 32, "d": 4096, "params": 7e9}, "70b": {"layers": 80, "d": 8192, "params": 70e9}}
HBM_BYTES_PER_S = 3.35e12  # H100 SXM memory bandwidth


def course_kv_shape(model: str, gqa: bool) -> shapes.ModelShape:
    """The course's 7B / 70B: heads of 128 dims; GQA keeps 8 KV heads, MHA one per query head."""
    m = MODELS[model]
    heads = m["d"] // 128
    return shapes.ModelShape(model, m["d"], m["layers"], heads, 8 if gqa else heads, 0, 0)


def gpt_mini_kv_bytes(preset: str) -> int:
    """Bytes per cached token of posttrain's own KVCache for a gpt_mini preset (fp32), measured."""
    tok = CharTokenizer()
    cfg = ModelConfig(preset=preset).resolved(tok.vocab_size)
    cache = KVCache(cfg, rows=1, max_len=1)  # one row, one position
    return cache.k.numel() * cache.k.element_size() + cache.v.numel() * cache.v.element_size()


def kv_cache(model: str, B: int, L: int, gqa: bool) -> dict:
    """Bytes of the KV cache of B sequences of L tokens (shapes.kv_bytes_per_token, bf16), the
    bf16 weights, and one H100; the time to stream the cache once at HBM bandwidth."""
    m = MODELS[model]
    per_tok = shapes.kv_bytes_per_token(course_kv_shape(model, gqa))  # 2·layers·kv_heads·head_dim·2 B
    kv, weights = B * L * per_tok, 2 * m["params"]  # bytes
    free = units.H100_BYTES - weights
    ms = kv / HBM_BYTES_PER_S * 1000
    if kv > free:
        bound = "HBM capacity: split across GPUs"
    elif kv > 5 * weights:
        bound = "KV bandwidth (decode-bound)"
    elif kv > weights:
        bound = "KV dominates weights"
    else:
        bound = "weight bandwidth dominates KV"
    return {
        "figure": figure(
            [
                bar(
                    ["weights (bf16)", "KV cache", "one H100 (planner's budget)"],
                    [units.gib(weights), units.gib(kv), units.H100_GIB],
                    "GiB",
                    marker={"color": ["#1f77b4", "#ff7f0e", "#cccccc"]},
                )
            ],
            f"{model}, {'GQA-8' if gqa else 'MHA'}, B = {B}, L = {L}",
            "",
            "GiB (2^30 bytes)",
        ),
        "kpis": [
            ["KV per token", units.size(per_tok)],
            ["KV total", units.size(kv)],
            ["weights", units.size(weights)],
            ["free HBM after weights", units.size(free) if free > 0 else "none: the weights alone exceed one H100"],
            ["H100s the KV alone needs", f"{kv / units.H100_BYTES:.1f}"],
            ["time to read the KV once", f"{ms:.1f} ms"],
            ["time to read the weights once", f"{weights / HBM_BYTES_PER_S * 1000:.1f} ms"],
            ["bottleneck", bound],
            ["posttrain's gpt_mini nano KV per token (fp32, measured)", f"{gpt_mini_kv_bytes('nano')} B"],
        ],
        "note": f"Every decode step streams the weights once ({weights / HBM_BYTES_PER_S * 1000:.1f} ms) and every "
        f"cached token's keys and values once ({ms:.1f} ms here): {bound}.",
    }


register(
    Widget(
        "kv",
        "KV cache footprint and bandwidth",
        kv_cache,
        [
            Knob("model", "model", ["7b", "70b"], "7b", "select"),
            Knob("B", "concurrent sequences B", [1, 8, 32, 128, 256, 512], 32),
            Knob("L", "sequence length L", [128, 512, 2048, 8192, 32768], 2048),
            Knob("gqa", "GQA (8 KV heads)", [False, True], True, "check"),
        ],
        {
            "knobs": {"model": "70b", "B": 256, "L": 8192},
            "what": "70B with 256 sequences of 8k tokens: 640 GiB of KV cache, more than eight H100s hold; the "
            "engine must cut concurrency or preempt, and the rollout phase stalls.",
        },
        f"Weights, KV cache and one H100, all in GiB; the H100 bar is the planner's budget of 80·10⁹ bytes "
        f"({units.H100_GIB:.1f} GiB) of the {units.H100_REPORTED_GIB:.1f} GiB the card reports.",
        ["posttrain.sizing.shapes:kv_bytes_per_token", "posttrain.models.gpt_mini:KVCache"],
    )
)


# ---- 21 · scheduling: the real engine, and a labelled cost model around it -------------------------

SCHED_PROMPTS, SCHED_K, SCHED_MAX_NEW = 8, 4, 64
W_BYTES, KV_TOKEN_BYTES, HBM_BPS, FLOPS = 14e9, 131072, 3.35e12, 800e12  # the course's 7B on one H100
PREFILL_S = 2 * 7e9 / FLOPS  # compute-bound prefill, per token
SPEC_GAMMA, DRAFT_COST, CHUNK = 4, 0.1, 16  # draft tokens, draft/target cost, chunk budget


@functools.lru_cache(maxsize=1)
def _sched_setup():
    """The recorded 2-layer gpt_mini SFT'd on CoT traces (runs.engine_runs) and 8 held-out
    problems of 2–6 terms: its response lengths follow the number of terms."""
    tok = CharTokenizer(BASE_CHARS)
    model = runs.unpack_model(runs.recorded()["engine model"])
    task = ArithmeticTask(runs.COT_TASK)
    items = task.items(SCHED_PROMPTS, "test", 1)
    return model, tok, task, items, [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]


@functools.lru_cache(maxsize=64)
def _sched_run(slots: int, cbatch: bool, temperature: float) -> dict:
    """The engine on 8 prompts × K: continuous batching = one generate() with `slots` slots;
    static = one generate() per batch of `slots` samples, each running until its longest
    finishes. Counter-based sampling draws the same responses either way (group_offset)."""
    model, tok, task, items, prompts = _sched_setup()
    sp = SamplingParams(temperature=temperature, max_new_tokens=SCHED_MAX_NEW)
    engine = Engine(model, tok, max_slots=slots)
    per = SCHED_PROMPTS if cbatch else slots // SCHED_K  # static: whole groups per batch
    samples, forwards, prefill, naive, busy = [], 0, 0, 0, 0.0
    for a in range(0, SCHED_PROMPTS, per):
        samples += engine.generate(prompts[a : a + per], SCHED_K, sp, seed=0, group_offset=a)
        st = engine.stats
        forwards += st["rollout/decode_steps"]
        prefill += st["rollout/prefill_tokens"]
        naive += st["rollout/prompt_tokens"]
        busy += st["rollout/slot_occupancy"] * st["rollout/decode_steps"] * st["rollout/slots"]  # active slot-steps
    lengths = [len(s.response_ids) for s in samples]
    right = sum(safe_reward(task, items[s.group], s.text).reward for s in samples) if cbatch else None
    kv_read = sum(sum(len(s.prompt_ids) + t for t in range(len(s.response_ids))) for s in samples) * KV_TOKEN_BYTES
    return {
        "lengths": lengths,
        "forwards": forwards,
        "prefill": prefill,
        "naive": naive,
        "kv_read": kv_read,
        "occupancy": busy / max(forwards * min(slots, len(samples)), 1),
        "capped": sum(s.finish_reason == "length" for s in samples),
        "right": right,
        "responses": [s.response_ids for s in samples],
        "prompt_lens": [len(p) for p in prompts],
        "distinct": sum(
            len({tuple(s.response_ids) for s in samples[g * SCHED_K : (g + 1) * SCHED_K]}) for g in range(SCHED_PROMPTS)
        )
        / SCHED_PROMPTS,
    }


def _tokens_per_forward(alpha: float) -> float:
    """Expected tokens per target forward with SPEC_GAMMA draft tokens accepted at rate α."""
    return SPEC_GAMMA + 1 if alpha >= 1 else (1 - alpha ** (SPEC_GAMMA + 1)) / (1 - alpha)


def _sched_parts(run: dict, share: bool, spec: bool, alpha: float) -> tuple[float, float, float]:
    """Modelled seconds on the course's 7B/H100, by part: each decode forward streams the weights
    (4.2 ms); every generated token reads its context's KV once; each prefilled token costs 2·7e9
    FLOPs. Speculative decoding divides the target forwards by the tokens each verifies and adds
    the draft's forwards at a tenth of the cost."""
    forwards = run["forwards"]
    if spec:
        forwards = forwards / _tokens_per_forward(alpha) * (1 + SPEC_GAMMA * DRAFT_COST)
    return (
        forwards * W_BYTES / HBM_BPS,
        run["kv_read"] / HBM_BPS,
        (run["prefill"] if share else run["naive"]) * PREFILL_S,
    )


def _sched_time(run: dict, share: bool, spec: bool, alpha: float) -> float:
    return sum(_sched_parts(run, share, spec, alpha))


def scheduler(slots: int, cbatch: bool, share: bool, chunked: bool, spec: bool, temperature: float) -> dict:
    run, base = _sched_run(slots, cbatch, temperature), _sched_run(slots, False, temperature)
    alpha = runs.recorded()["spec acceptance"][str(temperature)]
    t, t0 = _sched_time(run, share, spec, alpha), _sched_time(base, False, False, alpha)
    lengths = sorted(run["lengths"])
    occupancy = run["occupancy"]
    stall = sum(run["prompt_lens"]) * (1 if share else SCHED_K)  # one prefill forward takes every prompt
    stall = min(stall, CHUNK) if chunked else stall
    p95 = lengths[min(len(lengths) - 1, int(0.95 * len(lengths)))]
    parts = _sched_parts(run, share, spec, alpha)
    parts0 = _sched_parts(base, False, False, alpha)
    names = ["decode: weights", "decode: KV reads", "prefill", "longest prefill stall"]
    return {
        "figure": figure(
            [
                bar(list(range(len(run["lengths"]))), run["lengths"], "response length (tokens)"),
                bar(
                    names,
                    [1000 * x for x in parts] + [1000 * stall * PREFILL_S],
                    "this setting (ms)",
                    xaxis="x2",
                    yaxis="y2",
                ),
                bar(
                    names,
                    [1000 * x for x in parts0] + [1000 * sum(run["prompt_lens"]) * SCHED_K * PREFILL_S],
                    "static batches, no tricks (ms)",
                    xaxis="x2",
                    yaxis="y2",
                    opacity=0.4,
                ),
            ],
            f"{slots} slots, {SCHED_PROMPTS} prompts × {SCHED_K}, T = {temperature}",
            "sample (group-major)",
            "tokens",
            grid={"rows": 1, "columns": 2, "pattern": "independent"},
            barmode="group",
            xaxis={"domain": [0, 0.45]},
            xaxis2={"domain": [0.58, 1]},
            yaxis2={"title": {"text": "modelled ms (7B, one H100)"}, "rangemode": "tozero"},
        ),
        "kpis": [
            ["decode forwards (engine)", run["forwards"]],
            ["static batching would need", base["forwards"]],
            ["slot occupancy", r(occupancy, 3)],
            ["prompt tokens prefilled", run["prefill"] if share else run["naive"]],
            ["response length mean / p95 / max", f"{sum(lengths) / len(lengths):.1f} / {p95} / {lengths[-1]}"],
            ["responses cut by the 64-token cap", run["capped"]],
            ["distinct responses per prompt (of 4)", r(run["distinct"], 2)],
            ["draft acceptance α at this T (measured)", r(alpha, 3)],
            ["tokens per target forward (spec, model)", r(_tokens_per_forward(alpha), 2) if spec else 1.0],
            ["longest decode stall (tokens in one prefill forward)", stall],
            ["modelled rollout time, 7B on one H100", f"{1000 * t:.0f} ms"],
            ["speed-up over static batches without tricks", f"{t0 / t:.2f}×"],
        ],
        "note": (
            f"The engine needed {run['forwards']} decode forwards for {len(lengths)} responses of "
            f"{lengths[0]}–{lengths[-1]} tokens ({run['capped']} cut by the cap); static batches of {slots} would "
            f"need {base['forwards']}. Modelled on a 7B model: {1000 * t:.0f} ms, {t0 / t:.2f}× the plain engine."
            + (
                f" Speculative decoding verifies {_tokens_per_forward(alpha):.2f} tokens per forward at α = {alpha:.2f}."
                if spec
                else ""
            )
        ),
    }


register(
    Widget(
        "scheduler",
        "Scheduling: continuous batching, shared prefill, chunked prefill, speculative decoding",
        scheduler,
        [
            Knob("slots", "slots (max concurrent)", [4, 8, 16, 32], 8),
            Knob("cbatch", "continuous batching (engine)", [False, True], True, "check"),
            Knob("share", "shared prompt prefill (engine)", [False, True], True, "check"),
            Knob("chunked", "chunked prefill (model)", [False, True], False, "check"),
            Knob("spec", "speculative decoding (model, measured α)", [False, True], False, "check"),
            Knob("temperature", "temperature T", [0.0, 0.5, 1.0], 1.0),
        ],
        {
            "knobs": {"cbatch": False},
            "what": "Static batches of 8 (two prompts' groups each): every batch runs until its longest response ends "
            "while the finished slots idle, so the engine needs about a quarter more decode forwards for the "
            "same responses and slot occupancy falls from about 0.94 to 0.75; continuous batching refills a "
            "slot the moment its response ends.",
        },
        "Real engine runs (posttrain's rollout.Engine on a small gpt_mini SFT'd on chain-of-thought sums, "
        "whose response lengths follow the number of terms): decode forwards, prefill tokens and lengths are "
        "counted by the engine. Chunked prefill and speculative decoding are not in the engine: they are a "
        "labelled model (the draft's acceptance rate α is measured between two recorded gpt_mini models), and "
        "time is modelled with the course's 7B-on-H100 constants.",
        [
            "posttrain.framework.rollout:Engine.generate",
            "posttrain.framework.decode_loop:DecodeLoop._window",
            "posttrain.framework.decode_loop:DecodeLoop._admit",
            "posttrain.framework.decode_loop:DecodeLoop._prefill",
            "posttrain.tasks.base:safe_reward",
            "posttrain.lessons.runs:spec_acceptance",
        ],
    )
)
