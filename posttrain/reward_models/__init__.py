"""Rewards that come from a model: the room above the rollout engine and below the recipes.

    judge.py            JudgeTask: a task whose reward is an LLM judge's verdict (pointwise or pairwise)
    judge_backends.py   where the judge's replies come from: a model sampled in this process, or a server
    reward_model.py     the Bradley–Terry / ORM reward model (trained by `posttrain rm`) and its scorers
    rlhf.py             RewardModelTask: RL on a frozen reward model's score, and the over-optimisation curve
    prm.py              the process reward model: step labels, its loss, aggregation of step scores
    wrap.py             the one place a task gets a model's reward: `with_judge`, `with_reward_model`

tasks/ keeps prompts, gold answers, verifiers, the sandbox and the worker pool, and never reaches the
engine; a recipe wraps the task it made with what these modules give (docs/architecture.md §2).
"""
