"""Weight sync for a LoRA policy (models/lora.py): only the adapted layers travel, merged.

colocated   the sampler shares the trainer's module and runs the adapter path
            (W·x + (α/r)·B·A·x): nothing to copy, the version is bumped as usual
separate    the sampler is a plain copy without adapter layers (`Engine.own_copy`:
            models/lora.unadapted_copy); a sync writes W + (α/r)·B·A into each adapted Linear,
            in place. Frozen weights never change, so they are copied once, when the copy is made
whole       (vLLM) the whole merged state, every sync: local.py
"""

from __future__ import annotations

from posttrain.framework.weight_sync.local import WeightSync
from posttrain.models.lora import lora_layers, merged_weight


class LoraSync(WeightSync):
    """weight_sync for a LoRA policy: separate = the sampler is a plain (merged) copy and
    receives merged weights of the adapted layers only; colocated = shared module, as usual."""

    def weights(self):
        if self.mode != "separate":
            return super().weights()
        return ((f"{name}.weight", merged_weight(layer)) for name, layer in lora_layers(self.trainer_model).items())
