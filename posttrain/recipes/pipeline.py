"""The whole recipe in one command: pretrain → SFT (chain-of-thought) → RL (GRPO) → eval → table.

One run directory with a sub-directory per stage (`pretrain/`, `sft/`, `rl/`). A stage whose final
checkpoint exists is skipped; a stage with a partial run is resumed; so re-running the
command after a crash or a Ctrl-C continues where it stopped. Each stage's checkpoint is the
next stage's `init`. The final table (stage × held-out pass@1, pass@8, greedy accuracy,
mean length, wall time) is printed and saved as `summary.json`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from posttrain import checkpoint
from posttrain.config import PretrainConfig, RLConfig, SFTConfig, save_config
from posttrain.eval import evaluate
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask


@dataclass
class PipelineConfig:
    out: str = "runs/pipeline"    # run directory; one sub-directory per stage
    seed: int = 0                 # passed to every stage
    device: str = "auto"          # passed to every stage
    dtype: str = "auto"           # passed to every stage
    threads: int = 0              # torch CPU threads (0 = default)
    task: ArithmeticConfig = field(default_factory=ArithmeticConfig)  # shared by every stage
    eval_problems: int = 300      # held-out problems in the final table
    eval_samples: int = 8         # samples per problem for pass@1 / pass@8
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rl: RLConfig = field(default_factory=RLConfig)


def _stage_cfg(cfg: PipelineConfig, stage_cfg, name: str, **extra):
    common = {k: getattr(cfg, k) for k in ("seed", "device", "dtype", "threads", "task")}
    return dataclasses.replace(stage_cfg, out=str(Path(cfg.out, name)), **common, **extra)


def _run_stage(module, stage_cfg, run_dir: Path) -> float:
    """Run, resume or skip a stage; returns its wall time (0 when skipped)."""
    last = checkpoint.latest(run_dir)
    if last is not None and int(last.name.split("_")[1]) >= stage_cfg.steps:
        print(f"[pipeline] {run_dir.name}: done already ({last}), skipping")
        return 0.0
    t0 = time.time()
    module.run(stage_cfg, resume=last is not None)
    return time.time() - t0


def train_chain(cfg: PipelineConfig, upto: str = "rl") -> dict[str, float]:
    """Run (or resume, or skip) each stage in order up to `upto`; returns stage -> wall seconds."""
    from posttrain.recipes import pretrain, rl, sft
    root = Path(cfg.out)
    root.mkdir(parents=True, exist_ok=True)
    save_config(cfg, root / "config.yaml")
    stages = [
        ("pretrain", pretrain, _stage_cfg(cfg, cfg.pretrain, "pretrain")),
        ("sft", sft, _stage_cfg(cfg, cfg.sft, "sft", init=str(root / "pretrain"))),
        ("rl", rl, _stage_cfg(cfg, cfg.rl, "rl", init=str(root / "sft"))),
    ]
    names = [name for name, _, _ in stages]
    stages = stages[:names.index(upto) + 1]
    return {name: _run_stage(module, stage_cfg, root / name) for name, module, stage_cfg in stages}


def run(cfg: PipelineConfig, resume: bool = False) -> dict:
    root = Path(cfg.out)
    walls = train_chain(cfg)
    task = ArithmeticTask(cfg.task)
    heldout = task.items(cfg.eval_problems, "test", cfg.seed + 1)
    rows = []
    for name, wall in walls.items():
        model, tok, _ = checkpoint.load_model(root / name)
        res = evaluate(model, tok, task, heldout, n=cfg.eval_samples, ks=(1, cfg.eval_samples), seed=cfg.seed)
        rows.append({"stage": name, "greedy": res["eval/greedy_acc"], "pass@1": res["eval/pass@1"],
                     f"pass@{cfg.eval_samples}": res[f"eval/pass@{cfg.eval_samples}"],
                     "length": res["eval/length_mean"], "wall_s": round(wall, 1)})
    table = format_table(rows)
    print(table)
    (root / "summary.json").write_text(json.dumps(rows, indent=1))
    (root / "summary.txt").write_text(table + "\n")
    return {"rows": rows}


def format_table(rows: list[dict]) -> str:
    cols = list(rows[0])
    lines = ["  ".join(f"{c:>10}" for c in cols)]
    for r in rows:
        lines.append("  ".join(f"{r[c]:>10.3f}" if isinstance(r[c], float) else f"{r[c]:>10}" for c in cols))
    return "\n".join(lines)
