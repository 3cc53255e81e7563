"""LoRA through peft on a Hugging Face model: train the adapters only, hand merged weights to the sampler.

    W' = W + (α / r) · B · A        A [r, in] random, B [out, r] zero: W' = W before the first step

`apply_lora(model, cfg)` injects adapters into `model.hf` (an HFCausalLM) in place and freezes
every other parameter, so the Trainer (which optimises parameters with requires_grad) keeps
AdamW moments and gradients for A and B only: that is where the memory goes down. The
module's forward is unchanged, so the engine, the reference and the heads see a model with
adapters like any other (colocated sampling runs the adapter path: W·x + (α/r)·B·A·x).

Weight sync (framework/weight_sync/lora.py, weight_sync=separate): the sampler holds a plain
model without adapter layers (`unadapted_copy`) and receives the merged W + (α/r)·B·A of
every adapted Linear (`merged_weight`), the only weights that change. Checkpoints write the merged weights
(`merged_state_dict`), a plain HF directory that transformers loads without peft, and beside
them `adapter/` in PEFT's own format (adapter_config.json naming the base model +
adapter_model.safetensors): `PeftModel.from_pretrained(base, CKPT/adapter)` rebuilds the policy,
and `--resume` puts the adapters back on the base (`load_adapter`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import torch

from posttrain.errors import UsageError

ADAPTER = "default"


@dataclass
class LoraConfig:
    r: int = 0  # adapter rank; 0 = off (full fine-tuning). Memory and capacity grow with r
    alpha: float = 16.0  # scale α: the update is (α / r)·B·A, so α/r acts as an lr multiplier
    dropout: float = 0.0  # dropout on the adapter input (0 keeps sampler and trainer identical)
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    # Linear layer names to adapt (Llama/Qwen names; attention only: q_proj, v_proj)


def apply_lora(model, cfg: LoraConfig) -> dict:
    """Inject adapters into `model.hf` and freeze the rest; returns the parameter counts."""
    if not hasattr(model, "hf"):
        raise UsageError(
            "lora needs a Hugging Face model: export gpt_mini with `posttrain export RUN "
            "--format hf DIR` and pass init=DIR"
        )
    if cfg.dropout > 0:
        raise UsageError(
            "lora.dropout > 0 makes the trainer's logprobs differ from the sampler's "
            "(the on-policy ratio is no longer 1); use lora.dropout=0"
        )
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import inject_adapter_in_model
    except ImportError:
        raise UsageError("lora needs peft: pip install 'posttrain[hf]'") from None
    try:
        inject_adapter_in_model(
            PeftLoraConfig(
                r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules)
            ),
            model.hf,
        )
    except ValueError as e:
        raise UsageError(f"lora.target_modules={list(cfg.target_modules)}: {str(e).splitlines()[0][:160]}") from None
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    return param_counts(model)


def param_counts(model) -> dict:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"params/total": total, "params/trainable": trainable, "params/trainable_frac": trainable / max(total, 1)}


def lora_layers(module) -> dict:
    """name -> peft LoraLayer of every adapted Linear in `module` (empty without adapters)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return {}
    return {n: m for n, m in module.named_modules() if isinstance(m, LoraLayer)}


@torch.no_grad()
def merged_weight(layer) -> torch.Tensor:
    """W + (α/r)·B·A of one adapted Linear (peft's own delta, so fan-in/fan-out conventions hold)."""
    return layer.base_layer.weight + layer.get_delta_weight(ADAPTER)


@torch.no_grad()
def merged_state_dict(module) -> dict | None:
    """The state dict of `module` with adapters merged into plain Linear names; None without adapters."""
    layers = lora_layers(module)
    if not layers:
        return None
    out = {k.replace(".base_layer.", "."): v for k, v in module.state_dict().items() if "lora_" not in k}
    for name, layer in layers.items():
        out[f"{name}.weight"] = merged_weight(layer)
    return out


def save_adapter(model, directory: str | Path, base: str | None) -> None:
    """The adapters as PEFT writes them (PeftModel.save_pretrained): adapter_config.json with the
    base model's path, adapter_model.safetensors with keys `base_model.model.<module>.lora_A.weight`."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    cfg = copy.deepcopy(model.hf.peft_config[ADAPTER])
    cfg.base_model_name_or_path, cfg.task_type = base, "CAUSAL_LM"
    Path(directory).mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(directory))
    state = get_peft_model_state_dict(model.hf, adapter_name=ADAPTER)
    save_file(
        {f"base_model.model.{k}": v.detach().contiguous().cpu() for k, v in state.items()},
        str(Path(directory, "adapter_model.safetensors")),
    )


def load_adapter(model, directory: str | Path) -> None:
    """Adapter weights saved by `save_adapter` into a model that has the same adapters injected."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(Path(directory, "adapter_model.safetensors")))
    state = {k.removeprefix("base_model.model."): v for k, v in state.items()}
    result = set_peft_model_state_dict(model.hf, state, adapter_name=ADAPTER)
    missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k]
    if missing:
        raise UsageError(
            f"{directory}: the saved adapters do not match this run's lora settings "
            f"(missing {missing[0]}); resume with the lora.* keys the run was started with"
        )


def unadapted_copy(model):
    """A deep copy of `model` whose adapted Linears are plain Linears holding the merged weights."""
    twin = copy.deepcopy(model)
    for name, layer in lora_layers(twin).items():
        base = layer.base_layer
        base.weight.data.copy_(merged_weight(layer))
        parent_name, _, child = name.rpartition(".")
        setattr(twin.get_submodule(parent_name), child, base)
    return twin.eval().requires_grad_(False)
