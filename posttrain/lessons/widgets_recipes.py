"""Widget of lesson 23: "which recipe is this paper?", a decision tree from four questions to an
algorithm family, answered in posttrain's terms: which algorithm module, which roles it needs,
which command runs it. Lesson 27's gap explorer is widgets_gaps.py."""

from __future__ import annotations

from posttrain import algorithms
from posttrain.lessons.registry import Knob, Widget, figure, line, register
from posttrain.sizing import memory

# ---- 23 · which recipe is this paper? ------------------------------------------------------------

REWARD = ["verifier", "reward model", "preference pairs", "process reward model"]
DATA = ["on-policy (samples its own answers)", "off-policy (a fixed dataset)"]
BASELINE = ["learned critic", "group mean", "leave-one-out", "none"]
TURNS = ["single turn", "multi-turn with tools"]
LABEL = {
    "verifier": "RLVR",
    "reward model": "RLHF",
    "preference pairs": "pure preference",
    "process reward model": "PRM-guided RL",
}
# family → (posttrain algorithm names, the command that runs it)
FAMILY = {
    "PPO": (["ppo"], "posttrain rl configs/grpo_arith.yaml algorithm=ppo"),
    "GRPO / DAPO / Dr. GRPO": (
        ["grpo", "dapo", "dr_grpo"],
        "posttrain rl configs/grpo_arith.yaml algorithm=grpo (or dapo, dr_grpo)",
    ),
    "RLOO": (["rloo"], "posttrain rl configs/grpo_arith.yaml algorithm=rloo"),
    "REINFORCE": (["reinforce"], "posttrain rl configs/grpo_arith.yaml algorithm=reinforce"),
    "DPO / IPO / KTO / ORPO / SimPO": (
        ["dpo", "ipo", "kto", "orpo", "simpo"],
        "posttrain dpo init=RUN loss_type=dpo (ipo, kto, orpo, simpo)",
    ),
    "offline RL / reward-weighted SFT (RAFT, ReST)": (
        ["sft"],
        (
            "posttrain sft data=rejection init=RUN (RFT; posttrain's "
            "rejection keeps verified samples, RM ranking is not wired)"
        ),
    ),
    "offline: rejection-sampled SFT or DPO": (
        ["sft", "dpo"],
        "posttrain sft data=rejection init=RUN, or posttrain dpo init=RUN",
    ),
}


def classify_paper(reward: str, data: str, baseline: str, turns: str) -> tuple[str, list[str]]:
    """The course's decision tree: (algorithm family, warnings)."""
    on = data.startswith("on")
    warn = []
    if reward == "preference pairs":
        family = "DPO / IPO / KTO / ORPO / SimPO"
        if on:
            warn.append(
                "inconsistent: a preference-pair loss trains on a fixed dataset; on-policy preference "
                "learning needs a judge or reward model to label fresh samples (online DPO)"
            )
    elif not on:
        family = (
            "offline RL / reward-weighted SFT (RAFT, ReST)"
            if reward == "reward model"
            else "offline: rejection-sampled SFT or DPO"
        )
    else:
        family = {
            "learned critic": "PPO",
            "group mean": "GRPO / DAPO / Dr. GRPO",
            "leave-one-out": "RLOO",
            "none": "REINFORCE",
        }[baseline]
    if turns.startswith("multi"):
        warn.append("multi-turn: tool output enters the response with response_mask = 0 (lesson 08)")
    return family, warn


def classify(reward: str, data: str, baseline: str, turns: str) -> dict:
    family, warn = classify_paper(reward, data, baseline, turns)
    names, command = FAMILY[family]
    roles = memory.ROLES[names[0]]
    rl = [n for n in names if n in algorithms.ALGORITHMS]
    cfg = algorithms.get(rl[0]).Config() if rl else None  # posttrain's defaults for the first one
    defaults = (
        f"clip ε {getattr(cfg, 'eps_low', '—')}, KL β {cfg.kl_coef}, aggregation {cfg.aggregation}"
        if cfg
        else "— (not an RL algorithm module)"
    )
    need = [k for k in ("rollout", "reference", "critic", "reward_model") if getattr(roles, k)]
    if reward in ("reward model", "process reward model") and "reward_model" not in need:
        need.append("reward_model")
    # the tree, drawn: one column per question, the chosen answer of each red
    cols = [
        ("reward source", REWARD, reward),
        ("data", ["on-policy", "off-policy"], data.split(" ")[0]),
        ("baseline", BASELINE, baseline),
        ("turns", TURNS, turns),
    ]
    xs, ys, texts, colors = [], [], [], []
    for i, (_, opts, pick) in enumerate(cols):
        for j, o in enumerate(opts):
            xs.append(i)
            ys.append(-j)
            texts.append(o)
            colors.append("#d62728" if o == pick else "#9ecae1")
    path_y = [-opts.index(pick) for _, opts, pick in cols]
    consistent = not any(w.startswith("inconsistent") for w in warn)
    return {
        "figure": figure(
            [
                line(list(range(4)), path_y, "your path", line={"color": "#d62728", "width": 3}),
                line(
                    xs,
                    ys,
                    "answers",
                    mode="markers+text",
                    text=texts,
                    textposition="bottom center",
                    marker={"size": 16, "color": colors},
                ),
            ],
            f"{family}  ·  {LABEL[reward]}",
            "",
            "",
            showlegend=False,
            height=360,
            xaxis={"tickvals": list(range(4)), "ticktext": [c[0] for c in cols], "range": [-0.6, 3.6]},
            yaxis={"visible": False, "range": [-4.2, 0.6]},
        ),
        "kpis": [
            ["algorithm family", family],
            ["reward label", LABEL[reward]],
            ["posttrain algorithms", ", ".join(names)],
            ["roles it needs", ", ".join(need) or "none beyond the policy"],
            ["posttrain command", command],
            ["posttrain defaults of the first algorithm", defaults],
            ["consistent?", "yes" if consistent else "no"],
        ]
        + [[f"note {i + 1}", w] for i, w in enumerate(warn)],
        "note": (
            f"In posttrain's terms this paper is {family} ({LABEL[reward]}): roles {', '.join(need) or 'policy only'}."
            + (" " + warn[0][0].upper() + warn[0][1:] + "." if warn else "")
        ),
    }


register(
    Widget(
        "classify",
        "Which recipe is this paper?",
        classify,
        [
            Knob("reward", "Q1 · where does the reward come from?", REWARD, "verifier", "select"),
            Knob("data", "Q2 · whose samples does it train on?", DATA, DATA[0], "select"),
            Knob("baseline", "Q3 · what is the baseline?", BASELINE, "group mean", "select"),
            Knob("turns", "Q4 · single or multi-turn?", TURNS, TURNS[0], "select"),
        ],
        {
            "knobs": {"reward": "preference pairs", "data": DATA[0]},
            "what": "Preference pairs trained on-policy: a pair loss needs a fixed labelled dataset, so the "
            "description contradicts itself (consistent? no) unless a judge labels fresh samples, which "
            "makes it online DPO or RLHF.",
        },
        "Four questions about a paper, the course's decision tree, and what the answer is in posttrain: the "
        "algorithm modules, the roles memory.ROLES says they need, and the command that runs them.",
        ["posttrain.algorithms:get", "posttrain.sizing.memory:Roles"],
    )
)
