"""Weight sync for a LoRA policy (models/lora.py): only the adapted layers travel, merged.

colocated   the sampler shares the trainer's module and runs the adapter path
            (W·x + (α/r)·B·A·x): nothing to copy, the version is bumped as usual
separate    the sampler is a plain copy without adapter layers (`unadapted_copy`); a sync
            writes W + (α/r)·B·A into each adapted Linear, in place. Frozen weights never
            change, so they are copied once, when the copy is made
"""

from __future__ import annotations

import time

import torch

from posttrain.framework.weight_sync.local import WeightSync
from posttrain.models.lora import lora_layers, merged_weight, unadapted_copy


class LoraSync(WeightSync):
    """weight_sync for a LoRA policy: separate = the sampler is a plain (merged) copy and
    receives merged weights of the adapted layers only; colocated = shared module, as usual."""

    def __init__(self, trainer_model, engine, mode: str = "colocated"):
        if mode == "separate":
            engine.model = unadapted_copy(trainer_model)
        super().__init__(trainer_model, engine, mode)

    @torch.no_grad()
    def sync(self) -> dict:
        if self.mode != "separate":
            return super().sync()
        t0 = time.perf_counter()
        copied = 0
        dst = dict(self.engine.model.named_modules())
        for name, layer in lora_layers(self.trainer_model).items():
            w = dst[name].weight
            w.copy_(merged_weight(layer))  # [out, in]: W + (α/r)·B·A
            copied += w.numel() * w.element_size()
        self.engine.policy_version += 1
        return {
            "time/sync_s": time.perf_counter() - t0,
            "sync/bytes": float(copied),
            "sync/policy_version": float(self.engine.policy_version),
        }
