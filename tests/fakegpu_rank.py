"""`posttrain` as one of torchrun's ranks on a machine of fake GPUs (tests/fakegpu.py, two devices):

    torchrun --nproc-per-node 2 tests/fakegpu_rank.py rl ... device=fakegpu scale.trainer_shard=replicate

Rank r runs on fakegpu:r (distributed/launch.join), so a tensor that reaches another rank's device is
refused with CUDA's error. Used by tests/test_ranks.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fakegpu  # noqa: E402

fakegpu.install(devices=2)

from posttrain.cli import main  # noqa: E402

sys.exit(main())
