"""The CUDA path, on a machine that has one (`@pytest.mark.gpu`: skipped elsewhere, tests/conftest.py).

Each test states its tolerance by the compute dtype: fp32 on the card agrees with fp32 on the CPU
to float noise (1e-5 per token, 1e-4 on a loss); bf16 autocast (the CUDA default) keeps 8 bits of
mantissa, so its logprobs move by up to ~1e-2 of a logit and the bounds are 0.05-0.1. The CPU suite
checks the same code paths on tests/fakegpu.py's second device (tests/test_device_placement.py)."""

import math

import pytest
import torch

from posttrain.config import RLConfig, load_config
from posttrain.framework.card import OutOfMemory, card_bytes, phase
from posttrain.framework.logprobs import sequence_logprobs
from posttrain.logging import read_metrics
from posttrain.recipes import dpo, rl

from conftest import TINY_TASK
from test_recipes import _pairs_file

pytestmark = pytest.mark.gpu


def test_logprobs_on_the_card_match_the_cpu_at_each_dtype(nano):
    ids = torch.randint(0, nano.config.vocab_size, (4, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cpu, _ = sequence_logprobs(nano, ids)  # [4, 24]
        model = nano.to("cuda")
        fp32, _ = sequence_logprobs(model, ids.to("cuda"))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            bf16, _ = sequence_logprobs(model, ids.to("cuda"))
    assert (fp32.cpu() - cpu).abs().max() < 1e-5
    assert (bf16.float().cpu() - cpu).abs().max() < 0.1


@pytest.mark.parametrize(
    "dtype,tol", [("float32", 1e-4), ("auto", 0.1)]
)  # bf16: the trainer's sums vs an fp32 reference
def test_dpo_on_the_card_starts_at_log_2(sft_ckpt, tmp_path, dtype, tol):
    """Issue 31's crash: the reference scored pairs left on the CPU. Policy = reference at step 1."""
    pairs = _pairs_file(tmp_path / "pairs.jsonl", 16)
    args = [f"init={sft_ckpt}", f"pairs={pairs}", "loss_type=dpo", "batch_size=4", "steps=1", "eval_problems=0"]
    dpo.run(
        load_config(dpo.DPOConfig, None, [f"out={tmp_path}/run", "device=cuda", f"dtype={dtype}", *args, *TINY_TASK])
    )
    step = read_metrics(tmp_path / "run")[-1]
    assert step["loss"] == pytest.approx(math.log(2), abs=tol)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("auto", 0.05)])
def test_rl_on_the_card_sampler_and_trainer_agree(sft_ckpt, tmp_path, dtype, tol):
    args = ["prompts_per_step=2", "samples_per_prompt=4", "eval_problems=2", "eval_samples=2", "steps=2", *TINY_TASK]
    rl.run(
        load_config(RLConfig, None, [f"out={tmp_path}/run", f"init={sft_ckpt}", "device=cuda", f"dtype={dtype}", *args])
    )
    for m in read_metrics(tmp_path / "run")[1:]:
        assert m["mismatch/logprob_abs"] < tol and abs(m["ratio/mean"] - 1) < tol


def test_the_card_size_and_an_out_of_memory_line():
    capacity = card_bytes("cuda")
    assert capacity == torch.cuda.get_device_properties(0).total_memory
    with pytest.raises(OutOfMemory) as e:
        with phase("train"):
            torch.empty(2 * capacity, dtype=torch.uint8, device="cuda")
    assert e.value.phase == "train" and e.value.what == "allocated"
    assert str(e.value).startswith("out of memory in the train phase (measured peak ")
