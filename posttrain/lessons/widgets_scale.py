"""Widgets of the scale lessons (22b, 25, 28): long-tail rollouts, kernel-level savings, and where
to spend optimisation effort. Back-of-envelope models, written out so their numbers are tested."""

from __future__ import annotations

import math

from posttrain.lessons import units
from posttrain.lessons.registry import Knob, Widget, bar, figure, line, r, register
from posttrain.sizing import memory, shapes, throughput

# ---- 22b · the straggler tax -------------------------------------------------------------------


def lengths(K: int, mu: float, cv: float) -> list[float]:
    """K log-normal response lengths with mean μ and coefficient of variation cv, from the course's
    seeded LCG and Box–Muller (so its published numbers reproduce)."""
    seed = 42 + 13 * K + round(mu) + round(100 * cv)
    s = math.sqrt(math.log(1 + cv * cv))
    out = []
    for _ in range(K):
        seed = (seed * 9301 + 49297) % 233280
        u = max(seed / 233280, 1e-9)
        seed = (seed * 9301 + 49297) % 233280
        z = math.sqrt(-2 * math.log(u)) * math.cos(2 * math.pi * seed / 233280)
        out.append(math.exp(math.log(mu) - s * s / 2 + s * z))
    return out


def p95(xs: list[float], rule: str) -> float:
    """'course': sorted[floor(0.95·K)], the maximum itself for K ≤ 20; 'fixed': the linearly
    interpolated 95th percentile."""
    xs = sorted(xs)
    if rule == "course":
        return xs[min(len(xs) - 1, math.floor(0.95 * len(xs)))]
    pos = 0.95 * (len(xs) - 1)
    lo = math.floor(pos)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (pos - lo)


def stragglers(K: int, mu: int, cv: float, cap: bool, dynk: bool, rule: str) -> dict:
    orig = lengths(K, mu, cv)
    eff = list(orig)
    if cap:
        c = p95(orig, rule)
        eff = [min(x, c) for x in eff]
    if dynk:  # groups of ≤ 16; the slowest 40% are cut short
        n = min(K, 16)
        for g in range(0, K, n):
            grp = eff[g : g + n]
            settle = sorted(grp)[math.floor(0.6 * len(grp))]
            eff[g : g + n] = [0.6 * x if x > settle else x for x in grp]
    tau, mean = max(eff), sum(eff) / K
    idx = list(range(K))
    return {
        "figure": figure(
            [
                bar(idx, orig, "sampled length", opacity=0.3),
                bar(idx, eff, "decoded after cap / dynamic K"),
                line(
                    [-0.5, K - 0.5],
                    [p95(orig, rule)] * 2,
                    f"p95 by the {rule} rule",
                    line={"dash": "dash", "color": "#d62728"},
                ),
            ],
            f"K = {K}, μ = {mu}, cv = {cv}",
            "response",
            "tokens",
            barmode="overlay",
        ),
        "kpis": [
            ["τ_R = longest response", f"{tau:.0f} tok"],
            ["mean response", f"{mean:.0f} tok"],
            ["straggler tax max/mean − 1", f"{100 * (tau / mean - 1):.0f}%"],
            ["decode saved", f"{100 * (1 - sum(eff) / sum(orig)):.0f}%"],
            ["expected max-of-K (× μ)", r(throughput.max_of_k(K, cv), 2)],
        ],
        "note": "The step waits for the longest response; everyone else's slot idles meanwhile.",
    }


register(
    Widget(
        "stragglers",
        "The straggler tax of long-tailed responses",
        stragglers,
        [
            Knob("K", "responses K", [4, 8, 16, 32, 64], 16),
            Knob("mu", "mean length μ", [200, 800, 2000], 800),
            Knob("cv", "coefficient of variation", [0.0, 0.5, 1.0, 2.0], 1.0),
            Knob("cap", "length cap at p95", [False, True], False, "check"),
            Knob("dynk", "dynamic K", [False, True], False, "check"),
            Knob("rule", "p95 rule", ["fixed", "course"], "fixed", "select"),
        ],
        {
            "knobs": {"cv": 2.0},
            "what": "cv = 2 with no patch: the longest response is 9× the mean, so the step takes 9× the "
            "average decode and most slots idle for most of it.",
        },
        "Each bar is one response's length; the step lasts as long as the longest. Lengths are drawn "
        "log-normal with the course's seeded generator (a model, not engine output).",
        ["posttrain.sizing.throughput:max_of_k"],
    )
)


# ---- 25 · kernels: prefix sharing and chunked log-probs ---------------------------------------------


def kernels(K: int, gp: float, tokens: int, vocab: int, chunk: int) -> dict:
    """Prefix sharing as token counts: the course's ratio K/(1 + K·G/P) (prompt tokens unshared over
    all tokens shared) and the ratio of all tokens computed, K(1 + G/P)/(1 + K·G/P); an upper bound
    on time saved, since a prefill token is cheaper than a decode token. And the logits memory
    (shapes.logits_bytes, bf16) of a full log-softmax vs. one vocabulary chunk at a time; the FP8
    cast reads 140 GB of bf16 and writes 70 GB of FP8 at 3.35 TB/s."""
    share = K / (1 + K * gp)
    all_tokens = K * (1 + gp) / (1 + K * gp)
    full = shapes.logits_bytes(tokens, vocab)  # bf16 logits [tokens, vocab]
    chunk = min(chunk, vocab)  # a chunk as wide as the vocabulary = no chunking
    chunked = shapes.logits_bytes(tokens, vocab, vocab_chunk=chunk)
    ks = [1, 2, 4, 8, 16, 32, 64, 128]
    label = "no chunking (whole vocabulary)" if chunk == vocab else f"one {chunk}-column chunk"
    return {
        "figure": figure(
            [
                line(ks, [k / (1 + k * gp) for k in ks], f"course's prompt-token ratio, G/P = {gp}"),
                line([K], [share], f"K = {K}", mode="markers", marker={"size": 12}),
                bar(["full logits", label], [units.gib(full), units.gib(chunked)], "GiB", xaxis="x2", yaxis="y2"),
            ],
            "prefix sharing (left) and chunked log-probs (right)",
            "K samples per prompt",
            "× fewer tokens",
            grid={"rows": 1, "columns": 2, "pattern": "independent"},
            xaxis={"type": "log"},
            yaxis2={"type": "log", "title": {"text": "logits held at once (GiB)"}},
        ),
        "kpis": [
            ["course's prompt-token ratio K/(1 + K·G/P)", f"{share:.2f}×"],
            ["all tokens computed, unshared / shared", f"{all_tokens:.2f}×"],
            ["full logits", units.size(full)],
            ["logits held at once", units.size(chunked)],
            ["chunking saves", f"{full / chunked:.0f}×"],
            ["bf16→fp8 cast of 140 GB at 3.35 TB/s (read + write)", f"{(140 + 70) / 3.35:.0f} ms"],
        ],
        "note": f"The trainer holds {units.size(chunked)} of logits at once ({label}) instead of "
        f"{units.size(full)}; posttrain's Engine prefills each prompt once for its K samples "
        "(rollout/prefix_reuse).",
    }


register(
    Widget(
        "kernels",
        "Two kernel-level savings",
        kernels,
        [
            Knob("K", "samples per prompt K", [4, 16, 64], 16),
            Knob("gp", "response / prompt length G/P", [0.05, 0.1, 0.5, 1.0], 0.1),
            Knob("tokens", "tokens in the batch", [4096, 32768], 32768),
            Knob("vocab", "vocabulary", [32768, 131072], 131072),
            Knob("chunk", "vocab chunk (131072 = none)", [1024, 4096, 131072], 4096),
        ],
        {
            "knobs": {"chunk": 131072, "vocab": 131072, "tokens": 32768},
            "what": "Materialising the full logits of 32k tokens × 131k vocabulary takes 8.0 GiB in bf16 (and "
            "as much again for the softmax): the trainer's forward runs out of memory at long contexts "
            "unless the log-prob is computed chunk by chunk.",
        },
        "Left: the course's prompt-token ratio of prefix sharing (a token count, not a time). Right: logits memory, "
        "full vs. chunked, in GiB.",
        ["posttrain.sizing.shapes:logits_bytes"],
    )
)


# ---- 28 · where to spend optimisation effort --------------------------------------------------------

BASE = {"rollout": 60.0, "train": 20.0, "reference": 10.0, "sync": 5.0, "algorithm": 5.0}  # seconds of a 100 s step


def budget(
    prefix: bool,
    cbatch: bool,
    spec: bool,
    fp8: bool,
    train_opts: bool,
    sync: str,
    refpool: bool,
    placement: str = "colocated",
) -> dict:
    """The course's 100 s step (rollout 60, train 20, reference 10, sync 5, algorithm 5) with each
    optimisation's multiplier on its role, composed into a step by throughput.step_time under the
    placement (colocated: the sum; one_step_off: the rollout side and the trainer side overlap, the
    samples one version stale).
    The trainer's memory with and without checkpointing comes from memory.plan (llama3-8b, GRPO,
    8 H100s)."""
    t = dict(BASE)
    for on, mult in ((prefix, 0.4), (cbatch, 0.6), (spec, 0.7), (fp8, 0.7)):
        t["rollout"] *= mult if on else 1
    if train_opts:  # chunked CE ×0.8, packing ×0.7, FSDP + ckpt ×0.85
        t["train"] *= 0.8 * 0.7 * 0.85
    t["sync"] *= {"every step": 1.0, "every 5 steps": 0.2, "overlapped": 0.0}[sync]
    if refpool:
        t["reference"] = 0.0
    step = lambda x: throughput.step_time(
        rollout_s=x["rollout"],
        reference_s=x["reference"],
        train_s=x["train"] + x["algorithm"],
        sync_s=x["sync"],
        topology=placement,
    )
    now, before = step(t), step(BASE)
    total, base_total = now["step_s"], before["step_s"]
    largest = max(t, key=t.get)
    mem = memory.plan("llama3-8b", algo="grpo", gpus=8, checkpointing=train_opts, suggest=False)["peak_bytes"]
    names = list(BASE)
    return {
        "figure": figure(
            [
                bar(
                    names + ["step"], list(BASE.values()) + [base_total], "baseline (100 s of role time)", opacity=0.35
                ),
                bar(names + ["step"], list(t.values()) + [total], "optimised"),
            ],
            f"{placement}: step {base_total:.1f} s → {total:.1f} s",
            "role (and the whole step)",
            "seconds per step",
            barmode="group",
        ),
        "kpis": [
            ["optimised step", f"{total:.1f} s"],
            ["speed-up", f"{base_total / total:.2f}×"],
            ["largest remaining slice", f"{largest} {100 * t[largest] / sum(t.values()):.0f}%"],
            ["trainer peak per GPU, llama3-8b GRPO on 8 H100", f"{mem / 2**30:.1f} GiB"],
        ],
        "note": (
            f"Step {base_total:.1f} s → {total:.1f} s ({base_total / total:.2f}×); {largest} is now "
            f"{100 * t[largest] / sum(t.values()):.0f}% of the role time. A 2× on a 10% slice buys 5%, and under "
            "a one-step-off placement a faster trainer buys nothing while rollout is the longer side."
        ),
    }


register(
    Widget(
        "budget",
        "Where an optimisation pays",
        budget,
        [
            Knob("prefix", "prefix caching ×0.4", [False, True], True, "check"),
            Knob("cbatch", "continuous batching ×0.6", [False, True], True, "check"),
            Knob("spec", "speculative decoding ×0.7", [False, True], False, "check"),
            Knob("fp8", "FP8 rollout ×0.7", [False, True], False, "check"),
            Knob("train_opts", "chunked CE + packing + FSDP/ckpt", [False, True], True, "check"),
            Knob("sync", "weight sync", ["every step", "every 5 steps", "overlapped"], "every step", "select"),
            Knob("refpool", "separate reference pool", [False, True], False, "check"),
            Knob("placement", "placement", ["colocated", "one_step_off"], "colocated", "select"),
        ],
        {
            "knobs": {"prefix": False, "cbatch": False, "train_opts": True},
            "what": "Optimising only the trainer: 1.12× overall, because rollout is still 60 of the 100 "
            "seconds; the week goes to the wrong slice (and one step off, where rollout is the longer "
            "side, it buys 1.00×).",
        },
        "Seconds per role before and after the chosen optimisations (the course's multipliers: a deliberate "
        "model), composed into a step by throughput.step_time.",
        ["posttrain.sizing.throughput:step_time", "posttrain.sizing.memory:plan"],
    )
)
