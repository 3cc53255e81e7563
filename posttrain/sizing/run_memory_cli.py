"""`posttrain memory` for one posttrain run: its predicted peak (run_memory.py), and, for a run that
ran, the peak it measured.

    posttrain memory RUN_DIR                          predicted (RUN_DIR/memory.json, written at start)
                                                      vs measured (max memory/peak_gib in metrics.jsonl)
    posttrain memory CONFIG.yaml --stage rl [key=value ...] [--device cuda] [--dtype bfloat16] [--card-gib 80]
    posttrain memory HF_DIR [--stage rl] [key=value ...] [--seq-len 1024 --prompt-len 256]

memory_cli.main hands over here when the first argument is a directory or `--stage` is given; a
model name without them is the planner of memory.py (any framework, on GPUs, as the course counts).
"""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.errors import UsageError
from posttrain.sizing.run_memory import STAGES, GiB, init_shape, predict_run_peak
from posttrain.sizing.shapes import mini_shape, resolve_model

CONFIGS = {  # stage -> its config class (module:name), imported when asked
    "pretrain": "posttrain.config:PretrainConfig",
    "sft": "posttrain.config:SFTConfig",
    "rl": "posttrain.config:RLConfig",
    "dpo": "posttrain.config:DPOConfig",
    "rm": "posttrain.config:RMConfig",
    "distill": "posttrain.config:DistillConfig",
}


def wants_run(argv: list[str]) -> bool:
    """Is this `posttrain memory` call about one run (a directory, or --stage)?"""
    return "--stage" in argv or bool(argv and not argv[0].startswith("-") and Path(argv[0]).is_dir())


def main(argv: list[str]) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="posttrain memory", description="The peak memory of one posttrain run.")
    p.add_argument("target", help="a run directory, a stage's YAML config or a Hugging Face model directory")
    p.add_argument("overrides", nargs="*", help="key=value config overrides (dotted for sections)")
    p.add_argument("--stage", choices=STAGES, help="the stage (a run directory knows its own; default rl)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: the config's (auto: cuda if visible)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="default: the config's (auto: bf16 on cuda)")
    p.add_argument("--seq-len", type=int, default=0, help="longest row of a step (default: the model's context)")
    p.add_argument("--prompt-len", type=int, default=0, help="RL prompt tokens (default: seq-len − max_new_tokens)")
    p.add_argument(
        "--card-gib", type=float, help="the card's memory: optim.micro_batch_tokens=auto fits it (with --device cuda)"
    )
    p.add_argument("--json", action="store_true", help="print the prediction (and measurement) as JSON")
    a = p.parse_args(argv)
    target = Path(a.target)
    if (target / "config.yaml").exists() and not a.overrides:  # a run directory
        est, measured = run_dir(target, a.stage)
    else:
        est, measured = predict_config(a, target), None
    if a.json:
        print(json.dumps({"predicted": est, "measured_peak_gib": measured}, indent=1))
    else:
        print(format_prediction(est, measured))


def run_dir(d: Path, stage: str | None) -> tuple[dict, float | None]:
    """The prediction the run wrote at its start (else one from its config.yaml) and the largest
    `memory/peak_gib` it logged (None before its first step)."""
    from posttrain.logging import read_metrics  # entry: no torch until called

    saved = d / "memory.json"
    if saved.exists():
        est = json.loads(saved.read_text())
    else:
        import yaml

        cfg = yaml.safe_load((d / "config.yaml").read_text())
        st = stage or _stage_of(d)
        shape, hf = init_shape(cfg.get("init", ""), _model_shape(cfg))
        est = predict_run_peak(cfg, st, shape, **_where(cfg, None, None), hf=hf)
    peaks = [m["memory/peak_gib"] for m in read_metrics(d) if "memory/peak_gib" in m]
    return est, max(peaks) if peaks else None


def predict_config(a, target: Path) -> dict:
    """A stage's config (YAML, or a Hugging Face directory as its init) with overrides, predicted."""
    import importlib

    from posttrain.config import load_config  # entry: no torch until called

    stage = a.stage or "rl"
    module, name = CONFIGS[stage].split(":")
    cls = getattr(importlib.import_module(module), name)
    if target.is_dir():  # a model directory: the stage's defaults from it
        cfg = load_config(cls, None, [f"init={target}", *a.overrides])
    elif target.suffix in (".yaml", ".yml"):
        cfg = load_config(cls, str(target), a.overrides)
    else:
        raise UsageError(f"{target}: give a run directory, a stage's YAML config or a Hugging Face model directory")
    shape, hf = init_shape(getattr(cfg, "init", ""), _model_shape(cfg))
    where = _where(cfg, a.device, a.dtype)
    capacity = a.card_gib * GiB if a.card_gib else None
    return predict_run_peak(
        cfg, stage, shape, **where, seq_len=a.seq_len, prompt_len=a.prompt_len, hf=hf, capacity=capacity
    )


def format_prediction(est: dict, measured: float | None = None) -> str:
    """The prediction as a table (GiB), with the measured peak beside it when there is one."""
    lines = [
        f"{est['stage']} on {est['device']} ({est['compute_dtype']}), micro-batch {est['micro_batch_tokens']:,} "
        f"tokens: predicted peak {est['peak_gib']:.2f} GiB"
    ]
    if est.get("baseline_bytes"):
        lines[0] += f" (process {est['baseline_bytes'] / GiB:.2f} + tensors {est['tensor_bytes'] / GiB:.2f})"
    for phase, parts in est["components"].items():
        lines.append(f"  {phase:12s} {est['phases'][phase] / GiB:8.3f}")
        lines += [f"    {k:30s} {v / GiB:8.3f}" for k, v in parts.items() if v]
    top = max((k for k in est["phases"] if k != "persistent"), key=est["phases"].__getitem__)
    lines.append(f"  peak = persistent + {top} (the largest phase)")
    if est.get("peak_so_far", 0) >= est["peak_bytes"]:
        lines.append(f"  (the process had already peaked at {est['peak_so_far'] / GiB:.2f} GiB loading the model)")
    if measured is not None:
        what = "max_memory_allocated" if est["device"] == "cuda" else "peak RSS"
        lines.append(
            f"measured peak {measured:.2f} GiB (memory/peak_gib, {what}); predicted / measured = "
            f"{est['peak_gib'] / measured:.2f}"
        )
    return "\n".join(lines)


def _where(cfg, device: str | None, dtype: str | None) -> dict:
    """device and compute dtype as the run resolves them (runtime.resolve): auto = cuda when one is
    visible; bf16 autocast on cuda, fp32 on the CPU, unless the config names a dtype."""
    get = (lambda k: cfg.get(k)) if isinstance(cfg, dict) else (lambda k: getattr(cfg, k, None))
    dev = device or str(get("device") or "auto")
    if dev == "auto":
        import torch

        dev = "cuda" if torch.cuda.is_available() else "cpu"
    dev = "cuda" if dev.startswith("cuda") else "cpu"
    dt = dtype or {"bf16": "bfloat16", "fp32": "float32"}.get(str(get("dtype")), str(get("dtype") or "auto"))
    if dt == "auto":
        dt = "bfloat16" if dev == "cuda" else "float32"
    return {"device": dev, "compute_dtype": dt}


def _model_shape(cfg):
    """The shape of a run from scratch: its `model:` section (gpt_mini), or nano's."""
    from posttrain.config import build  # entry: no torch until called
    from posttrain.models.gpt_mini import ModelConfig  # entry: no torch until called

    model = cfg.get("model") if isinstance(cfg, dict) else getattr(cfg, "model", None)
    if model is None:
        return resolve_model("nano")
    return mini_shape(build(ModelConfig, model, "model.") if isinstance(model, dict) else model, "model")


def _stage_of(d: Path) -> str:
    """A run directory's stage: its checkpoints' meta.json, else the directory's name."""
    for meta in sorted(d.glob("checkpoints/*/meta.json")):
        stage = json.loads(meta.read_text()).get("stage")
        if stage in STAGES:
            return stage
    if d.name in STAGES:
        return d.name
    raise UsageError(f"{d}: cannot tell its stage (no checkpoint meta.json); pass --stage")
