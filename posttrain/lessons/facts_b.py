"""Numbers quoted in the text of lessons 13–22 (text engineer B), each computed by posttrain's own
functions or read from a committed JSON, so a page cannot drift from the code it describes.

`FACTS = {name: function}`: a function takes no argument and returns a number, a short string, or a
table {"columns": [...], "rows": [[...], ...]} (lessons/facts.py has the contract). Names start with
their lesson's number. This module holds lessons 13–16 and merges facts_b_signal (17–18a),
facts_b_sys (19 through facts_b_topology, 20–22), facts_b_pref (15–16 held to their papers) and
facts_b_hw (20–22 held to the H100). Nothing here trains; recorded runs are read from lessons/data/ and benchmarks/results/.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from posttrain.algorithms import core, dapo, dr_grpo, grpo
from posttrain.lessons import claims, dapo_toy, facts_b_hw, facts_b_pref, facts_b_signal, facts_b_sys, runs
from posttrain.lessons.facts_b_data import kpi, result, t
from posttrain.lessons.widgets_reward_model import KPI_ALL, KPI_CD
from posttrain.preference.dpo import DPOLossConfig, SeqLogps, preference_loss
from posttrain.reward_models.reward_model import bradley_terry_loss

# ---- 13 · DAPO ---------------------------------------------------------------------------------


def p_degenerate_exact(p: float, k: int) -> float:
    """P(all K rewards equal), exactly: one group per possible number of right answers j = 0..K,
    asked to dapo.degenerate, weighted by the binomial probability C(K, j) p^j (1−p)^(K−j)."""
    j = torch.arange(k + 1)
    rewards = (torch.arange(k).unsqueeze(0) < j.unsqueeze(1)).double()  # [K+1, K]
    dead = dapo.degenerate(rewards.reshape(-1), j.repeat_interleave(k)).view(k + 1, k)[:, 0]  # [K+1]
    weight = torch.tensor(
        [math.comb(k, int(n)) * p ** int(n) * (1 - p) ** (k - int(n)) for n in j], dtype=torch.float64
    )
    return round(float((weight * dead).sum()), 4)


def rl13_degenerate_table() -> dict:
    ps, ks = (0.5, 0.7, 0.9, 0.95), (4, 8, 16)
    return {
        "columns": ["accuracy p"] + [f"groups with signal, K = {k}" for k in ks],
        "rows": [[p] + [round(1 - p_degenerate_exact(p, k), 3) for k in ks] for p in ps],
    }


def rl13_overlong_table() -> dict:
    """The paper's setting: cap 20,480 tokens, buffer 4,096 (the ramp starts at 16,384)."""
    lengths = t(8000, 16384, 17408, 18432, 19456, 20480)
    pen = dapo.overlong_penalty(lengths, 20480, 4096)
    return {
        "columns": ["response length |y|", "reward added"],
        "rows": [[int(n), round(float(v), 2) + 0.0] for n, v in zip(lengths, pen)],
    }


ABLATION = [
    ("all four on", (1, 1, 1, 1)),
    ("① clip-higher off", (0, 1, 1, 1)),
    ("② dynamic sampling off", (1, 0, 1, 1)),
    ("③ token-level loss off", (1, 1, 0, 1)),
    ("④ overlong shaping off", (1, 1, 1, 0)),
    ("all four off (GRPO)", (0, 0, 0, 0)),
]


def _ablation(switches) -> dict:
    return runs.recorded()[dapo_toy.key(*map(bool, switches))]


def rl13_ablation_table() -> dict:
    rows = []
    for name, sw in ABLATION:
        r = _ablation(sw)
        rows.append(
            [
                name,
                round(r["acc"][-1], 3),
                round(sum(r["useful"]) / len(r["useful"]), 3),
                int(r["samples"][-1]),
                round(r["entropy"][-1], 3),
            ]
        )
    return {
        "columns": [
            "setting",
            f"accuracy at step {dapo_toy.STEPS}",
            "groups with signal per batch",
            "responses sampled",
            "final entropy",
        ],
        "rows": rows,
    }


def _equal_compute() -> tuple[int, float, float]:
    """(step, accuracy) of the all-on run when it has sampled as many responses as the run
    without dynamic sampling samples in all its steps, and that run's final accuracy."""
    on, off = _ablation((1, 1, 1, 1)), _ablation((1, 0, 1, 1))
    budget = off["samples"][-1]
    i = next(i for i, n in enumerate(on["samples"]) if n >= budget)
    return on["step"][i], on["acc"][i], off["acc"][-1]


# ---- 14 · Dr. GRPO -----------------------------------------------------------------------------


def _signed(xs) -> str:
    return ", ".join(f"{x:+.2f}".replace("-", "−") for x in xs)


def rl14_group_table() -> dict:
    """The lesson's two prompts, GRPO (population std, as the course's tables) vs. Dr. GRPO."""
    rows = []
    for name, rw in (("X", (1, 0, 1, 0)), ("Y", (1, 1, 1, 0))):
        r = t(*rw)
        g = torch.zeros(len(rw), dtype=torch.long)
        mean, std, _ = core.group_stats(r, g, "population")
        rows.append(
            [
                f"{name} = {list(rw)}",
                round(float(mean[0]), 2),
                round(float(std[0]), 3),
                _signed(grpo.advantages(r, g, grpo.Config(std="population")).tolist()),
                _signed(dr_grpo.advantages(r, g, dr_grpo.Config()).tolist()),
            ]
        )
    return {"columns": ["group", "mean", "std (population)", "GRPO A_i", "Dr. GRPO A_i"], "rows": rows}


def rl14_difficulty_table(k: int = 8) -> dict:
    """Per prompt with j of K answers right: the advantage of a right answer and the total |A|
    the group puts into the gradient, GRPO (population std) vs. Dr. GRPO."""
    rows = []
    g = torch.zeros(k, dtype=torch.long)
    for j in (1, 2, 4, 6, 7):
        r = (torch.arange(k) < j).double()
        a_g = grpo.advantages(r, g, grpo.Config(std="population"))
        a_d = dr_grpo.advantages(r, g, dr_grpo.Config())
        rows.append(
            [
                f"{j} of {k}",
                round(j / k, 3),
                round(float(a_g[0]), 2),
                round(float(a_d[0]), 2),
                round(float(a_g.abs().sum()), 2),
                round(float(a_d.abs().sum()), 2),
            ]
        )
    return {
        "columns": ["right", "pass rate p̂", "GRPO A(right)", "Dr. GRPO A(right)", "GRPO Σ|A|", "Dr. GRPO Σ|A|"],
        "rows": rows,
    }


AGG_LABEL = {
    "seq-mean-token-mean": "GRPO: seq-mean-token-mean",
    "token-mean": "DAPO: token-mean",
    "seq-mean-token-sum": "÷G: seq-mean-token-sum",
    "seq-mean-token-sum-norm": "Dr. GRPO: ÷(G·L_max)",
}


def token_weights(short: int, long: int, adv: float = 0.5, l_max: int = 500) -> dict:
    """∂L/∂log π of one token of each of two responses (both with advantage `adv`), per
    aggregation mode, by autograd through core.aggregate."""
    T = max(short, long)
    mask = torch.zeros(2, T, dtype=torch.float64)
    mask[0, :short], mask[1, :long] = 1, 1
    out = {}
    for mode in AGG_LABEL:
        lp = torch.zeros(2, T, dtype=torch.float64, requires_grad=True)
        (g,) = torch.autograd.grad(core.aggregate(-adv * lp, mask, mode, core.batch_norm(mask, max_len=l_max)), lp)
        out[mode] = (-float(g[0, 0]), -float(g[1, 0]))
    return out


def rl14_token_table() -> dict:
    w = token_weights(10, 200)
    return {
        "columns": ["aggregation", "per token, 10-token answer", "per token, 200-token answer", "long / short"],
        "rows": [[AGG_LABEL[m], f"{a:.4g}", f"{b:.4g}", f"{b / a:.3g}"] for m, (a, b) in w.items()],
    }


def _wrong_len(algorithm: str) -> str:
    a = claims.recorded()["length_bias"]["algorithms"][algorithm]
    return f"{a['wrong_length_first10']:.1f} → {a['wrong_length_last10']:.1f}"


def _claims_run(section: str, algorithm: str) -> dict:
    return next(r for r in result("claims")[section] if r["algorithm"] == algorithm)


# ---- 15 · RLHF and the reward model ------------------------------------------------------------


def rl15_bt_table() -> dict:
    """Per pair with score gap Δ = r_w − r_l: the modelled preference σ(Δ), the loss, and the
    gradient on r_w (autograd through reward_model.bradley_terry_loss: σ(−Δ))."""
    rows = []
    for d in (-2.0, 0.0, 0.5, 1.0, 2.0, 3.0, 4.0):
        r_w = t(d).requires_grad_(True)
        loss = bradley_terry_loss(r_w, t(0.0))
        (g,) = torch.autograd.grad(loss.sum(), r_w)
        rows.append([d, round(1 / (1 + math.exp(-d)), 3), round(float(loss.detach()), 3), round(-float(g), 3)])
    return {
        "columns": ["gap Δ = r̂_w − r̂_l", "P(w preferred) = σ(Δ)", "loss −log σ(Δ)", "push on r̂_w = σ(−Δ)"],
        "rows": rows,
    }


COURSE_SCORES = (0.0, 1.0, 2.0, 2.5)  # the widget's hidden true scores of A, B, C, D (course lesson 15)


# ---- 16 · DPO and its family -------------------------------------------------------------------


def _pair_loss(kind: str, beta: float, chosen=-10.0, rejected=-12.0, ref=-11.0, len_w=5.0, len_l=4.0) -> float:
    s = SeqLogps(t(chosen), t(rejected), t(ref), t(ref), t(len_w), t(len_l))
    return float(preference_loss(DPOLossConfig(loss_type=kind, beta=beta), s)[0][0])


def rl16_family_table() -> dict:
    """One pair (docs/algorithms.md §21): log π chosen −10, rejected −12, both −11 under π_ref, 5 and
    4 tokens; h = 2. β = 0.1 except SimPO (its paper's 2.5, γ 1.375)."""
    rows = [
        ["DPO", "−log σ(βh)", 0.1],
        ["cDPO (ε = 0.1)", "label-smoothed DPO", 0.1],
        ["hinge (SLiC)", "max(0, 1 − βh)", 0.1],
        ["IPO", "(h̄ − 1/(2β))², h̄ per token", 0.1],
        ["KTO", "1 − σ(β(ρ − z₀)), per answer", 0.1],
        ["ORPO", "NLL(w) − λ log σ(log-odds gap)", 0.1],
        ["SimPO", "−log σ(β·avg-log-π gap − γ)", 2.5],
    ]
    kinds = {
        "DPO": "dpo",
        "cDPO (ε = 0.1)": "cdpo",
        "hinge (SLiC)": "hinge",
        "IPO": "ipo",
        "KTO": "kto",
        "ORPO": "orpo",
        "SimPO": "simpo",
    }
    return {
        "columns": ["loss", "per pair", "β", "value"],
        "rows": [[n, f, b, round(_pair_loss(kinds[n], b), 4)] for n, f, b in rows],
    }


def rl16_gradient_table(beta: float = 0.5) -> dict:
    """Loss and −∂L/∂h of one pair as the log-ratio gap h grows (1-token answers, so IPO's
    per-token h̄ is h), by autograd through preference_loss."""
    rows = []
    for h in (0.0, 1.0, 2.0, 4.0, 8.0):
        out = []
        for kind in ("dpo", "ipo"):
            x = t(h).requires_grad_(True)
            loss, _ = preference_loss(
                DPOLossConfig(loss_type=kind, beta=beta), SeqLogps(x, t(0.0), t(0.0), t(0.0), t(1.0), t(1.0))
            )
            (g,) = torch.autograd.grad(loss.sum(), x)
            out += [round(float(loss.detach()), 3), round(-float(g), 3) + 0.0]
        rows.append([h] + out)
    return {"columns": ["gap h", "DPO loss", "DPO push on h", "IPO loss", "IPO push on h"], "rows": rows}


def rl16_bench_table() -> dict:
    rows = []
    for r in result("dpo_family"):
        e0, e1 = r["evals"][0], r["evals"][-1]
        rows.append(
            [
                r["run"],
                f"{e0['eval/greedy_acc']:.2f} → {e1['eval/greedy_acc']:.2f}",
                f"{e0['eval/pass@1']:.3f} → {e1['eval/pass@1']:.3f}",
                round(r["final_logps_chosen"], 2),
                round(r["final_logps_rejected"], 2),
            ]
        )
    return {
        "columns": ["run (100 steps)", "greedy accuracy", "pass@1", "final log π(chosen)", "final log π(rejected)"],
        "rows": rows,
    }


def _dpo_run(name: str) -> dict:
    return next(r for r in result("dpo_family") if r["run"] == name)


FACTS: dict[str, Callable[[], object]] = {
    # 13 · DAPO
    "rl13_p_degenerate_09_k4": lambda: p_degenerate_exact(0.9, 4),
    "rl13_p_degenerate_09_k16": lambda: p_degenerate_exact(0.9, 16),
    "rl13_degenerate_table": rl13_degenerate_table,
    "rl13_eps_low": lambda: dapo.Config().eps_low,
    "rl13_eps_high": lambda: dapo.Config().eps_high,
    "rl13_clip_top": lambda: 1 + dapo.Config().eps_high,
    "rl13_clip_bottom": lambda: 1 - dapo.Config().eps_low,
    "rl13_rare_token_grpo": lambda: round(0.01 * (1 + grpo.Config().eps_high), 4),
    "rl13_rare_token_dapo": lambda: round(0.01 * (1 + dapo.Config().eps_high), 4),
    "rl13_overlong_table": rl13_overlong_table,
    "rl13_toy_steps": lambda: dapo_toy.STEPS,
    "rl13_toy_prompts": lambda: dapo_toy.N_PROMPTS,
    "rl13_toy_batch": lambda: dapo_toy.PROMPTS,
    "rl13_toy_k": lambda: dapo_toy.K,
    "rl13_toy_max_len": lambda: dapo_toy.MAX_LEN,
    "rl13_toy_seeds": lambda: dapo_toy.SEEDS,
    "rl13_ablation_table": rl13_ablation_table,
    "rl13_ablation_useful_off": lambda: round(
        sum(_ablation((1, 0, 1, 1))["useful"]) / len(_ablation((1, 0, 1, 1))["useful"]), 2
    ),
    "rl13_acc_all_on": lambda: round(_ablation((1, 1, 1, 1))["acc"][-1], 3),
    "rl13_acc_no_dynamic": lambda: round(_ablation((1, 0, 1, 1))["acc"][-1], 3),
    "rl13_samples_all_on": lambda: int(_ablation((1, 1, 1, 1))["samples"][-1]),
    "rl13_samples_no_dynamic": lambda: int(_ablation((1, 0, 1, 1))["samples"][-1]),
    "rl13_sample_ratio": lambda: round(
        _ablation((1, 1, 1, 1))["samples"][-1] / _ablation((1, 0, 1, 1))["samples"][-1], 1
    ),
    "rl13_equal_compute_step": lambda: _equal_compute()[0],
    "rl13_other_switches_spread": lambda: round(
        max(
            abs(_ablation(sw)["acc"][-1] - _ablation((1, 1, 1, 1))["acc"][-1])
            for sw in ((0, 1, 1, 1), (1, 1, 0, 1), (1, 1, 1, 0))
        ),
        3,
    ),
    "rl13_equal_compute_acc": lambda: round(_equal_compute()[1], 3),
    "rl13_bench_degenerate_k4": lambda: next(
        r["observed"] for r in result("claims")["degenerate"]["rows"] if r["K"] == 4
    ),
    "rl13_bench_mean_p": lambda: round(result("claims")["degenerate"]["mean_p"], 2),
    # 14 · Dr. GRPO
    "rl14_group_table": rl14_group_table,
    "rl14_difficulty_table": rl14_difficulty_table,
    "rl14_token_table": rl14_token_table,
    "rl14_y_wrong_grpo": lambda: rl14_group_table()["rows"][1][3].split(", ")[-1],
    "rl14_y_wrong_dr": lambda: rl14_group_table()["rows"][1][4].split(", ")[-1],
    "rl14_rare_right_grpo": lambda: rl14_difficulty_table()["rows"][0][2],
    "rl14_rare_right_dr": lambda: rl14_difficulty_table()["rows"][0][3],
    "rl14_hard_vs_mid_grpo": lambda: round(
        rl14_difficulty_table()["rows"][0][4] / rl14_difficulty_table()["rows"][2][4], 2
    ),
    "rl14_hard_vs_mid_dr": lambda: round(
        rl14_difficulty_table()["rows"][0][5] / rl14_difficulty_table()["rows"][2][5], 2
    ),
    "rl14_grpo_long_share": lambda: (
        f"{100 * token_weights(10, 200)['seq-mean-token-mean'][1] / token_weights(10, 200)['seq-mean-token-mean'][0]:.1f}%"
    ),
    "rl14_grpo_break_share": lambda: (
        f"{100 * token_weights(2, 500)['seq-mean-token-mean'][1] / token_weights(2, 500)['seq-mean-token-mean'][0]:.1f}%"
    ),
    "rl14_bench_steps": lambda: _claims_run("length", "grpo")["steps"],
    "rl14_bench_wrong_len_start": lambda: round(_claims_run("length", "grpo")["length/wrong_mean_first10"], 1),
    "rl14_bench_wrong_len_grpo": lambda: round(_claims_run("length", "grpo")["length/wrong_mean_last10"], 1),
    "rl14_bench_wrong_len_dr": lambda: round(_claims_run("length", "dr_grpo")["length/wrong_mean_last10"], 1),
    "rl14_bench_right_len_grpo": lambda: round(_claims_run("length", "grpo")["length/correct_mean_last10"], 1),
    "rl14_bench_pass1_start": lambda: round(_claims_run("length", "grpo")["pass@1_start"], 3),
    "rl14_bench_pass1_grpo": lambda: round(_claims_run("length", "grpo")["pass@1_end"], 3),
    "rl14_bench_pass1_dr": lambda: round(_claims_run("length", "dr_grpo")["pass@1_end"], 3),
    # the 3-seed re-run with a budget that cannot cap wrong answers (lessons/data/claims.json)
    "rl14_claim_budget": lambda: claims.recorded()["length_bias"]["algorithms"]["grpo"]["max_new_tokens"],
    "rl14_claim_seeds": lambda: claims.seeds_text("length_bias"),
    "rl14_claim_wrong_grpo": lambda: _wrong_len("grpo"),
    "rl14_claim_wrong_dr": lambda: _wrong_len("dr_grpo"),
    "rl14_claim_verdict": lambda: "reproduced here" if claims.length_bias_holds() else "did not reproduce here either",
    # 15 · RLHF and the reward model
    "rl15_bt_table": rl15_bt_table,
    "rl15_worked_loss": lambda: round(float(bradley_terry_loss(t(1.0), t(0.2))), 6),
    "rl15_worked_loss_centred": lambda: round(float(bradley_terry_loss(t(1.0), t(0.2), center_coef=0.01)), 6),
    "rl15_cd_worse_pick": lambda: f"{100 / (1 + math.exp(COURSE_SCORES[3] - COURSE_SCORES[2])):.0f}%",
    "rl15_all_right_lr1": lambda: kpi("bt_rm", KPI_ALL, lr=1.0),
    "rl15_all_right_lr001": lambda: kpi("bt_rm", KPI_ALL, lr=0.01),
    "rl15_all_right_50pairs": lambda: kpi("bt_rm", KPI_ALL, lr=0.01, pairs=50),
    "rl15_cd_wrong_lr1": lambda: f"{100 - float(kpi('bt_rm', KPI_CD, lr=1.0).rstrip('%')):.1f}%",
    "rl15_rm_pairs": lambda: result("rm_ensemble")["pairs"],
    "rl15_rm_members": lambda: ", ".join(f"{a:.3f}" for a in result("rm_ensemble")["members"].values()),
    "rl15_rm_best_member": lambda: round(max(result("rm_ensemble")["members"].values()), 3),
    "rl15_rm_ensemble": lambda: round(result("rm_ensemble")["ensemble"], 3),
    # 16 · DPO and its family
    "rl16_family_table": rl16_family_table,
    "rl16_dpo_pair": lambda: round(_pair_loss("dpo", 0.1), 4),
    "rl16_gradient_table": rl16_gradient_table,
    "rl16_dpo_push_at_8": lambda: rl16_gradient_table()["rows"][-1][2],
    "rl16_bench_table": rl16_bench_table,
    "rl16_bench_greedy_start": lambda: _dpo_run("dpo lr 1e-5")["evals"][0]["eval/greedy_acc"],
    "rl16_bench_greedy_dpo": lambda: _dpo_run("dpo lr 1e-5")["evals"][-1]["eval/greedy_acc"],
    "rl16_bench_greedy_nll": lambda: _dpo_run("dpo_nll lr 1e-5")["evals"][-1]["eval/greedy_acc"],
    "rl16_bench_chosen_dpo": lambda: round(_dpo_run("dpo lr 1e-5")["final_logps_chosen"], 2),
    "rl16_bench_chosen_nll": lambda: round(_dpo_run("dpo_nll lr 1e-5")["final_logps_chosen"], 2),
    "rl16_dpo4_break_pi": lambda: kpi("dpo4", "final π", beta=2.0, lr=0.5, loss_type="ipo"),
    "rl16_dpo4_break_chosen": lambda: kpi(
        "dpo4", "log π(chosen), first → last 50 pairs", beta=2.0, lr=0.5, loss_type="ipo"
    ),
}

FACTS.update(facts_b_signal.FACTS)  # lessons 17–18a
FACTS.update(facts_b_sys.FACTS)  # lessons 19–22
FACTS.update(facts_b_pref.FACTS)  # 15–16 against their sources
FACTS.update(facts_b_hw.FACTS)  # 20–22 against the hardware
