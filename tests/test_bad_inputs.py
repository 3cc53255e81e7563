"""Bad input, by design: a one-line error naming the thing and the fix, or a counted skip.

Config keys and types have their exact messages in tests/test_config.py; this file covers
impossible combinations, malformed data rows (file:line), verifiers that return garbage,
and a full disk during a checkpoint save.
"""

import errno
import json

import pytest
import torch

from posttrain import TrainingHalted, UsageError, checkpoint, cli
from posttrain.config import RLConfig, SFTConfig, load_config
from posttrain.tasks.base import RewardResult, safe_reward, score_samples

from conftest import TINY_TASK


def _message(fn, *args, error=UsageError):
    with pytest.raises(error) as e:
        fn(*args)
    assert "\n" not in str(e.value)
    return str(e.value)


# ---- config: combinations no run can honour --------------------------------------------------

@pytest.mark.parametrize("overrides,message", [
    (["optim.minibatches=3", "rollout.prompts_per_step=4", "rollout.samples_per_prompt=4"],
     "optim.minibatches=3 does not divide the 16 samples of a step (rollout.prompts_per_step=4 × "
     "rollout.samples_per_prompt=4); use one of 1, 2, 4, 8, 16"),
    (["optim.minibatches=0"], "optim.minibatches=0 does not divide the 128 samples of a step "
     "(rollout.prompts_per_step=16 × rollout.samples_per_prompt=8); use one of 1, 2, 4, 8, 16, 32, 64, 128"),
    (["rollout.temperature=0"], "rollout.temperature=0.0 samples greedily: RL needs a sampling distribution "
     "(behaviour logprobs, different samples per group); use rollout.temperature > 0, e.g. 1.0"),
    (["degenerate=drop"], "rollout.degenerate='drop' is unknown; use keep, skip or resample"),   # the old flat name
])
def test_rl_impossible_combinations_are_refused_before_any_work(tmp_path, overrides, message):
    from posttrain.recipes import rl
    cfg = load_config(RLConfig, None, [f"out={tmp_path}/rl", "init=/nonexistent", *overrides])
    assert _message(rl.run, cfg) == message
    assert not (tmp_path / "rl").exists()                    # refused before the run directory


def test_algorithm_keys_are_checked_when_the_config_loads():
    """The `algo:` section is the algorithm's own Config, built (and validated) with the config."""
    assert _message(load_config, RLConfig, None, ["algo.kl_coef=-0.1"]) == "kl_coef and adv_eps must be ≥ 0 (got -0.1, 1e-06)"
    assert _message(load_config, RLConfig, None, ["algo.name=rloo", "algo.eps_high=0.3"]).startswith(
        "unknown config key 'algo.eps_high' for Config")


def test_kl_coefficient_without_reference_logprobs():
    """A KL term needs reference logprobs: the loss says so instead of computing KL against zeros."""
    from posttrain.algorithms import grpo
    from posttrain.algorithms.core import batch_norm
    mask = torch.ones(2, 3)
    batch = {"loss_mask": mask, "old_logprobs": torch.zeros(2, 3), "advantages": torch.ones(2, 3)}
    cfg = grpo.Config(kl_coef=0.1)
    msg = _message(grpo.loss, torch.zeros(2, 3), batch, cfg, batch_norm(mask))
    assert msg == "grpo: kl_coef > 0 needs batch['ref_logprobs']; load a reference or set kl_coef=0"


def test_unknown_wandb_mode():
    from posttrain.logging import RunLogger, WandbConfig
    msg = _message(lambda: RunLogger(None, "rl", 1, wandb=WandbConfig(project="p", mode="cloud")))
    assert msg == "wandb.mode='cloud' is unknown; use offline, online or disabled"


# ---- data: malformed rows name file:line -------------------------------------------------------

@pytest.mark.parametrize("line,reason", [
    ("{not json", "not valid JSON (Expecting property name enclosed in double quotes)"),
    ('["1+2", "3", "4"]', "a row must be a JSON object with prompt, chosen, rejected"),
    ('{"prompt": 12, "chosen": "3", "rejected": "4"}', "'prompt' must be a string or a list of {role, content} messages"),
    ('{"prompt": "1+2", "rejected": "4"}', "missing field 'chosen'"),
])
def test_malformed_preference_rows_name_file_and_line(tmp_path, line, reason):
    from posttrain.preference.data import load_jsonl
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "1+1", "chosen": "2", "rejected": "3"}\n\n' + line + "\n")
    assert _message(load_jsonl, path) == f"{path}:3: {reason} (fix the row, or pass on_bad=skip to skip and count it)"
    pairs, skipped = load_jsonl(path, "skip")
    assert (len(pairs), skipped) == (1, 1)


# ---- verifiers returning garbage: scored 0, the reason kept, counted -----------------------------

class Garbage:
    """A task whose verifier returns whatever the item says."""

    def __init__(self):
        self.name = "garbage"

    def reward(self, item, response):
        if item == "raise":
            raise ZeroDivisionError("division by zero")
        return item


BAD_VERIFIERS = [
    ("raise", "ZeroDivisionError: division by zero"),
    (None, "verifier returned NoneType, not RewardResult"),
    (1.0, "verifier returned float, not RewardResult"),
    (RewardResult(float("nan")), "verifier returned a non-finite reward nan"),
    (RewardResult(float("-inf")), "verifier returned a non-finite reward -inf"),
    (RewardResult(None), "verifier returned reward None (NoneType), not a number"),
    (RewardResult("1"), "verifier returned reward '1' (str), not a number"),
]


@pytest.mark.parametrize("returned,error", BAD_VERIFIERS)
def test_bad_verifier_output_scores_zero_with_the_reason(returned, error):
    res = safe_reward(Garbage(), returned, "text")
    assert (res.reward, res.error) == (0.0, error)


def test_bad_verifier_outputs_are_counted_and_never_kill_the_step():
    from posttrain.framework.rollout import Sample
    items = [r for r, _ in BAD_VERIFIERS] + [RewardResult(1.0, {"correct": 1.0})]
    samples = [Sample([1], [2], [-0.1], [1], "stop", 0, 0, i, item=it, text="x") for i, it in enumerate(items)]
    metrics = score_samples(Garbage(), samples)
    assert metrics == {"reward/errors": 7.0, "reward/timeouts": 0.0, "reward/correct": 1.0 / 8}
    assert [s.reward for s in samples] == [0.0] * 7 + [1.0]
    assert [s.reward_error for s in samples] == [e for _, e in BAD_VERIFIERS] + [None]


# ---- a full disk while saving a checkpoint -----------------------------------------------------

def test_full_disk_on_save_stops_with_one_line_and_keeps_the_previous_checkpoint(sft_ckpt, tmp_path, monkeypatch, capsys):
    run = tmp_path / "sft"
    args = ["sft", f"init={sft_ckpt}", "batch_size=4", "num_problems=50", "eval_problems=4", "steps=4", "save_every=2",
            f"out={run}", "tensorboard=false", *TINY_TASK]
    real_save, calls = torch.save, {"n": 0}

    def full_disk(obj, f, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:                                  # trainer.pt of the step-4 checkpoint
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *a, **k)
    monkeypatch.setattr(torch, "save", full_disk)
    assert cli.main(args) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"posttrain sft: stopped: disk full while writing checkpoint step_000004 in {run / 'checkpoints'} "
                   "(partial write removed, earlier checkpoints intact): free space there or set out= on a bigger "
                   f"disk, then --resume {run}")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002"]
    assert checkpoint.load_trainer_state(run / "checkpoints" / "step_000002")["step"] == 2
    monkeypatch.setattr(torch, "save", real_save)            # space freed: the run resumes and finishes
    from posttrain.recipes import sft
    assert sft.run(load_config(SFTConfig, None, args[1:]), resume=True)["checkpoint"].endswith("step_000004")


def test_full_disk_on_the_first_save_says_to_start_again(tmp_path, monkeypatch, nano, tok):
    def full_disk(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(checkpoint, "save_file", full_disk)
    msg = _message(checkpoint.save, tmp_path, 1, nano, tok, error=TrainingHalted)
    assert msg.endswith("free space there or set out= on a bigger disk, then start the run again")
    assert list((tmp_path / "checkpoints").iterdir()) == []
    with pytest.raises(PermissionError):                     # any other OSError is not disguised as a full disk
        monkeypatch.setattr(checkpoint, "save_file", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "no")))
        checkpoint.save(tmp_path, 1, nano, tok)


def test_keep_last_retains_the_newest_checkpoints_with_policy_version(tmp_path, nano, tok):
    for step in range(1, 5):
        checkpoint.save(tmp_path, step, nano, tok, {"step": step, "extra": {"policy_version": step}}, keep_last=2)
    kept = [p.name for p in checkpoint.step_dirs(tmp_path)]
    assert kept == ["step_000003", "step_000004"]
    assert checkpoint.load_trainer_state(checkpoint.latest(tmp_path))["extra"] == {"policy_version": 4}
    assert json.loads((checkpoint.latest(tmp_path) / "meta.json").read_text())["step"] == 4
