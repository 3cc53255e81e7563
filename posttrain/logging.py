"""Metric sinks: metrics.jsonl always, TensorBoard when installed, W&B when configured,
and a rich progress bar on a terminal (plain lines otherwise).

One flat dict per step with namespaced keys (docs/architecture.md §7). The same dict goes to every
sink: `RUN_DIR/metrics.jsonl`, TensorBoard event files in `RUN_DIR/tensorboard/` (the
`tensorboard` package, extra `report`; without it a one-time note says so), and a W&B run
when `wandb.project` is set (`wandb.mode=offline` writes `RUN_DIR/wandb/` with no network).
A resumed run drops what was logged after its checkpoint, in every sink that can, so nothing
is logged twice.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from posttrain.errors import UsageError

RUN_LOGS = ("metrics.jsonl", "samples.jsonl")  # step-keyed jsonl files a resume truncates
EVAL_FAULTS = ("eval/errors", "eval/timeouts", "eval/workers_replaced")  # shown on the console when not 0
_notes_shown: set[str] = set()


@dataclass
class WandbConfig:
    project: str = ""  # W&B project; "" = no W&B run
    mode: str = "offline"  # offline (RUN_DIR/wandb, sync later with `wandb sync`) | online | disabled
    entity: str = ""  # W&B team or user; "" = your default
    name: str = ""  # run name; "" = the run directory's name


def _fmt(v) -> str:
    if isinstance(v, float):
        if v != 0 and (abs(v) >= 1e4 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:.4f}"
    return str(v)


def note_once(text: str) -> None:
    """A hint printed once per process (e.g. an optional sink that is not installed)."""
    if text not in _notes_shown:
        _notes_shown.add(text)
        print(f"note: {text}", flush=True)


class RunLogger:
    """`log(step, metrics)` writes every sink and updates the console."""

    def __init__(
        self,
        run_dir: str | Path | None,
        stage: str,
        total_steps: int,
        log_every: int = 10,
        show: tuple[str, ...] = ("loss",),
        start_step: int = 0,
        tensorboard: bool = True,
        wandb: WandbConfig | None = None,
        config: dict | None = None,
    ):
        self.stage, self.total, self.log_every, self.show = stage, total_steps, max(1, log_every), show
        self.path = Path(run_dir, "metrics.jsonl") if run_dir else None
        if run_dir is not None:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            for name in RUN_LOGS:
                truncate_jsonl(Path(run_dir, name), start_step)  # a resumed run re-logs nothing twice
        self.tb = _tensorboard(run_dir, start_step) if tensorboard and run_dir else None
        self.wandb = _wandb(wandb, run_dir, stage, config, start_step > 0) if wandb and wandb.project else None
        self.t0, self.start_step = time.time(), start_step
        self.tty = sys.stdout.isatty()
        self._progress = None
        if self.tty:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn(f"[bold]{stage}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
            )
            self._task = self._progress.add_task(stage, total=total_steps, completed=start_step, info="")
            self._progress.start()

    def log(self, step: int, metrics: dict) -> None:
        record = {"step": step, **{k: (float(v) if hasattr(v, "item") else v) for k, v in metrics.items()}}
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(record, allow_nan=True) + "\n")
        scalars = {
            k: float(v)
            for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)
        faults = [k for k in EVAL_FAULTS if record.get(k)]  # the verifier, not the policy, failed
        info = "  ".join(f"{k} {_fmt(record[k])}" for k in (*self.show, *faults) if k in record)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info)
            if faults:  # the bar's line is overwritten by the next step: these stay
                self._progress.console.print(f"{self.stage} step {step}: {info}")
        elif step <= self.start_step:  # the starting evaluation: one-off work, no ETA yet
            print(f"{self.stage} step {step}/{self.total}  {info}", flush=True)
        elif step % self.log_every == 0 or step == self.total or faults:
            done = step - self.start_step
            eta = (time.time() - self.t0) / max(done, 1) * (self.total - step)
            print(f"{self.stage} step {step}/{self.total}  {info}  eta {_eta(eta)}", flush=True)
        if step <= self.start_step:
            self.t0 = time.time()  # the ETA counts from the first step, not from before the eval

    def message(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def _tensorboard(run_dir, start_step: int):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        note_once(
            "TensorBoard event files are off: the tensorboard package is not installed "
            "(pip install 'posttrain[report]'); metrics.jsonl still has every metric"
        )
        return None
    # purge_step drops events a killed run wrote after the checkpoint it resumes from
    return SummaryWriter(str(Path(run_dir, "tensorboard")), purge_step=start_step + 1 if start_step else None)


def _wandb(cfg: WandbConfig, run_dir, stage: str, config: dict | None, resume: bool):
    if cfg.mode not in ("offline", "online", "disabled"):
        raise UsageError(f"wandb.mode={cfg.mode!r} is unknown; use offline, online or disabled")
    try:
        import wandb
    except ImportError:
        raise UsageError(
            "wandb.project is set but the wandb package is not installed; "
            "pip install 'posttrain[wandb]' or drop wandb.project"
        ) from None
    run_dir = Path(run_dir or ".")
    id_file = run_dir / "wandb_run_id"  # the same W&B run continues after --resume
    run_id = id_file.read_text().strip() if resume and id_file.exists() else uuid.uuid4().hex[:8]
    id_file.write_text(run_id)
    return wandb.init(
        project=cfg.project,
        entity=cfg.entity or None,
        name=cfg.name or run_dir.name,
        mode=cfg.mode,
        dir=str(run_dir),
        id=run_id,
        resume="allow",
        group=stage,
        config=config,
        settings=wandb.Settings(silent=True),
    )


def truncate_jsonl(path: Path, step: int) -> None:
    """Keep the rows of a step-keyed jsonl file up to `step` (0 = a fresh run: delete it).

    The file is rewritten into a temp file that replaces it by a rename: a kill during the
    rewrite leaves the old file or the new one, never a truncated one. A torn last row (a kill
    mid-write) is dropped (read_jsonl)."""
    if not path.exists():
        return
    if step == 0:
        path.unlink()
        return
    keep = [row for row in read_jsonl(path) if row.get("step", 0) <= step]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.writelines(json.dumps(row, allow_nan=True) + "\n" for row in keep)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(seconds), 60)
    return f"{m}:{s:02d}"


def read_jsonl(path: str | Path) -> list[dict]:
    """The rows of a jsonl log. A torn last row (the writer was killed mid-line) is dropped; a
    bad row before it is a one-line UsageError naming file:line (something else wrote there)."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if n == len(lines):  # the tail of a kill: the next write replaces it
                break
            raise UsageError(f"{path}:{n}: not a JSON row ({e.msg}); delete that line") from None
    return rows


def read_metrics(run_dir: str | Path) -> list[dict]:
    return read_jsonl(Path(run_dir, "metrics.jsonl"))
