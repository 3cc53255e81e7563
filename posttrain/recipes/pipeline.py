"""The whole recipe in one command: pretrain → SFT (chain-of-thought) → DPO → RL (GRPO) → eval → table.

One run directory with a sub-directory per stage (`pretrain/`, `sft/`, `dpo/`, `rl/`); `stages`
picks which run (`stages=pretrain,sft,rl` leaves DPO out; RL then starts from SFT). A stage whose final
checkpoint exists is skipped; a stage with a partial run is resumed; so re-running the
command after a crash or a Ctrl-C continues where it stopped. Each stage's checkpoint is the
next stage's `init`. The final table (stage × held-out pass@1, pass@8, greedy accuracy,
mean length, wall time) is printed and saved as `summary.json`.
"""

from __future__ import annotations

import json
from pathlib import Path

from posttrain import checkpoint
from posttrain.errors import UsageError
from posttrain.eval import evaluate
from posttrain.recipes import dpo, pretrain, rl, sft
from posttrain.recipes.chain import ALL_STAGES, PipelineConfig, stage_names, train_chain
from posttrain.report import write_report
from posttrain.tasks.arithmetic import ArithmeticTask

__all__ = ["PipelineConfig", "format_table", "run"]


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
    walls = train_chain(cfg, {"pretrain": pretrain, "sft": sft, "dpo": dpo, "rl": rl})
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
