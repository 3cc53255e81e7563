"""Facts of lessons 05–08 (the trainer, weight sync, the controller, agent episodes); see facts_a.py."""

from __future__ import annotations

import inspect

import torch

from posttrain.algorithms import core, grpo, reinforce
from posttrain.config import RLConfig
from posttrain.framework.agent import observation_ids
from posttrain.framework.batch import RolloutBatch, collate, collate_samples, split_micro_batches
from posttrain.framework.controller import Controller, group_metrics, group_rewards
from posttrain.framework.rollout import Engine
from posttrain.framework.sample import Sample
from posttrain.framework.weight_sync import WeightSync
from posttrain.lessons.facts_a_tools import (
    at,
    kpi,
    load_json,
    table,
    tiny_model,
    toy_batch,
)
from posttrain.lessons.widgets_step import CONTROLLER_LR, TURNS
from posttrain.models.tokenizer import CharTokenizer
from posttrain.tasks.arithmetic import verify

# ---- 05 · the trainer --------------------------------------------------------------------------


def rl05_microbatch_table() -> dict:
    """The loss of one batch vs the sum over its micro-batches (trainer.split_micro_batches, 16
    padded tokens each) with the batch's normaliser, vs the mean of micro-batches each normalised
    by its own tokens/sequences."""

    b, lp = toy_batch(drift=0.3)
    T = b.loss_mask.shape[1]
    rows = []
    for mode in core.AGGREGATIONS:
        cfg = grpo.Config(kl_coef=0.0, aggregation=mode)
        whole, _ = grpo.loss(lp, b, cfg, core.batch_norm(b.loss_mask))
        micro = [(m, lp[m.row_index, : m.loss_mask.shape[1]]) for m in split_micro_batches(b, 16)]
        shared = sum(float(grpo.loss(x, m, cfg, core.batch_norm(b.loss_mask, T))[0]) for m, x in micro)
        alone = sum(float(grpo.loss(x, m, cfg, core.batch_norm(m.loss_mask, T))[0]) for m, x in micro) / len(micro)
        rows.append([mode, f"{float(whole):+.4f}", f"{shared:+.4f}", f"{alone:+.4f}"])
    return table(
        ["aggregation", "whole batch", "Σ micro-batches, batch normaliser", "mean of micro-batches, own normaliser"],
        rows,
    )


def rl05_micro_rows() -> str:

    return "+".join(str(len(m.loss_mask)) for m in split_micro_batches(toy_batch()[0], 16))


def rl05_clip_equals_reinforce() -> float:
    """max |∇ GRPO clipped loss − ∇ REINFORCE loss| over the logprobs at ratio 1 (same aggregation)."""
    b, trainer_lp = toy_batch()
    norm = core.batch_norm(b.loss_mask)
    grads = []
    for mod, cfg in (
        (grpo, grpo.Config(kl_coef=0.0, aggregation="token-mean")),
        (reinforce, reinforce.Config(aggregation="token-mean")),
    ):
        lp = trainer_lp.clone().requires_grad_(True)
        loss, _ = mod.loss(lp, b, cfg, norm)
        grads.append(torch.autograd.grad(loss, lp)[0])
    return float((grads[0] - grads[1]).abs().max())


def rl05_sync_ratio_max() -> str:
    """async_vs_sync.json: the synchronous runs' step maximum of π_θ/π_old, averaged over the run and
    the seeds (fp32, built-in engine): 1 up to the sampler/trainer numerical difference."""
    runs = [r["mean ratio/max"] for r in load_json("async_vs_sync.json")["runs"] if r["run"] == "sync"]
    return f"{sum(runs) / len(runs):.5f}"


def rl05_optim_table() -> dict:

    o = RLConfig().optim
    return table(
        ["learning rate", "AdamW betas", "weight decay", "gradient-norm clip", "micro-batch (padded tokens)"],
        [
            [
                f"{o.lr:g}",
                f"{o.betas[0]:g}, {o.betas[1]:g}",
                f"{o.weight_decay:g}",
                f"{o.grad_clip:g}",
                o.micro_batch_tokens,
            ]
        ],
    )


# ---- 06 · weight sync --------------------------------------------------------------------------

SYNC_LABELS = (
    "clip/frac (mean over the run)",
    "expected reward at step 50",
    "expected reward at step 100",
    "sampler versions behind at most",
)


def rl06_sync_table() -> dict:
    """The sync widget (GRPO on a 16-answer policy sampled from a WeightSync copy) by sync interval."""
    rows = [[n] + [kpi("sync", lab, sync_every=n) for lab in SYNC_LABELS] for n in (1, 2, 3, 5, 8, 10, 20, 40)]
    return table(
        [
            "sync every N steps",
            "clip/frac, mean",
            "reward at step 50",
            "reward at step 100",
            "sampler behind by at most",
        ],
        rows,
    )


def rl06_separate_sync() -> dict:
    """WeightSync in `separate` mode on the tiny model: the sampler's copy before and after sync()."""

    model, tok = tiny_model()
    engine = Engine(model, tok)
    sync = WeightSync(model, engine, mode="separate")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)  # the trainer steps
    gap = lambda: max(
        float((a - b).detach().abs().max()) for a, b in zip(model.parameters(), engine.model.parameters())
    )
    before, v0 = gap(), engine.policy_version
    m = sync.sync()
    return table(
        [
            "sampler is a copy",
            "largest weight gap before sync",
            "after sync",
            "bytes copied",
            "policy_version before → after",
        ],
        [
            [
                "yes" if engine.model is not model else "no",
                f"{before:.3f}",
                f"{gap():.3f}",
                int(m["sync/bytes"]),
                f"{v0} → {engine.policy_version}",
            ]
        ],
    )


def rl06_stale_runs() -> dict:
    """async_vs_sync.json, seed 0: the same GRPO run on fresh samples and on samples up to 4
    versions old, with and without the importance correction."""
    names = {
        "sync": "synchronous (fresh)",
        "fixed4_none": "4 versions stale, no correction",
        "fixed4_tis": "4 versions stale, truncated IS",
    }
    rows = [
        [
            names[r["run"]],
            f"{r['pass@1_before']:.3f} → {r['pass@1_after']:.3f}",
            f"{r['mean ratio/max']:.2f}",
            f"{r['mean clip/frac']:.4f}",
        ]
        for r in load_json("async_vs_sync.json")["runs"]
        if r["seed"] == 0 and r["run"] in names
    ]
    return table(["run (60 steps)", "held-out pass@1", "mean of max ratio", "mean clip/frac"], rows)


def _stale_run(name: str) -> dict:
    return next(r for r in load_json("async_vs_sync.json")["runs"] if r["seed"] == 0 and r["run"] == name)


def rl06_fixed4_staleness() -> str:
    """Mean versions behind of the 'fixed4' runs: 4 at most, less over the first steps."""
    return f"{_stale_run('fixed4_none')['mean staleness/mean']:.2f}"


def rl06_fixed4_ratio_max() -> str:
    return f"{_stale_run('fixed4_none')['mean ratio/max']:.2f}"


def rl06_fixed4_clip() -> float:
    return _stale_run("fixed4_none")["mean clip/frac"]


def rl06_fixed4_tis_loss_pts() -> float:
    """Points of held-out pass@1 the 4-stale TIS run lost over its 60 steps (seed 0)."""
    r = _stale_run("fixed4_tis")
    return 100 * (r["pass@1_before"] - r["pass@1_after"])


def rl06_fixed4_tis_reward() -> str:
    return f"{_stale_run('fixed4_tis')['mean reward/mean']:.3f}"


def rl06_sync_reward() -> str:
    return f"{_stale_run('sync')['mean reward/mean']:.3f}"


# ---- 07 · the controller -----------------------------------------------------------------------


def rl07_group_metrics() -> dict:
    """controller.group_rewards / group_metrics on four groups of three rewards."""
    from types import SimpleNamespace

    groups = [[1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 1, 0]]
    samples = [SimpleNamespace(group=g, reward=float(r)) for g, rs in enumerate(groups) for r in rs]
    found = group_rewards(samples)
    m = group_metrics(found)
    rows = [[", ".join(str(r) for r in rs), "yes" if found[g][1] else "no"] for g, rs in enumerate(groups)]
    rows.append(["group/degenerate_frac", m["group/degenerate_frac"]])
    rows.append(["group/all_pass_frac, group/all_fail_frac", f"{m['group/all_pass_frac']}, {m['group/all_fail_frac']}"])
    return table(["rewards of the group", "degenerate?"], rows)


def rl07_keep_vs_skip() -> dict:
    """GRPO's gradient on the useful groups' tokens when two degenerate groups are kept in the batch
    (degenerate=keep) vs dropped (skip): kept, they add nothing but still count in the normaliser."""
    b, b_lp = toy_batch(
        lengths=(3, 5, 4, 2, 6, 3, 2, 4),
        rewards=(1, 0, 0, 1, 1, 1, 0, 0),  # groups 2, 3 degenerate
        groups=(0, 0, 1, 1, 2, 2, 3, 3),
    )
    useful = slice(0, 4)
    rows = []
    for mode in ("token-mean", "seq-mean-token-mean"):
        cfg = grpo.Config(kl_coef=0.0, aggregation=mode)
        norms = []
        for keep in (True, False):
            sub = b if keep else b.map(lambda v: v[useful])
            lp = (b_lp if keep else b_lp[useful]).clone().requires_grad_(True)
            loss, _ = grpo.loss(lp, sub, cfg, core.batch_norm(sub.loss_mask))
            (grad,) = torch.autograd.grad(loss, lp)
            norms.append(float(grad[useful].norm()))
        rows.append([mode, f"{norms[0]:.4f}", f"{norms[1]:.4f}", f"{norms[0] / norms[1]:.3f}"])
    return table(["aggregation", "gradient norm, degenerate groups kept", "… skipped", "kept / skipped"], rows)


def rl07_step_example() -> dict:
    """Three answers to <3+4+5> through the verifier, grpo.advantages (population std) and
    collate_samples, as one controller step hands them on."""

    tok = CharTokenizer()
    prompt = tok.encode(tok.chat_prompt("3+4+5"))
    texts = ["12#", "11#", "14#"]
    samples = [
        Sample(prompt, tok.encode(t), [0.0] * len(t), [1] * len(t), "stop", 0, 0, i, reward=verify(t, 12))
        for i, t in enumerate(texts)
    ]
    b = collate_samples(samples, tok.pad_id)
    adv = grpo.advantages(b.rewards.double(), b.group_index, grpo.Config(std="population"))
    rows = [[t, s.reward, f"{float(a):+.2f}"] for t, s, a in zip(texts, samples, adv)]
    rows.append(["batch input_ids shape", str(tuple(b.input_ids.shape)), f"{int(b.loss_mask.sum())} loss tokens"])
    return table(["response", "reward", "advantage"], rows)


def rl07_widget_step() -> dict:
    """What the controller widget's real step reports once every phase has run, for the default
    answers and for a group of three right answers."""
    labels = ("rewards", "advantages (population std)", "grad norm", "Δ log π(y) of the trainer", "policy_version")
    rows = [
        [answers] + [kpi("controller", lab, phase=8, answers=answers) for lab in labels]
        for answers in ("12, 11, 14", "12, 12, 12")
    ]
    return table(["answers"] + list(labels), rows)


def rl07_step_lines() -> int:
    """The length of Controller.step in lines, read from the source."""
    return len(inspect.getsourcelines(Controller.step)[0])


def rl07_widget_lr() -> str:
    return f"{CONTROLLER_LR:g}"


def rl07_recipe_lr() -> str:
    return f"{RLConfig().optim.lr:g}"


def _grpo_length_run() -> dict:
    return next(r for r in load_json("claims.json")["length"] if r["algorithm"] == "grpo")


def rl07_degenerate_first() -> float:
    return _grpo_length_run()["group/degenerate_frac_first10"]


def rl07_degenerate_last() -> float:
    return _grpo_length_run()["group/degenerate_frac_last10"]


# ---- 08 · agent episodes -----------------------------------------------------------------------


def rl08_mask_table() -> dict:
    """REINFORCE's loss on the lesson's episode (tool output in the middle) when the tool tokens'
    logprobs are changed to garbage, with the tool mask and without it."""

    tok = CharTokenizer()
    prompt = tok.encode(TURNS[0][1])
    response, is_tool = [], []
    for role, text in TURNS[1:]:
        ids = tok.encode(text)
        response += ids
        is_tool += [role == "tool"] * len(ids)
    tool = torch.zeros(len(prompt) + len(response), dtype=torch.bool)
    tool[len(prompt) :] = torch.tensor(is_tool)
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(1, tool.numel(), generator=g, dtype=torch.float64)
    garbage = torch.where(tool, torch.full_like(lp, -50.0), lp)  # the tool tokens scored absurdly
    rows = []
    for masked in (True, False):
        rmask = [0 if (t and masked) else 1 for t in is_tool]
        b = collate([prompt], [response], tok.pad_id, response_masks=[rmask])
        mask = b["loss_mask"].double()
        rb = RolloutBatch(loss_mask=mask, advantages=torch.tensor([1.0], dtype=torch.float64), old_logprobs=lp)
        cfg, norm = reinforce.Config(), core.batch_norm(mask)
        losses = [float(reinforce.loss(x, rb, cfg, norm)[0]) for x in (lp, garbage)]
        x = lp.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(reinforce.loss(x, rb, cfg, norm)[0], x)
        rows.append(
            [
                "on" if masked else "off",
                int(mask.sum()),
                f"{losses[0]:.3f}",
                f"{losses[1]:.3f}",
                f"{float(grad[0, tool].abs().max()):.1f}",
            ]
        )
    return table(
        ["tool mask", "tokens in the loss", "loss", "loss, tool tokens rescored", "largest gradient on a tool token"],
        rows,
    )


def rl08_observation_text() -> str:

    tok = CharTokenizer()
    return tok.decode(observation_ids(tok, "1368"))


# ---- one KPI of a widget at another setting ------------------------------------------------------

AT = {
    "rl05_break_clipped": at("loss_assembly", "clip/frac (gradient zeroed)", eps=0.05, drift=1.0),
    "rl05_break_outside": at("loss_assembly", "ρ outside [1−ε, 1+ε]", eps=0.05, drift=1.0),
    "rl06_break_reward50": at("sync", "expected reward at step 50", sync_every=20),
    "rl06_break_behind": at("sync", "sampler versions behind at most", sync_every=20),
    "rl06_break_clip": at("sync", "clip/frac (mean over the run)", sync_every=20),
    "rl06_break_tis_reward50": at("sync", "expected reward at step 50", sync_every=20, correction="tis"),
}


FACTS = {
    name: fn for name, fn in sorted(globals().items()) if name.startswith("rl") and name[2:4].isdigit() and callable(fn)
} | AT
