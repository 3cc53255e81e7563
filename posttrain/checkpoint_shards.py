"""The optimizer state of a sharded run, written by every rank through torch.distributed.checkpoint (DCP).

    RUN_DIR/checkpoints/step_N/shards/     .metadata and one __R_0.distcp file per rank

With the policy sharded over N ranks (distributed/ranks.py, FSDP2) the AdamW moments are 2/3 of a step's
state and each rank holds 1/N of them: each writes its own part here, in parallel, and reads back the parts
it needs on `--resume`, whatever the number of ranks then (DCP reshards: 2 ranks can resume 4 ranks'
checkpoint, and one rank reads it whole). The weights stay in model.safetensors, gathered by rank 0, so
`posttrain export`, `eval`, `serve` and `init=` read every checkpoint the same way.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

DIR = "shards"


def save(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str | Path) -> None:
    """Every rank writes its part of the optimizer state into `path` (a collective)."""
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.save(state, checkpoint_id=str(path))


def load(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str | Path) -> None:
    """Every rank reads the parts of the optimizer state in `path` that its shard needs (a collective)."""
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}  # the template: this rank's shapes
    dcp.load(state, checkpoint_id=str(path))
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
