"""The warm start: the checkpoint a stage starts from when it is given no `init=`.

Without `init`, RL, DPO, the reward model and distillation start from the default SFT(CoT) checkpoint: the
pipeline's pretrain → SFT, trained once (a few minutes on a CPU) into `runs/cache/` (`POSTTRAIN_CACHE`) and
reused by every later run. Built-in tasks only: on your own rows the default checkpoint knows nothing of
their format, so a run without `init=` is refused before any work.
"""

from __future__ import annotations

import os
from pathlib import Path

from posttrain import checkpoint, tasks
from posttrain.config import load_config
from posttrain.errors import UsageError
from posttrain.recipes import pretrain, sft
from posttrain.recipes.chain import PipelineConfig, train_chain

CACHE = Path(os.environ.get("POSTTRAIN_CACHE", "runs/cache"))


def refuse_default_init(cfg) -> None:
    """No init= on your own data (task.name=dataset, your Task class, an environment): refused in one
    line before any work. The default checkpoint knows only the built-in sums, so RL from it on your
    rows would spend minutes building it and then learn from a policy that has never seen their format
    (issue 29); the line names the commands that warm a model up on your data instead."""
    name = cfg.task.name
    if cfg.init or (name in tasks.TASKS and name != "dataset"):
        return
    keys = f"task.name={name}" + "".join(
        f" task.{k}={getattr(cfg.task, k)}" for k in ("train", "test") if getattr(cfg.task, k, "")
    )
    raise UsageError(
        f"task.name={name} without init= would start from the default checkpoint, which "
        f"knows only the built-in sums; warm a model up on your task first (posttrain pretrain {keys} "
        f"out=runs/my/pt, then posttrain sft {keys} init=runs/my/pt out=runs/my/sft) and give init=runs/my/sft, "
        "or init= a Hugging Face model directory"
    )


def default_init() -> str:
    """The default SFT(CoT) checkpoint: trained once with the pipeline's defaults, then cached
    (built-in tasks only: `refuse_default_init`)."""
    root = CACHE / "sft_cot"
    if checkpoint.latest(root / "sft") is None:
        print(
            f"no init= given: training the default SFT(CoT) checkpoint once into {root} "
            "(pretrain → SFT); later runs reuse it"
        )
    train_chain(
        load_config(PipelineConfig, "pipeline", [f"out={root}"]), {"pretrain": pretrain, "sft": sft}, upto="sft"
    )
    return str(root / "sft")
