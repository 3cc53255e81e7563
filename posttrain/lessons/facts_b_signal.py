"""Facts of lessons 17–18a (text engineer B), merged into facts_b.FACTS: reward models and search,
verifiers and reward hacking, data curation."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import torch

from posttrain.algorithms import dr_grpo, rloo
from posttrain.data import curate
from posttrain.eval import pass_at_k
from posttrain.lessons import claims
from posttrain.lessons.facts_b_data import kpi, result
from posttrain.lessons.widgets_signal import CURATE_DUPS, CURATE_POOL, CURATE_PROBE, curation_band
from posttrain.tasks import math_answer
from posttrain.tasks.arithmetic import verify
from posttrain.tasks.leaky import (
    LeakyArithmeticConfig,
    LeakyArithmeticTask,
    LeakyProblem,
)

# ---- 17 · ORM, PRM and search ------------------------------------------------------------------

PRM_METHODS = (
    "one sample (pass@1)",
    "majority of N",
    "ORM best of N",
    "PRM best of N",
    "PRM beam",
    "step samples: best-of-N / beam",
)


def rl17_budget_table() -> dict:
    """The prm widget at its default p_good, N and B: the beam at a matched step budget (the
    widget's default) and at the course's budget."""
    return {
        "columns": ["method", "matched budget", "course's beam budget"],
        "rows": [[m, kpi("prm", m, budget="matched"), kpi("prm", m, budget="course")] for m in PRM_METHODS],
    }


def rl17_weak_table() -> dict:
    """Weak steps (p_good 0.5), N 64, beam 8, matched budget."""
    knobs = {"p_good": 0.5, "N": 64, "B": 8, "budget": "matched"}
    return {
        "columns": ["method", "share of problems right"],
        "rows": [[m, kpi("prm", m, **knobs)] for m in PRM_METHODS[:5]],
    }


def rl17_bon_table() -> dict:
    rows = []
    for name, r in result("best_of_n")["runs"].items():
        rows.append(
            [{"sft": "after SFT", "rl": "after RL"}[name]]
            + [
                round(r[k], 3)
                for k in ("eval/pass@1", "eval/maj@8", "eval/best@8", "eval/best@8_ensemble", "eval/pass@8")
            ]
        )
    return {
        "columns": ["policy", "pass@1", "majority of 8", "best of 8 (one RM)", "best of 8 (3-RM ensemble)", "pass@8"],
        "rows": rows,
    }


def _peak() -> str:
    p = claims.overopt_peak()
    return f"{p['true']:.3f} at n = {p['n']} (√KL {p['sqrt_kl']:.2f})" if p else "no peak inside the sweep"


# ---- 18 · environments, verifiers, reward hacking ----------------------------------------------


def rl18_arith_table() -> dict:
    rows = ["12#", "let me think... 5+7=12#", "11#", "120#", "no digits at all", "is it 12? no, 13#"]
    return {"columns": ["response (gold 12)", "reward"], "rows": [[r, verify(r, 12)] for r in rows]}


def rl18_math_table() -> dict:
    gold = r"\frac{1}{2}"
    rows = [r"\boxed{0.5}", "the answer is 1/2", r"\boxed{\frac{2}{4}}", "50%", r"\boxed{0.6}", "I am not sure"]
    return {
        "columns": [f"response (gold {gold}, backend {math_answer.BACKEND})", "reward"],
        "rows": [[r, math_answer.score(r, gold).reward] for r in rows],
    }


def rl18_leak_table() -> dict:
    """One sum (5 + 7) under the two leaks of tasks/leaky.py: the proxy the policy is trained
    on and the true verifier, on the same responses."""
    item = LeakyProblem((5, 7))
    rows = []
    for leak in ("phrase", "contains"):
        task = LeakyArithmeticTask(LeakyArithmeticConfig(leak=leak))
        for resp in ("5+7=12#", "trust me#", "12? no, 13#"):
            c = task.reward(item, resp).components
            rows.append([leak, resp, c["proxy"], c["true"]])
    return {"columns": ["leak", "response", "proxy reward", "true reward"], "rows": rows}


HACK_TOY = {"solve": 0.7, "phrase": 0.4}  # P(correct) of the two actions in lesson 18's widget (course)


# ---- 18a · data: where the gradient is -----------------------------------------------------------


def mean_sq_advantage(p: float, k: int, algo) -> float:
    """E[A_i²] of one sample in a group of K with 0/1 rewards at pass rate p, exactly: one group
    per number of right answers j, the algorithm's own advantages, binomial weights."""
    total = 0.0
    g = torch.zeros(k, dtype=torch.long)
    for j in range(k + 1):
        r = (torch.arange(k) < j).double()
        a = algo.advantages(r, g, algo.Config())
        total += math.comb(k, j) * p**j * (1 - p) ** (k - j) * float((a**2).mean())
    return total


def rl18a_signal_table(k: int = 8) -> dict:
    rows = []
    for p in (0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98):
        rows.append(
            [
                p,
                round(p * (1 - p), 4),
                round(mean_sq_advantage(p, k, dr_grpo), 4),
                round(mean_sq_advantage(p, k, rloo), 4),
                round(p**k + (1 - p) ** k, 3),
            ]
        )
    return {
        "columns": ["pass rate p", "p(1−p)", f"E[A²], A = R − mean (K = {k})", "E[A²], RLOO", "P(group degenerate)"],
        "rows": rows,
    }


def rl18a_degenerate_table() -> dict:
    d = result("claims")["degenerate"]
    return {
        "columns": ["K", "observed", "mean over prompts of p^K + (1−p)^K", "(mean p)^K + (1 − mean p)^K"],
        "rows": [[r["K"], r["observed"], r["predicted_per_prompt"], r["predicted_mean_p"]] for r in d["rows"]],
    }


def rl18a_bucket_table() -> dict:
    band = (0.125, 0.875)
    return {
        "columns": ["pass rate over 8 samples", f"bucket (band {band[0]}–{band[1]})"],
        "rows": [[f"{n}/8", curate.bucket(n / 8, band)] for n in (0, 1, 2, 4, 7, 8)],
    }


def rl18a_curation_table() -> dict:
    c = result("curation")
    keys = [
        ("prompts probed", "prompts"),
        ("samples per prompt K", "k"),
        ("never solved", "bucket/never"),
        ("learnable (in the band)", "bucket/learnable"),
        ("always solved", "bucket/always"),
        ("removed: exact duplicates", "removed/exact_dup"),
        ("removed: out of band", "removed/out_of_band"),
        ("keep rate", "keep_rate"),
        ("groups with signal before", "frac_groups_with_signal_before"),
        ("groups with signal after (the probe's own samples)", "frac_groups_with_signal"),
    ]
    return {
        "columns": ["curate() on the SFT checkpoint", "value"],
        "rows": [[name, round(c[key], 3) if isinstance(c[key], float) else c[key]] for name, key in keys],
    }


FACTS: dict[str, Callable[[], object]] = {
    # 17 · ORM, PRM and search
    "rl17_chain_075": lambda: f"{100 * 0.75**6:.1f}%",
    "rl17_pass1_3_of_16": lambda: round(pass_at_k(16, 3, 1), 4),
    "rl17_pass8_3_of_16": lambda: round(pass_at_k(16, 3, 8), 4),
    "rl17_budget_table": rl17_budget_table,
    "rl17_beam_course": lambda: kpi("prm", "PRM beam", budget="course"),
    "rl17_beam_matched": lambda: kpi("prm", "PRM beam", budget="matched"),
    "rl17_orm": lambda: kpi("prm", "ORM best of N", budget="matched"),
    "rl17_steps_course": lambda: kpi("prm", "step samples: best-of-N / beam", budget="course"),
    "rl17_weak_table": rl17_weak_table,
    "rl17_bon_table": rl17_bon_table,
    "rl17_claim_seeds": lambda: claims.seeds_text("prm"),
    "rl17_claim_pass1": lambda: claims.recorded()["prm"]["accuracy"]["pass@1"],
    "rl17_claim_maj": lambda: claims.recorded()["prm"]["accuracy"]["maj@8"],
    "rl17_claim_orm": lambda: claims.recorded()["prm"]["accuracy"]["orm best@8"],
    "rl17_claim_prm": lambda: claims.recorded()["prm"]["accuracy"]["prm best@8"],
    "rl17_claim_step_acc": lambda: max(claims.recorded()["prm"]["step_accuracy"]["heldout"]),
    "rl17_claim_step_majority": lambda: claims.recorded()["prm"]["step_accuracy"]["majority"],
    "rl17_claim_verdict": lambda: "reproduced" if claims.prm_holds() else "did not reproduce",
    "rl18_claim_seeds": lambda: claims.seeds_text("overoptimization"),
    "rl18_claim_rm_acc": lambda: round(claims.recorded()["overoptimization"]["rm_heldout_pair_acc"]["rm_full"], 2),
    "rl18_claim_true_start": lambda: round(claims.recorded()["overoptimization"]["best_of_n"]["rm_full"][0]["true"], 3),
    "rl18_claim_true_end": lambda: round(claims.recorded()["overoptimization"]["best_of_n"]["rm_full"][-1]["true"], 3),
    "rl18_claim_proxy_end": lambda: round(
        claims.recorded()["overoptimization"]["best_of_n"]["rm_full"][-1]["proxy"], 3
    ),
    "rl18_claim_peak": lambda: _peak(),
    "rl17_bon_problems": lambda: int(result("best_of_n")["command"].split("--problems ")[1].split()[0]),
    # 18 · environments, verifiers, reward hacking
    "rl18_arith_table": rl18_arith_table,
    "rl18_math_table": rl18_math_table,
    "rl18_leak_table": rl18_leak_table,
    "rl18_toy_solve": lambda: HACK_TOY["solve"],
    "rl18_toy_phrase": lambda: HACK_TOY["phrase"],
    "rl18_toy_threshold": lambda: round(HACK_TOY["solve"] - HACK_TOY["phrase"], 2),
    "rl18_toy_phrase_at_05": lambda: round(HACK_TOY["phrase"] + 0.5, 2),
    "rl18_sandbox_p50_ms": lambda: round(1000 * result("verifier_costs")["sandbox_run_p50_s"]),
    "rl18_sandbox_p99_ms": lambda: round(1000 * result("verifier_costs")["sandbox_run_p99_s"]),
    "rl18_code_problems": lambda: result("verifier_costs")["code_problems"],
    "rl18_pool1_s": lambda: round(result("verifier_costs")["code_pool"]["1"]["wall_s"], 1),
    "rl18_pool4_s": lambda: round(result("verifier_costs")["code_pool"]["4"]["wall_s"], 1),
    # 18a · data: where the gradient is
    "rl18a_signal_table": rl18a_signal_table,
    "rl18a_degenerate_table": rl18a_degenerate_table,
    "rl18a_bench_prompts": lambda: result("claims")["degenerate"]["prompts"],
    "rl18a_bench_mean_p": lambda: round(result("claims")["degenerate"]["mean_p"], 3),
    "rl18a_bench_obs_k8": lambda: next(r["observed"] for r in result("claims")["degenerate"]["rows"] if r["K"] == 8),
    "rl18a_bench_naive_k8": lambda: next(
        r["predicted_mean_p"] for r in result("claims")["degenerate"]["rows"] if r["K"] == 8
    ),
    "rl18a_bucket_table": rl18a_bucket_table,
    "rl18a_curation_table": rl18a_curation_table,
    "rl18a_widget_dead_off": lambda: kpi("curation", "rollouts in groups with no signal", curation=0),
    "rl18a_widget_signal_off": lambda: kpi("curation", "expected gradient per 100 rollouts", curation=0),
    "rl18a_widget_pool": lambda: CURATE_POOL + CURATE_DUPS,
    "rl18a_widget_dups": lambda: CURATE_DUPS,
    "rl18a_widget_probe": lambda: CURATE_PROBE,
    "rl18a_widget_probe_se": lambda: math.sqrt(0.25 / CURATE_PROBE),  # binomial SE of a measured ½
    "rl18a_widget_max_band": lambda: "[{:.2f}, {:.2f}]".format(*curation_band(100)),
    "rl18a_fresh_dead_1of8": lambda: (7 / 8) ** 8,  # a fresh group of 8 at p = 1/8 all wrong
    "rl18a_near_threshold": lambda: inspect.signature(curate.curate).parameters["near_threshold"].default,
    "rl18a_ngram": lambda: inspect.signature(curate.curate).parameters["ngram"].default,
    "rl18a_widget_dead_strong": lambda: kpi("curation", "rollouts in groups with no signal", policy=100, curation=0),
    "rl18a_curation_band": lambda: " – ".join(str(b) for b in result("curation")["band"]),
    "rl18a_curation_wall_s": lambda: round(result("curation")["wall_s"], 1),
    "rl18a_pass_by_terms": lambda: ", ".join(
        f"{t} terms {v:.2f}" for t, v in result("curation")["pass_rate_by_terms"].items()
    ),
}
