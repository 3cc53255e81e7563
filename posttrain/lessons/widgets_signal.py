"""Widgets of the 'signal' lessons (17, 18, 18a): process reward models and search, hacking, curation.
Lesson 15's Bradley–Terry reward model is widgets_reward_model.py (registered just before this
module, so the widget order is the lessons' order); lesson 26's three forces, which reuse the
hacking run of lesson 18, are widgets_forces.py."""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import torch

from posttrain.algorithms import core, dapo, reinforce
from posttrain.data.curate import curate
from posttrain.framework.batch import RolloutBatch
from posttrain.lessons import claims
from posttrain.lessons.registry import Knob, Widget, bar, figure, line, r, register
from posttrain.preference.search import sample_table
from posttrain.reward_models.prm import aggregate
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask

# ---- 17 · ORM and PRM reranking vs. PRM beam search ------------------------------------------------

PRM_TRIALS, PRM_STEPS = 600, 6
ORM_NOISE, PRM_NOISE = 2.2, 1.93  # Gaussian noise on a ±2 logit: 18% of outcome / 15% of step labels flip


def _steps(gen, shape, p_good):
    """Reasoning steps of the given shape: ok, and the amount (1…9) a bad step adds to the answer."""
    ok = torch.rand(shape, generator=gen) < p_good
    err = torch.randint(1, 10, shape, generator=gen)
    return ok, torch.where(ok, 0, err)


def _step_scores(gen, ok):
    """A PRM's score per step: σ(±2 + noise), high when the step is right."""
    return torch.sigmoid(torch.where(ok, 2.0, -2.0) + PRM_NOISE * torch.randn(ok.shape, generator=gen))


@functools.lru_cache(maxsize=1)
def _prm_problems():
    task = ArithmeticTask(ArithmeticConfig(min_terms=PRM_STEPS + 1, max_terms=PRM_STEPS + 1))
    return task, task.items(PRM_TRIALS, "test", 0)


def prm_search(p_good: float, N: int, B: int, budget: str) -> dict:
    """PRM_TRIALS problems (7-term sums, posttrain's ArithmeticTask) answered by chains of 6
    steps, each right w.p. p_good; a wrong step shifts the answer. Best-of-N: N chains, the table
    of preference/search.sample_table (pass@1, majority vote, ORM best@N, PRM best@N with
    prm.aggregate 'min'). Beam: B prefixes, each extended by K candidate steps, ranked by the
    min of their step scores as search.beam_search ranks them; 'matched' K = ⌈N/B⌉ samples as
    many steps as best-of-N does, 'course' K = ⌈N/(6B)⌉ a sixth of it. The chains and the scores
    are simulated (a deliberate toy: no model is trained); the ranking and the table are posttrain's."""
    gen = torch.Generator().manual_seed(0)
    T, S = PRM_TRIALS, PRM_STEPS
    task, items = _prm_problems()
    gold = torch.tensor([task.gold(it) for it in items])
    ok, err = _steps(gen, (T, N, S), p_good)  # [T, N, S]
    final = gold[:, None] + err.sum(-1)  # [T, N] the answer each chain ends on
    right = final == gold[:, None]
    orm = torch.sigmoid(torch.where(right, 2.0, -2.0) + ORM_NOISE * torch.randn(T, N, generator=gen))
    steps = _step_scores(gen, ok)  # [T, N, S]
    samples = [SimpleNamespace(text=f"{int(a)}#") for a in final.flatten().tolist()]
    table = sample_table(
        task,
        items,
        samples,
        N,
        orm_scores=orm.flatten().tolist(),
        prm_scores=[aggregate(sc, "min") for sc in steps.view(-1, S).tolist()],
    )
    K = max(1, math.ceil(N / (B * S))) if budget == "course" else max(1, math.ceil(N / B))
    beam_err = torch.zeros(T, B, dtype=torch.long)  # answer error of each kept prefix
    beam_min = torch.ones(T, B)  # its weakest step score so far
    for _ in range(S):
        c_ok, c_err = _steps(gen, (T, B, K), p_good)  # [T, B, K] candidate next steps
        c_sc = _step_scores(gen, c_ok)
        score = torch.minimum(beam_min[..., None], c_sc).view(T, -1)  # aggregate 'min' of the prefix
        top = score.topk(B, dim=1).indices  # keep the B best prefixes
        beam_err = (beam_err[..., None] + c_err).view(T, -1).gather(1, top)
        beam_min = score.gather(1, top)
    beam = float((beam_err.gather(1, beam_min.argmax(1, keepdim=True)) == 0).float().mean())
    acc = {
        "one sample (pass@1)": table["pass@1"],
        f"majority of {N}": table[f"maj@{N}"],
        f"ORM best of {N}": table[f"orm best@{N}"],
        f"PRM best of {N}": table[f"prm best@{N}"],
        f"PRM beam {B}×{K}": beam,
    }
    names = ["one sample (pass@1)", "majority of N", "ORM best of N", "PRM best of N", "PRM beam"]
    vals = list(acc.values())
    best = max(range(len(vals)), key=vals.__getitem__)
    return claims.attach(
        "prm",
        {
            "figure": figure(
                [
                    bar(
                        list(acc),
                        vals,
                        "share of problems answered right",
                        marker={"color": ["#d62728" if i == best else "#1f77b4" for i in range(len(vals))]},
                    )
                ],
                f"p_good = {p_good}, N = {N}, beam {B} × {K} per step ({budget} budget)",
                "method",
                "accuracy over 600 problems",
                yaxis={"range": [0, 1]},
            ),
            "kpis": [[n, f"{100 * v:.1f}%"] for n, v in zip(names, vals)]
            + [
                ["best method", names[best]],
                ["step samples: best-of-N / beam", f"{N * S} / {B * K * S}"],
                ["p_good⁶", f"{100 * p_good**6:.1f}%"],
            ],
            "note": (
                f"Sampling {B * K * S} steps against best-of-N's {N * S}, the PRM beam answers {100 * beam:.1f}% "
                f"right; the best reranker of N whole chains {100 * max(vals[2], vals[3]):.1f}%, one sample "
                f"{100 * vals[0]:.1f}%. Best here: {names[best]}."
            ),
        },
    )


register(
    Widget(
        "prm",
        "Reranking with an ORM or a PRM, and PRM beam search",
        prm_search,
        [
            Knob("p_good", "P(step is good)", [0.5, 0.6, 0.75, 0.9], 0.75),
            Knob("N", "samples N", [2, 4, 8, 16, 32, 64], 16),
            Knob("B", "beam width", [1, 2, 4, 8], 4),
            Knob("budget", "beam budget", ["matched", "course"], "matched", "select"),
        ],
        {
            "knobs": {"p_good": 0.5, "N": 2},
            "what": "Weak steps and two samples: 1.6% of chains are right, and no reranker can pick a correct "
            "chain that was never sampled; every method stays near the floor and the policy has to get "
            "better first.",
        },
        "Share of 600 six-step problems answered right, by method; red: the best one. The chains and the "
        "reward models' scores are simulated (a deliberate toy); the ranking and the table are posttrain's "
        "search.sample_table and prm.aggregate." + claims.caption("prm"),
        [
            "posttrain.preference.search:sample_table",
            "posttrain.reward_models.prm:aggregate",
            "posttrain.tasks.arithmetic:ArithmeticTask.reward",
        ],
    )
)


# ---- 18 · reward hacking under a leaky verifier ----------------------------------------------------

HACK_STEPS = [50, 100, 200, 500]


@functools.lru_cache(maxsize=16)
def _hack_run(rho: float) -> dict:
    """REINFORCE (reinforce.loss, A = R, η = 0.2) on 2 actions, 200 seeds: 'solve' is right w.p.
    0.7; 'emit phrase' w.p. 0.4 but the leaky verifier adds ρ for the phrase."""
    S = 200
    gen = torch.Generator().manual_seed(0)
    theta = torch.zeros(S, 2, dtype=torch.float64, requires_grad=True)
    cfg = reinforce.Config()
    mask = torch.ones(S, 1, dtype=torch.float64)
    norm = core.batch_norm(mask)
    p_right = torch.tensor([0.7, 0.4], dtype=torch.float64)
    train_ema = held_ema = torch.zeros(S, dtype=torch.float64)
    snaps = {}
    for t in range(1, max(HACK_STEPS) + 1):
        logp = torch.log_softmax(theta, -1)
        a = torch.multinomial(logp.exp().detach(), 1, generator=gen)  # [S, 1]
        right = (torch.rand(S, generator=gen, dtype=torch.float64) < p_right[a[:, 0]]).double()
        train_r = right + rho * (a[:, 0] == 1).double()
        lp = logp.gather(1, a)
        batch = RolloutBatch(
            loss_mask=mask, advantages=reinforce.advantages(train_r, torch.arange(S), cfg), old_logprobs=lp.detach()
        )
        loss, _ = reinforce.loss(lp, batch, cfg, norm)
        (g,) = torch.autograd.grad(loss, theta)
        with torch.no_grad():
            theta -= 0.2 * S * g
        train_ema, held_ema = 0.95 * train_ema + 0.05 * train_r, 0.95 * held_ema + 0.05 * right
        if t in HACK_STEPS:
            snaps[t] = (torch.softmax(theta.detach(), -1).mean(0), float(train_ema.mean()), float(held_ema.mean()))
    return snaps


def hacking(rho: float, steps: int) -> dict:
    pi, train, held = _hack_run(rho)[steps]
    return claims.attach(
        "hacking",
        {
            "figure": figure(
                [
                    bar(["π(solve)", "π(emit phrase)"], pi.tolist(), "policy (mean of 200 seeds)"),
                    bar(["train reward (proxy)", "held-out correctness"], [train, held], "EMA", xaxis="x2", yaxis="y2"),
                ],
                f"leak ρ = {rho}, {steps} steps",
                "",
                "probability (mean of 200 seeds)",
                grid={"rows": 1, "columns": 2, "pattern": "independent"},
                yaxis={"range": [0, 1]},
                yaxis2={"range": [0, 1.6], "title": {"text": "reward (EMA)"}},
            ),
            "kpis": [
                ["π(solve)", r(pi[0], 3)],
                ["train reward EMA", r(train, 3)],
                ["held-out correctness EMA", r(held, 3)],
                ["phrase wins when 0.4 + ρ > 0.7", "yes" if 0.4 + rho > 0.7 else "no"],
            ],
            "note": (
                f"The policy learned the phrase (π(solve) = {float(pi[0]):.2f}): the train reward reads {train:.2f} "
                f"while held-out correctness is {held:.2f}; only the held-out number tells."
                if float(pi[0]) < 0.5
                else f"Half the policy drifts to the phrase (π(solve) = {float(pi[0]):.2f}): train reward {train:.2f} and "
                f"held-out correctness {held:.2f} have started to part."
                if train - held > 0.1
                else f"The policy solves (π(solve) = {float(pi[0]):.2f}): train reward {train:.2f} and held-out "
                f"correctness {held:.2f} move together; the leak is too small to pay."
            ),
        },
    )


register(
    Widget(
        "hacking",
        "Reward hacking under a leaky verifier",
        hacking,
        [Knob("rho", "leak ρ", [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0], 0.2), Knob("steps", "steps", HACK_STEPS, 500)],
        {
            "knobs": {"rho": 0.5, "steps": 500},
            "what": "ρ = 0.5: the phrase earns 0.9 per try against 0.7 for solving; the policy learns to emit "
            "the phrase, train reward climbs to ~0.9 while held-out correctness falls to ~0.4.",
        },
        "Left: the policy. Right: the proxy reward it is trained on vs. the correctness it should have. Two "
        "actions and a leaky verifier: a deliberate toy trained by reinforce.loss." + claims.caption("hacking"),
        ["posttrain.algorithms.reinforce:loss"],
    )
)


# ---- 18a · curation: where the gradient signal is --------------------------------------------------

CURATE_POOL, CURATE_DUPS, CURATE_PROBE = 380, 20, 16


def curation_band(curation: int) -> tuple[float, float]:
    """The band the curation knob keeps: [½ − w, ½ + w], w = ½ − 0.45·curation/100."""
    w = 0.5 - 0.45 * curation / 100
    return max(0.0, 0.5 - w), min(1.0, 0.5 + w)


@functools.lru_cache(maxsize=1)
def _pool():
    """A pool of 400 prompts (380 sums from ArithmeticTask + 20 repeated ones) and a hidden
    difficulty per prompt in [0, 1], piled up near both ends (3u² − 2u³ of a spread u): most
    prompts are far too easy or far too hard for a given policy, as in a scraped pool."""
    task = ArithmeticTask(ArithmeticConfig(min_terms=3, max_terms=6, max_value=99))
    items = task.items(CURATE_POOL, "train", 0)
    items = items + items[:CURATE_DUPS]  # duplicates a scraped pool has
    u = torch.arange(CURATE_POOL + CURATE_DUPS, dtype=torch.float64) % CURATE_POOL
    u = (u * 0.6180339887) % 1.0  # spread, repeatable
    return items, [task.prompt(it) for it in items], 3 * u**2 - 2 * u**3


def curation(policy: int, curation: int, K: int) -> dict:
    """The curation loop of data/curate.py on a simulated policy: each prompt's true pass rate is
    σ(6(s − d)) for policy strength s; probe draws CURATE_PROBE samples per prompt (the
    pass-rate estimate `probe` makes), curate() drops duplicates and keeps the band
    curation_band(curation); training then draws K fresh rollouts per kept prompt,
    and dapo.degenerate finds the groups whose rewards are all equal (no gradient)."""
    gen = torch.Generator().manual_seed(0)
    items, prompts, d = _pool()
    p = torch.sigmoid(6 * (policy / 100 - d))  # [N] true pass rates
    probe = (torch.rand(len(items), CURATE_PROBE, generator=gen, dtype=torch.float64) < p[:, None]).double()
    rates = probe.mean(1)
    kept, m = curate(
        list(range(len(items))),
        prompts,
        rates.numpy(),
        (probe.std(1) > 0).numpy(),
        band=curation_band(curation),
    )
    kept_t = torch.tensor(kept, dtype=torch.long)
    pk = p[kept_t]
    rew = (torch.rand(len(kept), K, generator=gen, dtype=torch.float64) < pk[:, None]).double()  # [n, K]
    dead = dapo.degenerate(rew.flatten(), torch.arange(len(kept)).repeat_interleave(K))
    wasted = float(dead.double().mean()) if kept else 0.0
    signal = float((pk * (1 - pk)).sum())
    rollouts = max(K * len(kept), 1)
    bins = [i / CURATE_PROBE for i in range(CURATE_PROBE + 1)]  # probe rates are k/16
    hist = lambda xs: [sum(1 for x in xs if abs(x - b) < 1e-9) for b in bins]
    kept_rates = rates[kept_t].tolist()
    return {
        "figure": figure(
            [
                bar(bins, hist(rates.tolist()), f"all prompts (probe of {CURATE_PROBE})", opacity=0.35),
                bar(bins, hist(kept_rates), "kept by curate()"),
                line(
                    bins,
                    [4 * b * (1 - b) * max(hist(rates.tolist())) for b in bins],
                    "p(1−p), scaled: gradient signal per prompt",
                    line={"dash": "dot"},
                ),
                line(bins, [b**K + (1 - b) ** K for b in bins], f"P(group of {K} all equal)", yaxis="y2"),
            ],
            f"policy strength {policy}, curation {curation}, K = {K}",
            "pass rate measured by the probe",
            "prompts",
            barmode="overlay",
            yaxis2={"overlaying": "y", "side": "right", "range": [0, 1], "title": {"text": "P(no signal)"}},
        ),
        "kpis": [
            ["prompts kept", len(kept)],
            ["duplicates removed", m["removed/exact_dup"] + m["removed/near_dup"]],
            ["out of band removed", m["removed/out_of_band"]],
            ["rollouts in groups with no signal", f"{100 * wasted:.0f}%"],
            ["expected gradient Σp(1−p)", r(signal, 1)],
            ["expected gradient per 100 rollouts", r(100 * signal / rollouts, 2)],
        ],
        "note": (
            f"curate() kept {len(kept)} of {len(items)} prompts; {100 * wasted:.0f}% of the training rollouts "
            f"then land in groups whose {K} rewards are all equal and teach nothing "
            f"({100 * signal / rollouts:.2f} units of expected gradient p(1−p) per 100 rollouts; more rollouts per "
            "prompt do not raise a prompt's expected gradient, they lower the noise of its estimate)."
        ),
    }


register(
    Widget(
        "curation",
        "Where the gradient signal is: pass rates and curation",
        curation,
        [
            Knob("policy", "policy strength", [0, 20, 40, 60, 80, 100], 80),
            Knob("curation", "curation", [0, 20, 40, 60, 80, 100], 60),
            Knob("K", "rollouts per prompt K", [2, 4, 8, 16, 32], 8),
        ],
        {
            "knobs": {"policy": 80, "curation": 0},
            "what": "A strong policy on an uncurated pool: most prompts pass every time, a large share of the "
            "rollouts land in all-right groups and teach nothing, and the expected gradient per rollout "
            "falls well below the curated pool's.",
        },
        "Histogram of the pass rates the probe measured, the prompts curate() kept, and the chance that a "
        "group of K rollouts has all-equal rewards. The policy and its probe are simulated (a deliberate "
        "toy); the curation is posttrain's data/curate.py, the degenerate test dapo.degenerate.",
        ["posttrain.data.curate:curate", "posttrain.data.curate:bucket", "posttrain.algorithms.dapo:degenerate"],
    )
)
