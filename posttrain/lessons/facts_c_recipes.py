"""Facts of lessons 23, 26 and 27: recipes and the report's alarms, the three forces, and the
gaps posttrain closes (GAE, KL estimators, truncated IS, LoRA)."""

from __future__ import annotations

from collections.abc import Callable

from posttrain import report as rp
from posttrain.algorithms import core
from posttrain.algorithms.ppo import gae
from posttrain.lessons import claims
from posttrain.lessons.facts_c_common import GIB, kpi, result, table
from posttrain.lessons.widgets_forces import leak, recipe
from posttrain.lessons.widgets_practice import MODES
from posttrain.sizing import memory, shapes

# ---- 23 · recipes and how runs fail -----------------------------------------------------------


def _default(fn, arg: str):
    import inspect

    return inspect.signature(fn).parameters[arg].default


def rl23_alarm_table() -> dict:
    """posttrain.report's alarms with their thresholds, read from the functions themselves."""

    return table(
        ["alarm", "reads", "fires when (the last quarter of the run)"],
        [
            [
                "reward up, held-out flat",
                "reward/mean, eval/pass@1",
                (
                    f"train reward rose ≥ {_default(rp.reward_up_heldout_flat, 'rise')} while held-out pass@1 moved "
                    f"< {_default(rp.reward_up_heldout_flat, 'flat')}"
                ),
            ],
            ["entropy collapse", "entropy", f"entropy < {_default(rp.entropy_collapse, 'frac'):.0%} of its start"],
            ["clip fraction high", "clip/frac", f"clip/frac > {_default(rp.clip_fraction_high, 'limit')}"],
            [
                "length blow-up",
                "length/mean, length/truncated_frac",
                (
                    f"mean length ×{_default(rp.length_blowup, 'growth'):g} or > "
                    f"{_default(rp.length_blowup, 'truncated_limit'):.0%} of responses hit the cap"
                ),
            ],
            [
                "sampler/trainer mismatch",
                "mismatch/logprob_abs",
                f"> {_default(rp.mismatch_high, 'limit')} nats per token at any step",
            ],
            [
                "many degenerate groups",
                "group/degenerate_frac",
                f"> {_default(rp.degenerate_groups, 'limit'):.0%} of groups",
            ],
        ],
    )


def rl23_real_runs_table() -> dict:
    """report.alarms on posttrain's own 100-step GRPO runs (benchmarks/results/claims.json), each
    summarised by the means of its first and last 10 steps and its held-out pass@1 at both ends."""

    label = {
        "length_grpo": "GRPO",
        "length_dr_grpo": "Dr. GRPO",
        "clip_0.2": "GRPO, 4 updates per batch",
        "clip_0.28": "the same, ε_high = 0.28",
        "group_2": "GRPO, K = 2, strong start",
        "group_8": "GRPO, K = 8, strong start",
    }
    rows = []
    for kind in ("length", "clip", "group"):
        for run in result("claims")[kind]:
            series = [{"step": 0, "eval/pass@1": run["pass@1_start"]}]
            for i, when in enumerate(("first10", "last10")):
                series.append(
                    {
                        "step": i + 1,
                        "eval/pass@1": run["pass@1_start" if i == 0 else "pass@1_end"],
                        **{
                            k: run[f"{k}_{when}"]
                            for k in ("reward/mean", "entropy", "clip/frac", "group/degenerate_frac")
                        },
                    }
                )
            fired = rp.alarms(series)
            rows.append(
                [
                    label[run["run"]],
                    f"{run['reward/mean_first10']:.2f} → {run['reward/mean_last10']:.2f}",
                    f"{run['pass@1_start']:.3f} → {run['pass@1_end']:.3f}",
                    f"{run['group/degenerate_frac_first10']:.2f} → {run['group/degenerate_frac_last10']:.2f}",
                    ", ".join(a.name for a in fired) or "none",
                ]
            )
    return table(["run (100 steps)", "train reward", "held-out pass@1", "degenerate groups", "alarms fired"], rows)


def rl23_modes_table() -> dict:
    """The failures widget at severity 1 for each mode: which alarms its metrics fire."""

    return table(
        ["what goes wrong (severity 1)", "alarms fired"],
        [[m, kpi("failures", "alarms fired", mode=m, severity=1.0)] for m in MODES],
    )


PAPERS = [  # (recipe, reward, data, baseline, turns): the classify widget's four questions
    ("InstructGPT's RL stage", "reward model", "on-policy (samples its own answers)", "learned critic", "single turn"),
    ("DeepSeek-R1-Zero", "verifier", "on-policy (samples its own answers)", "group mean", "single turn"),
    ("Tülu 3's DPO stage", "preference pairs", "off-policy (a fixed dataset)", "none", "single turn"),
    ("RLOO on a reward model", "reward model", "on-policy (samples its own answers)", "leave-one-out", "single turn"),
    (
        "a tool-using agent with a verifier",
        "verifier",
        "on-policy (samples its own answers)",
        "group mean",
        "multi-turn with tools",
    ),
]


def rl23_classify_table() -> dict:
    """The classify widget's answers for a few known recipes."""
    rows = []
    for name, reward, data, baseline, turns in PAPERS:
        k = {
            lab: kpi("classify", lab, reward=reward, data=data, baseline=baseline, turns=turns)
            for lab in ("algorithm family", "reward label", "roles it needs")
        }
        rows.append([name, k["algorithm family"], k["reward label"], k["roles it needs"]])
    return table(["recipe", "algorithm family", "reward label", "roles it needs (memory.ROLES)"], rows)


# ---- 26 · why recipes look the way they do ----------------------------------------------------


def rl26_cost_table() -> dict:
    """The cost force in numbers (sizing/memory.py, sizing/shapes.py): training vs serving the course's round sizes."""

    rows = []
    for b in (7, 70, 405):
        s = shapes.course_shape(b)
        p = shapes.count_params(s)
        train = memory.train_bytes_per_param() * p
        rows.append(
            [
                f"{b}B",
                f"{train / GIB:,.0f} GiB",
                memory.min_gpus(train),
                f"{2 * p / GIB:,.0f} GiB",
                f"{shapes.kv_bytes_per_token(s) / 1024:.0f} KiB",
            ]
        )
    return table(
        [
            "model",
            "training state (18 B/param)",
            "H100s to hold it (whole 8-GPU nodes past 8)",
            "bf16 weights to serve",
            "KV cache per token",
        ],
        rows,
    )


FORCE_SETTINGS = [(100, 0, 32), (100, 50, 32), (100, 50, 8), (100, 100, 512), (60, 50, 64), (20, 50, 8), (20, 50, 1)]


def memory_ratio() -> float:
    """Training state over serving weights, per parameter: 18 B / 2 B."""

    return memory.train_bytes_per_param() / 2


def rl26_extremes_table() -> dict:
    """The forces widget's rules (widgets_forces.recipe and .leak, the course's decision table) at a
    few corners of its map; the widget's training run behind them is not repeated here."""

    rows = []
    for sig, bias, cost in FORCE_SETTINGS:
        reward, algo, topo, named = recipe(sig, bias, cost)
        rows.append([f"{sig}%", f"{bias}%", cost, reward, algo, topo, named, f"{leak(sig):g}"])
    return table(
        [
            "verifiable signal",
            "bias tolerance",
            "GPUs",
            "reward",
            "algorithm",
            "topology",
            "closest recipe",
            "reward leak ρ",
        ],
        rows,
    )


# ---- 27 · concepts the course leaves out -----------------------------------------------------


def rl27_kl_table() -> dict:
    """k1, k2, k3 (core.kl) on 4,096 tokens sampled from π_θ, against the exact KL(π_θ ‖ π_ref)
    of two 16-token categoricals (π_ref's logits shifted by 0.5 × a ramp)."""
    import torch

    base = torch.linspace(-1.5, 1.5, 16, dtype=torch.float64)
    lp, lr = (
        torch.log_softmax(base, -1),
        torch.log_softmax(base + 0.5 * torch.linspace(-1, 1, 16, dtype=torch.float64), -1),
    )
    exact = float((lp.exp() * (lp - lr)).sum())
    y = torch.multinomial(lp.exp(), 4096, replacement=True, generator=torch.Generator().manual_seed(0))
    rows = []
    for k in core.KL_ESTIMATORS:
        est = core.kl(lp[y], lr[y], k)  # [4096]
        rows.append(
            [k, f"{float(est.mean()):.4f}", f"{float(est.std()):.4f}", f"{float((est < 0).double().mean()):.0%}"]
        )
    return table(["estimator", f"mean (exact KL = {exact:.4f})", "std per token", "tokens < 0"], rows)


def rl27_gae_table() -> dict:
    """ppo.gae on one 5-token response with an outcome reward of 1 on its last token and a critic's
    values V = (0.2, 0.4, 0.5, 0.7, 0.9), γ = 1, for three λ."""
    import torch

    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.2, 0.4, 0.5, 0.7, 0.9]], dtype=torch.float64)
    mask = torch.ones_like(rewards)
    rows = []
    for lam in (0.0, 0.95, 1.0):
        adv, _ = gae(rewards, values, mask, gamma=1.0, lam=lam)
        rows.append([lam, *[f"{float(a):+.3f}" for a in adv[0]]])
    return table(["λ", *[f"A at token {t + 1}" for t in range(5)]], rows)


def rl27_gaps_table() -> dict:
    """The gaps widget, fix on and off, for four of the gaps posttrain closed (the cheap ones)."""
    rows = []
    for g in ("kl", "whiten", "offpolicy", "lora"):
        k = {lab: kpi("gaps", lab, gap=g) for lab in ("gap", "measured", "with the fix", "without the fix")}
        rows.append([k["gap"], k["measured"], k["with the fix"], k["without the fix"]])
    return table(["gap", "what is measured", "posttrain's fix on", "fix off"], rows)


def rl27_lora() -> dict:

    s = shapes.resolve_model("llama-7b")
    run = result("lora_memory")
    return {
        "params": shapes.lora_params(s, 16),
        "frac": shapes.lora_params(s, 16) / shapes.count_params(s),
        "opt_ratio": run["full"]["optimizer_state_bytes"] / run["lora"]["optimizer_state_bytes"],
        "measured_frac": run["lora"]["trainable"] / run["lora"]["total"],
    }


def rl27_precision_table() -> dict:
    """The precision lab (lessons/data/claims.json): a bf16/fp16/fp32 sampler against an fp32 trainer."""
    e = claims.recorded()["precision"]
    learn = {(r["format"], r["correction"]): r["pass@1_end"] for r in e["learning"]}
    cell = lambda fmt, c: round(learn[fmt, c], 3) if (fmt, c) in learn else "—"
    return {
        "columns": [
            "sampler",
            "mean |δ| per token",
            "largest |δ|",
            "PPO clip fraction (ε 0.2)",
            "tokens TIS caps / the mask drops",
            "held-out pass@1 after 20 steps: none / TIS / mask",
        ],
        "rows": [
            [
                fmt,
                f"{v['delta_abs_mean']:.1e}",
                f"{v['delta_abs_max']:.2g}",
                f"{v['clip_frac_eps0.2']:.1e}" if v["clip_frac_eps0.2"] else "0",
                f"{v['tis_capped_frac']:.2g} / {v['mask_dropped_frac']:.2g}",
                " / ".join(str(cell(fmt, c)) for c in ("none", "tis", "mask")),
            ]
            for fmt, v in e["mismatch"].items()
        ],
    }


FACTS: dict[str, Callable[[], object]] = {
    "rl23_alarm_table": rl23_alarm_table,
    "rl23_real_runs_table": rl23_real_runs_table,
    "rl23_modes_table": rl23_modes_table,
    "rl23_classify_table": rl23_classify_table,
    "rl23_classify_break": lambda: kpi(
        "classify", "consistent?", reward="preference pairs", data="on-policy (samples its own answers)"
    ),
    "rl26_cost_table": rl26_cost_table,
    "rl26_extremes_table": rl26_extremes_table,
    "rl26_train_over_serve": lambda: memory_ratio(),
    "rl27_kl_table": rl27_kl_table,
    "rl27_gaps_table": rl27_gaps_table,
    "rl27_gae_table": rl27_gae_table,
    "rl27_lora_params": lambda: rl27_lora()["params"],
    "rl27_lora_pct": lambda: 100 * rl27_lora()["frac"],
    "rl27_lora_measured_pct": lambda: 100 * rl27_lora()["measured_frac"],
    "rl27_lora_opt_ratio": lambda: rl27_lora()["opt_ratio"],
    "rl27_w_bias_none16": lambda: kpi("off_policy", "bias", delta=16, mode="none"),
    "rl27_w_bias_tis16": lambda: kpi("off_policy", "bias", delta=16, mode="tis"),
    "rl27_w_capped_tis16": lambda: kpi("off_policy", "capped / masked tokens", delta=16, mode="tis"),
    "rl27_w_bias_tis16_c10": lambda: kpi("off_policy", "bias", delta=16, mode="tis", cap=10.0),
    "rl27_w_sd_tis16_c10": lambda: kpi("off_policy", "std over 200 batches", delta=16, mode="tis", cap=10.0),
    "rl27_w_sd_tis16": lambda: kpi("off_policy", "std over 200 batches", delta=16, mode="tis"),
    "rl27_precision_table": rl27_precision_table,
    "rl27_claim_bf16_max": lambda: claims.recorded()["precision"]["mismatch"]["bf16"]["delta_abs_max"],
    "rl27_claim_capped": lambda: (
        f"{max(max(v['tis_capped_frac'], v['mask_dropped_frac']) for v in claims.recorded()['precision']['mismatch'].values()):.2g}"
    ),
}
