"""`python -m posttrain ...` is the `posttrain` command: what torchrun starts on every rank
(`torchrun --nproc-per-node N -m posttrain rl CONFIG ...`, distributed/launch.py)."""

import sys

from posttrain.cli import main

sys.exit(main())
