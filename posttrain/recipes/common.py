"""What every stage shares: the run directory, the starting model, the step plan, the LM loss.

The step loop itself (resume, signals, checkpoints, evals, logs) is framework/loop.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import yaml

from posttrain import checkpoint, postmortem, runtime, tasks
from posttrain.config import save_config, to_dict
from posttrain.distributed import launch
from posttrain.errors import UsageError
from posttrain.framework import card
from posttrain.framework.batch import split_micro_batches, to_device
from posttrain.framework.logprobs import micro_logprobs
from posttrain.framework.world import current
from posttrain.models import attention, hub
from posttrain.models.gpt_mini import GPTMini
from posttrain.models.lora import apply_lora
from posttrain.models.tokenizer import BASE_CHARS, DEFAULT_CHARS, CharTokenizer
from posttrain.reward_models.wrap import with_judge
from posttrain.sizing.run_memory import AUTO_HEADROOM, model_shape, predict_run_peak
from posttrain.tasks import hub_data


class Run:
    """The run directory of one stage, with its runtime and the checkpoint to resume from."""

    def __init__(self, cfg, stage: str, resume: bool = False):
        self.cfg, self.stage = cfg, stage
        device = launch.join(cfg.device)  # under torchrun: this rank's device, in the run's process group
        self.world = current()
        self.rt = runtime.resolve(device, cfg.dtype, cfg.threads)  # a bad device: refused before any write
        attention.check(packing_attention(cfg), self.rt.device, self.rt.compute_dtype)  # flex/varlen on a CPU too
        self.dir = Path(cfg.out or f"runs/{stage}")
        self.resume_from = None
        self.resume_state = None
        if resume:
            self.resume_from = checkpoint.resume_target(self.dir)
            same_model(self.dir, cfg)  # before config.yaml is rewritten: a refused resume changes nothing
            self.resume_state = checkpoint.load_trainer_state(self.resume_from)  # a torn trainer.pt fails now
        elif checkpoint.latest(self.dir) is not None and not cfg.overwrite:
            raise UsageError(
                f"run directory {str(self.dir)!r} already holds checkpoints; "
                f"pass --resume {self.dir} to continue, overwrite=true to start over, or out=NEW_DIR"
            )
        self.sources: dict = {}
        if self.world.main:  # rank 0 writes the run directory and fetches what the hub holds
            write_run_dir(self.dir, cfg)
            self.sources = record_sources(self.dir, cfg, resume)  # hub ids: a bad one fails here, before any model
            postmortem.watch(self.dir, stage)  # a death from here on is named, on stderr and in RUN_DIR/crash.log
        self.world.barrier()  # the other ranks then read the run directory and the hub's cache
        runtime.seed_everything(cfg.seed)
        self.predicted_peak: dict | None = None  # predict_memory


def packing_attention(cfg) -> str:
    """optim.packing_attention, auto for a stage without an optimizer section."""
    return getattr(getattr(cfg, "optim", None), "packing_attention", "auto")


def same_model(run_dir: Path, cfg) -> None:
    """A resume must build the model the run trained: its `model` and `init` keys as in the run's
    config.yaml (an override such as model.preset=micro is refused naming both values). The
    checkpoint's tensor shapes are checked again when the weights load (checkpoint.restore_weights)."""
    path = run_dir / "config.yaml"
    saved = yaml.safe_load(path.read_text()) if path.exists() else None
    if not isinstance(saved, dict):
        return
    now = to_dict(cfg)
    for section in ("model", "init"):
        if section not in saved or section not in now or saved[section] == now[section]:
            continue
        if (
            section == "init"
            and saved[section]
            and now[section]
            and Path(saved[section]).resolve() == Path(now[section]).resolve()
        ):
            continue  # the same directory, written another way
        was, new = saved[section], now[section]
        if isinstance(was, dict) and isinstance(new, dict):
            key = next(k for k in {**was, **new} if was.get(k) != new.get(k))
            section, was, new = f"{section}.{key}", was.get(key), new.get(key)
        raise UsageError(
            f"--resume {run_dir}: {section}={new!r} but the run was trained with {section}={was!r} "
            f"({path}); a run resumes only into its own model: drop the {section} override"
        )


def write_run_dir(directory: Path, cfg) -> None:
    """Create the run directory with its resolved `config.yaml`; an unwritable `out` (read-only
    filesystem, a path under a file, no permission) is a one-line UsageError before any work."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        save_config(cfg, directory / "config.yaml")
    except OSError as e:
        raise UsageError(
            f"out={directory}: cannot write the run directory ({e.strerror or e}); set out= to a writable directory"
        ) from None


MODEL_KEYS = ("init", "reward_model", "teacher", "task.judge.model")  # the config keys that name a model
DATA_KEYS = ("task.train", "task.test")  # ... and a dataset


def record_sources(run_dir: Path, cfg, resume: bool = False) -> dict:
    """Resolve every Hugging Face Hub id the config names (models/hub.py: a name that resolves nowhere
    is one line, before any model is loaded) and write RUN_DIR/sources.json: per key, the hub id and
    the commit its files came from (`pinned`: `key=org/name@<commit>` reads the same files again).
    Datasets were read when the task was built (tasks/hub_data.RECORDS). A resumed run whose inputs
    moved on the hub since says so in one line (its weights come from its checkpoint)."""
    out: dict = {}
    for key in MODEL_KEYS:
        value = str(_config_value(cfg, key) or "")
        names = value.split(",") if key == "reward_model" else [value]  # RUN_A,RUN_B: an RM ensemble
        for i, name in enumerate(names):
            if hub.is_hub_name(name):
                out[key if i == 0 else f"{key}[{i}]"] = hub.resolve_model(name, key).record()
    for key in DATA_KEYS:
        if rec := hub_data.RECORDS.get((key, str(_config_value(cfg, key) or ""))):
            out[key] = rec
    path = run_dir / "sources.json"
    if resume and path.exists():
        was = json.loads(path.read_text())
        for key, rec in out.items():
            if key in was and was[key].get("revision") != rec["revision"]:
                print(f"sources: {key} was {was[key].get('revision')} when the run began, now {rec['revision']}")
    if out:
        path.write_text(json.dumps(out, indent=1))
        print("sources: " + ", ".join(f"{k}={v['hub_id']}@{v['revision']}" for k, v in out.items()), flush=True)
    return out


def _config_value(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part, None)
    return cfg


def init_model(cfg, init: str, run: Run, task=None) -> tuple[GPTMini, CharTokenizer]:
    """Start from a checkpoint (`init`: a run, a checkpoint or a Hugging Face directory) or from
    random weights shaped by `cfg.model` (with a vocabulary for `task`); then the training
    switches: gradient checkpointing and LoRA adapters (`cfg.lora.r > 0`); then the card
    (framework/card.py): weights and optimizer state that cannot fit it are refused (the whole run's
    predicted peak above it is predict_memory's warning)."""
    device = run.rt.device
    if init:
        model, tok, path = checkpoint.load_model(init, device, "init")
        source = hub.resolve_model(init, "init")  # memoised: the hub commit (None for a local path)
        # a LoRA checkpoint's adapter_config names its base: the hub id as PEFT writes it, else the directory
        model.lora_base = source.repo_id or str(path.resolve())
        print(f"init: {path}" if source.repo_id is None else f"init: {source.repo_id}@{source.revision} ({path})")
    else:
        tok = new_tokenizer(cfg, task)
        model = GPTMini(cfg.model.resolved(tok.vocab_size)).to(device)
    model.grad_checkpointing = bool(getattr(cfg, "grad_checkpointing", False))
    model.packing_attention = packing_attention(cfg)  # the packed rows' kernel (models/attention.py)
    lora_cfg = getattr(cfg, "lora", None)
    if lora_cfg is not None and lora_cfg.r > 0:
        counts = apply_lora(model, lora_cfg)
        print(
            f"lora: r={lora_cfg.r} alpha={lora_cfg.alpha} trainable {counts['params/trainable']:,} of "
            f"{counts['params/total']:,} params ({100 * counts['params/trainable_frac']:.2f}%)"
        )
    check_card(run, model)
    return model, tok


def check_card(run: Run, model) -> None:
    """Before any work on a CUDA card: weights + optimizer state must fit it, else a UsageError
    (framework/card.py). Whether the whole run fits is said once its predicted peak is known
    (predict_memory)."""
    card.check_state_fits(model, card.card_bytes(run.rt.device), run.rt.device)


def new_tokenizer(cfg, task=None) -> CharTokenizer:
    """The vocabulary of a model started from scratch: the built-in task needs only the base
    characters (58: a smaller embedding, and the same initial weights as before the tool and
    text tasks existed); every other task gets the full vocabulary (tool specials, capitals, /),
    and a task with its own text (a dataset) adds the characters its rows use."""
    name = getattr(getattr(cfg, "task", None), "name", "arithmetic")
    if name == "arithmetic":
        return CharTokenizer(BASE_CHARS)
    extra = task.vocabulary() if hasattr(task, "vocabulary") else ""
    return CharTokenizer(DEFAULT_CHARS + "".join(sorted(set(extra) - set(DEFAULT_CHARS))))


def make_task(cfg, task=None):
    """The stage's task: `task` when the Python API hands one over (your reward functions), else the one
    `cfg.task` describes; scored by a judge when `task.judge.model` is set (reward_models/wrap.py)."""
    return with_judge(task if task is not None else tasks.make(cfg.task), cfg.task)


def prepare_task(task, tok, model, max_new_tokens: int, run_dir: Path, stage: str) -> None:
    """Before training: the task's own startup checks against this model (its rows render, encode
    and fit the context; reward functions answer a dry call), then the first training prompt as
    the model will see it, printed and saved to RUN_DIR/first_prompt.txt."""
    if hasattr(task, "check"):
        postmortem.step("the startup checks of the task")
        task.check(tok, getattr(model.config, "max_seq_len", None), max_new_tokens)
    show_first_prompt(tok.chat_prompt(task.prompt(task.items(1, "train", 0)[0])), run_dir, stage)
    if getattr(task, "correctness", "task") is None:
        print(
            f"{stage} evaluation: the task has no correctness signal (no task.correct, task.correct_threshold "
            "or answer column): it reports rewards, not accuracy",
            flush=True,
        )


def show_first_prompt(text: str, run_dir: Path, stage: str) -> None:
    """What the model is trained on, visible: the first example as rendered, printed and saved."""
    print(f"first {stage} prompt, as the model sees it (chat template applied): {text!r}", flush=True)
    if current().main:  # rank 0 writes the run directory
        (run_dir / "first_prompt.txt").write_text(text)


def print_plan(stage: str, lines: dict) -> None:
    """The step plan in units, printed at start: what one step means in prompts, samples,
    tokens, micro-batches and optimizer steps (docs/architecture.md §10: never ambiguous batch semantics)."""
    body = "  ".join(
        f"{k}: {v:,}" if isinstance(v, int) and not isinstance(v, bool) else f"{k}: {v}" for k, v in lines.items()
    )
    print(f"[{stage}] {body}", flush=True)


def predict_memory(r: Run, stage: str, model, seq_len: int = 0, prompt_len: int = 0, cfg=None) -> dict:
    """The run's predicted peak (sizing/run_memory.predict_run_peak), printed at start, written to
    RUN_DIR/memory.json and kept on the Run: the step loop logs it as `memory/predicted_gib` beside
    the measured `memory/peak_gib`.
    Call it while the model is the only large thing built: on a CPU the process's own share (the
    interpreter, torch, transformers) is its resident set now minus the model's tensors, and the
    peak so far (loading) is a floor."""
    dev = r.rt.device
    tensors = (*model.parameters(), *model.buffers())
    baseline = 0
    if dev.type == "cpu":
        with torch.no_grad():  # weights loaded from safetensors are file mappings, resident once read:
            for t in tensors:  # read them now, so that RSS − their bytes is the process's own share
                t.sum()
        baseline = max(0, runtime.current_memory_bytes(dev) - sum(t.numel() * t.element_size() for t in tensors))
    bf16 = r.rt.autocast_on and r.rt.compute_dtype == torch.bfloat16
    capacity = card.card_bytes(dev)
    est = predict_run_peak(
        cfg if cfg is not None else r.cfg,  # a config resolved since the run began (RL's max_new_tokens)
        stage,
        model_shape(model),
        device=dev.type,
        compute_dtype="bfloat16" if bf16 else "float32",
        seq_len=seq_len or model.config.max_seq_len,
        prompt_len=prompt_len,
        hf=hasattr(model, "hf"),
        baseline_bytes=baseline,
        peak_so_far=runtime.peak_memory_bytes(dev),  # loading may already have peaked higher
        capacity=capacity,  # optim.micro_batch_tokens=auto fits the card (CUDA)
        ranks=r.world.size,  # per rank: its rows, and 1/N of the trainer's state when sharded
        shard=getattr(getattr(r.cfg, "scale", None), "trainer_shard", "replicate"),
    )
    r.predicted_peak = est
    if getattr(getattr(r.cfg, "optim", None), "micro_batch_tokens", None) == "auto":
        r.rt.micro_batches = runtime.MicroBatches(**est["budgets"])  # the trainer's and the reference's splits
        if capacity is not None:
            b = est["budgets"]
            print(
                f"[{stage} memory] optim.micro_batch_tokens=auto: train {b['train']:,}, reference and other passes "
                f"without gradient {b['reference']:,} tokens (fit in {1 - AUTO_HEADROOM:.0%} of "
                f"{capacity / 2**30:.1f} GiB)",
                flush=True,
            )
    card.expect(est["peak_bytes"])  # an out-of-memory line quotes it
    if warning := card.over_card_warning(est["peak_bytes"], capacity, dev, card.peak_phase(est)):
        print(warning, flush=True)
    if r.world.main:
        tmp = r.dir / "memory.json.tmp"  # `posttrain memory RUN_DIR` holds it against memory/peak_gib
        tmp.write_text(json.dumps(est, indent=1))
        tmp.replace(r.dir / "memory.json")  # a temporary name, then renamed (docs/architecture.md §9)
    ph = {k: v / 2**30 for k, v in est["phases"].items()}
    top = max((k for k in ph if k != "persistent"), key=ph.__getitem__)
    what = "tensors allocated" if dev.type == "cuda" else "resident set"
    print(
        f"[{stage} memory] predicted peak {est['peak_gib']:.2f} GiB"
        + (f" per rank ({r.world.size} ranks, {est['shard']})" if r.world.size > 1 else "")
        + f" ({what} on {dev.type}: "
        + (f"process {baseline / 2**30:.2f} + " if baseline else "")
        + f"persistent {ph['persistent']:.2f} + {top} {ph[top]:.2f}"
        + ("; already reached while loading" if est["peak_so_far"] >= est["peak_bytes"] else "")
        + "); measured: memory/peak_gib",
        flush=True,
    )
    return est


def batch_plan(batch: dict, micro_batch_tokens: int, unit: int = 1) -> dict:
    """Token and micro-batch counts of one optimizer step on `batch`, split as the trainer splits it
    (the supervised stages measure step 1's batch; later batches differ only by padding):
    `micro_batch_tokens` the trainer's budget (Trainer.budgets.train)."""
    return {
        "tokens/step": int(batch["attention_mask"].sum()),
        "loss tokens/step": int(batch["loss_mask"].sum()),
        "micro-batches/step": len(split_micro_batches(batch, micro_batch_tokens, unit)),
    }


def lm_loss(model, mb, norm):
    """Next-token cross-entropy on `loss_mask` positions, normalised by the whole batch's tokens."""
    lp, _ = micro_logprobs(model, mb)  # packed when the trainer packed mb (optim.packing)
    mask = mb["loss_mask"]
    loss = -(lp * mask).sum() / max(norm["tokens"], 1.0)
    return loss, {"train/nll": float(-(lp.detach() * mask).sum() / mask.sum().clamp(min=1))}


class EpochIndices:
    """Row indices of step s's batch: consecutive slices of an epoch-wise permutation of N
    examples, pure in (seed, s), so a resumed run sees the same batches."""

    def __init__(self, n: int, batch_size: int, seed: int):
        self.N, self.B, self.seed = n, batch_size, seed

    def __call__(self, step: int) -> list[int]:
        first = (step - 1) * self.B
        idx = []
        for pos in range(first, first + self.B):
            epoch, off = divmod(pos, self.N)
            idx.append(int(self._perm(epoch)[off]))
        return idx

    def _perm(self, epoch: int):
        if getattr(self, "_epoch", None) != epoch:
            g = torch.Generator().manual_seed(self.seed * 7919 + epoch)
            self._epoch, self._p = epoch, torch.randperm(self.N, generator=g)
        return self._p


def supervised_step(trainer, batch_fn, loss_fn, device, unit: int = 1):
    """`step_fn` for the supervised stages: the batch of step s, one optimizer step."""

    def step_fn(step: int) -> dict:
        t0 = time.perf_counter()
        batch = to_device(batch_fn(step), device)  # the stage's device boundary (a no-op if already there)
        with card.phase("train"):
            metrics = trainer.step(batch, loss_fn, unit=unit)
        metrics["train/tokens_per_s"] = float(batch["attention_mask"].sum()) / (time.perf_counter() - t0)
        return metrics

    return step_fn


def prompt_width(cfg, tok, task) -> int:
    """Tokens of the longest of 200 train prompts (of `cfg.seed`): an RL or distillation step's rows are at most
    this + max_new_tokens."""
    return max(len(tok.encode(tok.chat_prompt(task.prompt(it)))) for it in task.items(200, "train", cfg.seed))
