"""Widgets of part I, lessons 07–08: one RL step end to end. The controller calls the roles in
order (07, phase by phase on gpt_mini), and an agent episode interleaves the policy's turns with
tool output that the mask keeps out of the loss (08). Lessons 05–06 are widgets_loop.py."""

from __future__ import annotations

import dataclasses
import functools

import torch

from posttrain.algorithms import core, grpo
from posttrain.chat import CALL_CLOSE, CALL_OPEN
from posttrain.config import OptimConfig
from posttrain.framework.agent import observation_ids
from posttrain.framework.batch import collate, collate_samples
from posttrain.framework.reference import Reference, score_logprobs
from posttrain.framework.rollout import Engine, token_logprobs
from posttrain.framework.sample import Sample
from posttrain.framework.trainer import Trainer, policy_loss_fn
from posttrain.framework.weight_sync import WeightSync
from posttrain.lessons.registry import Knob, Widget, bar, figure, line, r, register
from posttrain.models.gpt_mini import GPTMini, ModelConfig
from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask, Problem
from posttrain.tasks.base import safe_reward

# ---- 07 · the controller, phase by phase --------------------------------------------------------

PHASES = [
    "0 · before the step",
    "1 · rollout",
    "2 · reward",
    "3 · collate",
    "4 · reference",
    "5 · advantages",
    "6 · train step",
    "7 · weight sync",
    "8 · metrics",
]
_NODES = ["rollout", "reward", "collate", "reference", "algorithm", "trainer", "weight sync", "metrics"]
DEGENERATE = "degenerate (dropped under skip / resample)?"
ANSWER_SETS = ["12, 11, 14", "12, 12, 11", "11, 13, 14", "12, 12, 12"]
CONTROLLER_LR = 1e-2  # far above the RL recipe's, so that one step moves the log-probabilities visibly


@functools.lru_cache(maxsize=8)
def _controller_step(answers: str) -> dict:
    """One step of the loop, its roles called by hand, on a tiny gpt_mini (1 layer, 32 wide, seeded) for the prompt
    <3+4+5> and three given responses, each role the framework's own: the behaviour logprobs
    the sampler records (rollout.token_logprobs), the verifier (ArithmeticTask.reward),
    collate_samples, Reference.score, grpo.advantages, Trainer.step with policy_loss_fn(grpo),
    WeightSync.sync. The responses are fixed instead of sampled, so the rewards can be chosen."""
    torch.manual_seed(0)
    tok, task = CharTokenizer(BASE_CHARS), ArithmeticTask(ArithmeticConfig())
    model = GPTMini(ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=32).resolved(tok.vocab_size))
    item = Problem((3, 4, 5))
    prompt = tok.encode(tok.chat_prompt(task.prompt(item)))
    texts = [tok.chat_response(a.strip()) for a in answers.split(",")]
    engine = Engine(model, tok)
    sync = WeightSync(model, engine, mode="separate")  # the sampler holds its own copy
    samples = []
    with torch.no_grad():
        for i, t in enumerate(texts):  # ❶ behaviour logprobs, as recorded
            ids = torch.tensor([prompt + tok.encode(t)])
            lp = token_logprobs(engine.model(ids)[0, len(prompt) - 1 : -1], ids[0, len(prompt) :], 1.0)
            samples.append(
                Sample(
                    prompt,
                    tok.encode(t),
                    lp.tolist(),
                    [1] * len(t),
                    "stop",
                    engine.policy_version,
                    0,
                    i,
                    item=item,
                    text=t,
                )
            )
    for s in samples:  # ❷ the verifier
        s.reward = safe_reward(task, s.item, s.text).reward
    batch = collate_samples(samples, tok.pad_id)  # ❸
    ref = Reference(model)
    batch = dataclasses.replace(batch, ref_logprobs=ref.score(batch))  # ❹
    cfg = grpo.Config(std="population", kl_coef=0.05)
    adv = grpo.advantages(batch.rewards, batch.group_index, cfg)  # ❺
    batch = dataclasses.replace(batch, advantages=core.broadcast(adv, batch.loss_mask))
    trainer = Trainer(model, OptimConfig(lr=CONTROLLER_LR, weight_decay=0.0, schedule="constant"), 1)
    metrics = trainer.step(batch, policy_loss_fn(grpo, cfg, 1.0))  # ❻
    with torch.no_grad():
        new_lp = (score_logprobs(model, batch) * batch.loss_mask).sum(1)  # trainer, after the step
        stale_lp = (score_logprobs(engine.model, batch) * batch.loss_mask).sum(1)  # sampler, not yet synced
    version_before = engine.policy_version
    metrics.update(sync.sync())  # ❼
    with torch.no_grad():
        synced_lp = (score_logprobs(engine.model, batch) * batch.loss_mask).sum(1)
    return {
        "old_tok": batch.old_logprobs.double(),
        "ref_tok": batch.ref_logprobs.double(),
        "mask_t": batch.loss_mask.double(),
        "texts": texts,
        "rewards": batch.rewards.tolist(),
        "old": (batch.old_logprobs.sum(1)).tolist(),
        "ref": (batch.ref_logprobs.sum(1)).tolist(),
        "adv": adv.tolist(),
        "shape": tuple(batch.input_ids.shape),
        "mask": batch.loss_mask.tolist(),
        "loss_tokens": int(batch.loss_mask.sum()),
        "new": new_lp.tolist(),
        "stale": stale_lp.tolist(),
        "synced": synced_lp.tolist(),
        "versions": (version_before, engine.policy_version),
        "metrics": metrics,
    }


def controller(phase: int, answers: str) -> dict:
    st = _controller_step(answers)
    k = phase  # phases 1.. reveal one role each
    names = [f"y{i}: {t}" for i, t in enumerate(st["texts"])]
    colors = ["#d62728" if i + 1 == k else ("#9ecae1" if i + 1 < k else "#eeeeee") for i in range(len(_NODES))]
    right = []
    if k == 1:
        right = [bar(names, st["old"], "behaviour log π(y) (sum over tokens)", xaxis="x2", yaxis="y2")]
    elif k == 2:
        right = [bar(names, st["rewards"], "reward from the verifier", xaxis="x2", yaxis="y2")]
    elif k == 3:
        right = [
            {
                "type": "heatmap",
                "z": st["mask"],
                "y": names,
                "colorscale": [[0, "#eeeeee"], [1, "#1f77b4"]],
                "zmin": 0,
                "zmax": 1,
                "showscale": False,
                "xaxis": "x2",
                "yaxis": "y2",
                "name": "loss_mask",
                "xgap": 1,
                "ygap": 1,
            },
            line(
                [None],
                [None],
                "loss_mask 1: in the loss",
                mode="markers",
                xaxis="x2",
                yaxis="y2",
                marker={"size": 12, "symbol": "square", "color": "#1f77b4"},
            ),
            line(
                [None],
                [None],
                "loss_mask 0: prompt or padding",
                mode="markers",
                xaxis="x2",
                yaxis="y2",
                marker={"size": 12, "symbol": "square", "color": "#eeeeee"},
            ),
        ]
    elif k == 4:
        right = [
            bar(names, st["old"], "behaviour log π(y)", xaxis="x2", yaxis="y2"),
            bar(names, st["ref"], "reference log π_ref(y)", xaxis="x2", yaxis="y2"),
        ]
    elif k == 5:
        right = [bar(names, st["adv"], "advantage A", xaxis="x2", yaxis="y2")]
    elif k == 6:
        right = [
            bar(
                names,
                [n - o for n, o in zip(st["new"], st["old"])],
                "Δ log π(y) after the step (trainer)",
                xaxis="x2",
                yaxis="y2",
            )
        ]
    elif k >= 7:
        right = [
            bar(
                names,
                [n - o for n, o in zip(st["stale"], st["old"])],
                "sampler before sync: Δ log π",
                xaxis="x2",
                yaxis="y2",
            ),
            bar(
                names,
                [n - o for n, o in zip(st["synced"], st["old"])],
                "sampler after sync: Δ log π",
                xaxis="x2",
                yaxis="y2",
            ),
        ]
    ytitle = {
        1: "log-probability",
        2: "reward",
        3: "response",
        4: "log-probability",
        5: "advantage",
        6: "Δ log-probability",
        7: "Δ log-probability",
        8: "Δ log-probability",
    }.get(k, "")
    xs = list(range(len(_NODES)))
    m = st["metrics"]
    kpis = [["phase", PHASES[k]], ["responses", ", ".join(st["texts"])]]
    reveal = [
        (1, "behaviour log π(y)", ", ".join(f"{x:.2f}" for x in st["old"])),
        (2, "rewards", ", ".join(f"{x:g}" for x in st["rewards"])),
        (3, "batch input_ids shape", str(st["shape"])),
        (3, "loss tokens", st["loss_tokens"]),
        (
            4,
            "KL to the reference (k3, token mean)",
            r(core.masked_mean(core.kl(st["old_tok"], st["ref_tok"]), st["mask_t"]), 4),
        ),
        (5, "advantages (population std)", ", ".join(f"{a:+.2f}" for a in st["adv"])),
        (5, DEGENERATE, "yes" if max(abs(a) for a in st["adv"]) == 0 else "no"),
        (6, "loss", r(m["loss"], 4)),
        (6, "grad norm", r(m["grad/norm"], 4)),
        (6, "Δ log π(y) of the trainer", ", ".join(f"{n - o:+.3f}" for n, o in zip(st["new"], st["old"]))),
        (7, "policy_version", f"{st['versions'][0]} → {st['versions'][1]}"),
        (8, "metrics logged", len(m)),
    ]
    kpis += [[label, v] for ph, label, v in reveal if ph <= k]
    moved = [n - o for n, o in zip(st["new"], st["old"])]
    note = {
        0: "Nothing has run yet: the controller is about to call the roles in order.",
        1: "The sampler wrote three responses and recorded each token's log-probability as it sampled.",
        2: f"The verifier read each response's last integer against 12: rewards {', '.join(f'{x:g}' for x in st['rewards'])}.",
        3: f"collate_samples padded the three rows into one batch of shape {st['shape']}; only response tokens are in the loss.",
        4: "The frozen reference scored the same tokens; at the first step it equals the policy, so the KL term is 0.",
        5: (
            "Every reward is equal: every advantage is 0 and this group teaches nothing."
            if max(abs(a) for a in st["adv"]) == 0
            else "The group's mean and std turned rewards into advantages: right answers positive, wrong negative."
        ),
        6: (
            "One optimizer step moved the trainer's log-probabilities: "
            + ", ".join(f"{t[:-1]} {d:+.3f}" for t, d in zip(st["texts"], moved))
            + (" (nothing moved: every advantage and the KL term are 0)" if max(abs(a) for a in st["adv"]) == 0 else "")
            + "."
        ),
        7: f"WeightSync copied the weights to the sampler and bumped policy_version {st['versions'][0]} → {st['versions'][1]}.",
        8: f"The step logged {len(m)} metrics; the next step samples from the synced weights.",
    }[k]
    return {
        "figure": figure(
            [
                line(
                    [0] * len(xs),
                    [-i for i in xs],
                    "roles",
                    mode="markers+text",
                    text=_NODES,
                    textposition="middle right",
                    marker={"size": 18, "color": colors},
                )
            ]
            + right,
            PHASES[k],
            "",
            "",
            grid={"rows": 1, "columns": 2, "pattern": "independent"},
            yaxis={"visible": False, "range": [-len(xs) + 0.4, 0.6]},
            xaxis={"visible": False, "range": [-0.3, 2.2], "domain": [0, 0.3]},
            xaxis2={"domain": [0.42, 1], "title": {"text": "token position in the batch" if k == 3 else ""}},
            yaxis2={"title": {"text": ytitle}},
            showlegend=bool(right),
        ),
        "kpis": kpis,
        "note": note,
    }


register(
    Widget(
        "controller",
        "One controller iteration, role by role",
        controller,
        [
            Knob("phase", "phase", list(range(len(PHASES))), 1),
            Knob("answers", "the three responses to <3+4+5>", ANSWER_SETS, ANSWER_SETS[0], kind="select"),
        ],
        {
            "knobs": {"answers": "12, 12, 12", "phase": 5},
            "what": "All three responses right: every advantage is 0; training on this group spends a forward "
            "and backward on nothing. Under degenerate=skip (or resample) the controller drops it; the default, "
            "keep, trains on it.",
        },
        "Left: the roles, the active one red. Right: what the active role produced, computed by calling the "
        "step's roles in order on a tiny gpt_mini with three fixed responses (a learning rate far above the "
        "recipe's, so that one step shows).",
        [
            "posttrain.framework.rollout:token_logprobs",
            "posttrain.tasks.base:safe_reward",
            "posttrain.framework.batch:collate_samples",
            "posttrain.framework.reference:Reference.score",
            "posttrain.algorithms.grpo:advantages",
            "posttrain.framework.trainer:Trainer.step",
            "posttrain.framework.trainer:policy_loss_fn",
            "posttrain.framework.weight_sync:WeightSync.sync",
        ],
    )
)


# ---- 08 · agent episodes: the tool mask ---------------------------------------------------------

TURNS = [  # posttrain's tool markup (models/tokenizer.py, tasks/tools.py): the call ⟦…⟧, the result ⟨…⟩
    ("prompt", "<123+456+789>"),
    ("assistant", f"{CALL_OPEN}123+456+789{CALL_CLOSE}"),
    ("tool", CharTokenizer().decode(observation_ids(CharTokenizer(), "1368"))),  # as the episode runner inserts it
    ("assistant", "1368#"),
]


def tool_mask(mask_tools: bool) -> dict:
    tok = CharTokenizer()
    prompt = tok.encode(TURNS[0][1])
    response, rmask, roles = [], [], []
    for role, text in TURNS[1:]:
        ids = tok.encode(text)
        response += ids
        rmask += [0 if (role == "tool" and mask_tools) else 1] * len(ids)
        roles += [role] * len(ids)
    batch = collate([prompt], [response], tok.pad_id, response_masks=[rmask])
    lm = batch["loss_mask"][0, len(prompt) :]
    colors = {"assistant": "#1f77b4", "tool": "#ff7f0e"}
    return {
        "figure": figure(
            [
                bar(
                    list(range(len(response))),
                    lm.tolist(),
                    "trained on (loss_mask)",
                    marker={"color": [colors[x] for x in roles]},
                    text=[tok.decode([i]) for i in response],
                )
            ],
            "response tokens: blue = assistant, orange = tool output",
            "response position",
            "loss_mask",
            yaxis={"range": [0, 1.1]},
        ),
        "kpis": [
            ["tokens scored", int(lm.sum())],
            ["assistant tokens", roles.count("assistant")],
            ["tool tokens", roles.count("tool")],
            ["tool tokens in the loss", int(lm[[x == "tool" for x in roles]].sum())],
        ],
        "note": "Only the policy's own tokens carry a gradient; tool output is data the policy read.",
    }


register(
    Widget(
        "tool_mask",
        "Multi-turn episode: which tokens are trained",
        tool_mask,
        [Knob("mask_tools", "mask tool output", [False, True], True, kind="check")],
        {
            "knobs": {"mask_tools": False},
            "what": f"Without the mask the loss also trains the policy to produce '{TURNS[2][1]}' itself: it "
            "learns to imitate the tool's output instead of when to call the tool.",
        },
        "One bar per response token; height 1 = in the loss.",
        ["posttrain.framework.batch:collate"],
    )
)
