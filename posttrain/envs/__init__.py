"""Environments from outside, trained through the OpenAI-compatible server (posttrain/serve/).

    source.py          ExternalRollouts: a step's episodes driven by outside code against the live
                       policy; the served tokens, logprobs and versions become the samples
    verifiers_env.py   task.name=verifiers:ENV — a `verifiers` environment and its rubric
    openenv_env.py     task.name=openenv — an OpenEnv reset/step server, played by the policy

A task is driven from outside when it has `external = True` and one of two coroutines, which
reach the policy through the `Endpoint` they are given (base URL, model, sampling) and name
their episode on every request (header X-Episode-Id, X-Session-ID, or the `user` field):

    async def episode(self, item, endpoint, episode_id) -> RewardResult | float
    async def group(self, item, endpoint, episode_ids) -> list[RewardResult | float]

plus `items(n, split, seed)` and `prompt(item)` like every task. Your own agent code can be
such a task (`task.name=my_agents.py:MyTask`).
"""
