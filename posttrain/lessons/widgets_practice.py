"""Widgets of the practice lessons: 23 (failure modes, caught by posttrain.report's alarms), 24 (the
infra engineer's sizing question: memory.plan + throughput.role_model) and 27 (a gap posttrain
closed: truncated importance weights for stale samples, core.off_policy_weights)."""

from __future__ import annotations

import functools

import torch

from posttrain import report
from posttrain.algorithms import core, dapo
from posttrain.framework.rollout import token_logprobs
from posttrain.lessons import claims, units
from posttrain.lessons.registry import Knob, Widget, bar, figure, line, r, register
from posttrain.sizing import memory, throughput

_BASE = torch.linspace(-1.5, 1.5, 16, dtype=torch.float64)  # a 16-token policy's logits

# ---- 23 · failure modes: a synthetic run, the report's alarms ------------------------------------

MODES = [
    "healthy",
    "entropy collapse",
    "easy prompts",
    "reward hacking",
    "stale sampler",
    "temperature mismatch",
    "length blow-up",
]
STEPS = 40


def failure_run(mode: str, severity: float) -> list[dict]:
    """40 steps of metrics, each measured with posttrain's functions on sampled data (all steps at
    once, one row of each tensor per step); `mode` at `severity` bends one cause, the rest stay healthy."""
    gen = torch.Generator().manual_seed(0)
    sev = lambda m: severity if mode == m else 0.0
    u = torch.linspace(0, 1, STEPS, dtype=torch.float64).unsqueeze(1)  # [S, 1] progress through the run
    sharp = 1 + (0.5 + 40 * sev("entropy collapse")) * u  # logits scale: the policy sharpens
    ent = core.entropy_from_logits((_BASE * sharp).unsqueeze(1)).squeeze(1)  # [S, 1, V] → [S]
    old = torch.log_softmax(_BASE, -1)[torch.randint(0, 16, (STEPS, 512), generator=gen)]
    drift = 0.02 + 1.5 * sev("stale sampler") * u  # |log ρ| spread of a stale sampler
    new = old + drift * torch.randn(STEPS, 512, generator=gen, dtype=torch.float64)
    adv = torch.where(torch.rand(STEPS, 512, generator=gen) < 0.5, 1.0, -1.0).double()
    _, clipped = core.ppo_clip_loss(new, old, adv, 0.2, 0.2)  # [S, 512]
    # progress: each step teaches in proportion to the tokens whose gradient survived the clip
    learned = (1 - clipped.double().mean(1)).cumsum(0).unsqueeze(1) / STEPS  # [S, 1] ≈ u when healthy
    p = (0.3 + 0.3 * learned + 0.69 * sev("easy prompts") * learned).clamp(max=0.99)
    correct = (torch.rand(STEPS, 1024, generator=gen, dtype=torch.float64) < p).double()  # [S, 256 groups × 4]
    degen = dapo.degenerate(correct.flatten(), torch.arange(STEPS * 256).repeat_interleave(4)).view(STEPS, -1)
    hack = 0.4 * sev("reward hacking") * u  # reward the verifier pays by mistake
    heldout = 0.3 + 0.3 * learned * (1 - sev("reward hacking"))
    y = torch.randint(0, 16, (512,), generator=gen)
    logits = _BASE.expand(512, 16)
    t_sampler = 1 + 0.3 * sev("temperature mismatch")  # the sampler's T; the trainer's is 1
    mism = float((token_logprobs(logits, y, t_sampler) - token_logprobs(logits, y, 1.0)).abs().mean())
    lens = 20 * (1 + 3 * sev("length blow-up") * u) * torch.exp(0.5 * torch.randn(STEPS, 512, generator=gen) - 0.125)
    cols = {
        "reward/mean": correct.mean(1) + hack.squeeze(1),
        "eval/pass@1": heldout.squeeze(1),
        "entropy": ent,
        "group/degenerate_frac": degen.double().mean(1),
        "clip/frac": clipped.double().mean(1),
        "mismatch/logprob_abs": torch.full((STEPS,), mism),
        "length/mean": lens.clamp(max=64).mean(1),
        "length/truncated_frac": (lens > 64).double().mean(1),
    }
    return [{"step": s + 1, **{k: float(v[s]) for k, v in cols.items()}} for s in range(STEPS)]


def failures(mode: str, severity: float) -> dict:
    rows = failure_run(mode, severity)
    fired = report.alarms(rows)
    xs = [m["step"] for m in rows]
    flat = [
        "reward/mean",
        "eval/pass@1",
        "group/degenerate_frac",
        "clip/frac",
        "mismatch/logprob_abs",
        "length/truncated_frac",
    ]
    return {
        "figure": figure(
            [line(xs, report.series(rows, k), k) for k in flat]
            + [
                line(xs, [m[k] / rows[0][k] for m in rows], f"{k} ÷ its start", xaxis="x2", yaxis="y2")
                for k in ("entropy", "length/mean")
            ],
            f"{mode}, severity {severity}",
            "step",
            "value (0–1)",
            grid={"rows": 1, "columns": 2, "pattern": "independent"},
            yaxis={"range": [0, 1.05]},
            xaxis2={"title": {"text": "step"}},
        ),
        "kpis": [["alarms fired", ", ".join(a.name for a in fired) or "none"]]
        + [[a.name, a.message] for a in fired]
        + [
            ["final train reward", r(rows[-1]["reward/mean"], 3)],
            ["final held-out pass@1", r(rows[-1]["eval/pass@1"], 3)],
            ["final entropy", r(rows[-1]["entropy"], 3)],
            ["final clip/frac", r(rows[-1]["clip/frac"], 3)],
            ["final degenerate groups", r(rows[-1]["group/degenerate_frac"], 3)],
        ],
        "note": (
            f"posttrain report's alarms on this run: {', '.join(a.name for a in fired) or 'none'}. Train reward "
            f"{rows[0]['reward/mean']:.2f} → {rows[-1]['reward/mean']:.2f}, held-out "
            f"{rows[0]['eval/pass@1']:.2f} → {rows[-1]['eval/pass@1']:.2f}."
        ),
    }


register(
    Widget(
        "failures",
        "Failure modes and the alarms that catch them",
        failures,
        [
            Knob("mode", "what goes wrong", MODES, "entropy collapse", "select"),
            Knob("severity", "how badly", [0.0, 0.25, 0.5, 0.75, 1.0], 0.25),
        ],
        {
            "knobs": {"mode": "stale sampler", "severity": 1.0},
            "what": "A sampler that falls further behind each step: |log ρ| grows until over 40% of the tokens "
            "have their gradient clipped away, so each step teaches less and the reward climbs only about "
            "two-thirds as far as a healthy run's. The reward curve only looks slow; the clip-fraction "
            "alarm names the cause.",
        },
        "Left: metrics in [0, 1]; right: entropy and mean length relative to step 1. The run is a "
        "deliberate toy (its metrics are generated, each measured with posttrain's functions); the alarms "
        "are posttrain.report.alarms, what `posttrain report RUN_DIR` runs on a real run.",
        [
            "posttrain.report:alarms",
            "posttrain.report:entropy_collapse",
            "posttrain.report:clip_fraction_high",
            "posttrain.algorithms.dapo:degenerate",
            "posttrain.framework.rollout:token_logprobs",
        ],
    )
)


# ---- 24 · the whiteboard question: does it fit, and where does the time go? ------------------------

PARAMS_B = {"llama3-8b": 8, "llama-70b": 70}


def sizing(model: str, gpus: int, placement: str, lora: int) -> dict:
    """memory.plan for GRPO (colocated, or split: half trainer, 1/8 reference, the rest rollout) and
    throughput.role_model for the step's per-role seconds."""
    split = {}
    if placement == "split":
        split = {"gpus": gpus // 2, "ref_gpus": max(1, gpus // 8), "rollout_gpus": gpus - gpus // 2 - max(1, gpus // 8)}
    p = memory.plan(
        model,
        algo="grpo",
        gpus=split.get("gpus", gpus),
        lora=lora,
        checkpointing=True,
        placement=placement,
        **{k: v for k, v in split.items() if k != "gpus"},
    )
    topo = "colocated" if placement == "colocated" else "one_step_off"
    t = throughput.role_model(PARAMS_B[model], topology=topo)
    pools = list(p["pools"].items())
    state = 18 * p["params"]  # mixed precision, bytes
    return {
        "figure": figure(
            [
                bar([n for n, _ in pools], [units.gib(q["peak_bytes"]) for _, q in pools], "peak GiB per GPU"),
                line(
                    [pools[0][0], pools[-1][0]],
                    [units.gib(p["capacity_bytes"])] * 2,
                    "H100 budget (80·10⁹ B of 79.6 GiB)",
                    line={"dash": "dash", "color": "black"},
                ),
                bar(list(t["terms"]), list(t["terms"].values()), "seconds per step", xaxis="x2", yaxis="y2"),
            ],
            f"{model}, GRPO, {gpus} × H100, {placement}, LoRA {lora or 'off'}",
            "",
            "GiB per GPU",
            grid={"rows": 1, "columns": 2, "pattern": "independent"},
            showlegend=False,
            yaxis2={"title": {"text": "seconds per step"}},
        ),
        "kpis": [
            ["fits?", "yes" if p["fits"] else "no"],
            ["peak per GPU", units.size(p["peak_bytes"])],
            [
                "full training state 18 B × P",
                f"{units.size(state, 2)} vs {units.size(gpus * p['capacity_bytes'])} of HBM",
            ],
            ["step time (role model)", f"{t['step_s']:.1f} s"],
            ["rollout share of the role time", f"{100 * t['terms']['rollout'] / sum(t['terms'].values()):.0f}%"],
            ["cheapest change that fits", p["suggestions"][0]["change"] if p["suggestions"] else "—"],
        ],
        "note": (
            f"Peak {units.size(p['peak_bytes'])} per GPU: "
            + ("it fits" if p["fits"] else "it does not fit")
            + f"; rollout is {100 * t['terms']['rollout'] / sum(t['terms'].values()):.0f}% of the role-time total."
        ),
    }


register(
    Widget(
        "sizing",
        "The whiteboard question: fit and step time",
        sizing,
        [
            Knob("model", "model", list(PARAMS_B), "llama3-8b", "select"),
            Knob("gpus", "H100s", [8, 16, 32, 64], 8),
            Knob("placement", "placement", ["colocated", "split"], "colocated", "select"),
            Knob("lora", "LoRA rank (0 = full)", [0, 16], 0),
        ],
        {
            "knobs": {"model": "llama-70b", "gpus": 8, "placement": "colocated", "lora": 0},
            "what": "'70B on 8 H100s, colocated' (the course's interview answer) does not fit: full training "
            "state alone is 18 B × 69B params ≈ 1.13 TiB against 596 GiB of HBM (8 × 80 GB), before any "
            "activation or KV cache. It needs LoRA, offload or more GPUs.",
        },
        "Left: peak memory per GPU of each pool (memory.plan), in GiB. Right: seconds per role in one step "
        "(throughput.role_model).",
        ["posttrain.sizing.memory:plan", "posttrain.sizing.throughput:role_model"],
    )
)


# ---- 27 · a gap closed: truncated importance weights for stale samples ----------------------------

STALENESS = [0, 1, 2, 4, 8, 16]
CORRECTIONS = list(core.OFF_POLICY_CORRECTIONS)
_DRIFT = 0.15 * torch.linspace(-1, 1, 16, dtype=torch.float64)  # how one version moves the logits
_GOOD = (torch.arange(16) >= 12).double()  # f(y) = 1 on the top four tokens


def stale_estimate(delta: int, mode: str, cap: float, trials: int = 200):
    """Estimate E_π[f] from tokens sampled by a policy `delta` versions old, weighted by
    core.off_policy_weights. Returns (truth, mean estimate, std over trials, metrics of trial 0)."""
    mu, pi = torch.log_softmax(_BASE, -1), torch.log_softmax(_BASE + delta * _DRIFT, -1)
    gen = torch.Generator().manual_seed(0)
    y = torch.multinomial(mu.exp(), trials * 64, replacement=True, generator=gen).view(trials * 8, 8)  # rows of 8
    w, m = core.off_policy_weights(pi[y], mu[y], torch.ones(trials * 8, 8, dtype=torch.float64), mode, cap)
    est = (w * _GOOD[y]).view(trials, 64).mean(1)  # [trials]
    return float((pi.exp() * _GOOD).sum()), est.mean(), est.std(), m


@functools.cache
def _curves(cap: float) -> dict:
    return {md: [stale_estimate(d, md, cap) for d in STALENESS] for md in CORRECTIONS}


def off_policy(delta: int, mode: str, cap: float) -> dict:
    curves = _curves(cap)  # every (Δ, mode) at this cap, once
    truth, est, sd, m = curves[mode][STALENESS.index(delta)]
    return claims.attach(
        "off_policy",
        {
            "figure": figure(
                [line(STALENESS, [c[1] - c[0] for c in cs], md, mode="lines+markers") for md, cs in curves.items()]
                + [
                    line([delta], [est - truth], "this setting", mode="markers", marker={"size": 14}),
                    *[
                        line(
                            STALENESS,
                            [float(c[3]["offpolicy/capped_frac"]) for c in cs],
                            f"{md}: capped",
                            xaxis="x2",
                            yaxis="y2",
                        )
                        for md, cs in curves.items()
                        if md != "none"
                    ],
                ],
                f"cap C = {cap}: bias of the estimate (left), share of tokens capped (right)",
                "staleness Δ (versions)",
                "estimate − truth",
                grid={"rows": 1, "columns": 2, "pattern": "independent"},
                xaxis2={"title": {"text": "staleness Δ"}},
                yaxis2={"range": [0, 1], "title": {"text": "share of tokens capped"}},
            ),
            "kpis": [
                ["true E_π[f]", r(truth, 4)],
                ["mean estimate", r(est, 4)],
                ["bias", r(est - truth, 4)],
                ["std over 200 batches", r(sd, 4)],
                ["capped / masked tokens", r(m["offpolicy/capped_frac"], 3)],
                ["largest weight", r(m["offpolicy/weight_max"], 3)],
                ["mean |log ρ|", r(m["offpolicy/log_ratio_abs"], 3)],
            ],
            "note": "Without a weight an average of stale samples estimates the old policy (a loss with no ratio "
            "does the same; PPO's ratio against μ carries the weight and over-clips instead); capping trades a "
            "little bias for bounded variance; masking drops the tokens that moved most.",
        },
    )


register(
    Widget(
        "off_policy",
        "Stale samples and truncated importance weights",
        off_policy,
        [
            Knob("delta", "staleness Δ (versions)", STALENESS, 4),
            Knob("mode", "correction", CORRECTIONS, "tis", "select"),
            Knob("cap", "cap C", [1.5, 2.0, 5.0, 10.0], 2.0),
        ],
        {
            "knobs": {"delta": 16, "mode": "none"},
            "what": "Samples 16 versions old averaged with no weight: the estimate is the old policy's value, far "
            "from the current one. A policy-gradient loss with no ratio would train on it as if it were fresh.",
        },
        "Each point: the mean over 200 batches of 64 tokens of the weighted estimate minus the truth. The "
        "16-token policies are a deliberate toy; the weights are core.off_policy_weights."
        + claims.caption("off_policy"),
        ["posttrain.algorithms.core:off_policy_weights"],
    )
)
