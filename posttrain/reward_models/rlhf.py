"""RLHF: a frozen reward model as the reward of any RL algorithm, the verifier logged beside it.

    posttrain rl configs/grpo_arith.yaml reward_model=runs/rm [algo.kl_coef=0.001]

`RewardModelTask` wraps a task: items, prompts and gold answers are the task's; the reward
the algorithm sees is the RM's score (the proxy), computed for a whole rollout batch in a
few forwards (`reward_batch`, which tasks/base.score_samples prefers when a task has it).
The task's own verifier scores the same samples, so every step logs

    reward/proxy   mean RM score            what the policy is pushed up on
    reward/true    mean verifier reward     what we actually want

next to `kl/ref`. Optimising a proxy drives the two apart (Gao, Schulman & Hilton 2023,
"Scaling Laws for Reward Model Overoptimization", 2210.10760): the proxy keeps rising while
the true reward peaks and falls as the KL from the start grows. `write_curve` saves that
curve (step, kl, proxy, true) as CSV and JSON in the run directory with the KL at which
the true reward turned.

Deviations: the held-out evaluation (`eval/pass@1` …) always uses the verifier, never the
RM; a verifier error on a sample is kept as that sample's error (the proxy still rewards it).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from posttrain.tasks.base import RewardResult, safe_reward


class RewardModelTask:
    """The wrapped task with the reward replaced by `scorer.score(prompts, responses)`."""

    def __init__(self, task, scorer):
        self.task, self.scorer = task, scorer
        self.name = f"reward_model/{task.name}"

    def items(self, n, split="train", seed=0):
        return self.task.items(n, split, seed)

    def prompt(self, item):
        return self.task.prompt(item)

    def gold(self, item):
        return self.task.gold(item)

    def reward(self, item, response: str) -> RewardResult:
        return self.reward_batch([item], [response])[0]

    def reward_batch(self, items, responses: list[str]) -> list[RewardResult]:
        """One RM pass over the whole batch; the verifier on each sample for `true`."""
        proxy = self.scorer.score([self.task.prompt(it) for it in items], responses)  # [N] floats
        out = []
        for it, text, p in zip(items, responses, proxy):
            true = safe_reward(self.task, it, text)
            out.append(RewardResult(float(p), {"proxy": float(p), "true": float(true.reward)}, true.error))
        return out


def curve(metrics: list[dict]) -> list[dict]:
    """(step, kl, proxy, true, seq_kl) rows of the training steps that logged all three; seq_kl is the
    per-token KL times the mean response length, the sequence-level KL whose root Gao et al. plot on x."""
    keys = ("kl/ref", "reward/proxy", "reward/true")
    return [
        {
            "step": m["step"],
            "kl": m["kl/ref"],
            "proxy": m["reward/proxy"],
            "true": m["reward/true"],
            "seq_kl": m["kl/ref"] * m.get("length/mean", 1.0),
        }  # per-token mean × tokens ≈ KL of a response
        for m in metrics
        if m.get("step", 0) > 0 and all(k in m for k in keys)
    ]


def turn(rows: list[dict], window: int = 5) -> dict:
    """Where the true reward peaked: the row whose `window`-step running mean of `true` is
    highest (the raw per-step reward is noisy), and how far the proxy rose after it."""
    if not rows:
        return {}
    smooth = [
        sum(r["true"] for r in rows[max(0, i - window + 1) : i + 1]) / min(i + 1, window) for i in range(len(rows))
    ]
    i = max(range(len(rows)), key=smooth.__getitem__)
    after = rows[i:]
    return {
        "peak_step": rows[i]["step"],
        "peak_kl": rows[i]["kl"],
        "peak_true_smoothed": smooth[i],
        "start_true": rows[0]["true"],
        "final_true_smoothed": smooth[-1],
        "start_proxy": rows[0]["proxy"],
        "proxy_at_peak": rows[i]["proxy"],
        "final_proxy": sum(r["proxy"] for r in after[-window:]) / len(after[-window:]),
        "final_kl": rows[-1]["kl"],
        "window": window,
    }


def write_curve(run_dir: str | Path) -> dict:
    """overoptimization.csv and overoptimization.json (rows + turn) from RUN_DIR/metrics.jsonl."""
    run_dir = Path(run_dir)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = curve(metrics)
    with open(run_dir / "overoptimization.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["step", "kl", "proxy", "true", "seq_kl"])
        w.writeheader()
        w.writerows(rows)
    summary = turn(rows)
    (run_dir / "overoptimization.json").write_text(json.dumps({"turn": summary, "rows": rows}, indent=1))
    return summary
