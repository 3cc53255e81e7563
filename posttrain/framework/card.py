"""The card a run is on: will the run fit it, and what to say when it ran out (issue 31,
docs/architecture.md §12).

Before any work (recipes/common.init_model, every stage):

    check_state_fits(model, capacity, device)   weights + gradients + Adam state of the trainable
                                                 parameters alone exceed the card: a UsageError
                                                 (exit 2), since no knob but LoRA or a bigger card helps
    over_card_warning(predicted, capacity, device)   the run's predicted peak (sizing/run_memory, printed
                                                 by every stage at start) is above the card: one
                                                 warning line naming the knobs of the phase that peaks

During the run, `phase(name)` wraps each phase (rollout, reward, reference, train, eval, …): a
CUDA out-of-memory error inside becomes `OutOfMemory`, one line naming the phase, the measured
peak (torch.cuda.max_memory_allocated; the process's peak RSS on a CPU), the predicted peak
when the stage had one, and the knobs that lower it. It is a TrainingHalted (exit 1): nothing
is saved after it (a step cut in the middle is not a state to keep), so the last checkpoint,
written atomically, is the one `--resume` continues from; the line says which.

The functions take the capacity as a number, so their logic is tested on the CPU.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from posttrain import checkpoint, runtime
from posttrain.errors import TrainingHalted, UsageError
from posttrain.sizing.memory import train_bytes_per_param

GiB = 2**30
# What lowers each phase's memory: the rollout's KV cache grows with the sequences decoding at once,
# the trainer's activations with the micro-batch; LoRA shrinks the gradients and Adam state of both.
KNOBS = {
    "rollout": "lower rollout.max_slots, or set lora.r=16",
    "train": "lower optim.micro_batch_tokens, or set grad_checkpointing=true or lora.r=16",
}
ANY_PHASE = "lower optim.micro_batch_tokens or rollout.max_slots, or set grad_checkpointing=true or lora.r=16"
_PREDICTED: list[float | None] = [None]  # the predicted peak of the stage now running (one at a time)


def card_bytes(device) -> int | None:
    """Total memory of a CUDA device (the card's real size); None on any other device."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(device).total_memory)


def peak_bytes() -> tuple[float, str]:
    """The measured peak so far and what it counts: bytes allocated on the current CUDA device
    (torch.cuda.max_memory_allocated), else the process's peak resident set (a CPU run)."""
    if torch.cuda.is_available():
        return float(runtime.peak_memory_bytes("cuda")), "allocated"
    return float(runtime.peak_memory_bytes("cpu")), "peak RSS"


def state_bytes(model: torch.nn.Module) -> int:
    """Weights + gradients + Adam m and v as posttrain trains: fp32 master weights under
    autocast, so a trainable parameter costs sizing/memory's "no-master" bytes (4 + 4 + 8 = 16)
    and a frozen one its own size (LoRA's base)."""
    per_trainable = train_bytes_per_param("no-master")
    return sum(p.numel() * (per_trainable if p.requires_grad else p.element_size()) for p in model.parameters())


def check_state_fits(model: torch.nn.Module, capacity: int | None, device="cuda") -> None:
    """A UsageError when the weights and optimizer state alone exceed `capacity` bytes."""
    need = state_bytes(model)
    if capacity is None or need <= capacity:
        return
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    raise UsageError(
        f"the model's weights, gradients and Adam state ({trainable:,} trainable parameters) need "
        f"{need / GiB:.1f} GiB, more than {device}'s {capacity / GiB:.1f} GiB before any activation; "
        "train LoRA adapters (lora.r=16), pick a smaller model or a bigger card"
    )


def knobs(phase: str) -> str:
    """The config keys that lower a phase's memory (all of them for a phase without its own)."""
    return KNOBS.get(phase, ANY_PHASE)


def peak_phase(est: dict) -> str:
    """The phase a run_memory prediction peaks in, by the name its knobs go by (KNOBS): the trainer's
    step (its gradients and AdamW temporaries) counts as the train phase's, and the engine's slot KV
    cache, kept between calls (persistent), as the rollout's."""
    phases = {k: v for k, v in est["phases"].items() if k != "persistent"}
    phases["train"] = phases.get("train", 0.0) + phases.pop("step", 0.0)
    if "rollout" in phases:
        phases["rollout"] += est["components"]["persistent"].get("KV cache (slots)", 0.0)
    return max(phases, key=phases.__getitem__)


def over_card_warning(predicted: float | None, capacity: int | None, device="cuda", phase: str = "") -> str:
    """The start-of-run warning when the run's predicted peak (set by `phase`) exceeds the card (""
    when it fits or either number is unknown)."""
    if predicted is None or capacity is None or predicted <= capacity:
        return ""
    at = f" in its {phase} phase" if phase else ""
    return (
        f"warning: this run is predicted to peak at {predicted / GiB:.1f} GiB{at}, more than {device}'s "
        f"{capacity / GiB:.1f} GiB; {knobs(phase)}"
    )


def expect(predicted: float | None) -> None:
    """Remember the predicted peak of the stage starting now, for an out-of-memory line."""
    _PREDICTED[0] = predicted


class OutOfMemory(TrainingHalted):
    """A CUDA out-of-memory error in one phase of a run, said in one line (exit 1)."""

    def __init__(self, phase: str, peak: float, what: str, predicted: float | None, run_dir: str | None = None):
        self.phase, self.peak, self.what, self.predicted, self.run_dir = phase, peak, what, predicted, run_dir
        super().__init__(self.line())

    def line(self) -> str:
        planned = f", predicted {self.predicted / GiB:.1f} GiB" if self.predicted is not None else ""
        return (
            f"out of memory in the {self.phase} phase (measured peak {self.peak / GiB:.2f} GiB {self.what}{planned}); "
            f"{knobs(self.phase)}{self._resume()}"
        )

    def _resume(self) -> str:
        if self.run_dir is None:
            return ""
        last = checkpoint.latest(self.run_dir)
        if last is None:
            return "; no checkpoint was written yet: run again"
        return f"; the last checkpoint ({Path(last).name}) is intact: continue with --resume {self.run_dir}"

    def in_run(self, run_dir) -> OutOfMemory:
        """The same error, saying how to continue RUN_DIR (the first run that hears of it wins)."""
        if self.run_dir is None:
            self.run_dir = str(run_dir)
            self.args = (self.line(),)
        return self


@contextmanager
def phase(name: str):
    """Name the phase of a CUDA out-of-memory error raised inside (the innermost phase wins)."""
    try:
        yield
    except torch.OutOfMemoryError:
        peak, what = peak_bytes()
        raise OutOfMemory(name, peak, what, _PREDICTED[0]) from None
