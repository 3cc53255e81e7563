"""The one place a task gets a reward from a model, for every stage (recipes/common.make_task) and for RL
(recipes/rl.py): a task's own verifier stays the task's; a judge or a reward model is wrapped around it."""

from __future__ import annotations

from posttrain.reward_models.judge import JudgeTask
from posttrain.reward_models.reward_model import load_scorer
from posttrain.reward_models.rlhf import RewardModelTask


def with_judge(task, task_cfg):
    """`task` scored by an LLM judge when `task.judge.model` is set (reward_models/judge.py), else `task`.
    Evaluation keeps the task's verifier (`JudgeTask.heldout_task`)."""
    judge = getattr(task_cfg, "judge", None)
    if judge is None or not judge.model or isinstance(task, JudgeTask):
        return task
    return JudgeTask(task, judge)


def with_reward_model(task, reward_model: str, device):
    """RLHF: with `reward_model=RUN` (or RUN_A,RUN_B, an ensemble), a frozen RM's score is the reward the
    controller trains on and the verifier is logged beside it (reward_models/rlhf.py); otherwise `task`."""
    if not reward_model:
        return task
    return RewardModelTask(task, load_scorer(reward_model, device))
