"""Facts of the gpt_mini track's post-training half (G04–G06): chain of thought, DPO and GRPO, from
posttrain's losses and advantages and the recorded benchmark results (cot_vs_direct, dpo_family, claims)."""

from __future__ import annotations

import math
from collections.abc import Callable

from posttrain.algorithms import grpo
from posttrain.config import RLConfig, load_config
from posttrain.lessons.facts_c_async import rl22c_gain
from posttrain.lessons.facts_c_common import kpi, result, table
from posttrain.preference.dpo import DPOLossConfig, SeqLogps, preference_loss
from posttrain.recipes.chain import PipelineConfig
from posttrain.tasks.arithmetic import Problem

# ---- gpt_mini 04 · chain of thought -----------------------------------------------------------


def g04_table() -> dict:
    """benchmarks/results/cot_vs_direct.json: nano pretrained, then 800 SFT steps on direct answers or
    on CoT traces, sums of 2–6 two-digit terms (10–99), held-out greedy accuracy by term count."""
    r = result("cot_vs_direct")
    return table(
        ["terms K", "additions in the sum", "direct answer", "chain of thought", "distinct problems (90^K)"],
        [
            [
                k,
                k - 1,
                f"{r['direct'][f'eval/greedy_acc_k{k}']:.2f}",
                f"{r['cot'][f'eval/greedy_acc_k{k}']:.2f}",
                f"{90**k:.1e}" if k > 3 else f"{90**k:,}",
            ]
            for k in range(2, 7)
        ],
    )


def g04_target(terms: tuple, cot: bool) -> str:

    return Problem(terms).target(cot)


def g04_sync_role_s(role: str) -> float:
    """Seconds a step of posttrain's synchronous GRPO on nano spends in one role (async_vs_sync.json,
    the 'sync' runs, mean over seeds)."""
    rs = [r["roles_s"][role] for r in result("async_vs_sync")["runs"] if r["run"] == "sync"]
    return sum(rs) / len(rs)


# ---- gpt_mini 05 · DPO ------------------------------------------------------------------------


def g05_first_step(beta: float = 0.1) -> dict:
    """preference_loss on one pair when π_θ = π_ref (every log-ratio 0): the loss and its gradient
    with respect to the chosen and rejected log-probs."""
    import torch

    lp = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    zero, one = torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    loss, _ = preference_loss(DPOLossConfig("dpo", beta), SeqLogps(lp[:1], lp[1:], zero, zero, one, one))
    (g,) = torch.autograd.grad(loss.sum(), lp)
    return {"loss": float(loss.detach()), "grad_chosen": float(g[0]), "grad_rejected": float(g[1])}


def g05_family_table() -> dict:
    """benchmarks/results/dpo_family.json: from the same SFT checkpoint and the same verifier-labelled
    pairs, 100 steps each; held-out pass@1 and the final mean log-probabilities of the pairs."""
    rows = []
    for r in result("dpo_family"):
        if r["run"] in ("dpo lr 1e-5", "dpo lr 3e-6", "dpo_nll lr 1e-5", "orpo lr 1e-5"):
            ev = {e["step"]: e["eval/pass@1"] for e in r["evals"]}
            p8 = {e["step"]: e["eval/pass@8"] for e in r["evals"]}
            rows.append(
                [
                    r["run"],
                    f"{ev[0]:.3f} → {ev[50]:.3f} → {ev[100]:.3f}",
                    f"{r['final_logps_chosen']:.2f}",
                    f"{r['final_logps_rejected']:.2f}",
                    f"{p8[0]:.3f} → {p8[100]:.3f}",
                ]
            )
    return table(
        [
            "loss, learning rate",
            "held-out pass@1 at steps 0 → 50 → 100",
            "log π(chosen), last batch",
            "log π(rejected), last batch",
            "held-out pass@8, 0 → 100",
        ],
        rows,
    )


def g05_run(name: str) -> dict:
    return next(r for r in result("dpo_family") if r["run"] == name)


# ---- gpt_mini 06 · RL with verifiable rewards (GRPO) -----------------------------------------


def g06_group_table() -> dict:
    """grpo.advantages for the group r = (1, 1, 0, 0) and (1, 0, 0, 0), both std conventions."""
    import torch

    rows = []
    for rewards in ((1.0, 1.0, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0), (1.0, 1.0, 1.0, 1.0)):
        r = torch.tensor(rewards, dtype=torch.float64)
        adv = {
            std: grpo.advantages(r, torch.zeros(4, dtype=torch.long), grpo.Config(std=std))
            for std in ("population", "unbiased")
        }
        rows.append(
            [
                ", ".join(f"{x:g}" for x in rewards),
                *[", ".join(f"{float(a):+.3f}" for a in adv[std]) for std in ("population", "unbiased")],
            ]
        )
    return table(
        ["rewards of the group", "A, population std (the course's tables)", "A, unbiased std (torch, TRL, verl)"], rows
    )


def g06_degenerate_table() -> dict:
    """benchmarks/results/claims.json: 300 train prompts, each prompt's pass rate p estimated from 32
    samples of the SFT model; fresh groups of K: the share with all-equal rewards, against
    p^K + (1 − p)^K per prompt and against the same formula at the mean p."""
    d = result("claims")["degenerate"]
    return table(
        ["K", "observed", "predicted, per-prompt p", f"predicted from the mean p = {d['mean_p']:.2f}"],
        [
            [r["K"], f"{r['observed']:.2f}", f"{r['predicted_per_prompt']:.2f}", f"{r['predicted_mean_p']:.2f}"]
            for r in d["rows"]
        ],
    )


def g06_group_runs() -> dict:
    return {r["run"]: r for r in result("claims")["group"]}


def g06_config() -> dict:

    c = load_config(RLConfig, "grpo_arith", [])
    return {
        "K": c.rollout.samples_per_prompt,
        "prompts": c.rollout.prompts_per_step,
        "lr": c.optim.lr,
        "kl": c.algo.kl_coef,
    }


FACTS: dict[str, Callable[[], object]] = {
    "g04_table": g04_table,
    "g04_direct_acc": lambda: result("cot_vs_direct")["direct"]["eval/greedy_acc"],
    "g04_cot_acc": lambda: result("cot_vs_direct")["cot"]["eval/greedy_acc"],
    "g04_direct_len": lambda: result("cot_vs_direct")["direct"]["eval/length_mean"],
    "g04_cot_len": lambda: result("cot_vs_direct")["cot"]["eval/length_mean"],
    "g04_example_cot": lambda: g04_target((3, 4, 5, 6), True),
    "g04_example_direct": lambda: g04_target((3, 4, 5, 6), False),
    "g04_example_len": lambda: len(g04_target((3, 4, 5, 6), True)),
    "g04_compound_100": lambda: 0.99**100,
    "g04_rollout_s": lambda: g04_sync_role_s("rollout_s"),
    "g04_train_s": lambda: g04_sync_role_s("train_s"),
    "g04_w_direct_1layer": lambda: kpi("cot", "direct answers, K = 2 → 6", layers=1, cot=False),
    "g04_w_cot_1layer": lambda: kpi("cot", "chain of thought, K = 2 → 6", layers=1),
    "g04_w_direct6": lambda: kpi("cot", "held-out accuracy (this setting)", cot=False, K=6),
    "g04_w_cot6": lambda: kpi("cot", "held-out accuracy (this setting)", cot=True, K=6),
    "g04_len_ratio": lambda: (
        result("cot_vs_direct")["cot"]["eval/length_mean"] / result("cot_vs_direct")["direct"]["eval/length_mean"]
    ),
    "g04_acc_ratio": lambda: (
        result("cot_vs_direct")["cot"]["eval/greedy_acc"] / result("cot_vs_direct")["direct"]["eval/greedy_acc"]
    ),
    "g05_loss0": lambda: g05_first_step()["loss"],
    "g05_ln2": lambda: math.log(2),
    "g05_grad_chosen": lambda: g05_first_step()["grad_chosen"],
    "g05_grad_rejected": lambda: g05_first_step()["grad_rejected"],
    "g05_family_table": g05_family_table,
    "g05_dpo_end": lambda: g05_run("dpo lr 1e-5")["evals"][-1]["eval/pass@1"],
    "g05_nll_end": lambda: g05_run("dpo_nll lr 1e-5")["evals"][-1]["eval/pass@1"],
    "g05_start": lambda: g05_run("dpo lr 1e-5")["evals"][0]["eval/pass@1"],
    "g05_dpo_chosen": lambda: g05_run("dpo lr 1e-5")["final_logps_chosen"],
    "g05_nll_chosen": lambda: g05_run("dpo_nll lr 1e-5")["final_logps_chosen"],
    "g06_group_table": g06_group_table,
    "g06_degenerate_table": g06_degenerate_table,
    "g06_k2_degenerate": lambda: result("claims")["degenerate"]["rows"][0]["observed"],
    "g06_k8_degenerate": lambda: result("claims")["degenerate"]["rows"][2]["observed"],
    "g06_mean_p": lambda: result("claims")["degenerate"]["mean_p"],
    "g06_k2_first10_degenerate": lambda: g06_group_runs()["group_2"]["group/degenerate_frac_first10"],
    "g06_k8_first10_degenerate": lambda: g06_group_runs()["group_8"]["group/degenerate_frac_first10"],
    "g06_k2_pass_end": lambda: g06_group_runs()["group_2"]["pass@1_end"],
    "g06_k8_pass_end": lambda: g06_group_runs()["group_8"]["pass@1_end"],
    "g06_group_pass_start": lambda: g06_group_runs()["group_2"]["pass@1_start"],
    "g06_cfg_K": lambda: g06_config()["K"],
    "g06_cfg_prompts": lambda: g06_config()["prompts"],
    "g06_cfg_lr": lambda: g06_config()["lr"],
    "g06_cfg_kl": lambda: g06_config()["kl"],
    "g06_lr_ratio": lambda: __import__("posttrain.config", fromlist=["x"]).SFTConfig().optim.lr / g06_config()["lr"],
    "g06_w_beta05_final": lambda: kpi("grpo_sim", "final P(correct)", beta=0.5),
    "g06_w_k2_dead": lambda: kpi("grpo_sim", "groups with no signal, steps 1–40", K=2),
    "g06_w_k2_p40": lambda: kpi("grpo_sim", "P(correct) at step 40", K=2),
    "g06_sync_gain_pts": lambda: 100 * rl22c_gain("sync", "pass@1_gain_mean"),
    "g06_sync_gain_sd_pts": lambda: 100 * rl22c_gain("sync", "pass@1_gain_sd"),
    "g06_sync_samples": lambda: result("async_vs_sync")["samples_per_step"],
    "g06_sync_lr": lambda: result("async_vs_sync")["overrides"][0].split("=")[1],
    "g06_target_acc": lambda: load_config(PipelineConfig, "pipeline", []).sft.target_acc,
    "g06_w_k2_answers": lambda: kpi("grpo_sim", "answers sampled per seed to reach 0.9", K=2),
    "g06_w_k8_answers": lambda: kpi("grpo_sim", "answers sampled per seed to reach 0.9", K=8),
}
