"""Every preset in configs/ loads with its stage's config class and its task builds problems."""

from pathlib import Path

import pytest

from posttrain import tasks
from posttrain.cli import STAGES, _load
from posttrain.config import load_config
from posttrain.tasks.hub_data import is_hub_dataset

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
STAGE_OF = {
    "grpo_": "rl",
    "leaky": "rl",
    "rlhf": "rl",
    "pretrain": "pretrain",
    "sft_": "sft",
    "rm": "rm",
    "pipeline": "pipeline",
}


def _stage(name: str) -> str:
    return next(stage for prefix, stage in STAGE_OF.items() if name.startswith(prefix))


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_preset_loads_and_its_task_builds(path):
    cfg = load_config(_load(STAGES[_stage(path.stem)][0]), str(path), [])
    if is_hub_dataset(getattr(getattr(cfg, "task", None), "train", "")):
        return  # rows from the hub (no network here): tests/test_gsm8k.py builds it from a test cache
    if hasattr(cfg, "task") and hasattr(cfg.task, "name"):
        items = tasks.make(cfg.task).items(3, "test")
        assert len(items) == 3


def test_every_preset_has_a_stage():
    assert all(_stage(p.stem) for p in CONFIGS.glob("*.yaml"))
