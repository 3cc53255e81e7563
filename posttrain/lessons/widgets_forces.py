"""Widget of lesson 26: the three forces (verifiable signal, estimator bias, compute) pick a recipe.

The course's rules choose the reward source, the algorithm and the topology; the consequences
are computed with posttrain: lesson 18's hacking run (widgets_signal._hack_run) with the leak
that much signal implies, and the memory plan of the chosen algorithm on that many GPUs.
"""

from __future__ import annotations

from posttrain.lessons.registry import Knob, Widget, bar, line, r, register
from posttrain.lessons.widgets_signal import _hack_run
from posttrain.sizing import memory


def recipe(signal: int, bias: int, cost: int) -> tuple[str, str, str, str]:
    reward = "verifier" if signal >= 70 else "mixed" if signal >= 30 else "reward model"
    if cost < 8 and signal < 40:
        algo = "DPO (no rollouts)"
    elif signal >= 70:
        algo = "Dr. GRPO" if bias < 30 else "GRPO" if bias < 70 else "DAPO"
    else:
        algo = "PPO" if signal < 40 else "GRPO (mixed reward)"
    topo = "colocated" if cost <= 8 else "disaggregated" if cost <= 64 else "async"
    if algo.startswith("DPO"):
        named = "DPO ablation"
    elif signal >= 80 and cost >= 32:  # R1 ran GRPO with both normalisations Dr. GRPO removes
        named = {"GRPO": "DeepSeek-R1", "Dr. GRPO": "Oat-Zero (the Dr. GRPO paper)", "DAPO": "DAPO"}[algo]
    elif signal < 30 and cost <= 16:
        named = "InstructGPT-style RLHF"
    elif signal < 30 and cost <= 64:
        named = "Tülu 3 (early stages)"
    elif 40 <= signal < 80 and cost >= 32:
        named = "Tülu 3 / Qwen-3 mixed"
    elif signal >= 70 and cost <= 8:
        named = "small open RLVR run"
    else:
        named = "custom (uncommon mix)"
    return reward, algo, topo, named


ALGOS = ["DPO (no rollouts)", "PPO", "GRPO (mixed reward)", "Dr. GRPO", "GRPO", "DAPO"]
ALGO_COLORS = ["#7f7f7f", "#1f77b4", "#9467bd", "#2ca02c", "#ff7f0e", "#8c564b"]


def categorical(colors: list[str]) -> list:
    """A heatmap colorscale with one flat colour per integer level 0..n−1 (zmin −0.5, zmax n − 0.5),
    so a legend of coloured squares can name the levels instead of a colorbar."""
    n = len(colors)
    return [pair for i, c in enumerate(colors) for pair in ([i / n, c], [(i + 1) / n, c])]


POSTTRAIN_ALGO = {
    "DPO (no rollouts)": "dpo",
    "PPO": "ppo",
    "GRPO (mixed reward)": "grpo",
    "Dr. GRPO": "dr_grpo",
    "GRPO": "grpo",
    "DAPO": "dapo",
}
RUN_STEPS = {1: 50, 8: 100, 16: 100, 32: 200, 64: 200, 512: 500}  # what a bigger cluster buys: more steps


def leak(signal: int) -> float:
    """How much a reward without a verifier pays for the wrong thing: the hacking toy's leak ρ
    (lesson 18) falls from 0.6 with no verifiable signal to 0 with a verifier for everything."""
    return round(0.6 * (1 - signal / 100), 10)


def forces(signal: int, bias: int, cost: int) -> dict:
    """The course's three-forces rules pick reward, algorithm and topology; two consequences are
    computed with posttrain: the lesson-18 hacking run (REINFORCE via reinforce.loss) with the leak
    this much signal implies, run for as many steps as the cluster buys, and memory.plan of the
    chosen algorithm for llama3-8b on this many H100s."""
    reward, algo, topo, named = recipe(signal, bias, cost)
    sig = list(range(0, 101, 5))
    z = [[ALGOS.index(recipe(s, b, cost)[1]) for s in sig] for b in sig]
    rho, steps = leak(signal), RUN_STEPS[cost]
    pi, train, held = _hack_run(rho)[steps]
    plan = memory.plan("llama3-8b", algo=POSTTRAIN_ALGO[algo], gpus=min(cost, 64), checkpointing=True, suggest=False)
    hacked = float(pi[0]) < 0.5  # the policy prefers the leaked phrase
    return {
        "figure": {
            "data": [
                {
                    "type": "heatmap",
                    "x": sig,
                    "y": sig,
                    "z": z,
                    "colorscale": categorical(ALGO_COLORS),
                    "zmin": -0.5,
                    "zmax": len(ALGOS) - 0.5,
                    "showscale": False,
                    "text": [[ALGOS[v] for v in row] for row in z],
                    "hoverinfo": "text",
                    "name": "algorithm",
                }
            ]
            + [
                line([None], [None], a, mode="markers", marker={"size": 12, "symbol": "square", "color": c})
                for a, c in zip(ALGOS, ALGO_COLORS)
            ]
            + [
                line(
                    [signal],
                    [bias],
                    "your setting",
                    mode="markers",
                    marker={"size": 16, "color": "black", "symbol": "x"},
                ),
                bar(
                    ["proxy reward (trained on)", "held-out correctness"],
                    [train, held],
                    f"after {steps} steps on {cost} GPUs ({topo})",
                    xaxis="x2",
                    yaxis="y2",
                    marker={"color": ["#1f77b4", "#d62728" if hacked else "#2ca02c"]},
                    showlegend=False,
                ),
            ],
            "layout": {
                "title": {
                    "text": f"algorithm by signal × bias at {cost} GPUs (top); leak ρ = {rho:g}, "
                    f"{steps} steps (bottom)",
                    "font": {"size": 14},
                },
                "height": 600,
                "showlegend": True,
                "xaxis": {"title": {"text": "verifier availability (signal, %)"}, "domain": [0, 0.78]},
                "yaxis": {"title": {"text": "estimator bias tolerance (%)"}, "domain": [0.5, 1]},
                "xaxis2": {"domain": [0, 0.78], "anchor": "y2"},
                "yaxis2": {"anchor": "x2", "domain": [0, 0.3], "range": [0, 1.6], "title": {"text": "reward"}},
                "margin": {"l": 60, "r": 20, "t": 40, "b": 40},
            },
        },
        "kpis": [
            ["reward source", reward],
            ["algorithm", algo],
            ["topology", topo],
            ["closest named recipe", named],
            ["reward leak ρ this signal implies", rho],
            ["steps the cluster buys", steps],
            ["proxy reward after the run", r(train, 3)],
            ["held-out correctness after the run", r(held, 3)],
            ["π(solve) after the run", r(pi[0], 3)],
            [
                "llama3-8b fits on this cluster?",
                ("yes" if plan["fits"] else "no") + f" (peak {plan['peak_bytes'] / 2**30:.1f} GiB per GPU)",
            ],
        ],
        "note": (
            f"{algo} with a {reward} reward on {cost} GPUs ({topo}). "
            + (
                f"With this little verifiable signal the reward leaks (ρ = {rho:g}), and {steps} steps of "
                f"optimisation drive the proxy to {train:.2f} while held-out correctness falls to {held:.2f}."
                if hacked
                else f"After {steps} steps the policy still solves (π(solve) = {float(pi[0]):.2f}); the proxy reward "
                f"({train:.2f}) overstates held-out correctness ({held:.2f}) only by what the leak pays."
            )
        ),
    }


_PCT = [0, 20, 30, 40, 60, 70, 80, 100]
GPUS = [1, 8, 16, 32, 64, 512]
register(
    Widget(
        "forces",
        "Signal × estimator × cost → a recipe",
        forces,
        [
            Knob("signal", "verifier availability %", _PCT, 60),
            Knob("bias", "bias tolerance %", [0, 20, 30, 50, 70, 100], 50),
            Knob("cost", "GPUs", GPUS, 8),
        ],
        {
            "knobs": {"signal": 20, "cost": 512},
            "what": "Little verifiable signal on a huge cluster: the reward model leaks (ρ = 0.48 > 0.3), and the "
            "500 steps the cluster buys optimise the leak: the proxy reward climbs past 0.8 while held-out "
            "correctness falls below 0.5. Spend on signal before spending on GPUs.",
        },
        "Top: which algorithm each (signal, bias) point leads to at this cluster size (the course's rules); "
        "bottom: the lesson-18 hacking run with the leak this signal implies, for the steps the cluster buys. "
        "The rules and the leak are a deliberate toy; the training and the memory check are posttrain's.",
        ["posttrain.algorithms.reinforce:loss", "posttrain.sizing.memory:plan"],
    )
)
