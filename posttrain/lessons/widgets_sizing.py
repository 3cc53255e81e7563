"""Widgets of lesson 22 (part III, systems): the memory envelope, the throughput equation of the three
topologies, and the memory planner over every role of an algorithm on one GPU pool.

The arithmetic is posttrain's: memory.envelope and memory.plan, throughput.role_model and
throughput.step_time. The KV cache and the scheduler (lessons 20–21) are widgets_systems.py.
"""

from __future__ import annotations

from posttrain.lessons import units
from posttrain.lessons.registry import Knob, Widget, bar, figure, line, r, register
from posttrain.sizing import memory
from posttrain.sizing import throughput as tp

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
                    f"one H100, planner's budget ({units.H100_GIB:.1f} GiB)",
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
            f"The trainer needs {units.size(train)} per GPU against the planner's {units.H100_GIB:.1f} GiB per H100: "
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
        f"Stacked GiB per GPU for the trainer and the sampler against one H100 (the planner's budget, 80·10⁹ B = "
        f"{units.H100_GIB:.1f} GiB of the {units.H100_REPORTED_GIB:.1f} GiB the card reports): the course's "
        "envelope (memory.envelope), a back-of-envelope model; lesson 22's planner widget counts every tensor.",
        ["posttrain.sizing.memory:envelope"],
    )
)


# ---- 22a · the throughput equation ---------------------------------------------------------------

TOPO = {
    "colo": "colocated",
    "disagg": "disaggregated",
    "1off": "one_step_off",
    "async": "async",
    "async2buf": "async_double_buffered",
}


def throughput(P: int, K: int, L: int, topo: str) -> dict:
    """throughput.role_model: per-role seconds of one step (64 prompts × K responses × L tokens)
    as the course's widget computes them, on 8 GPUs: 4 a side split, all 8 for every phase
    colocated; and the step time of the placement."""
    m = tp.role_model(params_b=P, k=K, response_len=L, topology=TOPO[topo])
    t, step = m["terms"], m["step_s"]
    colo = tp.role_model(params_b=P, k=K, response_len=L, topology="colocated")["step_s"]
    text = tp.step_time(  # the lesson's worked example, split one step off
        rollout_s=30, reward_s=1, reference_s=3, train_s=8, sync_s=1, topology="one_step_off"
    )
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
            ["colocated on the same 8 GPUs / this placement", r(step / colo, 2)],
            [
                "the text's worked example (30/1/3/8/1 s)",
                (
                    f"{text['step_s']:g} s, trainer idle "
                    f"{text['idle_s']['trainer']:g} s, {64 * 16 * 1024 / text['step_s'] / 1000:.1f}k tok/s"
                ),
            ],
        ],
        "note": (
            f"{m['equation']}: {m['assumes']}. Colocated runs every phase on all 8 GPUs and adds the terms; the "
            "on-policy split adds them too, on 4 GPUs a side; one step off overlaps the two sides; async puts the "
            "sync on the sampler's side, and only double-buffered weights hide it."
        ),
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
            Knob("topo", "placement", list(TOPO), "1off", "select"),
        ],
        {
            "knobs": {"L": 8192},
            "what": "Responses of 8k tokens: rollout is 98% of the step (its long tail grows with L), the "
            "trainer idles nearly all the time, and adding trainer GPUs buys nothing.",
        },
        "Seconds per role for one step, and the step time of the chosen placement on the same 8 GPUs "
        "(colo: colocated; disagg: split, on-policy; 1off: split, one step off; async: the sampler loads the "
        "weights; async2buf: double-buffered): the course's role-time model (throughput.role_model), not a "
        "measurement.",
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
                    "H100 budget (80·10⁹ B of 79.6 GiB)",
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
            ["H100 budget (80·10⁹ B of 79.6 GiB)", units.size(p["capacity_bytes"])],
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
