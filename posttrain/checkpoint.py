"""Checkpoints: weights in safetensors, optimizer and RNG and data position, written atomically.

    RUN_DIR/checkpoints/step_000200/
        model.safetensors  model.json  tokenizer.posttrain.json  trainer.pt  meta.json

A checkpoint is written into `step_N.tmp/` and renamed when complete, so a crash during a
save leaves the previous checkpoint intact and never a half-written one under a real name.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from posttrain import TrainingHalted, UsageError
from posttrain.models.gpt_mini import GPTMini, ModelConfig
from posttrain.models.tokenizer import CharTokenizer


def step_dirs(run_dir: str | Path) -> list[Path]:
    root = Path(run_dir, "checkpoints")
    if not root.is_dir():
        return []
    dirs = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_") and not p.name.endswith(".tmp")]
    return sorted(dirs, key=lambda p: int(p.name.split("_")[1]))


def latest(run_dir: str | Path) -> Path | None:
    dirs = step_dirs(run_dir)
    return dirs[-1] if dirs else None


def resolve(path: str | Path) -> Path:
    """A checkpoint directory, or the latest checkpoint of a run directory."""
    p = Path(path)
    if (p / "model.safetensors").exists() or (p / "config.json").exists():   # ours, or an HF directory
        return p
    last = latest(p)
    if last is not None:
        return last
    if not p.exists():
        raise UsageError(f"checkpoint {str(p)!r} does not exist; give a run directory or its checkpoints/step_N")
    raise UsageError(f"{str(p)!r} holds no checkpoint (no model.safetensors, no checkpoints/step_N); "
                     "train a stage first or point to its run directory")


def save(run_dir: str | Path, step: int, model: GPTMini, tokenizer: CharTokenizer,
         trainer_state: dict | None = None, meta: dict | None = None, keep_last: int = 2) -> Path:
    root = Path(run_dir, "checkpoints")
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        _write(tmp, step, model, tokenizer, trainer_state, meta)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)       # give back what the partial write took
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        fix = f"then --resume {run_dir}" if latest(run_dir) is not None else "then start the run again"
        raise TrainingHalted(f"disk full while writing checkpoint {final.name} in {root} (partial write removed, "
                             f"earlier checkpoints intact): free space there or set out= on a bigger disk, {fix}") from None
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in step_dirs(run_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _write(tmp: Path, step: int, model, tokenizer, trainer_state, meta) -> None:
    if hasattr(model, "hf"):                         # a Hugging Face model: saved as an HF directory
        model.save(tmp)
        from posttrain.models.lora import lora_layers, save_adapter
        if lora_layers(model.hf):                    # + the adapters in PEFT's format, beside the merged weights
            save_adapter(model, tmp / "adapter", getattr(model, "lora_base", None))
    else:
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        if model.config.tie_embeddings:
            state.pop("head.weight", None)           # safetensors refuses shared tensors
        save_file(state, str(tmp / "model.safetensors"))
        (tmp / "model.json").write_text(json.dumps(dataclasses.asdict(model.config), indent=1))
    tokenizer.save(tmp)
    if trainer_state is not None:
        torch.save(trainer_state, tmp / "trainer.pt")
    (tmp / "meta.json").write_text(json.dumps({"step": step, **(meta or {})}, indent=1))
    for f in tmp.rglob("*"):                         # data on disk before the rename makes it visible
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


def load_model(path: str | Path, device="cpu") -> tuple[GPTMini, CharTokenizer, Path]:
    ckpt = resolve(path)
    from posttrain.models import hf
    if hf.is_hf_dir(ckpt):                           # any local HF causal LM (models/hf.py)
        model, tokenizer = hf.load_hf(ckpt, device)
        return model, tokenizer, ckpt
    try:
        cfg = ModelConfig(**json.loads((ckpt / "model.json").read_text()))
        model = GPTMini(cfg)
        state = load_file(str(ckpt / "model.safetensors"))
        if cfg.tie_embeddings:
            state["head.weight"] = state["embed.weight"]
        model.load_state_dict(state)
        tokenizer = CharTokenizer.load(ckpt)
    except Exception as e:
        raise UsageError(f"checkpoint {str(ckpt)!r} is unreadable ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
                         "point to a complete checkpoints/step_N written by posttrain") from None
    return model.to(device), tokenizer, ckpt


def restore_weights(model, ckpt: str | Path) -> None:
    """Put a checkpoint's weights into the run's model (resume): a LoRA run gets its adapters back
    on the base it was started from; any other model its whole state dict."""
    from posttrain.models.lora import load_adapter, lora_layers
    if hasattr(model, "hf") and lora_layers(model.hf):
        if not Path(ckpt, "adapter", "adapter_model.safetensors").exists():
            raise UsageError(f"{str(ckpt)!r} has no adapter/ (a LoRA checkpoint from before adapters were saved); "
                             "start a new run with init= that checkpoint")
        load_adapter(model, Path(ckpt, "adapter"))
        return
    model.load_state_dict(load_model(ckpt)[0].state_dict())


def load_trainer_state(ckpt: str | Path) -> dict:
    path = Path(ckpt, "trainer.pt")
    if not path.exists():
        raise UsageError(f"{str(ckpt)!r} has no trainer.pt; it cannot be resumed, only used as init=")
    return torch.load(path, map_location="cpu", weights_only=False)
