"""Widgets of part I, lessons 05–06: the trainer's loss, assembled term by term, and weight sync
(a stale sampler). The whole step (07, the controller) and the agent episode (08) are widgets_step.py."""

from __future__ import annotations

import copy
import dataclasses
import functools

import torch

from posttrain.algorithms import core, grpo
from posttrain.framework.batch import RolloutBatch
from posttrain.framework.weight_sync import WeightSync
from posttrain.lessons.registry import Knob, Widget, bar, figure, line, r, register

# The first optimizer a process builds imports torch's compiler stack (about a second of CPU); build
# one here, when the widgets are loaded (this module before widgets_step, in WIDGET_MODULES' order),
# so the first controller or sync setting does not pay it.
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
    """The sampler side as WeightSync sees an engine: the policy_version it stamps, a copy of its
    own (`own_copy`, asked by a separate sync) and `update_weights`, which copies the trainer's in."""

    def __init__(self, model):
        self.model, self.policy_version = model, 0

    def own_copy(self) -> None:
        self.model = copy.deepcopy(self.model).requires_grad_(False)

    @torch.no_grad()
    def update_weights(self, weights, version=None) -> int:
        own = dict(self.model.named_parameters())
        for name, t in weights:
            own[name].copy_(t)
        self.policy_version = self.policy_version if version is None else version
        return sum(p.numel() * p.element_size() for p in own.values())


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
