"""Numbers quoted by the text of lessons 00–12 (posttrain/lessons/text/rl-00.md … rl-12.md).

Each fact is a function of no arguments that returns a number, a short string or a table
{"columns": [...], "rows": [[...], ...]}, computed by posttrain's own functions (the algorithms,
the sampler, the trainer's logprobs, the weight sync, the memory planner), by a lesson widget at a
setting other than its default (registry.compute: the page then quotes exactly what the widget
shows), or read from a committed benchmark JSON. None trains a model; each runs in well under a
second on one core. Names carry their lesson number (rl03_…) and are unique across facts_a/b/c.

The facts of lessons 05–08 live in facts_a_loop.py and those of 09–12 in facts_a_algos.py, a few added
by the blind reads of lessons 00–09 in facts_a_intro.py (shared helpers: facts_a_tools.py);
FACTS below gathers them all, which is what the loader reads.
"""

from __future__ import annotations

import dataclasses

import torch

from posttrain import algorithms
from posttrain.algorithms import core, dr_grpo, grpo, ppo, rloo
from posttrain.framework.logprobs import sequence_logprobs
from posttrain.framework.reference import Reference, score_logprobs
from posttrain.lessons import facts_a_algos, facts_a_intro, facts_a_loop
from posttrain.lessons.facts_a_tools import (
    ARMS,
    BANDIT,
    at,
    bandit_grad,
    kpi,
    load_json,
    rollout_batch,
    signed,
    table,
    tiny_model,
)
from posttrain.lessons.widgets_lineage import COSTS, ESTIMATORS, LINEAGE, SIGNALS, lineage_advantages
from posttrain.sizing import memory
from posttrain.tasks.arithmetic import last_integer, verify

# ---- 00 · orientation ---------------------------------------------------------------------------


def rl00_n_algorithms() -> int:
    return len(algorithms.ALGORITHMS)


def rl00_lineage_table() -> dict:
    """Advantages of one group (1, 0, 0, 0) under each algorithm's own defaults, and the extra
    models each one keeps in memory (memory.ROLES)."""

    adv = lineage_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64))
    rows = []
    for name in LINEAGE:
        roles = memory.ROLES[name]
        extra = [k for k in ("reference", "critic") if getattr(roles, k)]
        if name == "ppo" and ppo.Config().critic == "shared":  # the critic is a head, not a second model
            extra = [k if k != "critic" else "critic (a value head on the policy's trunk)" for k in extra]
        rows.append([name, signed(adv[name]), " + ".join(extra) or "none"])
    return table(["algorithm", "A for rewards (1, 0, 0, 0)", "models besides the policy"], rows)


def rl00_forces_table() -> dict:
    """The forces_map widget with one force at a time moved to its failing setting."""

    cases = [
        ("none (the defaults)", {}),
        ("signal: a leaky reward model", {"signal": SIGNALS[1]}),
        ("estimator: one sample, no baseline", {"estimator": ESTIMATORS[1]}),
        ("cost: PPO with a separate critic", {"cost": COSTS[1]}),
    ]
    return table(
        ["force moved", "SIGNAL", "ESTIMATOR", "COST"],
        [[name] + [kpi("forces_map", f, **knobs) for f in ("SIGNAL", "ESTIMATOR", "COST")] for name, knobs in cases],
    )


# ---- 01 · the policy gradient on a bandit -----------------------------------------------------------


def rl01_one_step() -> dict:
    """One update from the uniform policy after sampling C (reward 0.9), η = 0.4."""
    theta = torch.zeros(5, dtype=torch.float64)
    new = theta - 0.4 * bandit_grad(theta, 2, BANDIT[2])
    pi0, pi1 = torch.softmax(theta, -1), torch.softmax(new, -1)
    rows = [[ARMS[i], f"{float(new[i]):+.3f}", f"{float(pi0[i]):.3f}", f"{float(pi1[i]):.3f}"] for i in range(5)]
    return table(["arm", "θ after", "π before", "π after"], rows)


def rl01_expected_grad() -> dict:
    """E_a~π[r(a)·∇log π(a)] at the uniform policy, summed exactly over the five arms."""
    theta = torch.zeros(5, dtype=torch.float64)
    pi = torch.softmax(theta, -1)
    ascent = -sum(float(pi[a]) * bandit_grad(theta, a, BANDIT[a]) for a in range(5))  # −∇loss = ∇J
    return table(
        ["arm", "reward r", "expected gradient on θ"],
        [[ARMS[i], BANDIT[i], f"{float(ascent[i]):+.3f}"] for i in range(5)],
    )


def rl01_mean_reward_uniform() -> float:
    return round(sum(BANDIT) / len(BANDIT), 3)


# ---- 02 · rollout: behaviour logprobs -------------------------------------------------------------


def rl02_parity_max_abs() -> float:
    """max |behaviour logprob − trainer logprob| over the response tokens, same weights, same T."""

    model, b = rollout_batch()
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, b.input_ids, 0.7)
    return float(((lp - b.old_logprobs).abs() * b.loss_mask).max())


def rl02_wrong_temperature_gap() -> float:
    """mean |difference| when the trainer scores at T = 1 what was sampled at T = 0.7."""

    model, b = rollout_batch()
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, b.input_ids, 1.0)
    return round(float(core.masked_mean((lp - b.old_logprobs).abs(), b.loss_mask)), 3)


def rl02_response_tokens() -> int:
    return int(rollout_batch()[1].loss_mask.sum())


def rl02_stale_vs_recomputed() -> dict:
    """After one gradient step (plain SGD, lr 0.1) on a GRPO loss, the ratio against the
    recorded behaviour logprobs vs against logprobs recomputed with the new weights."""

    model, b = tiny_model()[0], rollout_batch()[1]
    rewards = torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 0])
    b = dataclasses.replace(
        b,
        rewards=rewards,
        advantages=core.broadcast(grpo.advantages(rewards, b.group_index, grpo.Config()), b.loss_mask),
    )
    cfg, norm = grpo.Config(kl_coef=0.0), core.batch_norm(b.loss_mask)
    lp, _ = sequence_logprobs(model, b.input_ids, 0.7)
    loss, _ = grpo.loss(lp, b, cfg, norm)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    with torch.no_grad():
        for p, g in zip(model.parameters(), grads):
            p -= 0.1 * g
        new, _ = sequence_logprobs(model, b.input_ids, 0.7)
    rows = []
    for name, old in (("recorded at sampling", b.old_logprobs), ("recomputed after the step", new * b.loss_mask)):
        _, m = grpo.loss(new, dataclasses.replace(b, old_logprobs=old), cfg, norm)
        rows.append(
            [name, f"{float(m['ratio/mean']):.3f}", f"{float(m['ratio/max']):.3f}", f"{float(m['clip/frac']):.3f}"]
        )
    return table(["old logprobs", "mean ratio", "max ratio", "clip/frac"], rows)


def rl02_degenerate_table() -> dict:
    """P(all K responses get the same reward) in the sampler widget, by temperature and K."""
    Ks = (2, 4, 8)
    rows = [
        [T, kpi("sampler", "P(response right) = p²", temperature=T)]
        + [kpi("sampler", "P(degenerate group), formula", temperature=T, K=k) for k in Ks]
        for T in (0.25, 0.5, 1.0, 1.5)
    ]
    return table(["temperature", "P(response right)"] + [f"P(degenerate), K = {k}" for k in Ks], rows)


def rl02_degenerate_observed() -> dict:
    """claims.json: the SFT(CoT) model on 300 train prompts; observed vs predicted degenerate share."""
    d = load_json("claims.json")["degenerate"]
    return table(
        ["K", "observed", "mean over prompts of p^K + (1−p)^K", "at the mean p"],
        [[r["K"], r["observed"], r["predicted_per_prompt"], r["predicted_mean_p"]] for r in d["rows"]],
    )


def rl02_mean_p() -> float:
    return load_json("claims.json")["degenerate"]["mean_p"]


# ---- 03 · reward and reference -------------------------------------------------------------------

PROBES = [
    "let me think 3+4=7, 7+5=12, so 12#",
    "12#",
    "let me think... 12#",
    "11#",
    "120#",
    "no digits here#",
    "12 is wrong, it is 13#",
]


def rl03_probes() -> dict:

    rows = []
    for p in PROBES:
        got = last_integer(p)
        rows.append([p, "none" if got is None else got, verify(p, 12)])
    return table(["response to <3+4+5>", "last integer", "reward (gold 12)"], rows)


def rl03_k_table() -> dict:
    """k1, k2, k3 of one token as functions of d = log π_ref − log π_θ (core.kl)."""
    ds = torch.tensor([-2.0, -0.5, 0.0, 0.5, 2.0], dtype=torch.float64)
    policy = torch.zeros_like(ds)
    est = {k: core.kl(policy, ds, k) for k in core.KL_ESTIMATORS}
    return table(
        ["d = log π_ref − log π_θ", "k1", "k2", "k3"],
        [[f"{float(d):+.1f}"] + [f"{float(est[k][i]):+.3f}" for k in core.KL_ESTIMATORS] for i, d in enumerate(ds)],
    )


SWAP = {"shift": 1.0, "samples": 4096}  # the swap table's setting of the kl widget


def rl03_swap_table() -> dict:
    """The kl widget at SWAP, with the arguments in order and swapped."""
    rows = []
    for order in ("policy, ref", "ref, policy"):
        k = {lab: kpi("kl", lab, order=order, **SWAP) for lab in ("exact KL", "k1 mean", "k3 mean")}
        rows.append([order, k["exact KL"], k["k1 mean"], k["k3 mean"]])
    head = f"arguments of kl() (shift {SWAP['shift']:g}, {SWAP['samples']} tokens)"
    return table([head, "exact KL(π_θ‖π_ref)", "k1 mean", "k3 mean"], rows)


BETAS = (0.0, 0.001, 0.002, 0.005, 0.05, 0.2, 1.0)
HACK_THETA = 5.0  # the beta widget's reward function rises through its flaw only past θ = 5


def rl03_beta_table() -> dict:
    rows = []
    for b in BETAS:
        theta = kpi("beta", "final θ", beta=b)
        rows.append(
            [
                b,
                theta,
                kpi("beta", "final reward", beta=b),
                kpi("beta", "final KL", beta=b),
                "yes" if theta > HACK_THETA else "no",
            ]
        )
    return table(["β", "final θ", "final reward", "final KL = θ²", f"past the flaw (θ > {HACK_THETA:g})?"], rows)


def rl03_reference_frozen() -> dict:
    """Reference(policy) of the tiny model, then the policy's weights move: the policy's own
    logprobs change, the reference's do not (it is a frozen deep copy)."""

    _, b = rollout_batch()
    policy = tiny_model()[0]  # same weights as the sampler's
    ref = Reference(policy, temperature=0.7)
    pol0, ref0 = score_logprobs(policy, b, 0.7), ref.score(b)
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(1.05)  # stands in for an optimizer step
    pol1, ref1 = score_logprobs(policy, b, 0.7), ref.score(b)
    n_train = sum(p.numel() for p in ref.model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in ref.model.parameters())
    return table(
        [
            "reference parameters",
            "of them trainable",
            "largest change of the policy's logprobs",
            "largest change of ref_logprobs",
        ],
        [[n_all, n_train, f"{float((pol1 - pol0).abs().max()):.3f}", f"{float((ref1 - ref0).abs().max()):.3f}"]],
    )


# ---- 04 · the algorithm plug-in -----------------------------------------------------------------


def rl04_std_table() -> dict:
    """GRPO advantages of rewards (0, 0, 1) under the two std conventions (grpo.advantages)."""
    rw, g = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64), torch.zeros(3, dtype=torch.long)
    rows = []
    for std in core.STD_MODES:
        _, sd, _ = core.group_stats(rw, g, std)
        rows.append([std, f"{float(sd[0]):.3f}", signed(grpo.advantages(rw, g, grpo.Config(std=std)))])
    return table(["group std", "σ", "GRPO advantages"], rows)


def rl04_scale_table() -> dict:
    """Advantages of the same group with its rewards scaled by ¼: GRPO divides the scale away,
    the estimators without /std keep it (posttrain.algorithms' own advantages(), population std)."""
    g = torch.zeros(3, dtype=torch.long)
    rows = []
    for rw in ((0.0, 0.0, 1.0), (0.0, 0.0, 0.25)):
        r = torch.tensor(rw, dtype=torch.float64)
        rows.append(
            [
                ", ".join(f"{x:g}" for x in rw),
                signed(grpo.advantages(r, g, grpo.Config(std="population"))),
                signed(rloo.advantages(r, g, rloo.Config())),
                signed(dr_grpo.advantages(r, g, dr_grpo.Config())),
            ]
        )
    return table(["rewards", "GRPO", "RLOO", "Dr. GRPO"], rows)


def rl04_defaults_table() -> dict:
    """Each registered algorithm's defaults as its Config() has them."""
    rows = []
    for name, mod in algorithms.ALGORITHMS.items():
        cfg = mod.Config()
        show = lambda x: "none" if x is None else f"{x:g}"
        clip = f"{show(cfg.eps_low)} / {show(cfg.eps_high)}" if hasattr(cfg, "eps_low") else "—"
        beta = getattr(cfg, "kl_coef", 0.0)
        in_reward = 0.0
        if getattr(cfg, "kl_in", "loss") == "reward":  # PPO's default: a k1 KL in the token rewards
            beta, in_reward = 0.0, cfg.kl_coef
        elif hasattr(mod, "reward_kl"):  # REINFORCE++: its own reward KL, besides the loss's
            in_reward = mod.reward_kl(cfg)
        rows.append(
            [
                name,
                getattr(cfg, "aggregation", "—"),
                f"{beta:g}",
                f"{in_reward:g}" if in_reward else "—",
                "yes" if mod.needs_reference(cfg) else "no",
                clip,
            ]
        )
    return table(
        [
            "algorithm",
            "loss aggregation",
            "KL in the loss β",
            "KL in the reward β",
            "reference loaded",
            "clip ε low / high",
        ],
        rows,
    )


# ---- one KPI of a widget at another setting ------------------------------------------------------

AT = {
    "rl01_break_wrong_share": at("bandit", "seeds ending on a wrong arm", lr=2.0),
    "rl01_slow_pi_c": at("bandit", "mean max π", lr=0.05),
    "rl01_slow_c_share": at("bandit", "seeds ending on C (best)", lr=0.05),
    "rl02_break_degenerate": at("sampler", "P(degenerate group), formula", temperature=0.25, K=2),
    "rl03_beta0_theta": at("beta", "final θ", beta=0.0),
    "rl03_beta1_theta": at("beta", "final θ", beta=1.0),
}


def _gather() -> dict:

    out = {
        name: fn
        for name, fn in sorted(globals().items())
        if name.startswith("rl") and name[2:4].isdigit() and callable(fn)
    }
    out.update(AT)
    for mod in (facts_a_loop, facts_a_algos, facts_a_intro):
        clash = set(out) & set(mod.FACTS)
        if clash:
            raise ValueError(f"facts defined twice in facts_a*: {sorted(clash)}")
        out.update(mod.FACTS)
    return out


FACTS = _gather()
