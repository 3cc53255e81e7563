"""The pipeline's stages as a chain: its config, and running (or resuming, or skipping) each stage in order.

`PipelineConfig` is the whole recipe's config (`posttrain pipeline`); `train_chain` runs its stages with
the recipe modules it is handed, each stage's final checkpoint the next one's `init`. It imports no stage,
so the pipeline (all four: recipes/pipeline.py) and the warm start (pretrain → SFT, the default `init`
of the later stages: recipes/warm_start.py) share it without importing each other.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from posttrain import checkpoint
from posttrain.config import DPOConfig, PretrainConfig, RLConfig, SFTConfig
from posttrain.errors import UsageError
from posttrain.recipes.common import write_run_dir
from posttrain.tasks.arithmetic import ArithmeticConfig

ALL_STAGES = ("pretrain", "sft", "dpo", "rl")


@dataclass
class PipelineConfig:
    out: str = "runs/pipeline"  # run directory; one sub-directory per stage
    seed: int = 0  # passed to every stage
    device: str = "auto"  # passed to every stage
    dtype: str = "auto"  # passed to every stage
    threads: int = 0  # torch CPU threads (0 = default)
    task: ArithmeticConfig = field(default_factory=ArithmeticConfig)  # shared by every stage
    eval_problems: int = 300  # held-out problems in the final table
    eval_samples: int = 8  # samples per problem for pass@1 / pass@8
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    stages: str = "pretrain,sft,dpo,rl"  # comma-separated, in this order; dpo may be left out
    # SFT stops once held-out greedy accuracy reaches 0.7 (checked every 25 steps): RL then starts
    # in its learnable band whichever way a machine's rounding carries SFT (the jump is steep)
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(target_acc=0.7, eval_every=25))
    dpo: DPOConfig = field(default_factory=DPOConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    report: bool = True  # end with RUN/<last stage>/report.html (needs plotly: pip install 'posttrain[report]')


def _stage_cfg(cfg: PipelineConfig, stage_cfg, name: str, **extra):
    common = {k: getattr(cfg, k) for k in ("seed", "device", "dtype", "threads", "task")}
    return dataclasses.replace(stage_cfg, out=str(Path(cfg.out, name)), **common, **extra)


def _run_stage(module, stage_cfg, run_dir: Path) -> float:
    """Run, resume or skip a stage; returns its wall time (0 when skipped)."""
    last = checkpoint.latest(run_dir)
    early = last is not None and "finished_early" in json.loads((last / "meta.json").read_text())
    if last is not None and (int(last.name.split("_")[1]) >= stage_cfg.steps or early):
        print(f"[pipeline] {run_dir.name}: done already ({last}), skipping")
        return 0.0
    t0 = time.time()
    module.run(stage_cfg, resume=last is not None)
    return time.time() - t0


def train_chain(cfg: PipelineConfig, modules: dict, upto: str | None = None) -> dict[str, float]:
    """Run (or resume, or skip) each stage in order up to `upto` (default: the last one), stage `name`
    by `modules[name].run`; returns stage -> wall seconds."""
    root = Path(cfg.out)
    write_run_dir(root, cfg)
    names = stage_names(cfg)
    upto = upto or names[-1]
    walls, prev = {}, None
    for name in names[: names.index(upto) + 1]:
        extra = {"init": str(root / prev)} if prev else {}
        walls[name] = _run_stage(modules[name], _stage_cfg(cfg, getattr(cfg, name), name, **extra), root / name)
        prev = name
    return walls


def stage_names(cfg: PipelineConfig) -> list[str]:
    names = [n.strip() for n in cfg.stages.split(",") if n.strip()]
    allowed = [n for n in ALL_STAGES if n in names]
    if names != allowed or not {"pretrain", "sft"} <= set(names):
        raise UsageError(
            f"stages={cfg.stages!r}: use stages in the order {','.join(ALL_STAGES)}, "
            "with pretrain and sft; dpo and rl may be left out"
        )
    return names
