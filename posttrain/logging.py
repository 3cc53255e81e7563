"""Metric sinks: metrics.jsonl always; a rich progress bar on a terminal, plain lines otherwise.

One flat dict per step with namespaced keys (DESIGN.md §6). TensorBoard and W&B sinks
attach here too when their extras are installed.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path


def _fmt(v) -> str:
    if isinstance(v, float):
        if v != 0 and (abs(v) >= 1e4 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:.4f}"
    return str(v)


class RunLogger:
    """`log(step, metrics)` appends to metrics.jsonl and updates the console."""

    def __init__(self, run_dir: str | Path | None, stage: str, total_steps: int,
                 log_every: int = 10, show: tuple[str, ...] = ("loss",), start_step: int = 0):
        self.stage, self.total, self.log_every, self.show = stage, total_steps, max(1, log_every), show
        self.path = Path(run_dir, "metrics.jsonl") if run_dir else None
        if self.path is not None and start_step == 0 and self.path.exists():
            self.path.unlink()
        if self.path is not None and start_step > 0 and self.path.exists():
            self._truncate_after(start_step)   # a resumed run re-logs nothing twice
        self.t0, self.start_step = time.time(), start_step
        self.tty = sys.stdout.isatty()
        self._progress = None
        if self.tty:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
            self._progress = Progress(TextColumn(f"[bold]{stage}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                      TextColumn("{task.fields[info]}"), TimeRemainingColumn())
            self._task = self._progress.add_task(stage, total=total_steps, completed=start_step, info="")
            self._progress.start()

    def _truncate_after(self, step: int) -> None:
        keep = [line for line in self.path.read_text().splitlines() if line and json.loads(line).get("step", 0) <= step]
        self.path.write_text("".join(line + "\n" for line in keep))

    def log(self, step: int, metrics: dict) -> None:
        record = {"step": step, **{k: (float(v) if hasattr(v, "item") else v) for k, v in metrics.items()}}
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(record, allow_nan=True) + "\n")
        info = "  ".join(f"{k} {_fmt(record[k])}" for k in self.show if k in record)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info)
        elif step % self.log_every == 0 or step == self.total:
            done = step - self.start_step
            eta = (time.time() - self.t0) / max(done, 1) * (self.total - step)
            print(f"{self.stage} step {step}/{self.total}  {info}  eta {_eta(eta)}", flush=True)

    def message(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def _eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(seconds), 60)
    return f"{m}:{s:02d}"


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir, "metrics.jsonl")
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
