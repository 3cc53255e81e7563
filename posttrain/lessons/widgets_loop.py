"""Widgets of part I, lessons 05–08: the trainer's loss, weight sync, the controller, agent masks."""

from __future__ import annotations

import math

import torch

from posttrain.algorithms import core, grpo
from posttrain.framework.batch import collate, collate_samples
from posttrain.framework.rollout import Sample
from posttrain.lessons.registry import Knob, Widget, bar, figure, line, r, register
from posttrain.models.tokenizer import CharTokenizer

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
    batch = {"loss_mask": _MASK, "old_logprobs": _OLD, "ref_logprobs": _REF, "advantages": _ADV}
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
        "figure": figure([bar(labels, (pg * _MASK)[sel].tolist(), "pg_tok = −min(ρA, clip(ρ)A)"),
                          bar(labels, (beta * kl_tok)[sel].tolist(), "β·k3_tok"),
                          line(labels, ratio[sel].tolist(), "ρ = π_new/π_old", mode="markers", yaxis="y2",
                               marker={"size": 10}),
                          line([labels[0], labels[-1], None, labels[0], labels[-1]],
                               [1 - eps, 1 - eps, None, 1 + eps, 1 + eps], "clip band 1 ± ε", yaxis="y2",
                               line={"dash": "dot", "color": "grey"})],
                         f"ε = {eps}, β = {beta}, drift ±{drift}", "", "per-token loss", barmode="group",
                         yaxis2={"overlaying": "y", "side": "right", "title": {"text": "ρ"}}),
        "kpis": [["policy loss (token mean)", r(m["loss/policy"])], ["KL term β·mean(k3)", r(beta * float(m["kl/ref"]))],
                 ["total loss", r(total)], ["clip/frac (gradient zeroed)", r(m["clip/frac"], 3)],
                 ["ρ outside [1−ε, 1+ε]", r(core.masked_mean(band, _MASK), 3)]],
        "note": "The last token of each row has mask 0: it never enters the loss or a metric.",
    }


register(Widget(
    "loss_assembly", "One loss, assembled token by token", loss_assembly,
    [Knob("eps", "clip ε", [0.05, 0.1, 0.2, 0.3, 0.4], 0.2), Knob("beta", "KL β", [0.0, 0.01, 0.05, 0.1, 0.5], 0.05),
     Knob("drift", "policy drift since sampling", [0.05, 0.1, 0.25, 0.5, 1.0], 0.1),
     Knob("seed", "draw", [0, 1, 2], 0)],
    {"knobs": {"eps": 0.05, "drift": 1.0},
     "what": "A tight clip with a policy that drifted far from the sampler: every token sits outside the "
             "band and half of them (those the update would push further out) get no gradient at all."},
    "Per-token policy loss and KL term; dots: the importance ratio of each token.",
    ["posttrain.algorithms.grpo:loss", "posttrain.algorithms.core:ppo_clip_loss",
     "posttrain.algorithms.core:finish_loss"]))


# ---- 06 · weight sync: a stale sampler ---------------------------------------------------------

def stale_sync(sync_every: int) -> dict:
    """The course's 1-D toy: the trainer's θ_T chases 4; the sampler's θ_R is synced every
    `sync_every` steps; a step only updates when ρ = e^(θ_T − θ_R) is inside the clip band."""
    theta_t = theta_r = 0.0
    ema, out, logrho, rewards = 0.0, 0, [], []
    for s in range(200):
        rho = float(core.importance_ratio(torch.tensor(theta_t), torch.tensor(theta_r)))
        if 0.8 <= rho <= 1.2:
            theta_t += (4 - theta_t) * 0.04
        else:
            out += 1
        reward = 1 / (1 + math.exp(-(theta_t - 2)))
        ema = 0.95 * ema + 0.05 * reward
        if (s + 1) % sync_every == 0:
            theta_r = theta_t
        logrho.append(abs(theta_t - theta_r))
        rewards.append(ema)
    steps = list(range(1, 201))
    return {
        "figure": figure([line(steps, logrho, "|log ρ| after the step"), line(steps, rewards, "reward EMA", yaxis="y2")],
                         f"sync every {sync_every} step(s)", "step", "|log ρ|", yaxis={"range": [0, 2]},
                         yaxis2={"overlaying": "y", "side": "right", "range": [0, 1], "title": {"text": "reward EMA"}}),
        "kpis": [["steps outside the clip band", f"{100 * out / 200:.0f}%"], ["final reward EMA", r(ema, 2)],
                 ["final |log ρ|", r(logrho[-1], 2)]],
        "note": "Between syncs the trainer moves away from the weights that sampled; once ρ leaves the "
                "band the clip blocks every update until the next sync.",
    }


register(Widget(
    "sync", "A stale sampler and the clip", stale_sync,
    [Knob("sync_every", "sync every N steps", [1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 40], 1)],
    {"knobs": {"sync_every": 20},
     "what": "Syncing every 20 steps: 88% of steps fall outside the clip band and do nothing, and the "
             "reward stalls while the loss curve still looks normal."},
    "|log ρ| between trainer and sampler, and the reward EMA, over 200 steps.",
    ["posttrain.algorithms.core:importance_ratio"]))


# ---- 07 · the controller, phase by phase --------------------------------------------------------

PHASES = ["idle", "1 rollout", "2 reference", "3 advantages", "4 collate", "5 train step", "6 weight sync", "7 log"]
_NODES = ["rollout", "reference", "algorithm", "collate", "trainer", "weight sync", "log"]


def controller(phase: int, rewards: str) -> dict:
    tok = CharTokenizer()
    prompt = tok.encode("<3+4+5>")
    texts = ["12#", "11#", "14#"]
    rw = [float(x) for x in rewards.split(",")]
    samples = [Sample(prompt, tok.encode(t), [-2.3 + 0.2 * i] * 3, [1, 1, 1], "stop", 0, 0, i, reward=rw[i])
               for i, t in enumerate(texts)]
    batch = collate_samples(samples, tok.pad_id)
    adv = grpo.advantages(batch["rewards"].double(), batch["group_index"], grpo.Config(std="population"))
    colors = ["#d62728" if i + 1 == phase else "#9ecae1" for i in range(len(_NODES))]
    xs = list(range(len(_NODES)))
    show_adv = phase >= 3
    return {
        "figure": figure([line(xs, [1] * len(xs), "roles", mode="markers+text", text=_NODES,
                               textposition="top center", marker={"size": 28, "color": colors}),
                          bar([f"y{i}: {t}" for i, t in enumerate(texts)], rw, "reward", xaxis="x2", yaxis="y2"),
                          bar([f"y{i}: {t}" for i, t in enumerate(texts)], adv.tolist() if show_adv else [0, 0, 0],
                              "advantage (after phase 3)", xaxis="x2", yaxis="y2")],
                         f"phase: {PHASES[phase]}", "", "", grid={"rows": 1, "columns": 2, "pattern": "independent"},
                         yaxis={"visible": False, "range": [0.5, 1.6]}, xaxis={"visible": False},
                         yaxis2={"range": [-1.6, 1.6], "title": {"text": "advantage"}}),
        "kpis": [["rewards", rewards], ["advantages (population std)", ", ".join(f"{float(a):+.2f}" for a in adv)],
                 ["batch input_ids shape", str(tuple(batch["input_ids"].shape))],
                 ["loss tokens", int(batch["loss_mask"].sum())],
                 ["skip the step (degenerate)?", "yes" if float(adv.abs().sum()) == 0 else "no"]],
        "note": "The controller only calls the roles in order; it never touches a parameter or a logit.",
    }


register(Widget(
    "controller", "One controller iteration", controller,
    [Knob("phase", "phase", list(range(8)), 0), Knob("rewards", "rewards of the 3 rollouts",
                                                     ["1,0,0", "1,1,0", "0,0,0", "1,1,1"], "1,0,0", kind="select")],
    {"knobs": {"rewards": "1,1,1", "phase": 3},
     "what": "All three rollouts right: every advantage is 0; training on this group would spend a "
             "forward and backward on nothing, so the controller skips (or resamples) it."},
    "Left: the role active in this phase. Right: rewards, and the advantages once phase 3 has run.",
    ["posttrain.framework.batch:collate_samples", "posttrain.algorithms.grpo:advantages"]))


# ---- 08 · agent episodes: the tool mask ---------------------------------------------------------

TURNS = [("prompt", "<123+456+789>"), ("assistant", "let me compute c(123+456+789)#"), ("tool", "=1368#"),
         ("assistant", "the answer is 1368#")]


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
    lm = batch["loss_mask"][0, len(prompt):]
    colors = {"assistant": "#1f77b4", "tool": "#ff7f0e"}
    return {
        "figure": figure([bar(list(range(len(response))), lm.tolist(), "trained on (loss_mask)",
                              marker={"color": [colors[x] for x in roles]},
                              text=list(tok.decode([i]) for i in response))],
                         "response tokens: blue = assistant, orange = tool output", "response position",
                         "loss_mask", yaxis={"range": [0, 1.1]}),
        "kpis": [["tokens scored", int(lm.sum())], ["assistant tokens", roles.count("assistant")],
                 ["tool tokens", roles.count("tool")], ["tool tokens in the loss", int(lm[[x == "tool" for x in roles]].sum())]],
        "note": "Only the policy's own tokens carry a gradient; tool output is data the policy read.",
    }


register(Widget(
    "tool_mask", "Multi-turn episode: which tokens are trained", tool_mask,
    [Knob("mask_tools", "mask tool output", [False, True], True, kind="check")],
    {"knobs": {"mask_tools": False},
     "what": "Without the mask the loss also trains the policy to produce '=1368#' itself: it learns "
             "to imitate the tool's output instead of when to call the tool."},
    "One bar per response token; height 1 = in the loss.", ["posttrain.framework.batch:collate"]))
