"""Facts added to lessons 00–09 by their blind reads (issue 44, docs/course_reviews.md §3) where the
lesson's own module is full: what the forces map's cost assumes, where the bandit's wrong-arm share
starts, the exact per-token spread of the KL estimators in the lesson-03 toy, and the sign that lesson
09's seeds did not share a checkpoint. The rest of these lessons' facts are in facts_a*.py."""

from __future__ import annotations

from posttrain.algorithms import core
from posttrain.lessons.facts_a_tools import algo_runs, at
from posttrain.lessons.widgets_lineage import COST_MODEL
from posttrain.lessons.widgets_reward import kl_toy
from posttrain.sizing import memory


def kl_sd(estimator: str, shift: float) -> float:
    """The exact standard deviation of one token's estimate (core.kl) under π_θ, in the KL widget's toy."""
    lp_theta, lp_ref = kl_toy(shift)
    p = lp_theta.exp()
    est = core.kl(lp_theta, lp_ref, estimator)  # [16] the estimate if this token is drawn
    mean = float((p * est).sum())
    return float((p * (est - mean) ** 2).sum()) ** 0.5


def cost_peak_gib(algo: str) -> float:
    return (
        memory.plan(COST_MODEL, algo=algo, gpus=8, checkpointing=True, suggest=False, critic="separate")["peak_bytes"]
        / 2**30
    )


def rl09_seed0_entropy_ratio() -> float:
    """REINFORCE's mean entropy on seed 0 over that of seeds 1 and 2 (algorithms.json): the seeds
    did not start from one checkpoint."""
    ent = {r["seed"]: r["entropy"] for r in algo_runs() if r["algorithm"] == "reinforce"}
    return ent[0] / ((ent[1] + ent[2]) / 2)


FACTS = {
    "rl00_cost_model": lambda: COST_MODEL,
    "rl00_cost_grpo_gib": lambda: cost_peak_gib("grpo"),
    "rl00_cost_ppo_gib": lambda: cost_peak_gib("ppo"),
    "rl00_bytes_per_param": lambda: sum(memory.PRECISION[memory.PlanConfig().precision]),
    "rl01_wrong_share_02": at("bandit", "seeds ending on a wrong arm", lr=0.2),
    "rl01_wrong_share_04": at("bandit", "seeds ending on a wrong arm", lr=0.4),
    "rl03_k3_cap": lambda: f"{core.K3_CAP:g}",
    "rl03_log_ratio_clamp": lambda: f"{core.LOG_RATIO_CLAMP:g}",
    "rl03_sd_k1_near": lambda: kl_sd("k1", 0.25),
    "rl03_sd_k3_near": lambda: kl_sd("k3", 0.25),
    "rl03_sd_k1_far": lambda: kl_sd("k1", 1.0),
    "rl03_sd_k3_far": lambda: kl_sd("k3", 1.0),
    "rl09_seed0_entropy_ratio": rl09_seed0_entropy_ratio,
}
