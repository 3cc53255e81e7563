"""Role 5, weight sync: every way the trainer's new weights reach a sampler, in one room.

    kind            file            where the sampler is           what moves, when
    colocated       local.py        the trainer's own module       nothing; the version is bumped
    separate        local.py        a copy in the same process     every parameter, in place
    lora            lora.py         a plain copy without adapters  merged W + (α/r)·B·A of adapted layers
    push            snapshots.py    Ray actors (placement: ray)    versioned buckets through the object store
    broadcast       broadcast.py    Ray actors, one process group  the same buckets as flat byte tensors
    async           snapshots.py    the producer's own copy        a published version, loaded between
                                    (distributed/async_rollout.py) two requests

Each is one explicit `sync()` after the optimizer step (framework/roles.WeightSyncer) that
returns its metrics (`time/sync_s`, `sync/bytes`, `sync/policy_version`), so the step reads the
same whatever the placement; tests/test_weight_sync.py checks that after it the sampler's
weights equal the trainer's for every kind.
"""

from posttrain.framework.weight_sync.local import WeightSync
from posttrain.framework.weight_sync.lora import LoraSync
from posttrain.framework.weight_sync.snapshots import (
    PushSync,
    WeightPublisher,
    load_buckets,
    state_buckets,
    switch_weights,
)

__all__ = ["WeightSync", "LoraSync", "PushSync", "WeightPublisher", "load_buckets", "state_buckets", "switch_weights"]
