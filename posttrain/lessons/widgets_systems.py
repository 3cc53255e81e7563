"""Widgets of part III (systems): the KV cache, the rollout engine's scheduler on a simulated
workload, and the topology equations.

The arithmetic is posttrain's: shapes.kv_bytes_per_token, memory.envelope and memory.plan,
throughput.compare_topologies and throughput.role_model.
"""

from __future__ import annotations

import functools

from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.lessons import runs, units
from posttrain.lessons.registry import Knob, Widget, bar, figure, line, r, register
from posttrain.models.gpt_mini import KVCache, ModelConfig
from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
from posttrain.sizing import memory, shapes
from posttrain.sizing import throughput as tp
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
                    ["weights (bf16)", "KV cache", "one H100"],
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
        "Weights, KV cache and the capacity of one H100 (80 GB as sold = 74.5 GiB), all in GiB.",
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
            "posttrain.framework.rollout:_Run._step",
            "posttrain.framework.rollout:_Run._admit",
            "posttrain.framework.rollout:_Run._prefill",
            "posttrain.tasks.base:safe_reward",
            "posttrain.lessons.runs:spec_acceptance",
        ],
    )
)


# ---- 22 · memory envelope (the course's model; the memory planner plugs in beside it) -------------


def memory_envelope(P: int, L: int, B: int, G: int, ckpt: bool) -> dict:
    """memory.envelope: training = 18 B/param sharded over G + activations (not sharded; ÷8 with
    checkpointing); inference = bf16 weights and KV over TP = min(G, 8). Shown in GiB."""
    e = memory.envelope(P, seq_len=L, batch=B, gpus=G, checkpointing=ckpt)
    params, tpn = P * 1e9, min(G, 8)
    train, infer = e["train_gb"] * memory.GB, e["infer_gb"] * memory.GB  # bytes per GPU
    act, weights_inf = e["activations_gb"] * memory.GB, 2 * params / tpn
    fits = train <= units.H100_BYTES and infer <= units.H100_BYTES
    g = units.gib
    return {
        "figure": figure(
            [
                bar(
                    ["trainer / GPU", "inference / GPU"], [g(train - act), g(weights_inf)], "weights, grads, optimizer"
                ),
                bar(["trainer / GPU", "inference / GPU"], [g(act), g(infer - weights_inf)], "activations / KV cache"),
                line(
                    ["trainer / GPU", "inference / GPU"],
                    [units.H100_GIB] * 2,
                    "one H100 (74.5 GiB)",
                    line={"dash": "dash", "color": "black"},
                ),
            ],
            f"{P}B, L = {L}, B = {B}, {G} GPUs, checkpointing {'on' if ckpt else 'off'}",
            "",
            "GiB per GPU",
            barmode="stack",
        ),
        "kpis": [
            ["per-GPU training", units.size(train)],
            ["per-GPU inference", units.size(infer)],
            ["activations per GPU", units.size(act)],
            ["KV per token", units.size(e["kv_kb_per_token"] * 1024)],
            ["fits on H100s?", "yes" if fits else "no"],
            ["training state, whole model (18 B/param)", units.size(18 * params, 2)],
        ],
        "note": (
            f"The trainer needs {units.size(train)} per GPU against 74.5 GiB: "
            + ("it fits." if fits else "it does not fit.")
            + " In the course's envelope activations are not sharded, and checkpointing keeps 1/8 of them."
        ),
    }


register(
    Widget(
        "memory",
        "Memory envelope of one trainer and one sampler GPU",
        memory_envelope,
        [
            Knob("P", "model size (B params)", [1, 7, 13, 70, 405], 7),
            Knob("L", "sequence length", [2048, 8192, 32768, 65536], 8192),
            Knob("B", "sequences per GPU", [1, 4, 16], 4),
            Knob("G", "GPUs (FSDP)", [1, 8, 16, 64], 8),
            Knob("ckpt", "activation checkpointing", [False, True], True, "check"),
        ],
        {
            "knobs": {"ckpt": False},
            "what": "Checkpointing off at 8k tokens: the 7B activations alone are 128 GiB per GPU, and the "
            "trainer runs out of memory at its first step.",
        },
        "Stacked GiB per GPU for the trainer and the sampler against one H100 (80 GB = 74.5 GiB): the course's "
        "envelope (memory.envelope), a back-of-envelope model; lesson 22's planner widget counts every tensor.",
        ["posttrain.sizing.memory:envelope"],
    )
)


# ---- 22a · the throughput equation ---------------------------------------------------------------

TOPO = {"colo": "colocated", "disagg": "disaggregated", "async": "async"}


def throughput(P: int, K: int, L: int, topo: str) -> dict:
    """throughput.role_model: per-role seconds of one step (64 prompts × K responses × L tokens,
    4 GPUs a side) as the course's widget computes them, and the step time of the placement."""
    m = tp.role_model(params_b=P, k=K, response_len=L, topology=TOPO[topo])
    t, step = m["terms"], m["step_s"]
    text = tp.step_time(rollout_s=30, reward_s=1, reference_s=3, train_s=8, sync_s=1)  # the lesson's worked example
    return {
        "figure": figure(
            [
                bar(list(t), list(t.values()), "seconds per step"),
                bar(["step time"], [step], f"τ_step ({TOPO[topo]})", marker={"color": "#d62728"}),
            ],
            f"{P}B, K = {K}, L = {L}, {TOPO[topo]}",
            "role",
            "seconds per step",
        ),
        "kpis": [[f"τ_{k}", f"{v:.1f} s"] for k, v in t.items()]
        + [
            ["τ_step", f"{step:.1f} s"],
            ["useful tokens/s", f"{m['useful_tokens_per_s'] / 1000:.1f}k"],
            ["rollout share of the step", f"{100 * t['rollout'] / step:.0f}%"],
            ["bottleneck", m["bottleneck"]],
            [
                "the text's worked example (30/1/3/8/1 s)",
                (
                    f"{text['step_s']:g} s, trainer idle "
                    f"{text['idle_s']['trainer']:g} s, {64 * 16 * 1024 / text['step_s'] / 1000:.1f}k tok/s"
                ),
            ],
        ],
        "note": "τ_colo adds every term; disaggregated overlaps the two sides; async also hides the sync.",
    }


register(
    Widget(
        "throughput",
        "The throughput equation, per role",
        throughput,
        [
            Knob("P", "params (B)", [1, 7, 13, 34, 70], 7),
            Knob("K", "responses per prompt K", [1, 4, 8, 16, 32], 16),
            Knob("L", "response length", [256, 1024, 4096, 8192], 1024),
            Knob("topo", "placement", ["colo", "disagg", "async"], "disagg", "select"),
        ],
        {
            "knobs": {"L": 8192},
            "what": "Responses of 8k tokens: rollout is 98% of the step (its long tail grows with L), the "
            "trainer idles nearly all the time, and adding trainer GPUs buys nothing.",
        },
        "Seconds per role for one step, and the step time of the chosen placement: the course's role-time "
        "model (throughput.role_model), not a measurement.",
        ["posttrain.sizing.throughput:role_model", "posttrain.sizing.throughput:step_time"],
    )
)


# ---- 22 · the memory planner: every role of an algorithm on one GPU pool ---------------------------


def planner(model: str, algo: str, gpus: int, lora: int, ckpt: bool) -> dict:
    """memory.plan: bytes per GPU of each component (policy, master, grads, Adam, critic, reference,
    activations, KV cache) for `algo` on `gpus` H100s, colocated, and its cheapest fix if it does not fit."""
    p = memory.plan(model, algo=algo, gpus=gpus, lora=lora, checkpointing=ckpt, suggest=True)
    pool = next(iter(p["pools"].values()))
    comps = [(n, units.gib(b)) for n, b in pool["components"].items() if b > 0]
    phases = [(n, units.gib(b)) for n, b in pool["phases"].items()]
    fix = p["suggestions"][0]["change"] if p["suggestions"] else "—"
    return {
        "figure": figure(
            [bar([n], [v], n) for n, v in comps]
            + [
                line(
                    [phases[0][0], phases[-1][0]],
                    [units.gib(p["capacity_bytes"])] * 2,
                    "H100 capacity",
                    xaxis="x2",
                    yaxis="y2",
                    line={"dash": "dash", "color": "black"},
                ),
                bar([n for n, _ in phases], [v for _, v in phases], "peak by phase", xaxis="x2", yaxis="y2"),
            ],
            f"{model}, {algo}, {gpus} × H100, LoRA {lora or 'off'}, checkpointing {'on' if ckpt else 'off'}",
            "",
            "GiB per GPU",
            grid={"rows": 1, "columns": 2, "pattern": "independent"},
            showlegend=False,
            yaxis2={"title": {"text": "GiB per GPU"}},
        ),
        "kpis": [
            ["peak per GPU", units.size(p["peak_bytes"])],
            ["fits on H100?", "yes" if p["fits"] else "no"],
            ["H100 capacity", units.size(p["capacity_bytes"])],
            ["trainable params", f"{p['trainable_params'] / 1e9:.2f} B"],
            ["KV per token", units.size(p["notes"]["kv_bytes_per_token"])],
            ["cheapest change that fits", fix],
        ],
        "note": (
            f"Peak {units.size(p['peak_bytes'])} per GPU against {units.size(p['capacity_bytes'])}: "
            + ("it fits." if p["fits"] else f"it does not fit; the planner's cheapest fix: {fix}.")
        ),
    }


register(
    Widget(
        "planner",
        "The memory planner: one algorithm, one GPU pool",
        planner,
        [
            Knob("model", "model", ["qwen2.5-0.5b", "llama3-8b", "llama-70b"], "llama3-8b", "select"),
            Knob("algo", "algorithm", ["grpo", "ppo", "dpo"], "grpo", "select"),
            Knob("gpus", "GPUs", [1, 8, 64], 8),
            Knob("lora", "LoRA rank (0 = full)", [0, 16], 0),
            Knob("ckpt", "checkpointing", [False, True], False, "check"),
        ],
        {
            "knobs": {"model": "llama-70b", "algo": "ppo"},
            "what": "PPO on a 70B model and 8 GPUs: the critic doubles the trainable state and nothing fits "
            "(hundreds of GB per GPU); the planner's cheapest fix is checkpointing plus LoRA.",
        },
        "GiB per GPU by component (left) and the peak of each phase (right), from posttrain's planner.",
        ["posttrain.sizing.memory:plan"],
    )
)
