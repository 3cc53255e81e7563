"""Facts of lessons 22a and 22b: the throughput equation and long-tail rollouts (sizing/throughput.py,
the engine, committed runs). Lessons 22c and 28 (async staleness, where optimisation pays) are in
facts_c_async."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

from posttrain.algorithms.dapo import overlong_penalty
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.lessons.facts_b_hw import h100_run
from posttrain.lessons.facts_c_common import kpi, result, table
from posttrain.lessons.widgets_scale import p95
from posttrain.models.gpt_mini import GPTMini, ModelConfig
from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
from posttrain.sizing import throughput as tp

# ---- 22a · the throughput equation -------------------------------------------------------------

WORKED = {"rollout_s": 30, "reward_s": 1, "reference_s": 3, "train_s": 8, "sync_s": 1}  # the lesson's example
WORKED_TOKENS = 64 * 16 * 1024  # B·K·L̄


def rl22a_worked(topology: str = "one_step_off", **kw) -> dict:
    """The worked example's role times as those of two equal pools; every topology on the same GPUs
    (colocated runs each phase on both pools: throughput.compare_topologies)."""
    return tp.compare_topologies(**WORKED, **kw)[topology]


def rl22a_worked_table() -> dict:
    rows = []
    for t in tp.TOPOLOGIES:
        r = rl22a_worked(t)
        rows.append(
            [
                t,
                tp.STALENESS[t],
                f"{r['step_s']:g} s",
                r["bottleneck"],
                f"{r['idle_s']['trainer']:g} s",
                f"{tp.useful_tokens_per_s(64, 16, 1024, r['step_s']) / 1000:.1f}k",
            ]
        )
    return table(
        ["topology", "samples", "τ_step on the same GPUs", "bottleneck", "trainer idle per step", "useful tokens/s"],
        rows,
    )


SIDE = {
    "rollout": "rollout side",
    "reward": "rollout side",
    "reference": "trainer side",
    "train": "trainer side",
    "sync": "between the two",
}


def rl22a_role_table() -> dict:
    """The role model at its defaults (7B, K = 16, L = 1024, disaggregated)."""
    m = tp.role_model()
    return table(
        ["role", "runs on", "seconds"],
        [[k, SIDE[k], f"{v:.1f}"] for k, v in m["terms"].items()]
        + [["τ_step = max(rollout side, trainer side) + sync", "", f"{m['step_s']:.1f}"]],
    )


def rl22a_length_table() -> dict:
    rows = []
    for L in (256, 1024, 4096, 8192):
        m = tp.role_model(response_len=L)
        rows.append(
            [
                L,
                f"{1 + 1.8 * math.tanh(L / 2048):.2f}",
                f"{m['terms']['rollout']:.1f} s",
                f"{m['step_s']:.1f} s",
                f"{100 * m['terms']['rollout'] / m['step_s']:.0f}%",
                f"{m['idle_s']['trainer']:.1f} s",
            ]
        )
    return table(["response length L", "tail factor", "τ_R", "τ_step", "rollout share", "trainer idle"], rows)


def rl22a_colo_gain() -> float:
    """How much more useful tokens/s colocation gives on the same 8 GPUs at the role model's
    defaults (one step off on 4 + 4), in %."""
    colo, split = tp.role_model(topology="colocated"), tp.role_model()
    return 100 * (colo["useful_tokens_per_s"] / split["useful_tokens_per_s"] - 1)


def rl22a_k_doubling() -> dict:
    a, b = tp.role_model(k=16), tp.role_model(k=32)
    return {"rollout_ratio": b["terms"]["rollout"] / a["terms"]["rollout"], "step_ratio": b["step_s"] / a["step_s"]}


def rl22a_cpu_roles() -> dict:
    """Mean role times of a real posttrain run (benchmarks/async_vs_sync.json, sync, seed 0:
    GRPO on gpt_mini nano, 128 samples a step, one CPU thread), read through step_time."""
    run = next(r for r in result("async_vs_sync")["runs"] if r["run"] == "sync" and r["seed"] == 0)
    return tp.step_time(**run["roles_s"], topology="colocated")


def rl22a_cpu_measured_s() -> float:
    run = next(r for r in result("async_vs_sync")["runs"] if r["run"] == "sync" and r["seed"] == 0)
    return run["mean time/step_s"]


def rl22a_cpu_table() -> dict:
    r = rl22a_cpu_roles()
    return table(
        ["role", "seconds per step", "share"],
        [[k, f"{v:.3f}", f"{100 * r['shares'][k]:.1f}%"] for k, v in r["terms"].items()],
    )


def rl22a_h100_roles() -> dict:
    """The same accounting on one H100 (this project's run; lessons/data/h100_run.json): the last
    GRPO step's timers through throughput.from_metrics, colocated as it ran and, by the equation,
    split over two such GPUs one step off, or colocated on the same two (phases ∝ 1/GPUs)."""
    timers = h100_run()["grpo"]["timers"]
    roles = tp.from_metrics(timers)
    return {
        "colocated": tp.step_time(**roles, topology="colocated"),
        "one_step_off": tp.step_time(**roles, topology="one_step_off"),
        "colocated_2gpu": tp.compare_topologies(**roles)["colocated"],  # each phase on both GPUs
        "measured_s": timers["time/step_s"],
    }


def rl22a_h100_table() -> dict:
    r = rl22a_h100_roles()["colocated"]
    return table(
        ["role", "seconds per step", "share"],
        [[k, f"{v:.2f}", f"{100 * r['shares'][k]:.1f}%"] for k, v in r["terms"].items()],
    )


# ---- 22b · long-tail rollouts -------------------------------------------------------------------

CVS = (0.5, 1.0, 2.0)


def rl22b_maxk_table() -> dict:
    """E[longest of K]/mean, exact (throughput.max_of_k) against the √(2 ln K) shortcut."""
    return table(
        ["K", *[f"cv = {c}" for c in CVS], *[f"shortcut, cv = {c}" for c in CVS]],
        [
            [k, *[f"{tp.max_of_k(k, c):.2f}" for c in CVS], *[f"{tp.max_of_k_envelope(k, c):.2f}" for c in CVS]]
            for k in (4, 16, 64, 256)
        ],
    )


def rl22b_k32_pct(cv: float) -> float:
    return 100 * (tp.max_of_k(32, cv) / tp.max_of_k(16, cv) - 1)


def rl22b_course_p95_is_max_k() -> int:
    """The largest K for which the course's p95 rule, sorted[floor(0.95·K)], picks the maximum
    (widgets_scale.p95 with rule="course", on K distinct lengths)."""
    return max(k for k in range(1, 200) if p95(list(range(k)), "course") == k - 1)


def rl22b_tail_table() -> dict:
    """Log-normal lengths of mean μ and CV c: σ = √ln(1 + c²); the 95th percentile is
    μ·exp(1.645σ − σ²/2), and the longest 5% hold a share Φ(σ − 1.645) of all decoded tokens."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.95)
    rows = []
    for c in CVS:
        s = math.sqrt(math.log1p(c * c))
        rows.append([c, f"{s:.2f}", f"{math.exp(z * s - s * s / 2):.2f} μ", f"{100 * NormalDist().cdf(s - z):.0f}%"])
    return table(["cv", "σ of ln L", "95th percentile", "tokens in the longest 5%"], rows)


@lru_cache(maxsize=1)
def rl22b_cutoff() -> dict:
    """posttrain's engine on a random tiny gpt_mini (its lengths are long-tailed): 8 prompts,
    8 samples each, against 12 started and the first 8 of each group to finish kept
    (Engine.generate(keep=8), the `overprovision` straggler cut-off), cap 128 tokens."""
    import torch

    tok = CharTokenizer(BASE_CHARS)
    torch.manual_seed(0)
    model = GPTMini(
        ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=160).resolved(tok.vocab_size)
    ).eval()
    prompts = [tok.encode(f"<{i}+{2 * i + 1}>") for i in range(8)]
    out = {}
    for name, n, keep in (("all", 8, None), ("cut", 12, 8)):
        eng = Engine(model, tok, max_slots=256)
        samples = eng.generate(prompts, n, SamplingParams(max_new_tokens=128), seed=0, keep=keep)
        lengths = [len(s.response_ids) for s in samples]
        out[name] = {
            "steps": eng.stats["rollout/decode_steps"],
            "tokens": eng.stats["rollout/generated_tokens"],
            "kept": len(samples),
            "mean": sum(lengths) / len(lengths),
            "longest": max(lengths),
            "capped": sum(s.finish_reason == "length" for s in samples),
            "cancelled": eng.stats["rollout/cancelled"],
        }
    return out


def rl22b_cutoff_table() -> dict:
    c = rl22b_cutoff()
    label = {"all": "start 8 per prompt, keep all", "cut": "start 12 per prompt, keep the first 8"}
    return table(
        [
            "rollout",
            "decode steps (wall)",
            "tokens decoded",
            "samples kept",
            "mean kept length",
            "kept samples cut by the cap",
        ],
        [[label[k], v["steps"], v["tokens"], v["kept"], f"{v['mean']:.1f}", v["capped"]] for k, v in c.items()],
    )


def rl22b_overlong_table() -> dict:
    import torch

    lengths = torch.tensor([50.0, 80.0, 90.0, 100.0, 110.0])
    pen = overlong_penalty(lengths, max_len=100, buffer=20)
    return table(
        ["response length", "penalty (L_max = 100, buffer 20)"],
        [[int(a), f"{float(b) + 0.0:+.2f}"] for a, b in zip(lengths, pen)],
    )


FACTS: dict[str, Callable[[], object]] = {
    "rl22a_worked_table": rl22a_worked_table,
    "rl22a_worked_split_s": lambda: rl22a_worked()["step_s"],
    "rl22a_worked_onpolicy_s": lambda: rl22a_worked("disaggregated")["step_s"],
    "rl22a_worked_colo_s": lambda: rl22a_worked("colocated")["step_s"],
    "rl22a_worked_colo_pool_s": lambda: tp.step_time(**WORKED, topology="colocated")["step_s"],  # on one pool
    "rl22a_worked_colo_tail_s": lambda: rl22a_worked("colocated", rollout_parallel=0.0)["step_s"],
    "rl22a_worked_idle_s": lambda: rl22a_worked()["idle_s"]["trainer"],
    "rl22a_worked_tok_s": lambda: tp.useful_tokens_per_s(64, 16, 1024, rl22a_worked()["step_s"]),
    "rl22a_worked_tokens": lambda: WORKED_TOKENS,
    "rl22a_role_table": rl22a_role_table,
    "rl22a_rollout_share": lambda: 100 * tp.role_model()["shares"]["rollout"],
    "rl22a_length_table": rl22a_length_table,
    "rl22a_share_8192": lambda: 100 * tp.role_model(response_len=8192)["shares"]["rollout"],
    "rl22a_colo_gain_pct": rl22a_colo_gain,
    "rl22a_side_ratio": lambda: (lambda t: (t["rollout"] + t["reward"]) / (t["reference"] + t["train"]))(
        tp.role_model()["terms"]
    ),
    "rl22a_k32_rollout_ratio": lambda: rl22a_k_doubling()["rollout_ratio"],
    "rl22a_k32_step_ratio": lambda: rl22a_k_doubling()["step_ratio"],
    "rl22a_sync_70b_s": lambda: tp.role_model(params_b=70, topology="async")["terms"]["sync"],
    "rl22a_cpu_table": rl22a_cpu_table,
    "rl22a_cpu_bottleneck": lambda: rl22a_cpu_roles()["bottleneck"],
    "rl22a_cpu_train_share": lambda: 100 * rl22a_cpu_roles()["shares"]["train"],
    "rl22a_cpu_rollout_share": lambda: 100 * rl22a_cpu_roles()["shares"]["rollout"],
    "rl22a_cpu_equation_s": lambda: rl22a_cpu_roles()["step_s"],
    "rl22a_cpu_measured_s": rl22a_cpu_measured_s,
    "rl22a_6p_1m_4gpu_s": lambda: round(tp.train_time_s(1e6, 7e9, gpus=4), 1),  # lesson 22's ceiling
    "rl22a_h100_table": rl22a_h100_table,
    "rl22a_h100_equation_s": lambda: rl22a_h100_roles()["colocated"]["step_s"],
    "rl22a_h100_measured_s": lambda: rl22a_h100_roles()["measured_s"],
    "rl22a_h100_bottleneck": lambda: rl22a_h100_roles()["colocated"]["bottleneck"],
    "rl22a_h100_split_s": lambda: rl22a_h100_roles()["one_step_off"]["step_s"],
    "rl22a_h100_colo2_s": lambda: rl22a_h100_roles()["colocated_2gpu"]["step_s"],
    "rl22a_default_rollout_s": lambda: tp.role_model()["terms"]["rollout"],
    "rl22a_default_step_s": lambda: tp.role_model()["step_s"],
    "rl22b_maxk_table": rl22b_maxk_table,
    "rl22b_maxk_16_1": lambda: tp.max_of_k(16, 1.0),
    "rl22b_envelope_16_1": lambda: tp.max_of_k_envelope(16, 1.0),
    "rl22b_envelope_16_1_high_pct": lambda: 100 * (tp.max_of_k_envelope(16, 1.0) / tp.max_of_k(16, 1.0) - 1),
    "rl22b_course_p95_is_max_k": rl22b_course_p95_is_max_k,
    "rl22b_k32_c05_pct": lambda: rl22b_k32_pct(0.5),
    "rl22b_k32_c1_pct": lambda: rl22b_k32_pct(1.0),
    "rl22b_k32_c2_pct": lambda: rl22b_k32_pct(2.0),
    "rl22b_tail_table": rl22b_tail_table,
    "rl22b_cutoff_table": rl22b_cutoff_table,
    "rl22b_cutoff_steps_all": lambda: rl22b_cutoff()["all"]["steps"],
    "rl22b_cutoff_steps_cut": lambda: rl22b_cutoff()["cut"]["steps"],
    "rl22b_cutoff_tokens_all": lambda: rl22b_cutoff()["all"]["tokens"],
    "rl22b_cutoff_tokens_cut": lambda: rl22b_cutoff()["cut"]["tokens"],
    "rl22b_cutoff_mean_all": lambda: rl22b_cutoff()["all"]["mean"],
    "rl22b_cutoff_mean_cut": lambda: rl22b_cutoff()["cut"]["mean"],
    "rl22b_overlong_table": rl22b_overlong_table,
    "rl22b_w_cap_tax": lambda: kpi("stragglers", "straggler tax max/mean − 1", cap=True),
    "rl22b_w_capdyn_tax": lambda: kpi("stragglers", "straggler tax max/mean − 1", cap=True, dynk=True),
    "rl22b_w_capdyn_saved": lambda: kpi("stragglers", "decode saved", cap=True, dynk=True),
    "rl22b_w_course_tax": lambda: kpi("stragglers", "straggler tax max/mean − 1", cap=True, rule="course"),
    "rl22b_w_cv2_tax": lambda: kpi("stragglers", "straggler tax max/mean − 1", cv=2.0),
    "rl22b_w_cv2_longest": lambda: kpi("stragglers", "τ_R = longest response", cv=2.0),
}
