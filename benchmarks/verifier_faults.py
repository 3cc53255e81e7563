"""The fault table of issue 30: every fault class of benchmarks/faulty_verifiers.py, in a user Task
class (by path) and in a dataset's reward function, scored in-process (`verifier.workers=0`) and in
workers (the default for your code), in training and in evaluation. Each cell is a real
`posttrain rl` run (a subprocess, tiny budget, an evaluation at every step).

    python benchmarks/verifier_faults.py [--init SFT_RUN] [--out benchmarks/results/verifier_faults.json]

A cell is handled when the run goes on and every faulty call is counted: errors + timeouts in
training (reward/*) and in evaluation (eval/*) equal the calls that hit the subset of items that
misbehave, computed from the task itself (the leak maps more than verifier.memory_mb at once, so
each of its calls must fail: in-process nothing caps it, and it counts nothing). Faults that kill the process
they run in (segfault, os._exit) cannot be survived in-process: there the cell records whether the
run's last words name the verifier (posttrain/postmortem.py). A hang in-process stalls the step
(no deadline can be put on a call in the trainer's own thread): the cell records the stall.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from faulty_verifiers import FATAL, FAULTS, Faulty, FaultyConfig, rows_with_faults  # noqa: E402

from posttrain.logging import read_metrics  # noqa: E402
from posttrain.tasks.dataset import DatasetConfig, DatasetTask  # noqa: E402

FUNCTION_FAULTS = tuple(f for f in FAULTS if f not in ("none", "bad_component", "str_component"))  # None = n/a
BUDGET = dict(steps=2, prompts=4, samples=2, problems=8, eval_samples=2)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--init", default="", help="an arithmetic SFT run (default: a tiny chain trained here)")
    p.add_argument("--faults", default="", help="rerun these fault classes only, keeping --out's other cells")
    p.add_argument("--kinds", default="task,function")
    p.add_argument("--stall-s", type=float, default=180.0, help="an in-process hang's run is stopped after this")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/verifier_faults.json"))
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="faults_"))
    init = args.init or tiny_chain(tmp)
    chosen = args.faults.split(",") if args.faults else list(FAULTS)
    cells = []
    for kind in args.kinds.split(","):
        for fault in [f for f in chosen if kind == "task" or f in FUNCTION_FAULTS]:
            for mode in ("in-process", "workers"):
                wheres = ("eval", "train") if mode == "in-process" and fault in (*FATAL, "hang") else ("both",)
                for where in wheres:
                    stall = args.stall_s if (mode, fault) == ("in-process", "hang") else 1200.0
                    cells += run_cell(tmp, init, kind, fault, mode, where, stall)
                    print(json.dumps(cells[-1]), flush=True)
    if args.faults and Path(args.out).exists():  # the other classes' cells as they were
        cells = [c for c in json.loads(Path(args.out).read_text())["cells"] if c["fault"] not in chosen] + cells
    result = {"load_avg_after": os.getloadavg(), "budget": BUDGET, "cells": cells, "summary": summary(cells)}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(result["summary"]))
    return result


def tiny_chain(tmp: Path) -> str:
    import posttrain

    common = dict(threads=1, tensorboard=False, task={"max_terms": 3})
    posttrain.pretrain(out=str(tmp / "pt"), steps=3, batch_size=4, seq_len=32, corpus_chars=4000, **common)
    posttrain.sft(out=str(tmp / "sft"), init=str(tmp / "pt"), steps=3, batch_size=8, num_problems=200, **common)
    return str(tmp / "sft")


def run_cell(tmp: Path, init: str, kind: str, fault: str, mode: str, where: str, stall_s: float) -> list[dict]:
    """One `posttrain rl` run; a cell per phase it reached."""
    out = tmp / f"{kind}_{fault}_{mode}_{where}"
    cfg = FaultyConfig(fault=fault, where=where, max_terms=3)
    faulty = Faulty(cfg)
    if kind == "task":
        task_keys = [
            f"task.name={ROOT}/benchmarks/faulty_verifiers.py:Faulty",
            f"task.fault={fault}",
            f"task.where={where}",
        ]
        task_keys.append("task.max_terms=3")
        task = faulty
    else:
        (out / "data").mkdir(parents=True, exist_ok=True)
        for split, n in (("train", 400), ("test", 40)):
            rows = rows_with_faults(faulty, n, split)
            (out / "data" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        reward = f"{ROOT}/benchmarks/faulty_verifiers.py:faulty"
        task_keys = ["task.name=dataset", f"task.train={out}/data/train.jsonl", f"task.test={out}/data/test.jsonl"]
        task_keys.append(f"task.reward={reward}")
        task = DatasetTask(DatasetConfig(train=f"{out}/data/train.jsonl", test=f"{out}/data/test.jsonl", reward=reward))
    b = BUDGET
    cmd = [
        sys.executable,
        "-m",
        "posttrain.cli",
        "rl",
        f"init={init}",
        f"out={out}/run",
        f"steps={b['steps']}",
        "eval_every=1",
        "threads=1",
        "tensorboard=false",
        f"rollout.prompts_per_step={b['prompts']}",
        f"rollout.samples_per_prompt={b['samples']}",
        "rollout.max_new_tokens=24",
        f"eval.problems={b['problems']}",
        f"eval.samples={b['eval_samples']}",
        "verifier.timeout_s=3",
        *(["verifier.workers=0"] if mode == "in-process" else []),  # workers: the default for your code
        *task_keys,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=stall_s)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, stdout, stderr = None, str(e.stdout or ""), str(e.stderr or "")
    wall = time.time() - t0
    fires = (lambda it: faulty.fires(it)) if kind == "task" else (lambda row: bool(row.columns["fault"]))
    expected = {
        "train": sum(
            sum(map(fires, task.items(b["prompts"], "train", seed=f"0/{s}/0"))) * b["samples"]
            for s in range(1, b["steps"] + 1)
        ),
        "eval": sum(map(fires, task.items(b["problems"], "test", 0))) * (1 + b["eval_samples"]) * (b["steps"] + 1),
    }
    metrics = read_metrics(out / "run") if (out / "run" / "metrics.jsonl").exists() else []
    common = {"kind": kind, "fault": fault, "mode": mode, "rc": rc, "wall_s": round(wall, 1)}
    common["workers_in_plan"] = "verifier_workers: 2" in stdout
    common["traceback"] = "Traceback (most recent call last)" in stderr
    cells = []
    for phase, prefix in (("train", "reward/"), ("eval", "eval/")):
        if where not in ("both", phase):
            continue
        counted = sum(m.get(f"{prefix}errors", 0) + m.get(f"{prefix}timeouts", 0) for m in metrics)
        replaced = sum(m.get(f"{prefix}workers_replaced", 0) for m in metrics)
        cell = {**common, "phase": phase, "expected": expected[phase], "counted": counted, "replaced": replaced}
        completed = rc == 0 and not cell["traceback"]
        if mode == "in-process" and fault in FATAL:
            named = "run died during" in stderr and (
                "Faulty.reward (" in stderr or "faulty_verifiers.py:faulty" in stderr
            )
            cell.update(outcome="process died", named=named, handled=False)
        elif rc is None:
            cell.update(outcome=f"stalled (no end after {stall_s:g} s)", handled=False)
        elif fault == "leak" and counted == 0:
            cell.update(outcome="not capped", handled=False)
        else:
            cell.update(outcome="counted" if completed and counted == expected[phase] else "missed", handled=False)
            cell["handled"] = cell["outcome"] == "counted" and expected[phase] > 0
        cells.append(cell)
    return cells


def summary(cells: list[dict]) -> list[str]:
    """handled N/N per kind × mode × phase, with what the other cells did."""
    lines = []
    for kind in sorted({c["kind"] for c in cells}):
        for mode in ("in-process", "workers"):
            for phase in ("train", "eval"):
                mine = [c for c in cells if (c["kind"], c["mode"], c["phase"]) == (kind, mode, phase)]
                if not mine:
                    continue
                ok = sum(c["handled"] for c in mine)
                other = ", ".join(
                    f"{c['fault']}: {c['outcome']}" + (" (named)" if c.get("named") else "")
                    for c in mine
                    if not c["handled"]
                )
                lines.append(
                    f"{kind:8s} {mode:10s} {phase:5s} handled {ok}/{len(mine)}" + (f"  [{other}]" if other else "")
                )
    return lines


if __name__ == "__main__":
    main()
