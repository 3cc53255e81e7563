"""The `algo:` section of the RL config: `name` picks the algorithm, the other keys are its own.

Every algorithm's `Config` derives from `AlgoConfig` and sets its registry name as the default of
`name`, so `algo.name=dapo` in a config builds `dapo.Config` with DAPO's defaults (config.py picks
the class by name, as `task.name` picks a task) and the resolved config.yaml holds every value.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AlgoConfig:
    name: str = "grpo"  # the algorithm: reinforce | rloo | ppo | reinforce_pp | grpo | dr_grpo | dapo | gspo | cispo | maxrl | mgpo | dppo
