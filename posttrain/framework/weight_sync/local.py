"""In-process weight sync: hand the trainer's new weights to a local sampler, with a version number.

One explicit call in every mode, so the loop reads the same whichever it is:

- colocated: the sampler and the trainer share one module (the engine was built on it).
  `sync()` copies nothing — the sampler already sees the new weights — but still bumps
  `policy_version`, so every sample says which weights produced it.
- separate: the sampler holds its own copy (made here if it was built on the trainer's module), as a rollout worker
  in another process or on another device would. `sync()` copies every parameter, in place,
  through the engine's `update_weights`, bumps the version and measures the time. Across
  processes the same contract is kept by snapshots.py.
- whole: the sampler keeps the weights in a format of its own (vLLM: HF names, q/k/v and
  gate/up in fused groups), so every sync sends the whole plain state, LoRA merged
  (W + (α/r)·B·A), and the engine regroups it (framework/backends/vllm_engine.py).
"""

from __future__ import annotations

import time

import torch

from posttrain.errors import UsageError
from posttrain.framework.roles import CopyingSampler
from posttrain.models.lora import merged_state_dict

MODES = ("colocated", "separate", "whole")


def plain_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy's weights under plain names: LoRA adapters merged, else its parameters."""
    merged = merged_state_dict(model)
    return merged if merged is not None else dict(model.named_parameters())


class WeightSync:
    def __init__(self, trainer_model: torch.nn.Module, engine, mode: str = "colocated"):
        if mode not in MODES:
            raise UsageError(f"weight_sync={mode!r} is unknown; use colocated or separate")
        self.trainer_model, self.engine, self.mode = trainer_model, engine, mode
        if mode != "colocated" and isinstance(engine, CopyingSampler):
            engine.own_copy()  # built on the trainer's module: it gets a frozen copy to load into

    def weights(self):
        """(name, tensor) pairs one sync moves."""
        if self.mode == "whole":
            return plain_weights(self.trainer_model).items()
        return ((n, p.detach()) for n, p in self.trainer_model.named_parameters())

    @torch.no_grad()
    def load(self, version: int) -> int:
        """The sampler gets the trainer's weights as they are now, as `version`; bytes moved. Also
        called after a resume, once the checkpoint's weights are restored (distributed/placement.py)."""
        if self.mode == "colocated":
            self.engine.policy_version = version
            return 0
        return self.engine.update_weights(self.weights(), version)

    def sync(self) -> dict:
        t0 = time.perf_counter()
        copied = self.load(self.engine.policy_version + 1)
        return {
            "time/sync_s": time.perf_counter() - t0,
            "sync/bytes": float(copied),
            "sync/policy_version": float(self.engine.policy_version),
        }
