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
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from posttrain.errors import TrainingHalted, UsageError
from posttrain.models import hf, hub
from posttrain.models.gpt_mini import GPTMini, ModelConfig
from posttrain.models.lora import load_adapter, lora_layers, save_adapter
from posttrain.models.tokenizer import FILE_NAME as TOKENIZER_FILE
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


def resolve(path: str | Path, key: str = "checkpoint") -> Path:
    """A checkpoint directory, the latest checkpoint of a run directory, or the snapshot of a
    Hugging Face Hub id (`org/name[@revision]`, fetched into the hub cache: models/hub.py).
    `key` names the setting in the one-line error of a name that resolves nowhere."""
    p = hub.resolve_model(path, key).local_dir  # a local path comes back as it is
    if (p / "model.safetensors").exists() or (p / "config.json").exists():  # ours, or an HF directory
        return p
    last = latest(p)
    if last is not None:
        return last
    if not p.exists():
        raise UsageError(
            f"checkpoint {str(p)!r} does not exist; give a run directory, its checkpoints/step_N, a Hugging Face "
            "directory or a hub id (org/name[@revision])"
        )
    raise UsageError(
        f"{str(p)!r} holds no checkpoint (no model.safetensors, no checkpoints/step_N); "
        "train a stage first or point to its run directory"
    )


def resume_target(run_dir: str | Path) -> Path:
    """The checkpoint `--resume RUN_DIR` continues from, or a one-line UsageError before any work:
    a mistyped path, a directory that is not a run, a run that never saved."""
    d = Path(run_dir)
    if not d.is_dir():
        raise UsageError(f"--resume {d}: no such run directory; give the out= of an earlier run")
    last = latest(d)
    if last is None:
        raise UsageError(f"--resume {d}: no complete checkpoint there (checkpoints/step_N); start without --resume")
    return last


def step_path(run_dir: str | Path, step: int) -> Path:
    """Where the checkpoint of `step` lies once written."""
    return Path(run_dir, "checkpoints", f"step_{step:06d}")


def tmp_path(run_dir: str | Path, step: int) -> Path:
    """Where it is written first (renamed into `step_path` once whole)."""
    return Path(run_dir, "checkpoints", f"step_{step:06d}.tmp")


def stage(run_dir: str | Path, step: int) -> Path:
    """An empty `tmp_path` for the ranks of a sharded run to write their parts into before rank 0's
    `save(..., staged=True)` adds the rest and renames it."""
    tmp = tmp_path(run_dir, step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def save(
    run_dir: str | Path,
    step: int,
    model: GPTMini,
    tokenizer: CharTokenizer,
    trainer_state: dict | None = None,
    meta: dict | None = None,
    keep_last: int = 2,
    staged: bool = False,
) -> Path:
    """`staged`: the ranks already wrote their parts into `tmp_path` (`stage`); it is completed, not replaced."""
    root = Path(run_dir, "checkpoints")
    root.mkdir(parents=True, exist_ok=True)
    final = step_path(run_dir, step)
    tmp = tmp_path(run_dir, step)
    if not staged:
        shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(exist_ok=staged)
        _write(tmp, step, model, tokenizer, trainer_state, meta)
    except (OSError, RuntimeError, SafetensorError) as e:  # every writer: files, torch.save, safetensors
        full = _disk_full(e, root, model, trainer_state)  # asked before the partial write is freed
        shutil.rmtree(tmp, ignore_errors=True)  # give back what the partial write took
        fix = f"then --resume {run_dir}" if latest(run_dir) is not None else "then start the run again"
        if full:
            raise TrainingHalted(
                f"disk full while writing checkpoint {final.name} in {root} (partial write removed, "
                f"earlier checkpoints intact): free space there or set out= on a bigger disk, {fix}"
            ) from None
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        raise TrainingHalted(
            f"writing checkpoint {final.name} in {root} failed ({why}; partial write removed, earlier "
            f"checkpoints intact): fix the cause or set out= elsewhere, {fix}"
        ) from None
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in step_dirs(run_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _disk_full(e: Exception, root: Path, model, trainer_state) -> bool:
    """Was `e` a full disk? An OSError says so (ENOSPC, EDQUOT), safetensors says "os error 28";
    torch.save's RuntimeError only says "unexpected pos", so then: is less space left on `root`
    than the checkpoint's tensors need?"""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    if f"os error {errno.ENOSPC}" in str(e) or "No space left" in str(e):
        return True
    need = _tensor_bytes(model.state_dict()) + _tensor_bytes(trainer_state)
    return shutil.disk_usage(root).free < need


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _write(tmp: Path, step: int, model, tokenizer, trainer_state, meta) -> None:
    if hasattr(model, "hf"):  # a Hugging Face model: saved as an HF directory
        model.save(tmp)

        if lora_layers(model.hf):  # + the adapters in PEFT's format, beside the merged weights
            save_adapter(model, tmp / "adapter", getattr(model, "lora_base", None))
    else:
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        if model.config.tie_embeddings:
            state.pop("head.weight", None)  # safetensors refuses shared tensors
        save_file(state, str(tmp / "model.safetensors"))
        (tmp / "model.json").write_text(json.dumps(dataclasses.asdict(model.config), indent=1))
    tokenizer.save(tmp)
    if trainer_state is not None:
        torch.save(trainer_state, tmp / "trainer.pt")
    (tmp / "meta.json").write_text(json.dumps({"step": step, **(meta or {})}, indent=1))
    for f in tmp.rglob("*"):  # data on disk before the rename makes it visible
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


def load_model(path: str | Path, device="cpu", key: str = "checkpoint") -> tuple[GPTMini, CharTokenizer, Path]:
    """(model, tokenizer, checkpoint directory) of a posttrain checkpoint or run, a local Hugging
    Face directory, or a hub id (resolve)."""
    ckpt = resolve(path, key)

    if hf.is_hf_dir(ckpt):  # any local HF causal LM (models/hf.py)
        model, tokenizer = hf.load_hf(ckpt, device)
        return model, tokenizer, ckpt
    if not (ckpt / TOKENIZER_FILE).exists():  # never guess: the built-in vocabulary may not be this model's
        raise UsageError(
            f"checkpoint {str(ckpt)!r} has no {TOKENIZER_FILE}; copy it from the run that trained "
            "this model (every posttrain checkpoint holds one)"
        )
    try:
        cfg = ModelConfig(**json.loads((ckpt / "model.json").read_text()))
        model = GPTMini(cfg)
        state = load_file(str(ckpt / "model.safetensors"))
        if cfg.tie_embeddings:
            state["head.weight"] = state["embed.weight"]
        model.load_state_dict(state)
        tokenizer = CharTokenizer.load(ckpt)
    except Exception as e:
        raise UsageError(
            f"checkpoint {str(ckpt)!r} is unreadable ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
            "point to a complete checkpoints/step_N written by posttrain"
        ) from None
    return model.to(device), tokenizer, ckpt


def restore_weights(model, ckpt: str | Path) -> None:
    """Put a checkpoint's weights into the run's model (resume): a LoRA run gets its adapters back
    on the base it was started from; any other model its whole state dict. A checkpoint of another
    model (size, preset, init) is a one-line UsageError naming the first tensor that differs."""
    if hasattr(model, "hf") and lora_layers(model.hf):
        if not Path(ckpt, "adapter", "adapter_model.safetensors").exists():
            raise UsageError(
                f"{str(ckpt)!r} has no adapter/ (a LoRA checkpoint from before adapters were saved); "
                "start a new run with init= that checkpoint"
            )
        load_adapter(model, Path(ckpt, "adapter"))
        return
    saved = load_model(ckpt)[0].state_dict()
    own = model.state_dict()

    def shape(sd, k):
        return tuple(sd[k].shape) if k in sd else "absent"

    differ = [k for k in [*own, *saved] if shape(own, k) != shape(saved, k)]
    if differ:
        k = differ[0]
        raise UsageError(
            f"--resume: {ckpt} holds another model than this config builds ({k}: {shape(saved, k)} "
            f"there, {shape(own, k)} here); resume with the run's own config (drop model.* and init= "
            "overrides)"
        )
    model.load_state_dict(saved)


def load_trainer_state(ckpt: str | Path) -> dict:
    path = Path(ckpt, "trainer.pt")
    if not path.exists():
        raise UsageError(f"{str(ckpt)!r} has no trainer.pt; it cannot be resumed, only used as init=")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # truncated or corrupted: zip, pickle and EOF errors alike
        earlier = [p for p in step_dirs(Path(ckpt).parent.parent) if p != Path(ckpt)]
        fix = (
            f"move {ckpt} away to resume from {earlier[-1].name}" if earlier else "start the run again without --resume"
        )
        raise UsageError(f"{path} is unreadable ({type(e).__name__}: {str(e).splitlines()[0][:80]}); {fix}") from None
