"""The whole recipe in one command: pretrain → SFT (chain-of-thought) → DPO → RL (GRPO) → eval → table.

One run directory with a sub-directory per stage (`pretrain/`, `sft/`, `dpo/`, `rl/`); `stages`
picks which run (`stages=pretrain,sft,rl` leaves DPO out; RL then starts from SFT). A stage whose final
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

from posttrain import UsageError, checkpoint
from posttrain.config import PretrainConfig, RLConfig, SFTConfig
from posttrain.eval import evaluate
from posttrain.recipes import dpo, pretrain, rl, sft
from posttrain.recipes.common import write_run_dir
from posttrain.recipes.dpo import DPOConfig
from posttrain.report import write_report
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask

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


def train_chain(cfg: PipelineConfig, upto: str | None = None) -> dict[str, float]:
    """Run (or resume, or skip) each stage in order up to `upto` (default: the last one);
    returns stage -> wall seconds."""
    root = Path(cfg.out)
    write_run_dir(root, cfg)
    names = stage_names(cfg)
    upto = upto or names[-1]
    modules = {"pretrain": pretrain, "sft": sft, "dpo": dpo, "rl": rl}
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


def run(cfg: PipelineConfig, resume: bool = False) -> dict:
    if cfg.report:  # what the last line needs, checked before minutes of work
        try:
            import plotly  # noqa: F401
        except ImportError:
            raise UsageError(
                "the pipeline ends with report.html, which needs plotly: pip install 'posttrain[report]' "
                "(or pass report=false)"
            ) from None
    root = Path(cfg.out)
    if resume and not any(checkpoint.latest(root / name) for name in ALL_STAGES):
        raise UsageError(
            f"--resume {root}: no stage of a pipeline run has a checkpoint there; "
            "give the out= of an earlier pipeline run, or start without --resume"
        )
    walls = train_chain(cfg)
    walls = {**walls, **{k: v for k, v in _earlier_walls(root).items() if walls.get(k) == 0.0}}  # skipped stages
    task = ArithmeticTask(cfg.task)
    heldout = task.items(cfg.eval_problems, "test", cfg.seed + 1)
    rows = []
    for name, wall in walls.items():
        model, tok, _ = checkpoint.load_model(root / name)
        res = evaluate(model, tok, task, heldout, n=cfg.eval_samples, ks=(1, cfg.eval_samples), seed=cfg.seed)
        rows.append(
            {
                "stage": name,
                "greedy": res["eval/greedy_acc"],
                "pass@1": res["eval/pass@1"],
                f"pass@{cfg.eval_samples}": res[f"eval/pass@{cfg.eval_samples}"],
                "length": res["eval/length_mean"],
                "wall_s": round(wall, 1),
            }
        )
    table = format_table(rows)
    print(table)
    (root / "summary.json").write_text(json.dumps(rows, indent=1))
    (root / "summary.txt").write_text(table + "\n")
    if cfg.report:
        print(f"report: {write_report(root / stage_names(cfg)[-1])}")
    return {"rows": rows}


def _earlier_walls(root: Path) -> dict:
    """Stage wall times of the summary an earlier run of this pipeline wrote: a re-run skips the
    finished stages (0 s) and keeps the times they took when they ran."""
    try:
        return {r["stage"]: float(r["wall_s"]) for r in json.loads((root / "summary.json").read_text())}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def format_table(rows: list[dict]) -> str:
    cols = list(rows[0])
    lines = ["  ".join(f"{c:>10}" for c in cols)]
    for r in rows:
        lines.append("  ".join(f"{r[c]:>10.3f}" if isinstance(r[c], float) else f"{r[c]:>10}" for c in cols))
    return "\n".join(lines)
