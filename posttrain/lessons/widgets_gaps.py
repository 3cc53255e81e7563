"""Widget of lesson 27, the gap explorer: the course's missing concepts, each with posttrain's status
and, where posttrain closed the gap, a measurement of what switching the fix off does. Lesson 23's
"which recipe is this paper?" is widgets_recipes.py."""

from __future__ import annotations

import functools

import torch

from posttrain.algorithms import core, ppo, reinforce
from posttrain.framework.batch import RolloutBatch
from posttrain.lessons.registry import Knob, Widget, bar, figure, line, r, register
from posttrain.lessons.widgets_forces import categorical
from posttrain.lessons.widgets_practice import stale_estimate
from posttrain.lessons.widgets_signal import curation, prm_search
from posttrain.sizing import memory

# ---- 27 · the gap explorer --------------------------------------------------------------------------

# name → (label, slots in after, prerequisite, force, effort, posttrain status, where)
GAPS = {
    "prm": ("PRM training", "L17", "03, 17", "signal", "medium", "closed", "posttrain.reward_models.prm:mc_labels"),
    "rm": (
        "reward-model internals",
        "L15",
        "15",
        "signal",
        "small",
        "partly",
        "posttrain.reward_models.reward_model:RewardModel",
    ),
    "curriculum": (
        "curriculum and data mixing",
        "18a",
        "13, 18, 23",
        "signal",
        "medium",
        "closed",
        "posttrain.data.curate:curate",
    ),
    "rlaif": ("RLAIF / constitutional AI", "L15", "15", "signal", "medium", "open", ""),
    "gae": ("GAE", "L10", "04, 10", "estimator", "small", "closed", "posttrain.algorithms.ppo:gae"),
    "kl": ("KL estimators k1/k2/k3", "L03", "03", "estimator", "small", "closed", "posttrain.algorithms.core:kl"),
    "entropy": ("entropy bonus", "L13", "13", "estimator", "small", "closed", "posttrain.algorithms.core:finish_loss"),
    "offpolicy": (
        "off-policy correction (truncated IS)",
        "L19",
        "02, 10",
        "estimator",
        "medium",
        "closed",
        "posttrain.algorithms.core:off_policy_weights",
    ),
    "whiten": (
        "reward whitening",
        "L14",
        "14",
        "estimator",
        "small",
        "closed",
        "posttrain.algorithms.core:masked_whiten",
    ),
    "fp8": ("FP8 rollouts", "L22", "22", "cost", "medium", "open", ""),
    "moe": ("MoE under RL", "L22", "22, 25", "cost", "large", "open", ""),
    "kvoff": ("KV offload", "L20", "20", "cost", "small", "open", ""),
    "ckpt": ("checkpoint and resume", "L23", "19, 22", "cost", "medium", "closed", "posttrain.checkpoint:save"),
    "lora": ("LoRA", "L20", "06, 20", "cost", "medium", "closed", "posttrain.models.lora:apply_lora"),
}


def _gae_demo() -> tuple[str, float, float]:
    """Std of the first token's advantage over 2000 episodes of 32 tokens, reward 0/1 at the end,
    a critic that knows the value up to noise: ppo.gae with λ = 0.95 (on) or λ = 1 (off: the
    Monte-Carlo return minus V)."""
    gen = torch.Generator().manual_seed(0)
    B, T = 2000, 32
    rew = torch.zeros(B, T, dtype=torch.float64)
    rew[:, -1] = (torch.rand(B, generator=gen, dtype=torch.float64) < 0.5).double()
    values = 0.5 + 0.05 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.float64)
    out = {}
    for lam in (0.95, 1.0):
        adv, _ = ppo.gae(rew, values, mask, gamma=1.0, lam=lam)
        out[lam] = float(adv[:, 0].std())
    return "std of A at the first token", out[0.95], out[1.0]


def _kl_demo() -> tuple[str, float, float]:
    """Share of negative per-token KL estimates (k3 on, k1 off) on 4096 tokens of a policy 0.5
    away from its reference: a KL penalty that is sometimes a bonus."""
    gen = torch.Generator().manual_seed(0)
    base = torch.linspace(-1.5, 1.5, 16, dtype=torch.float64)
    lp, ref = torch.log_softmax(base, -1), torch.log_softmax(0.5 * base, -1)
    y = torch.multinomial(lp.exp(), 4096, replacement=True, generator=gen)
    share = {k: float((core.kl(lp[y], ref[y], k) < 0).double().mean()) for k in ("k3", "k1")}
    return "share of per-token KL estimates < 0", share["k3"], share["k1"]


def _entropy_demo() -> tuple[str, float, float]:
    """Entropy of a 5-armed bandit policy after 300 REINFORCE steps (reinforce.loss with the
    entropy term of core.finish_loss, c_H = 0.1 on, 0 off), 200 seeds."""
    out = {}
    for coef in (0.1, 0.0):
        gen = torch.Generator().manual_seed(0)
        S = 200
        rewards = torch.tensor([0.1, 0.3, 0.9, 0.4, 0.2], dtype=torch.float64)
        theta = torch.zeros(S, 5, dtype=torch.float64, requires_grad=True)
        cfg = reinforce.Config(baseline="mean", entropy_coef=coef)
        mask = torch.ones(S, 1, dtype=torch.float64)
        for _ in range(300):
            logp = torch.log_softmax(theta, -1)
            a = torch.multinomial(logp.exp().detach(), 1, generator=gen)
            lp = logp.gather(1, a)
            ent = core.entropy_from_logits(theta.unsqueeze(1))  # [S, 1]
            adv = reinforce.advantages(rewards[a[:, 0]], torch.zeros(S, dtype=torch.long), cfg)
            loss, _ = reinforce.loss(
                lp,
                RolloutBatch(loss_mask=mask, advantages=adv, old_logprobs=lp.detach()),
                cfg,
                core.batch_norm(mask),
                entropy=ent,
            )
            (g,) = torch.autograd.grad(loss, theta)
            with torch.no_grad():
                theta -= 0.5 * S * g
        out[coef] = float(core.entropy_from_logits(theta.detach().unsqueeze(1)).mean())
    return "policy entropy after 300 steps (nats)", out[0.1], out[0.0]


def _offpolicy_demo() -> tuple[str, float, float]:

    on, off = stale_estimate(16, "tis", 2.0), stale_estimate(16, "none", 2.0)
    return "|bias| of the estimate from 16-version-old samples", abs(float(on[1] - on[0])), abs(float(off[1] - off[0]))


def _whiten_demo() -> tuple[str, float, float]:
    """Two reward sources in one batch, one scored 0–1 and one 0–100: the spread (std) of the
    0–1 source's advantages after core.masked_whiten per source (on) or of the mixed batch (off),
    where the big source sets the scale and the small one's differences all but vanish."""
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(256, 1, generator=gen, dtype=torch.float64)
    b = 100 * torch.rand(256, 1, generator=gen, dtype=torch.float64)
    ones = torch.ones(256, 1, dtype=torch.float64)
    per = float(core.masked_whiten(a, ones).std())
    mixed = float(core.masked_whiten(torch.cat([a, b]), torch.cat([ones, ones]))[:256].std())
    return "std of the 0–1 source's advantages", per, mixed


def _lora_demo() -> tuple[str, float, float]:
    """Peak GiB per GPU of GRPO on llama3-8b on one H100 (memory.plan), LoRA rank 16 vs full."""
    on = memory.plan("llama3-8b", algo="grpo", gpus=1, lora=16, checkpointing=True, suggest=False)["peak_bytes"]
    off = memory.plan("llama3-8b", algo="grpo", gpus=1, lora=0, checkpointing=True, suggest=False)["peak_bytes"]
    return "peak GiB per GPU, llama3-8b GRPO on one H100", on / 2**30, off / 2**30


def _prm_demo() -> tuple[str, float, float]:

    k = dict(prm_search(0.75, 16, 4, "matched")["kpis"])
    return (
        "accuracy: PRM beam (on) vs ORM best of 16 (off)",
        float(k["PRM beam"][:-1]) / 100,
        float(k["ORM best of N"][:-1]) / 100,
    )


def _curriculum_demo() -> tuple[str, float, float]:

    on, off = (dict(curation(80, c, 8)["kpis"]) for c in (60, 0))
    return (
        "share of rollouts in groups with no signal",
        float(on["rollouts in groups with no signal"][:-1]) / 100,
        float(off["rollouts in groups with no signal"][:-1]) / 100,
    )


DEMOS = {
    "gae": _gae_demo,
    "kl": _kl_demo,
    "entropy": _entropy_demo,
    "offpolicy": _offpolicy_demo,
    "whiten": _whiten_demo,
    "lora": _lora_demo,
    "prm": _prm_demo,
    "curriculum": _curriculum_demo,
}


@functools.cache
def _demo(gap: str) -> tuple[str, float, float]:
    return DEMOS[gap]()


def gaps(gap: str, fix: str) -> dict:
    label, after, prereq, force, effort, status, where = GAPS[gap]
    forces = ["signal", "estimator", "cost"]
    cells = {f: [g for g, v in GAPS.items() if v[3] == f] for f in forces}
    rows = max(len(v) for v in cells.values())
    z = [
        [
            (2 if cells[f][i] == gap else 1 if GAPS[cells[f][i]][5] != "open" else 0) if i < len(cells[f]) else None
            for f in forces
        ]
        for i in range(rows)
    ]
    text = [[GAPS[cells[f][i]][0] if i < len(cells[f]) else "" for f in forces] for i in range(rows)]
    status_colors = ["#f4cccc", "#d9ead3", "#f6b26b"]
    traces = [
        {
            "type": "heatmap",
            "z": z,
            "x": forces,
            "y": list(range(rows)),
            "text": text,
            "texttemplate": "%{text}",
            "colorscale": categorical(status_colors),
            "zmin": -0.5,
            "zmax": 2.5,
            "xgap": 3,
            "ygap": 3,
            "showscale": False,
            "hoverinfo": "text",
            "name": "gaps",
        }
    ]
    traces += [
        line([None], [None], name, mode="markers", marker={"size": 12, "symbol": "square", "color": c})
        for name, c in zip(["open", "closed in posttrain", "selected"], status_colors)
    ]
    kpis = [
        ["gap", label],
        ["slots in after", after],
        ["prerequisite lessons", prereq],
        ["force", force],
        ["effort", effort],
        ["posttrain", {"closed": "closed in code", "partly": "partly closed", "open": "open"}[status]],
    ]
    if where:
        kpis.append(["where in posttrain", where])
    note = f"{label}: {'closed in posttrain by ' + where if status != 'open' else 'still open in posttrain'}."
    if gap in DEMOS:
        what, on, off = _demo(gap)
        val = on if fix == "on" else off
        traces.append(
            bar(
                ["fix on", "fix off"],
                [on, off],
                what,
                xaxis="x2",
                yaxis="y2",
                marker={
                    "color": ["#2ca02c", "#d62728"],
                    "line": {"width": [3 if fix == "on" else 0, 3 if fix == "off" else 0]},
                },
                showlegend=False,
            )
        )
        kpis += [
            ["measured", what],
            ["with the fix", r(on, 4)],
            ["without the fix", r(off, 4)],
            ["this setting", r(val, 4)],
        ]
        note += f" Measured, {what}: {on:.3g} with the fix, {off:.3g} without."
    else:
        kpis.append(["measured", "no demonstration (open, or nothing to switch off)"])
        traces.append(bar(["fix on", "fix off"], [0, 0], "no demonstration", xaxis="x2", yaxis="y2", showlegend=False))
    return {
        "figure": figure(
            traces,
            f"{label} ({force}, {effort}): posttrain {status}",
            "",
            "",
            grid={"rows": 1, "columns": 2, "pattern": "independent"},
            xaxis={"domain": [0, 0.5], "title": {"text": "force"}},
            yaxis={"visible": False, "autorange": "reversed"},
            xaxis2={"domain": [0.6, 1]},
            yaxis2={"title": {"text": "measured value"}, "rangemode": "tozero"},
        ),
        "kpis": kpis,
        "note": note,
    }


register(
    Widget(
        "gaps",
        "The gap explorer: what the course leaves out, and what posttrain closed",
        gaps,
        [
            Knob("gap", "gap", list(GAPS), "gae", "select"),
            Knob("fix", "posttrain's fix", ["on", "off"], "on", "select"),
        ],
        {
            "knobs": {"gap": "offpolicy", "fix": "off"},
            "what": "Off-policy correction switched off: samples 16 versions old estimate the old policy, with a "
            "bias of about 0.3 on a quantity near 0.9, where truncated importance weights leave about 0.02.",
        },
        "Left: the gaps by force, coloured by posttrain's status (legend). Right: where a fix can be "
        "switched off, the measured effect of doing so (computed by the function that closes the gap).",
        [
            "posttrain.algorithms.ppo:gae",
            "posttrain.algorithms.core:kl",
            "posttrain.algorithms.reinforce:loss",
            "posttrain.algorithms.core:off_policy_weights",
            "posttrain.algorithms.core:masked_whiten",
            "posttrain.sizing.memory:plan",
            "posttrain.preference.search:sample_table",
            "posttrain.data.curate:curate",
        ],
    )
)
