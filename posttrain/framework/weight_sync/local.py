"""In-process weight sync: hand the trainer's new weights to a local sampler, with a version number.

One explicit call in both modes, so the loop reads the same either way:

- colocated: the sampler and the trainer share one module. `sync()` copies nothing — the
  sampler already sees the new weights — but still bumps `policy_version`, so every sample
  says which weights produced it.
- separate: the sampler holds its own copy (as a rollout worker in another process or on
  another device would). `sync()` copies tensor by tensor, in place, bumps the version and
  measures the time. Across processes the same contract is kept by snapshots.py.
"""

from __future__ import annotations

import copy
import time

import torch

from posttrain import UsageError


class WeightSync:
    def __init__(self, trainer_model: torch.nn.Module, engine, mode: str = "colocated"):
        if mode not in ("colocated", "separate"):
            raise UsageError(f"weight_sync={mode!r} is unknown; use colocated or separate")
        self.trainer_model, self.engine, self.mode = trainer_model, engine, mode
        if mode == "colocated":
            engine.model = trainer_model
        elif engine.model is trainer_model:
            engine.model = copy.deepcopy(trainer_model).eval().requires_grad_(False)

    @torch.no_grad()
    def sync(self) -> dict:
        t0 = time.perf_counter()
        copied = 0
        if self.mode == "separate":
            src = dict(self.trainer_model.named_parameters())
            for name, p in self.engine.model.named_parameters():
                p.copy_(src[name].detach())
                copied += p.numel() * p.element_size()
        self.engine.policy_version += 1
        return {
            "time/sync_s": time.perf_counter() - t0,
            "sync/bytes": float(copied),
            "sync/policy_version": float(self.engine.policy_version),
        }
