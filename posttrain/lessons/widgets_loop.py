"""Widgets of part I, lessons 05–08: the trainer's loss, weight sync, the controller, agent masks."""

from __future__ import annotations

import dataclasses
import functools

import torch

from posttrain.algorithms import core, grpo
from posttrain.config import OptimConfig
from posttrain.framework.batch import RolloutBatch, collate, collate_samples
from posttrain.framework.reference import Reference, score_logprobs
from posttrain.framework.rollout import Engine, Sample, token_logprobs
from posttrain.framework.trainer import Trainer, policy_loss_fn
from posttrain.framework.weight_sync import WeightSync
from posttrain.lessons.registry import Knob, Widget, bar, figure, line, r, register
from posttrain.models.gpt_mini import GPTMini, ModelConfig
from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask, Problem
from posttrain.tasks.base import safe_reward

# The first optimizer a process builds imports torch's compiler stack (about a second of CPU); build
# one here, when the widgets are loaded, so the first controller or sync setting does not pay it.
torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)

# ---- 05 · the trainer: one loss, assembled -----------------------------------------------------

_OLD = torch.tensor([[-0.40, -0.10, -1.20, 0.0], [-0.50, -0.90, -0.20, 0.0]], dtype=torch.float64)
_REF = torch.tensor([[-0.30, -0.20, -1.10, 0.0], [-0.30, -0.80, -0.30, 0.0]], dtype=torch.float64)
_MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.float64)
_ADV = torch.tensor([0.71, -0.71], dtype=torch.float64)


def loss_assembly(eps: float, beta: float, drift: float, seed: int) -> dict:
    """grpo.loss (token-mean, k3) on 2 rollouts × 4 tokens; new logprobs = old + U(−drift, drift)."""
    gen = torch.Generator().manual_seed(seed)
    new = (_OLD + (torch.rand(_OLD.shape, generator=gen, dtype=torch.float64) * 2 - 1) * drift) * _MASK
    new.requires_grad_(True)
    batch = RolloutBatch(loss_mask=_MASK, old_logprobs=_OLD, ref_logprobs=_REF, advantages=_ADV)
    norm = core.batch_norm(_MASK)
    cfg = grpo.Config(eps_low=eps, eps_high=eps, kl_coef=beta, aggregation="token-mean")
    total, m = grpo.loss(new, batch, cfg, norm)
    pg, _ = core.ppo_clip_loss(new.detach(), _OLD, core.broadcast(_ADV, _MASK), eps, eps)
    kl_tok = core.kl(new.detach(), _REF, "k3")
    ratio = core.importance_ratio(new.detach(), _OLD)
    band = ((ratio < 1 - eps) | (ratio > 1 + eps)).double()
    labels = [f"traj {i} · tok {t}" for i in range(2) for t in range(3)]
    sel = _MASK.bool()
    return {
        "figure": figure(
            [
                bar(labels, (pg * _MASK)[sel].tolist(), "pg_tok = −min(ρA, clip(ρ)A)"),
                bar(labels, (beta * kl_tok)[sel].tolist(), "β·k3_tok"),
                line(labels, ratio[sel].tolist(), "ρ = π_new/π_old", mode="markers", yaxis="y2", marker={"size": 10}),
                line(
                    [labels[0], labels[-1], None, labels[0], labels[-1]],
                    [1 - eps, 1 - eps, None, 1 + eps, 1 + eps],
                    "clip band 1 ± ε",
                    yaxis="y2",
                    line={"dash": "dot", "color": "grey"},
                ),
            ],
            f"ε = {eps}, β = {beta}, drift ±{drift}",
            "token",
            "per-token loss",
            barmode="group",
            yaxis2={"overlaying": "y", "side": "right", "title": {"text": "ρ"}},
        ),
        "kpis": [
            ["policy loss (token mean)", r(m["loss/policy"])],
            ["KL term β·mean(k3)", r(beta * float(m["kl/ref"]))],
            ["total loss", r(total)],
            ["clip/frac (gradient zeroed)", r(m["clip/frac"], 3)],
            ["ρ outside [1−ε, 1+ε]", r(core.masked_mean(band, _MASK), 3)],
        ],
        "note": "The last token of each row has mask 0: it never enters the loss or a metric.",
    }


register(
    Widget(
        "loss_assembly",
        "One loss, assembled token by token",
        loss_assembly,
        [
            Knob("eps", "clip ε", [0.05, 0.1, 0.2, 0.3, 0.4], 0.2),
            Knob("beta", "KL β", [0.0, 0.01, 0.05, 0.1, 0.5], 0.05),
            Knob("drift", "policy drift since sampling", [0.05, 0.1, 0.25, 0.5, 1.0], 0.1),
            Knob("seed", "draw", [0, 1, 2], 0),
        ],
        {
            "knobs": {"eps": 0.05, "drift": 1.0},
            "what": "A tight clip with a policy that drifted far from the sampler: every token sits outside the "
            "band and half of them (those the update would push further out) get no gradient at all.",
        },
        "Per-token policy loss and KL term; dots: the importance ratio of each token.",
        [
            "posttrain.algorithms.grpo:loss",
            "posttrain.algorithms.core:ppo_clip_loss",
            "posttrain.algorithms.core:finish_loss",
        ],
    )
)


# ---- 06 · weight sync: a stale sampler ---------------------------------------------------------

SYNC_STEPS, SYNC_LR = 100, 2.0
_GOOD = (torch.arange(16) >= 12).double()  # the four rewarded answers of 16


class _Policy(torch.nn.Module):
    """A policy over 16 answers: one logit each, the rewarded four least likely at the start."""

    def __init__(self):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.linspace(1.5, -1.5, 16, dtype=torch.float64))


class _Sampler:
    """The sampler side as WeightSync sees an engine: a model and the policy_version it stamps."""

    def __init__(self, model):
        self.model, self.policy_version = model, 0


@functools.lru_cache(maxsize=32)
def _sync_run(sync_every: int, correction: str = "none") -> list[tuple[float, float, float, int]]:
    """GRPO (grpo.advantages, grpo.loss) on the 16-answer policy, 64 prompts × 4 samples a step
    drawn from the SAMPLER's copy; WeightSync(mode="separate") copies the trainer's weights into it
    every `sync_every` steps. correction 'none': the PPO ratio is taken against the sampler's
    logprobs; 'tis': as framework/off_policy.correct_off_policy, against the trainer's own logprobs with the
    advantages reweighted by core.off_policy_weights (cap 2). Per step: (clip/frac, largest
    |log ρ|, expected reward of the trainer's policy, versions the sampler is behind)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    policy = _Policy()
    sampler = _Sampler(policy)
    sync = WeightSync(policy, sampler, mode="separate")  # the sampler gets its own copy
    opt = torch.optim.SGD(policy.parameters(), lr=SYNC_LR)
    cfg = grpo.Config(std="population", kl_coef=0.0)
    groups = torch.arange(64).repeat_interleave(4)
    mask = torch.ones(256, 1, dtype=torch.float64)
    out, synced_at = [], 0
    for step in range(1, SYNC_STEPS + 1):
        with torch.no_grad():
            mu = torch.log_softmax(sampler.model.logits, -1)  # behaviour logprobs (stale weights)
            y = torch.multinomial(mu.exp(), 256, replacement=True, generator=gen)
        adv = grpo.advantages(_GOOD[y], groups, cfg)
        lp = torch.log_softmax(policy.logits, -1)[y].unsqueeze(1)  # [256, 1] the trainer's
        batch = RolloutBatch(loss_mask=mask, advantages=adv, old_logprobs=mu[y].unsqueeze(1))
        if correction != "none":  # framework/off_policy.correct_off_policy
            w, _ = core.off_policy_weights(lp.detach(), mu[y].unsqueeze(1), mask, correction, 2.0)
            batch = dataclasses.replace(batch, old_logprobs=lp.detach(), advantages=core.broadcast(adv, mask) * w)
        loss, m = grpo.loss(lp, batch, cfg, core.batch_norm(mask))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % sync_every == 0:
            sync.sync()  # copy + policy_version += 1
            synced_at = step
        with torch.no_grad():
            reward = float(torch.softmax(policy.logits, -1) @ _GOOD)
            rho = float(
                (torch.log_softmax(policy.logits, -1) - torch.log_softmax(sampler.model.logits, -1)).abs().max()
            )
        out.append((float(m["clip/frac"]), rho, reward, step - synced_at))
    return out


def stale_sync(sync_every: int, correction: str) -> dict:
    run = _sync_run(sync_every, correction)
    steps = list(range(1, SYNC_STEPS + 1))
    clip = sum(c for c, *_ in run) / len(run)
    half = run[SYNC_STEPS // 2 - 1][2]
    return {
        "figure": figure(
            [
                line(steps, [c for c, *_ in run], "clip/frac: tokens whose gradient the clip zeroed"),
                line(steps, [x[2] for x in run], f"expected reward of the trainer's policy (correction {correction})"),
                line(
                    steps, [x[1] for x in run], "largest |log ρ| (trainer vs sampler)", yaxis="y2", line={"dash": "dot"}
                ),
            ],
            f"sync every {sync_every} step(s), correction {correction}",
            "step",
            "share / reward",
            yaxis={"range": [0, 1.02]},
            yaxis2={"overlaying": "y", "side": "right", "rangemode": "tozero", "title": {"text": "|log ρ|"}},
        ),
        "kpis": [
            ["clip/frac (mean over the run)", r(clip, 3)],
            ["expected reward at step 50", r(half, 3)],
            ["expected reward at step 100", r(run[-1][2], 3)],
            ["sampler versions behind at most", max(x[3] for x in run)],
        ],
        "note": (
            f"Syncing every {sync_every} step(s), the sampler's weights were up to {max(x[3] for x in run)} versions "
            f"old; {100 * clip:.0f}% of the tokens had their gradient clipped away on average, and the trainer's "
            f"expected reward is {half:.2f} at step 50."
            + (
                " With truncated importance weights the ratio is taken against the trainer's own weights and the "
                "stale samples are reweighted instead of clipped."
                if correction != "none"
                else ""
            )
        ),
    }


register(
    Widget(
        "sync",
        "A stale sampler and the clip",
        stale_sync,
        [
            Knob("sync_every", "sync every N steps", [1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 40], 1),
            Knob("correction", "off-policy correction", ["none", "tis"], "none", "select"),
        ],
        {
            "knobs": {"sync_every": 20},
            "what": "Syncing every 20 steps: the sampler keeps drawing the same unrewarded answers from weights up "
            "to 19 versions old, the clip zeroes the gradient of the rewarded ones once their ratio leaves "
            "the band (a fifth of all tokens), and at step 50 the reward is 0.14 where syncing every step "
            "reaches 0.99. The loss curve looks normal all along.",
        },
        "A 16-answer policy trained by grpo.loss on samples from its own stale copy, which "
        "framework/weight_sync.WeightSync refreshes every N steps (a deliberate toy policy; the sync and "
        "the loss are posttrain's).",
        [
            "posttrain.framework.weight_sync:WeightSync.sync",
            "posttrain.algorithms.grpo:advantages",
            "posttrain.algorithms.grpo:loss",
            "posttrain.algorithms.core:off_policy_weights",
        ],
    )
)


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
ANSWER_SETS = ["12, 11, 14", "12, 12, 11", "11, 13, 14", "12, 12, 12"]


@functools.lru_cache(maxsize=8)
def _controller_step(answers: str) -> dict:
    """One real step of the loop on a tiny gpt_mini (1 layer, 32 wide, seeded) for the prompt
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
    trainer = Trainer(model, OptimConfig(lr=1e-2, weight_decay=0.0, schedule="constant"), 1)
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
        (5, "skip the step (degenerate)?", "yes" if max(abs(a) for a in st["adv"]) == 0 else "no"),
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
            "what": "All three responses right: every advantage is 0; training on this group would spend a "
            "forward and backward on nothing, so the controller skips (or resamples) it.",
        },
        "Left: the roles, the active one red. Right: what the active role produced, computed by running "
        "one real step of posttrain's loop on a tiny gpt_mini with three fixed responses.",
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

TURNS = [
    ("prompt", "<123+456+789>"),
    ("assistant", "let me compute c(123+456+789)#"),
    ("tool", "=1368#"),
    ("assistant", "the answer is 1368#"),
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
            "what": "Without the mask the loss also trains the policy to produce '=1368#' itself: it learns "
            "to imitate the tool's output instead of when to call the tool.",
        },
        "One bar per response token; height 1 = in the loss.",
        ["posttrain.framework.batch:collate"],
    )
)
