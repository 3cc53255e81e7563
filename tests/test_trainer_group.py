"""`trainer_ranks: 2` (distributed/trainer_group.py): `posttrain rl` with its trainer data-parallel
over two local gloo processes reproduces the 1-rank run."""

import pytest
import torch

from posttrain import UsageError
from posttrain.config import RLConfig, load_config
from posttrain.logging import read_metrics
from posttrain.recipes import rl

from conftest import TINY_TASK

# 5 samples a step: shards of 3 and 2 rows (an uneven split). The tiny model earns no reward, so an
# entropy bonus gives every step a real gradient: Adam would turn a rounding-level one (~1e-9, the
# only gradient of an all-zero-advantage step) into a full lr-sized step and amplify ulp differences.
COMMON = ["prompts_per_step=1", "samples_per_prompt=5", "eval_problems=4", "eval_samples=2", "eval_every=0",
          "steps=2", "threads=1", "optim.lr=3e-4", "algo.entropy_coef=0.01", *TINY_TASK]


def _weights(run_dir):
    from safetensors.torch import load_file
    from posttrain import checkpoint
    return load_file(checkpoint.latest(run_dir) / "model.safetensors")


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_two_trainer_ranks_reproduce_one(sft_ckpt, tmp_path):
    runs = {}
    for ranks in (1, 2):
        out = tmp_path / f"r{ranks}"
        rl.run(load_config(RLConfig, None, [f"out={out}", f"init={sft_ckpt}", f"trainer_ranks={ranks}", *COMMON]))
        runs[ranks] = read_metrics(out)[1:]
    one, two = runs[1], runs[2]
    assert [r["step"] for r in two] == [1, 2] and one[0].keys() == two[0].keys()   # same metrics format
    for a, b in zip(one, two):
        assert a["reward/mean"] == b["reward/mean"]                  # same rollouts: step 1's update agreed
        for k in ("loss", "grad/norm", "clip/frac", "kl/ref"):
            assert b[k] == pytest.approx(a[k], abs=1e-5), k
    w1, w2, w0 = _weights(tmp_path / "r1"), _weights(tmp_path / "r2"), _weights(sft_ckpt)
    assert _max_diff(w1, w2) <= 1e-5
    assert _max_diff(w1, w0) > 1e-4                                 # ... and the weights did move


def test_bad_trainer_keys_are_usage_errors(tmp_path):
    for bad, match in [("trainer_ranks=0", "trainer_ranks"), ("trainer_shard=zero3", "trainer_shard")]:
        with pytest.raises(UsageError, match=match):
            rl.run(load_config(RLConfig, None, [f"out={tmp_path}/x", "init=nowhere", bad]))
