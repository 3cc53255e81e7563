"""Widgets of lesson 00 (the lineage on one group) and lesson 13's DAPO ablation (recorded runs of
posttrain.lessons.dapo_toy, one per setting of DAPO's four switches)."""

from __future__ import annotations

import torch

from posttrain import algorithms
from posttrain.algorithms import ppo
from posttrain.framework.batch import RolloutBatch
from posttrain.lessons import dapo_toy, runs
from posttrain.lessons.registry import Knob, Widget, bar, figure, line, r, register
from posttrain.lessons.widgets_algos import BASELINES, _estimates, _expected
from posttrain.lessons.widgets_signal import _hack_run
from posttrain.sizing import memory

# ---- 00 · the lineage, applied to one group --------------------------------------------------------

LINEAGE = ["reinforce", "ppo", "grpo", "rloo", "dapo", "dr_grpo"]
GROUPS = ["1,0,0,0", "1,1,0,0", "1,1,1,0", "1,1,1,1", "0,0,0,0"]


def lineage_advantages(rewards: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each algorithm's own advantages(...) with its default Config on one group [K]. PPO's is
    ppo.advantages with its defaults on a batch that is this one group, one token per answer, at the
    first step: an untrained (zero-initialised) critic V = 0 and the reference equal to the policy, so
    GAE gives A = R and the default whitening over the batch's tokens centres and scales it."""
    g = torch.zeros(len(rewards), dtype=torch.long)
    out = {}
    for name in LINEAGE:
        if name == "ppo":
            zero = torch.zeros(len(rewards), 1, dtype=rewards.dtype)  # [K, 1] V_old, old and ref logprobs
            first = RolloutBatch(loss_mask=torch.ones_like(zero), values=zero, old_logprobs=zero, ref_logprobs=zero)
            out[name] = ppo.advantages(rewards, g, ppo.Config(), batch=first)[:, 0]
        else:
            mod = algorithms.get(name)
            out[name] = mod.advantages(rewards, g, mod.Config())
    return out


def lineage(group: str) -> dict:
    rw = torch.tensor([float(x) for x in group.split(",")], dtype=torch.float64)
    adv = lineage_advantages(rw)
    names = [f"y{i} (r={int(x)})" for i, x in enumerate(rw.tolist())]
    roles = {n: memory.ROLES[n] for n in LINEAGE}
    dead = [n for n, a in adv.items() if float(a.abs().max()) == 0]
    return {
        "figure": figure(
            [bar(names, a.tolist(), n) for n, a in adv.items()],
            f"one group of K = 4, rewards ({group})",
            "answer (its reward)",
            "advantage A_i",
            barmode="group",
        ),
        "kpis": [[n, ", ".join(f"{x:+.2f}" for x in a.tolist())] for n, a in adv.items()]
        + [
            [
                "roles beyond rollout + reward",
                "; ".join(
                    f"{n}: " + ("+".join(k for k in ("reference", "critic") if getattr(roles[n], k)) or "none")
                    for n in LINEAGE
                ),
            ],
            ["algorithms with no signal here", ", ".join(dead) or "none"],
        ],
        "note": "Same rewards, six estimators: each later algorithm changes the baseline or the scale, "
        "never the sign of a right answer's push.",
    }


register(
    Widget(
        "lineage",
        "The lineage on one group of four answers",
        lineage,
        [Knob("group", "rewards of the 4 answers", GROUPS, GROUPS[0], "select")],
        {
            "knobs": {"group": "1,1,1,1"},
            "what": "All four answers right: every group-baseline algorithm (GRPO, RLOO, DAPO, Dr. GRPO) gives "
            "A = 0, so the prompt teaches nothing; REINFORCE pushes every answer up by the same +1, which only "
            "adds noise. PPO's 0 here comes from whitening a batch that is this one group: in a real batch "
            "these answers would sit above the batch's mean and be pushed up too.",
        },
        "Advantages of each algorithm in the lineage, computed by its own advantages() with its defaults "
        "(PPO's on a batch that is this one group, at the first step).",
        [
            "posttrain.algorithms.reinforce:advantages",
            "posttrain.algorithms.ppo:advantages",
            "posttrain.algorithms.grpo:advantages",
            "posttrain.algorithms.rloo:advantages",
            "posttrain.algorithms.dapo:advantages",
        ],
    )
)


# ---- 00 · the three forces, each with one setting that holds and one that fails ---------------------

SIGNALS = ["verifier", "leaky reward model"]
ESTIMATORS = ["group baseline, K = 8", "no baseline, K = 1"]
COSTS = ["GRPO · qwen2.5-14b · 8 H100", "PPO, separate critic · qwen2.5-14b · 8 H100"]  # one change: the critic
COST_MODEL = "qwen2.5-14b"
FORCE_LESSONS = {
    "SIGNAL": "how do we know an answer is good? humans → reward models → verifiers · lessons 03, 15–18a",
    "ESTIMATOR": "a low-variance, low-bias gradient? baselines, clip, KL anchor · lessons 04, 09–14",
    "COST": "what fits on the cluster? drop the critic, disaggregate, go async · lessons 05–06, 19–28",
}


def forces_map(signal: str, estimator: str, cost: str) -> dict:
    """Every design question of the course falls under one of three forces. One measurement per
    force, by posttrain: SIGNAL, the lesson-18 hacking run (reinforce.loss) with an honest
    verifier or a reward model that leaks ρ = 0.5, 200 steps; ESTIMATOR, 2000 gradient estimates
    of the lesson-09 toy with rloo.advantages at K = 8 or reinforce.advantages at K = 1 (their
    error against the true gradient); COST, memory.plan of GRPO or of PPO with a separate critic on the
    same model and 8 H100s (the plan's defaults otherwise: full fine-tuning, FSDP, no offload)."""

    _pi, train, held = _hack_run(0.0 if signal == SIGNALS[0] else 0.5)[200]
    K, base = (8, BASELINES[1]) if estimator == ESTIMATORS[0] else (1, BASELINES[0])
    err = float((_estimates(K, 2000, torch.Generator().manual_seed(1), base) - _expected()).norm(dim=-1).mean())
    algo = "grpo" if cost == COSTS[0] else "ppo"
    plan = memory.plan(COST_MODEL, algo=algo, gpus=8, checkpointing=True, suggest=False, critic="separate")
    ok = {"SIGNAL": held > 0.6, "ESTIMATOR": err < 0.3, "COST": plan["fits"]}
    pos = {"SIGNAL": (0.0, 1.0), "ESTIMATOR": (-1.0, -0.6), "COST": (1.0, -0.6)}
    traces = [line([0, x], [0, y], "", line={"color": "#bbbbbb"}, hoverinfo="skip") for x, y in pos.values()]
    traces.append(
        line(
            [0],
            [0],
            "the loop",
            mode="markers+text",
            text=["one RL loop:<br>rollout → reward → update"],
            textposition="middle center",
            marker={"size": 90, "color": "#eeeeee", "symbol": "circle"},
        )
    )
    traces.append(
        line(
            [p[0] for p in pos.values()],
            [p[1] for p in pos.values()],
            "forces",
            mode="markers+text",
            text=[f"<b>{f}</b>" for f in pos],
            textposition="middle center",
            hovertext=[FORCE_LESSONS[f] for f in pos],
            hoverinfo="text",
            marker={"size": 70, "symbol": "square", "color": ["#2ca02c" if ok[f] else "#d62728" for f in pos]},
        )
    )
    verdict = {f: "holds" if v else "fails" for f, v in ok.items()}
    return {
        "figure": figure(
            traces,
            "green: this force holds; red: it breaks the run",
            "",
            "",
            showlegend=False,
            height=380,
            xaxis={"visible": False, "range": [-1.6, 1.6]},
            yaxis={"visible": False, "range": [-1.1, 1.4]},
        ),
        "kpis": [
            ["SIGNAL", f"{verdict['SIGNAL']}: held-out correctness {held:.2f} (train reward {train:.2f})"],
            ["ESTIMATOR", f"{verdict['ESTIMATOR']}: gradient error {err:.2f}"],
            [
                "COST",
                f"{verdict['COST']}: peak {plan['peak_bytes'] / 2**30:.0f} GiB per GPU of a "
                f"{plan['capacity_bytes'] / 2**30:.1f} GiB budget",
            ],
            ["forces that hold", sum(ok.values())],
        ],
        "note": (
            "; ".join(f"{f.lower()} {verdict[f]}" for f in pos)
            + f". Signal: {signal}; estimator: {estimator}; cost: {cost}."
        ),
    }


register(
    Widget(
        "forces_map",
        "The three forces: signal, estimator, cost",
        forces_map,
        [
            Knob("signal", "signal", SIGNALS, SIGNALS[0], "select"),
            Knob("estimator", "estimator", ESTIMATORS, ESTIMATORS[0], "select"),
            Knob("cost", "cost", COSTS, COSTS[0], "select"),
        ],
        {
            "knobs": {"signal": SIGNALS[1], "estimator": ESTIMATORS[1], "cost": COSTS[1]},
            "what": "All three forces at their failing setting: the leaky reward model is optimised instead of the "
            "task (held-out correctness falls below 0.5), a single sample without a baseline gives a "
            "gradient error several times larger, and a separate PPO critic makes a 14B model that fits on 8 "
            "H100s under GRPO overflow them.",
        },
        "The map of the course: every lesson answers one of three questions. Each force has a measurement "
        "made by posttrain on a lesson's toy (hover a box for its lessons); its colour says whether the "
        "chosen setting holds.",
        [
            "posttrain.algorithms.reinforce:loss",
            "posttrain.algorithms.rloo:advantages",
            "posttrain.algorithms.reinforce:advantages",
            "posttrain.sizing.memory:plan",
        ],
    )
)


# ---- 13 · DAPO ablation: the four switches, one recorded run each ----------------------------------


def dapo_ablation(clip_higher: bool, dynamic_sampling: bool, token_mean: bool, overlong: bool) -> dict:
    rec = runs.recorded()
    this = rec[dapo_toy.key(clip_higher, dynamic_sampling, token_mean, overlong)]
    on, off = rec[dapo_toy.key(True, True, True, True)], rec[dapo_toy.key(False, False, False, False)]
    n = len(this["step"])
    mean = lambda xs: sum(xs) / len(xs)
    return {
        "figure": figure(
            [
                line(this["step"], this["acc"], "this setting: accuracy"),
                line(on["step"], on["acc"], "all four on", line={"dash": "dot", "color": "green"}),
                line(off["step"], off["acc"], "all four off (GRPO)", line={"dash": "dot", "color": "grey"}),
                line(this["step"], this["entropy"], "this setting: entropy", xaxis="x2", yaxis="y2"),
                line(this["step"], this["useful"], "groups with signal / batch", xaxis="x2", yaxis="y2"),
            ],
            "exact accuracy over all prompts (left); entropy and useful groups (right)",
            "step",
            "accuracy",
            grid={"rows": 1, "columns": 2, "pattern": "independent"},
            yaxis={"range": [0, 1]},
            xaxis2={"title": {"text": "step"}},
            yaxis2={"range": [0, 1.3], "title": {"text": "entropy (nats) / share"}},
        ),
        "kpis": [
            ["accuracy at step 30 / 75 / 150", " / ".join(f"{this['acc'][i]:.3f}" for i in (5, 14, n - 1))],
            ["all on / all off at step 150", f"{on['acc'][-1]:.3f} / {off['acc'][-1]:.3f}"],
            ["groups with signal per batch (mean)", r(mean(this["useful"]), 3)],
            ["responses sampled in 150 steps", int(this["samples"][-1])],
            ["final entropy", r(this["entropy"][-1], 3)],
            ["clip/frac (mean)", r(mean(this["clip"]), 3)],
            ["mean length at step 150", r(this["length"][-1], 2)],
        ],
        "note": "Recorded runs (3 seeds each) of a tabular policy trained by dapo.advantages and dapo.loss; "
        "python -m posttrain.lessons.runs dapo re-runs all 16 in about 30 s.",
    }


register(
    Widget(
        "dapo_ablation",
        "DAPO ablation: the four switches, one recorded run each",
        dapo_ablation,
        [
            Knob("clip_higher", "① clip-higher (ε_high 0.28)", [False, True], True, "check"),
            Knob("dynamic_sampling", "② dynamic sampling (refill)", [False, True], True, "check"),
            Knob("token_mean", "③ token-level loss", [False, True], True, "check"),
            Knob("overlong", "④ overlong shaping", [False, True], True, "check"),
        ],
        {
            "knobs": {"dynamic_sampling": False},
            "what": "Dynamic sampling off: on average only 16% of each batch's groups have mixed rewards, the rest "
            "train nothing, and accuracy after 150 steps falls from 0.85 to 0.67 (the refill costs "
            "about 3.9× more sampled responses, so compare at equal steps, not equal compute).",
        },
        "Each setting is a real training run of posttrain's DAPO loss on a toy task whose hard prompts need "
        "long answers; the dotted curves are all switches on and all off.",
        ["posttrain.lessons.dapo_toy:run", "posttrain.algorithms.dapo:loss", "posttrain.algorithms.dapo:degenerate"],
    )
)
