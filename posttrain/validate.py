"""Config values no run can use, refused once the config is built: one line, exit 2, no work done.

`config.py` checks keys and types; this table checks values. A rule is keyed by the field's
leaf name (`lr`, not `optim.lr`), so it holds wherever a key lives and whichever stage owns
it; a leaf whose meaning differs between dataclasses is keyed `(DataclassName, leaf)`, and
that entry wins over the plain one. `validate(cfg)` walks the built dataclass (sections
included) and raises `UsageError` on the first value a rule refuses, naming the dotted key:

    optim.lr=nan: the learning rate must be a finite number in (0, 1]; e.g. optim.lr=3e-5

Combinations of keys (minibatches must divide the step's samples, a group baseline needs
two samples per prompt) and values that need the model (max_new_tokens past its context, a
preference row past it) are checked by the stage that knows them (recipes/rl.py
check_config, check_group_size, check_context; preference/data.fits_context).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from posttrain.errors import UsageError

Rule = Callable[[object], "str | None"]  # value -> why it is refused (None = fine)


def count(least: int, what: str, example: str) -> Rule:
    """An int of at least `least`."""

    def rule(v):
        if v < least:
            return f"{what} must be ≥ {least}; e.g. {{key}}={example}"
        return None

    return rule


def real(what: str, low: float = 0.0, high: float = math.inf, *, open_low: bool = False, example: str = "") -> Rule:
    """A finite float in [low, high] (or (low, high] with open_low)."""

    def rule(v):
        inside = (v > low if open_low else v >= low) and v <= high
        if math.isfinite(v) and inside:
            return None
        bound = f"> {low:g}" if open_low else f"≥ {low:g}"
        if math.isfinite(high):
            bound = f"in ({low:g}, {high:g}]" if open_low else f"in [{low:g}, {high:g}]"
        return f"{what} must be a finite number {bound}; e.g. {{key}}={example}"

    return rule


def one_of(*choices: str) -> Rule:
    """A string among `choices`."""

    def rule(v):
        return None if v in choices else f"use one of {list(choices)}; e.g. {{key}}={choices[0]}"

    return rule


def _compile(v) -> str | None:
    """optim.compile: true, false or auto (a bool is always fine; framework/compiled.py)."""
    return None if v == "auto" else "torch.compile of the forward is auto, true or false; e.g. {key}=auto"


def _micro_batch_tokens(v) -> str | None:
    """optim.micro_batch_tokens: auto (sized for the device: framework/batch.budgets) or a count ≥ 1."""
    if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
        return None
    return "the micro-batch token budget is auto or a number ≥ 1; e.g. {key}=auto or {key}=8192"


def _betas(v) -> str | None:
    if all(math.isfinite(b) and 0.0 <= b < 1.0 for b in v):
        return None
    return "AdamW's betas must be finite numbers in [0, 1); e.g. {key}=[0.9,0.95]"


def _steps(v) -> str | None:
    if v >= 1:
        return None
    return (
        "a run needs at least one optimizer step (e.g. {key}=100); to only evaluate a checkpoint "
        "use `posttrain eval CHECKPOINT`"
    )


RULES: dict[str | tuple[str, str], Rule] = {
    # how long and how much: at least one of each
    "steps": _steps,
    "batch_size": count(1, "the batch", "32"),
    "prompts_per_step": count(1, "the prompts (groups) per step", "16"),
    "samples_per_prompt": count(1, "the samples per prompt", "8"),
    "epochs": count(1, "the passes over each batch", "1"),
    "seq_len": count(2, "the sequence length (a next-token target needs 2 tokens)", "96"),
    "corpus_chars": count(1, "the corpus size", "400000"),
    "num_problems": count(1, "the training problems", "20000"),
    "rejection_prompts": count(1, "the prompts sampled for rejection SFT", "2000"),
    "rejection_samples": count(1, "the samples per prompt for rejection SFT", "8"),
    "pair_prompts": count(1, "the prompts sampled for pairs", "2000"),
    "eval_samples": count(1, "the samples per held-out problem", "8"),
    ("EvalConfig", "samples"): count(1, "the samples per held-out problem", "8"),
    "max_slots": count(1, "the rollout engine's decode slots", "256"),
    "prefill_chunk": count(1, "the prompt tokens per prefill forward", "16384"),
    "max_resample_attempts": count(1, "the rollout rounds per step", "3"),
    "micro_batch_tokens": _micro_batch_tokens,
    "packing_width": count(0, "the packed rows' least width (0 = the longest sequence)", "0"),
    "packing_attention": one_of("auto", "dense", "flex", "varlen"),  # models/attention.py KERNELS
    ("OptimConfig", "compile"): _compile,
    "compile_scope": one_of("blocks", "trunk"),  # framework/compiled.py SCOPES
    "rollout_workers": count(1, "the rollout workers", "2"),
    "trainer_ranks": count(1, "the trainer processes", "1"),
    "gpus": count(1, "the ranks (one GPU each)", "2"),
    "trainer_shard": one_of("fsdp", "replicate"),  # distributed/ranks.py SHARDS
    # schedules and sizes where 0 means "off" or "the default": never negative
    "save_every": count(0, "the checkpoint interval (0 = only at the end)", "50"),
    "eval_every": count(0, "the evaluation interval (0 = only at the end)", "50"),
    "log_every": count(0, "the logging interval", "10"),
    "keep_last": count(0, "the checkpoints kept (0 = all)", "2"),
    "threads": count(0, "the torch CPU threads (0 = torch's default)", "1"),
    "max_nonfinite_steps": count(0, "the non-finite steps tolerated in a row (0 = never stop)", "10"),
    "warmup_steps": count(0, "the warm-up steps", "0"),
    "eval_problems": count(0, "the held-out problems", "200"),
    ("EvalConfig", "problems"): count(0, "the held-out problems", "200"),
    "save_samples": count(0, "the audited samples per evaluation", "8"),
    "max_new_tokens": count(0, "the response cap (0 = what the task needs)", "0"),
    ("VerifierConfig", "memory_mb"): count(0, "a verifier worker's added address space (0 = no cap)", "2048"),
    ("VerifierConfig", "max_calls"): count(
        0, "the calls after which a verifier worker is replaced (0 = never)", "1000"
    ),
    # real numbers: never NaN or infinite
    "lr": real("the learning rate", high=1.0, open_low=True, example="3e-5"),  # AdamW steps are ~lr per weight
    ("OptimConfig", "weight_decay"): real("weight decay", example="0.1"),
    "grad_clip": real("the gradient-norm clip (0 = off)", example="1.0"),
    "min_lr_frac": real("the learning-rate floor", high=1.0, example="0.1"),
    "betas": _betas,
    "temperature": real("the sampling temperature", example="1.0"),
    ("VerifierConfig", "timeout_s"): real("the verifier deadline", open_low=True, example="30"),
    "reward_bound": real("the largest |reward| accepted", open_low=True, example="1e6"),
    "target_acc": real("the target accuracy (0 = off)", high=1.0, example="0.7"),
    "sync_bucket_mb": real("the weight-sync bucket size", open_low=True, example="64"),
    "gpu_memory_utilization": real("vLLM's share of the GPU", high=1.0, open_low=True, example="0.3"),
    ("VllmConfig", "kv_cache_mb"): count(0, "vLLM's KV cache size (0 = room for max_slots sequences)", "512"),
}


def validate(cfg, prefix: str = ""):
    """Check every field of the dataclass `cfg` (sections included) against RULES; returns cfg."""
    for f in dataclasses.fields(cfg):
        value, key = getattr(cfg, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            validate(value, f"{key}.")
            continue
        owned = (RULES.get((k.__name__, f.name)) for k in type(cfg).__mro__)  # RLOptimConfig is an OptimConfig
        rule = next((r for r in owned if r is not None), None) or RULES.get(f.name)
        if rule is None or value is None or isinstance(value, bool):
            continue
        why = rule(value)
        if why is not None:
            name = key.removesuffix("_")  # async_ is the YAML key async
            raise UsageError(f"{name}={value!r}: {why.format(key=name)}")
    return cfg
