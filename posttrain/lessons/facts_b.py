"""Numbers quoted in the text of lessons 13–22 (text engineer B), each computed by posttrain's own
functions or read from a committed JSON, so a page cannot drift from the code it describes.

`FACTS = {name: function}`: a function takes no argument and returns a number, a short string, or a
table {"columns": [...], "rows": [[...], ...]} (lessons/facts.py has the contract). Names start with
their lesson's number. Nothing here trains; the recorded runs are read from lessons/data/runs.json
and benchmarks/results/*.json.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch

from posttrain.algorithms import dapo, grpo
from posttrain.lessons import dapo_toy, runs

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _result(name: str):
    return json.loads((RESULTS / f"{name}.json").read_text())


def _t(*xs) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


# ---- 13 · DAPO ---------------------------------------------------------------------------------

def p_degenerate_exact(p: float, k: int) -> float:
    """P(all K rewards equal), exactly: one group per possible number of right answers j = 0..K,
    asked to dapo.degenerate, weighted by the binomial probability C(K, j) p^j (1−p)^(K−j)."""
    j = torch.arange(k + 1)
    rewards = (torch.arange(k).unsqueeze(0) < j.unsqueeze(1)).double()                       # [K+1, K]
    dead = dapo.degenerate(rewards.reshape(-1), j.repeat_interleave(k)).view(k + 1, k)[:, 0]  # [K+1]
    weight = torch.tensor([math.comb(k, int(n)) * p ** int(n) * (1 - p) ** (k - int(n)) for n in j], dtype=torch.float64)
    return round(float((weight * dead).sum()), 4)


def rl13_degenerate_table() -> dict:
    ps, ks = (0.5, 0.7, 0.9, 0.95), (4, 8, 16)
    return {"columns": ["accuracy p"] + [f"groups with signal, K = {k}" for k in ks],
            "rows": [[p] + [round(1 - p_degenerate_exact(p, k), 3) for k in ks] for p in ps]}


def rl13_overlong_table() -> dict:
    """The paper's setting: cap 20,480 tokens, buffer 4,096 (the ramp starts at 16,384)."""
    lengths = _t(8000, 16384, 17408, 18432, 19456, 20480)
    pen = dapo.overlong_penalty(lengths, 20480, 4096)
    return {"columns": ["response length |y|", "reward added"],
            "rows": [[int(n), round(float(v), 2) + 0.0] for n, v in zip(lengths, pen)]}


ABLATION = [("all four on", (1, 1, 1, 1)), ("① clip-higher off", (0, 1, 1, 1)),
            ("② dynamic sampling off", (1, 0, 1, 1)), ("③ token-level loss off", (1, 1, 0, 1)),
            ("④ overlong shaping off", (1, 1, 1, 0)), ("all four off (GRPO)", (0, 0, 0, 0))]


def _ablation(switches) -> dict:
    return runs.recorded()[dapo_toy.key(*map(bool, switches))]


def rl13_ablation_table() -> dict:
    rows = []
    for name, sw in ABLATION:
        r = _ablation(sw)
        rows.append([name, round(r["acc"][-1], 3), round(sum(r["useful"]) / len(r["useful"]), 3),
                     int(r["samples"][-1]), round(r["entropy"][-1], 3)])
    return {"columns": ["setting", f"accuracy at step {dapo_toy.STEPS}", "groups with signal per batch",
                        "responses sampled", "final entropy"], "rows": rows}


def _equal_compute() -> tuple[int, float, float]:
    """(step, accuracy) of the all-on run when it has sampled as many responses as the run
    without dynamic sampling samples in all its steps, and that run's final accuracy."""
    on, off = _ablation((1, 1, 1, 1)), _ablation((1, 0, 1, 1))
    budget = off["samples"][-1]
    i = next(i for i, n in enumerate(on["samples"]) if n >= budget)
    return on["step"][i], on["acc"][i], off["acc"][-1]


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
    "rl13_ablation_useful_off": lambda: round(sum(_ablation((1, 0, 1, 1))["useful"]) / len(_ablation((1, 0, 1, 1))["useful"]), 2),
    "rl13_acc_all_on": lambda: round(_ablation((1, 1, 1, 1))["acc"][-1], 3),
    "rl13_acc_no_dynamic": lambda: round(_ablation((1, 0, 1, 1))["acc"][-1], 3),
    "rl13_samples_all_on": lambda: int(_ablation((1, 1, 1, 1))["samples"][-1]),
    "rl13_samples_no_dynamic": lambda: int(_ablation((1, 0, 1, 1))["samples"][-1]),
    "rl13_sample_ratio": lambda: round(_ablation((1, 1, 1, 1))["samples"][-1] / _ablation((1, 0, 1, 1))["samples"][-1], 1),
    "rl13_equal_compute_step": lambda: _equal_compute()[0],
    "rl13_other_switches_spread": lambda: round(max(abs(_ablation(sw)["acc"][-1] - _ablation((1, 1, 1, 1))["acc"][-1])
                                              for sw in ((0, 1, 1, 1), (1, 1, 0, 1), (1, 1, 1, 0))), 3),
    "rl13_equal_compute_acc": lambda: round(_equal_compute()[1], 3),
    "rl13_bench_degenerate_k4": lambda: next(r["observed"] for r in _result("claims")["degenerate"]["rows"] if r["K"] == 4),
    "rl13_bench_mean_p": lambda: round(_result("claims")["degenerate"]["mean_p"], 2),
}
