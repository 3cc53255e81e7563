"""Configs: one typed dataclass per stage, YAML files, dotted `key=value` overrides.

    cfg = load_config(SFTConfig, "configs/sft_cot.yaml", ["steps=200", "model.preset=micro"])

Every field carries a comment that says what it does. Unknown keys fail with the closest
valid name; wrong types fail naming the key and the expected type (both `UsageError`, so
the CLI prints one line and exits 2). The fully resolved config is saved in the run
directory as `config.yaml`.
"""

from __future__ import annotations

import dataclasses
import difflib
import keyword
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from posttrain import UsageError
from posttrain.algorithms import grpo
from posttrain.algorithms.base import AlgoConfig
from posttrain.logging import WandbConfig
from posttrain.models.gpt_mini import ModelConfig
from posttrain.models.lora import LoraConfig
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.tasks.base import TaskConfig
from posttrain.validate import validate

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


@dataclass
class RunConfig:
    """Keys every stage accepts."""
    out: str = ""                 # run directory; "" = runs/<stage>
    seed: int = 0                 # seeds model init, data order and sampling
    steps: int = 100              # optimizer steps
    save_every: int = 0           # checkpoint every N steps (0 = only at the end)
    keep_last: int = 2            # checkpoints kept on disk (older ones are deleted)
    eval_every: int = 0           # evaluate every N steps (0 = only at the end)
    log_every: int = 10           # print/log metrics every N steps
    device: str = "auto"          # auto | cpu | cuda | cuda:N ; auto = cuda if available
    dtype: str = "auto"           # auto | float32 | bfloat16 ; auto = fp32 on CPU, bf16 autocast on CUDA
    threads: int = 0              # torch CPU threads (0 = torch's default)
    grad_checkpointing: bool = False  # recompute each block's activations in backward: less memory, ~1/3 more compute
    overwrite: bool = False       # allow reusing a non-empty `out` without --resume
    max_nonfinite_steps: int = 10  # stop (with a checkpoint) after this many skipped non-finite steps in a row
    tensorboard: bool = True      # TensorBoard event files in RUN_DIR/tensorboard (when the package is installed)
    wandb: WandbConfig = field(default_factory=WandbConfig)  # a W&B run when wandb.project is set (offline by default)


@dataclass
class OptimConfig:
    lr: float = 3e-4              # peak learning rate (AdamW)
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW betas; 0.95 forgets faster than 0.999, steadier for small batches
    weight_decay: float = 0.1     # decoupled, applied to matrices only (not norms)
    grad_clip: float = 1.0        # clip the global gradient norm to this (0 = off)
    warmup_steps: int = 0         # linear warm-up from 0 to lr
    schedule: str = "cosine"      # constant | cosine | linear ; decay after warm-up, to min_lr_frac·lr
    min_lr_frac: float = 0.1      # floor of the decay as a fraction of lr
    micro_batch_tokens: int = 8192  # largest micro-batch (padded tokens); bigger batches accumulate gradients


@dataclass
class PretrainConfig(RunConfig):
    steps: int = 300
    eval_every: int = 100
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=ArithmeticConfig)  # `task.name` picks the task; the corpus is its traces
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=2e-3, warmup_steps=50))
    batch_size: int = 32          # sequences per step
    seq_len: int = 96             # tokens per sequence (random windows of the corpus)
    corpus_chars: int = 400_000   # size of the generated corpus


@dataclass
class SFTConfig(RunConfig):
    steps: int = 500
    init: str = ""                # checkpoint or run dir to start from ("" = random init from `model`)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=ArithmeticConfig)  # `task.name` picks the task (tasks/__init__.py)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, warmup_steps=30))
    lora: LoraConfig = field(default_factory=LoraConfig)  # lora.r > 0: train LoRA adapters only (HF models)
    cot: bool = True              # train on chain-of-thought traces (True) or direct answers (False)
    mask_prompt: bool = True      # loss on response tokens only; False = also learn to predict the prompt
    batch_size: int = 64          # examples per step
    num_problems: int = 20000     # distinct training problems generated (train split only)
    eval_problems: int = 600      # held-out problems in the end-of-stage evaluation
    data: str = "gold"            # gold: the task's own traces | rejection: the init model's verified samples (RFT)
    rejection_prompts: int = 2000  # data=rejection: train prompts sampled (at most num_problems)
    rejection_samples: int = 8    # data=rejection: samples per prompt; correct, distinct ones are kept
    target_acc: float = 0.0       # stop at the first evaluation (every eval_every steps) whose held-out greedy
                                  # accuracy reaches this; 0 = off. A warm-up for RL: start where RL has room


def _resolve_path(path: str | None) -> Path | None:
    if path is None:
        return None
    p = Path(path)
    if p.exists():
        return p
    for cand in (CONFIG_DIR / path, CONFIG_DIR / f"{path}.yaml"):
        if cand.exists():
            return cand
    names = sorted(x.stem for x in CONFIG_DIR.glob("*.yaml")) if CONFIG_DIR.exists() else []
    raise UsageError(f"config file {path!r} not found; give a YAML path or a preset name ({', '.join(names)})")


def load_config(cls, path: str | None = None, overrides: typing.Sequence[str] = (), data: dict | None = None):
    """Build `cls` from an optional YAML file, then `data` (a nested dict: the Python API's keyword
    arguments), then `key=value` overrides (dotted for nesting)."""
    merged: dict = {}
    p = _resolve_path(path)
    if p is not None:
        try:
            merged = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise UsageError(f"config file {p} is not valid YAML: {str(e).splitlines()[0]}") from None
        except UnicodeDecodeError as e:
            line = p.read_bytes()[:e.start].count(b"\n") + 1
            raise UsageError(f"config file {p}:{line}: byte 0x{e.object[e.start]:02x} is not UTF-8; "
                             "save the file as UTF-8") from None
        if not isinstance(merged, dict):
            raise UsageError(f"config file {p} must hold a mapping of keys to values")
    data = _deep_merge(merged, data or {})
    for item in overrides:
        if "=" not in item:
            raise UsageError(f"override {item!r} must look like key=value (e.g. steps=100)")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UsageError(f"override {key!r}: {part!r} is not a section")
        node[parts[-1]] = value
    return validate(build(cls, data))           # values: posttrain/validate.py


def _deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def build(cls, data: dict, prefix: str = "", base=None):
    """Turn a nested dict into the dataclass `cls` (on top of `base`, default `cls()`),
    validating every key and type. Nested sections keep the stage's own defaults."""
    obj = base if base is not None else cls()
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    data = _renamed(cls, data, prefix, hints)
    kwargs = {}
    for key, value in data.items():
        if keyword.iskeyword(key):   # `async: true` in YAML is the field async_
            key += "_"
        if key not in hints:
            raise UsageError(f"unknown config key '{prefix}{key}' for {cls.__name__}{_suggest(obj, key, names, prefix)}")
        if dataclasses.is_dataclass(hints[key]) and isinstance(value, dict):
            sub, current = _section(hints[key], value, getattr(obj, key))
            kwargs[key] = build(sub, value, f"{prefix}{key}.", current)
        else:
            kwargs[key] = _coerce(hints[key], value, f"{prefix}{key}")
    return dataclasses.replace(obj, **kwargs)


_NOTED: set[str] = set()


def _renamed(cls, data: dict, prefix: str, hints) -> dict:
    """Old flat names moved into their sections (a one-line note, once); TRL's names refused with
    posttrain's name for the same thing."""
    moved, foreign = ALIASES.get(cls, ({}, {}))
    out = dict(data)
    for key in [k for k in data if k not in hints and (k + "_" not in hints or not keyword.iskeyword(k))]:
        if key in moved:
            *path, leaf = moved[key].split(".")
            node = out
            for part in path:
                node[part] = node = dict(node.get(part) or {})
            if leaf in node and node[leaf] != data[key]:
                raise UsageError(f"config keys '{prefix}{key}' and '{prefix}{moved[key]}' are the same key with two "
                                 f"values; keep '{prefix}{moved[key]}'")
            node[leaf] = out.pop(key)
            if key not in _NOTED:
                _NOTED.add(key)
                print(f"note: config key '{prefix}{key}' is now '{prefix}{moved[key]}' (the old name works until "
                      "posttrain 0.3)", file=sys.stderr)
        elif key in foreign:
            raise UsageError(f"unknown config key '{prefix}{key}' for {cls.__name__}: that is TRL's name; "
                             f"posttrain's is '{prefix}{foreign[key]}'")
    return out


def _section(tp, value: dict, current):
    """The dataclass of a nested section and its base. A `task:` section is the config of the task
    its `name` picks (tasks/__init__.py), an `algo:` section the Config of the algorithm its `name`
    picks (algorithms/__init__.py); switching the name starts from that one's defaults."""
    if isinstance(tp, type) and issubclass(tp, AlgoConfig):
        from posttrain import algorithms
        cls = algorithms.get(value.get("name", current.name)).Config
        return cls, current if type(current) is cls else None
    if not (isinstance(tp, type) and issubclass(tp, TaskConfig)):
        return tp, current
    from posttrain.tasks import config_class
    name = value.get("name", current.name)
    cls = config_class(name)
    if tp is not TaskConfig and cls is not tp:            # a stage typed to one task (dpo, rm, pipeline)
        raise UsageError(f"task.name={name!r}: this stage runs on task.name={tp().name} only")
    return cls, current if type(current) is cls else None


def _dotted_keys(obj, prefix=""):
    """Every leaf key of a config instance, dotted (sections at their current class: the task and
    algorithm picked by name)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _dotted_keys(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


def _suggest(obj, key, names, prefix) -> str:
    leafs = {k.rsplit(".", 1)[-1]: k for k in _dotted_keys(obj)}
    if key in leafs and "." in leafs[key]:         # an exact key of a section: `lr` is `optim.lr`
        return f"; did you mean '{prefix}{leafs[key]}'?"
    close = difflib.get_close_matches(key, names, n=1)
    if close:
        return f"; did you mean '{prefix}{close[0]}'?"
    # a key given at the wrong level: `lrr=...` for `optim.lr`
    close = difflib.get_close_matches(key, list(leafs), n=1)
    if close:
        return f"; did you mean '{prefix}{leafs[close[0]]}'?"
    return f"; valid keys: {', '.join(names)}"


def _coerce(tp, value, key):
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise UsageError(f"config key {key!r} is a section; give it as {key}.<field>=value")
        return build(tp, value, f"{key}.")
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, key)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise UsageError(f"config key {key!r} expects a list, got {value!r}")
        args = typing.get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise UsageError(f"config key {key!r} expects {len(args)} values, got {len(value)}")
            return tuple(_coerce(a, v, key) for a, v in zip(args, value))
        item = args[0] if args else typing.Any
        return origin(_coerce(item, v, key) for v in value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:
            return float(value)  # YAML 1.1 reads "1e-3" as a string
        except ValueError:
            pass
    if tp is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if tp in (int, float, str, bool) and not (isinstance(value, tp) and not (tp is int and isinstance(value, bool))):
        raise UsageError(f"config key {key!r} expects {tp.__name__}, got {value!r} ({type(value).__name__})")
    return value


def to_dict(cfg) -> dict:
    d = dataclasses.asdict(cfg)
    return _plain(d)


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def save_config(cfg, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


@dataclass
class RolloutConfig:
    """How each RL step samples."""
    prompts_per_step: int = 16    # prompts (groups) per step
    samples_per_prompt: int = 8   # responses per prompt: the group size G (TRL: num_generations)
    temperature: float = 1.0      # sampling temperature; the trainer recomputes logprobs at the same one
    max_new_tokens: int = 0       # response cap; 0 = what a correct trace of the task needs, plus slack
                                  # (TRL: max_completion_length)
    degenerate: str = "keep"      # groups whose rewards are all equal: keep | skip | resample
    max_resample_attempts: int = 3  # with degenerate=resample: rollout rounds per step at most
    overprovision: int = 0        # straggler cut-off: start samples_per_prompt + this per prompt, keep the first to finish
    max_slots: int = 256          # rollout engine decode slots (continuous batching)
    precision: str = "fp32"       # sampler arithmetic: fp32 | bf16 | fp16, emulated (posttrain/precision.py) against
                                  # the trainer's fp32: the precision lab; logprob mismatch and clip act on the difference


@dataclass
class RLOptimConfig(OptimConfig):
    """AdamW as in every stage, plus how often one batch is reused."""
    epochs: int = 1               # passes over each batch (PPO-style reuse; 1 = strictly on-policy; TRL: num_iterations)
    minibatches: int = 1          # optimizer steps per pass (the batch split into this many minibatches)


@dataclass
class EvalConfig:
    """The held-out evaluation at step 0, every `eval_every` steps and at the end."""
    problems: int = 200           # held-out problems per evaluation
    samples: int = 8              # samples per held-out problem: pass@1, pass@<samples> and maj@<samples>
    save_samples: int = 8         # audited samples written to samples.jsonl at each eval (top-reward + random)


@dataclass
class VerifierConfig:
    """Where reward functions and verifiers run."""
    workers: int = 0              # verifier processes (tasks/pool.py); 0 = in-process: cheapest, but a hang stalls the step
    timeout_s: float = 30.0       # per-call deadline with workers > 0; a late call scores 0 (reward/timeouts)
    memory_mb: int = 0            # address space a worker may add to what it inherits (0 = no cap); past it an
                                  # allocation fails (MemoryError, reward 0) and the worker is replaced
    max_calls: int = 0            # replace a worker after this many calls (0 = never): bounds what a leaky verifier keeps
    reward_bound: float = 1e6     # a reward or component beyond ±this (or NaN, inf, not a number) scores 0, counted
                                  # in reward/errors: a broken verifier, not a generous one


@dataclass
class ScaleConfig:
    """Where the roles run, and how far rollouts may run ahead of the trainer (distributed/)."""
    placement: str = "in-process"  # in-process | ray (rollout workers as Ray actors; the trainer in the driver)
    rollout_workers: int = 2      # placement=ray: rollout actors, each an Engine with its own model copy
    weight_sync: str = "colocated"  # colocated (sampler shares the module) | separate (a copy, synced)
    async_: bool = False          # YAML `async: true`: rollouts run ahead on a producer; more throughput, stale samples
    max_staleness: int = 1        # async: samples at most this many policy versions behind the trainer (0 = sync)
    stale: str = "pace"           # async: pace = producers wait (no work wasted) | drop = run free, drop older batches
                                  # | fixed = every batch exactly max_staleness old (staleness experiments)
    partial_rollouts: bool = False  # async, in-process: an update may land mid-sample (between decode steps);
                                  # each token records the version that produced it. Fresher tokens, mixed samples
    off_policy_correction: str = "auto"  # none | tis | seq_tis | mask (IS weights from behaviour logprobs); auto = tis if async
    off_policy_cap: float = 2.0   # C: truncate weights at C (tis, seq_tis) or zero them outside [1/C, C] (mask)
    sync_bucket_mb: float = 64.0  # weight sync across copies/processes: MB per transfer bucket
    sync_transport: str = "object_store"  # placement=ray: object_store (ray.put per bucket) | broadcast (a process
                                  # group of trainer + workers, one broadcast per bucket; gloo: the workers are CPU actors)
    trainer_ranks: int = 1        # trainer data-parallel over N local processes (gloo, CPU); rank 0 also runs the other roles
    trainer_shard: str = "replicate"  # trainer_ranks > 1: replicate = every rank a full copy, gradients all-reduced
                                  # | fsdp = FSDP2 fully_shard: params, grads, AdamW state split over ranks (less memory)


@dataclass
class RLConfig(RunConfig):
    steps: int = 150
    eval_every: int = 50
    init: str = ""                # SFT checkpoint or run dir; "" = the default SFT(CoT) checkpoint (trained once, cached)
    task: TaskConfig = field(default_factory=ArithmeticConfig)  # `task.name` picks the task (tasks/__init__.py)
    algo: AlgoConfig = field(default_factory=lambda: grpo.Config(kl_coef=0.01))  # `algo.name` picks the algorithm;
                                  # the other keys are its Config (posttrain rl --help algo)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: RLOptimConfig = field(default_factory=lambda: RLOptimConfig(
        lr=3e-5, weight_decay=0.0, schedule="constant", micro_batch_tokens=8192))  # RL lr ≈ SFT lr / 30
    eval: EvalConfig = field(default_factory=EvalConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)  # lora.r > 0: train LoRA adapters only
    reward_model: str = ""        # RLHF: an `rm` run whose frozen score is the reward (verifier logged as reward/true);
                                  # RUN_A,RUN_B = an ensemble, the mean of their scores


# Flat names of the RL config before it had sections: accepted with a one-line note (until 0.3).
RL_MOVED = {"algorithm": "algo.name", "epochs": "optim.epochs", "minibatches": "optim.minibatches",
            **{k: f"rollout.{k}" for k in ("prompts_per_step", "samples_per_prompt", "temperature", "max_new_tokens",
                                            "degenerate", "max_resample_attempts", "overprovision", "max_slots")},
            "eval_problems": "eval.problems", "eval_samples": "eval.samples", "save_samples": "eval.save_samples",
            "verifier_workers": "verifier.workers", "verifier_timeout_s": "verifier.timeout_s",
            **{k: f"scale.{k}" for k in ("placement", "rollout_workers", "weight_sync", "max_staleness", "stale",
                                          "partial_rollouts", "off_policy_correction", "off_policy_cap",
                                          "sync_bucket_mb", "sync_transport", "trainer_ranks", "trainer_shard")},
            "async": "scale.async", "async_": "scale.async"}
# TRL's GRPOConfig names, recognised so the error can name posttrain's key.
TRL_NAMES = {"beta": "algo.kl_coef", "num_generations": "rollout.samples_per_prompt",
             "max_completion_length": "rollout.max_new_tokens", "learning_rate": "optim.lr",
             "epsilon_high": "algo.eps_high", "epsilon": "algo.eps_low (and algo.eps_high)",
             "num_iterations": "optim.epochs", "max_steps": "steps", "max_grad_norm": "optim.grad_clip",
             "warmup_steps": "optim.warmup_steps", "lr_scheduler_type": "optim.schedule",
             "reward_funcs": "task.reward", "reward_weights": "task.reward_weights",
             "output_dir": "out", "logging_steps": "log_every", "save_steps": "save_every", "eval_steps": "eval_every",
             "per_device_train_batch_size": "rollout.prompts_per_step (× rollout.samples_per_prompt samples)",
             "scale_rewards": "algo.scale_by_std", "loss_type": "algo.aggregation (or algo.name=dr_grpo|dapo)"}
ALIASES = {RLConfig: (RL_MOVED, TRL_NAMES)}
