"""The card a run is on (posttrain/framework/card.py): what cannot fit is refused before any work, what
is predicted to overflow starts with a warning, and an out-of-memory error is one line naming
the phase, the peaks and the knobs, after which --resume continues from the last checkpoint.

Every check takes the card's capacity as a number, so its logic runs here on the CPU; the CUDA
out-of-memory error (torch.cuda.OutOfMemoryError is raisable without a GPU) is injected."""

import json
import subprocess
import sys

import pytest
import torch

from posttrain import TrainingHalted, UsageError, checkpoint
from posttrain.cli import main
from posttrain.framework.card import (
    ANY_PHASE,
    GiB,
    OutOfMemory,
    check_state_fits,
    over_card_warning,
    peak_phase,
    phase,
    state_bytes,
)
from posttrain.sizing.run_memory import predict_run_peak
from posttrain.sizing.shapes import ModelShape

from conftest import TINY_TASK


def test_weights_and_adam_state_that_cannot_fit_the_card_are_refused_in_one_line(nano):
    n = sum(p.numel() for p in nano.parameters())
    assert state_bytes(nano) == 16 * n  # fp32 weight 4 + gradient 4 + Adam m, v 8
    check_state_fits(nano, 16 * n, "cuda:0")  # exactly full: fits
    check_state_fits(nano, None, "cpu")  # no card: nothing to check
    with pytest.raises(UsageError) as e:
        check_state_fits(nano, 16 * n - 1, "cuda:0")
    assert "\n" not in str(e.value)
    assert str(e.value) == (
        f"the model's weights, gradients and Adam state ({n:,} trainable parameters) need "
        f"{16 * n / GiB:.1f} GiB, more than cuda:0's {(16 * n - 1) / GiB:.1f} GiB before any activation; "
        "train LoRA adapters (lora.r=16), pick a smaller model or a bigger card"
    )
    nano.embed.requires_grad_(False)  # frozen weights cost their own 4 bytes only
    frozen = nano.embed.weight.numel()
    assert state_bytes(nano) == 16 * (n - frozen) + 4 * frozen


def test_the_card_warning_names_the_knobs_of_the_phase_that_peaks_and_each_one_lowers_it():
    from posttrain.config import RLConfig, load_config

    assert over_card_warning(10 * GiB, 8 * GiB, "cuda:0", "rollout") == (
        "warning: this run is predicted to peak at 10.0 GiB in its rollout phase, more than cuda:0's "
        "8.0 GiB; lower rollout.max_slots, or set lora.r=16"
    )
    assert over_card_warning(8 * GiB, 8 * GiB) == over_card_warning(None, 8 * GiB) == over_card_warning(1, None) == ""
    kv = {"persistent": {"KV cache (slots)": 2}}  # the engine's cache, kept between calls: the rollout's
    assert peak_phase({"phases": {"persistent": 9, "train": 2, "step": 2, "rollout": 1}, "components": kv}) == "train"
    assert peak_phase({"phases": {"persistent": 9, "train": 2, "step": 1, "rollout": 2}, "components": kv}) == "rollout"
    # Qwen2.5-0.5B on a card under bf16, GRPO with 32 prompts × 8 samples in flight (issue 31's H100 run):
    # the prediction every stage prints at start (recipes/common.predict_memory)
    qwen = ModelShape("qwen2.5-0.5b", 896, 24, 14, 2, 4864, 151936, True, 64)

    def predicted(*over):
        cfg = load_config(RLConfig, None, ["rollout.prompts_per_step=32", "rollout.samples_per_prompt=8", *over])
        seq = 50 + cfg.rollout.max_new_tokens  # 50-token prompts
        est = predict_run_peak(cfg, "rl", qwen, device="cuda", compute_dtype="bfloat16", seq_len=seq, hf=True)
        return est["peak_bytes"], peak_phase(est)

    # 8,192-token micro-batches (26 rows of 50 + 256 tokens): the train phase sets the peak
    peak, phase = predicted()
    assert phase == "train"
    for knob in ("optim.micro_batch_tokens=2048", "grad_checkpointing=true", "lora.r=16"):
        assert predicted(knob)[0] < peak, knob
    # 4,096-token responses decoding 256 at a time with small micro-batches: the rollout sets it
    long = ("rollout.max_new_tokens=4096", "optim.micro_batch_tokens=1024")
    peak, phase = predicted(*long)
    assert phase == "rollout"
    for knob in ("rollout.max_slots=64", "lora.r=16"):
        assert predicted(*long, knob)[0] < peak, knob


def test_an_out_of_memory_error_names_its_innermost_phase_and_how_to_go_on(tmp_path):
    with pytest.raises(OutOfMemory) as e:
        with phase("step"), phase("reference"):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    err = e.value
    assert isinstance(err, TrainingHalted) and err.phase == "reference" and err.peak > 0
    assert str(err).startswith("out of memory in the reference phase (measured peak ")
    assert str(err).endswith(ANY_PHASE) and "\n" not in str(err)  # the reference has no knob of its own
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    assert str(err.in_run(run)).endswith(f"{ANY_PHASE}; no checkpoint was written yet: run again")
    fresh = OutOfMemory("train", 3.25 * GiB, "allocated", 2.5 * GiB)
    (run / "checkpoints" / "step_000002").mkdir()
    assert str(fresh.in_run(run)) == (
        "out of memory in the train phase (measured peak 3.25 GiB allocated, predicted 2.5 GiB); "
        "lower optim.micro_batch_tokens, or set grad_checkpointing=true or lora.r=16; "
        f"the last checkpoint (step_000002) is intact: continue with --resume {run}"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="device=cuda is valid on this machine")
@pytest.mark.parametrize(
    "argv",
    [
        ["pretrain"],
        ["sft"],
        ["rm"],
        ["dpo"],
        ["rl"],
        ["distill", "teacher=runs/rl"],
        ["pipeline", "report=false"],
    ],
    ids=lambda a: a[0],
)
def test_device_cuda_without_a_gpu_is_one_line_and_exit_2_before_any_work(argv, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*argv, "device=cuda", f"out={out}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"posttrain {argv[0]}: error: device=cuda but no CUDA GPU is visible; use device=cpu (or auto)"
    assert not out.exists()  # refused before the run directory is written


@pytest.mark.skipif(torch.cuda.is_available(), reason="device=cuda is valid on this machine")
def test_eval_and_serve_refuse_device_cuda_without_a_gpu(sft_ckpt, capsys):
    assert main(["eval", str(sft_ckpt), "--device", "cuda:1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "posttrain eval: error: device=cuda:1 but no CUDA GPU is visible; use device=cpu (or auto)"
    )
    pytest.importorskip("fastapi")
    assert main(["serve", str(sft_ckpt), "--device", "cuda"]) == 2
    assert capsys.readouterr().err.strip().endswith("device=cuda but no CUDA GPU is visible; use device=cpu (or auto)")


# An RL run whose reference runs out of CUDA memory at step 3 (injected: the reference's third
# call raises torch.cuda.OutOfMemoryError; the measured peak is pinned to 3.25 GiB).
INJECT = """
import sys, torch
from posttrain.framework import reference
from posttrain.framework import card
card.peak_bytes = lambda: (3.25 * 2**30, "allocated")
score, calls = reference.Reference.score, []
def failing(self, *a, **k):
    calls.append(1)
    if len(calls) == 3:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return score(self, *a, **k)
reference.Reference.score = failing
from posttrain.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_out_of_memory_mid_run_exits_1_in_one_line_and_resume_gives_the_uninterrupted_weights(sft_ckpt, tmp_path):
    from safetensors.torch import load_file

    common = [
        f"init={sft_ckpt}",
        "steps=4",
        "save_every=2",
        "prompts_per_step=2",
        "samples_per_prompt=2",
        "eval_problems=2",
        "eval_samples=2",
        "threads=1",
        "device=cpu",  # the resumed weights equal the uninterrupted run's: the CPU's fp32
        *TINY_TASK,
    ]
    cut, full = tmp_path / "cut", tmp_path / "full"
    run = subprocess.run(
        [sys.executable, "-c", INJECT, "rl", f"out={cut}", *common], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 1, run.stderr
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith(
        "posttrain rl: stopped: out of memory in the reference phase (measured peak 3.25 GiB allocated, "
    )
    predicted = json.loads((cut / "memory.json").read_text())["peak_bytes"]  # the one printed at start
    assert f"allocated, predicted {predicted / GiB:.1f} GiB); " in line
    assert line.endswith(f"{ANY_PHASE}; the last checkpoint (step_000002) is intact: continue with --resume {cut}")
    assert [p.name for p in checkpoint.step_dirs(cut)] == ["step_000002"]  # nothing written after the error
    resumed = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "rl", "--resume", str(cut)], capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr
    assert main(["rl", f"out={full}", *common]) == 0
    a, b = (load_file(checkpoint.latest(d) / "model.safetensors") for d in (cut, full))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [json.loads(x)["step"] for x in (cut / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 4
