"""Bad input, by design: a one-line error naming the thing and the fix, or a counted skip.

Config keys and types have their exact messages in tests/test_config.py; this file covers
impossible combinations, malformed data rows (file:line), verifiers that return garbage,
and a full disk during a checkpoint save.
"""

import errno
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from posttrain import TrainingHalted, UsageError, checkpoint, cli
from posttrain.config import RLConfig, SFTConfig, load_config
from posttrain.framework.batch import RolloutBatch
from posttrain.tasks.base import RewardResult, safe_reward, score_samples

from conftest import TINY_TASK


def _message(fn, *args, error=UsageError):
    with pytest.raises(error) as e:
        fn(*args)
    assert "\n" not in str(e.value)
    return str(e.value)


# ---- config: combinations no run can honour --------------------------------------------------


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["optim.minibatches=3", "rollout.prompts_per_step=4", "rollout.samples_per_prompt=4"],
            "optim.minibatches=3 does not divide the 16 samples of a step (rollout.prompts_per_step=4 × "
            "rollout.samples_per_prompt=4); use one of 1, 2, 4, 8, 16",
        ),
        (
            ["optim.minibatches=0"],
            "optim.minibatches=0 does not divide the 128 samples of a step "
            "(rollout.prompts_per_step=16 × rollout.samples_per_prompt=8); use one of 1, 2, 4, 8, 16, 32, 64, 128",
        ),
        (
            ["rollout.temperature=0"],
            "rollout.temperature=0.0 samples greedily: RL needs a sampling distribution "
            "(behaviour logprobs, different samples per group); use rollout.temperature > 0, e.g. 1.0",
        ),
        (["degenerate=drop"], "rollout.degenerate='drop' is unknown; use keep, skip or resample"),  # the old flat name
    ],
)
def test_rl_impossible_combinations_are_refused_before_any_work(tmp_path, overrides, message):
    from posttrain.recipes import rl

    cfg = load_config(RLConfig, None, [f"out={tmp_path}/rl", "init=/nonexistent", *overrides])
    assert _message(rl.run, cfg) == message
    assert not (tmp_path / "rl").exists()  # refused before the run directory


def test_algorithm_keys_are_checked_when_the_config_loads():
    """The `algo:` section is the algorithm's own Config, built (and validated) with the config."""
    assert (
        _message(load_config, RLConfig, None, ["algo.kl_coef=-0.1"])
        == "kl_coef and adv_eps must be ≥ 0 (got -0.1, 1e-06)"
    )
    assert _message(load_config, RLConfig, None, ["algo.name=rloo", "algo.eps_high=0.3"]).startswith(
        "unknown config key 'algo.eps_high' for Config"
    )


def test_kl_coefficient_without_reference_logprobs():
    """A KL term needs reference logprobs: the loss says so instead of computing KL against zeros."""
    from posttrain.algorithms import grpo
    from posttrain.algorithms.core import batch_norm

    mask = torch.ones(2, 3)
    batch = RolloutBatch(loss_mask=mask, old_logprobs=torch.zeros(2, 3), advantages=torch.ones(2, 3))
    cfg = grpo.Config(kl_coef=0.1)
    msg = _message(grpo.loss, torch.zeros(2, 3), batch, cfg, batch_norm(mask))
    assert msg == "grpo: kl_coef > 0 needs batch['ref_logprobs']; load a reference or set kl_coef=0"


def test_unknown_wandb_mode():
    from posttrain.logging import RunLogger, WandbConfig

    msg = _message(lambda: RunLogger(None, "rl", 1, wandb=WandbConfig(project="p", mode="cloud")))
    assert msg == "wandb.mode='cloud' is unknown; use offline, online or disabled"


# ---- data: malformed rows name file:line -------------------------------------------------------


@pytest.mark.parametrize(
    "line,reason",
    [
        ("{not json", "not valid JSON (Expecting property name enclosed in double quotes)"),
        ('["1+2", "3", "4"]', "a row must be a JSON object with prompt, chosen, rejected"),
        (
            '{"prompt": 12, "chosen": "3", "rejected": "4"}',
            "'prompt' must be a string or a list of {role, content} messages",
        ),
        ('{"prompt": "1+2", "rejected": "4"}', "missing field 'chosen'"),
    ],
)
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
    (RewardResult(10**400), "verifier returned reward 100000000000... (401 digits), too large for a float"),
    (
        RewardResult(1e308),
        ("verifier returned reward 1e+308, beyond reward_bound=1e+06 (raise verifier.reward_bound if it is meant)"),
    ),
    (
        RewardResult(-1e308),
        ("verifier returned reward -1e+308, beyond reward_bound=1e+06 (raise verifier.reward_bound if it is meant)"),
    ),
    (RewardResult(1.0, {"format": "yes"}), "verifier returned component 'format' = 'yes' (str), not a number"),
    (RewardResult(1.0, {"len": float("inf")}), "verifier returned a non-finite component 'len' = inf"),
    (RewardResult(1.0, [0.5]), "verifier returned components list, not a dict"),
]
# what a verifier may return: any real number, numpy's and torch's scalars included, converted to float
GOOD_VERIFIERS = [
    (True, 1.0),
    (np.float32(1.0), 1.0),
    (np.float64(0.25), 0.25),
    (np.int64(2), 2.0),
    (np.bool_(True), 1.0),
    (torch.tensor(0.5), 0.5),
    (-1e6, -1e6),
]


@pytest.mark.parametrize("returned,error", BAD_VERIFIERS)
def test_bad_verifier_output_scores_zero_with_the_reason(returned, error):
    res = safe_reward(Garbage(), returned, "text")
    assert (res.reward, res.error) == (0.0, error)


@pytest.mark.parametrize("returned,value", GOOD_VERIFIERS)
def test_numeric_verifier_output_is_accepted_as_a_float(returned, value):
    res = safe_reward(Garbage(), RewardResult(returned, {"part": returned}), "text")
    assert (res.reward, res.components, res.error) == (value, {"part": value}, None)
    assert type(res.reward) is float and type(res.components["part"]) is float


def test_the_reward_bound_is_the_tasks():
    task = Garbage()
    task.reward_bound = 10.0  # RL sets it from verifier.reward_bound
    assert safe_reward(task, RewardResult(10.0), "x").error is None
    assert safe_reward(task, RewardResult(-10.5), "x").error == (
        "verifier returned reward -10.5, beyond reward_bound=10 (raise verifier.reward_bound if it is meant)"
    )


def test_bad_verifier_outputs_are_counted_and_never_kill_the_step():
    from posttrain.framework.controller import sample_metrics
    from posttrain.framework.sample import Sample

    items = [r for r, _ in BAD_VERIFIERS] + [RewardResult(1.0, {"correct": 1.0})]
    samples = [Sample([1], [2], [-0.1], [1], "stop", 0, 0, i, item=it, text="x") for i, it in enumerate(items)]
    metrics = score_samples(Garbage(), samples)
    n = len(BAD_VERIFIERS)
    assert metrics == {"reward/errors": float(n), "reward/timeouts": 0.0, "reward/correct": 1.0 / (n + 1)}
    assert [s.reward for s in samples] == [0.0] * n + [1.0]
    assert [s.reward_error for s in samples] == [e for _, e in BAD_VERIFIERS] + [None]
    assert sample_metrics(samples, 8)["reward/mean"] == 1.0 / (n + 1)  # ±1e308 neither infinite nor "correct"


# ---- a full disk while saving a checkpoint -----------------------------------------------------


@pytest.mark.slow
def test_full_disk_on_save_stops_with_one_line_and_keeps_the_previous_checkpoint(
    sft_ckpt, tmp_path, monkeypatch, capsys
):
    run = tmp_path / "sft"
    args = [
        "sft",
        f"init={sft_ckpt}",
        "batch_size=4",
        "num_problems=50",
        "eval_problems=4",
        "steps=4",
        "save_every=2",
        f"out={run}",
        "tensorboard=false",
        *TINY_TASK,
    ]
    real_save, calls = torch.save, {"n": 0}

    def full_disk(obj, f, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:  # trainer.pt of the step-4 checkpoint
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", full_disk)
    assert cli.main(args) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        f"posttrain sft: stopped: disk full while writing checkpoint step_000004 in {run / 'checkpoints'} "
        "(partial write removed, earlier checkpoints intact): free space there or set out= on a bigger "
        f"disk, then --resume {run}"
    )
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002"]
    assert checkpoint.load_trainer_state(run / "checkpoints" / "step_000002")["step"] == 2
    monkeypatch.setattr(torch, "save", real_save)  # space freed: the run resumes and finishes
    from posttrain.recipes import sft

    assert sft.run(load_config(SFTConfig, None, args[1:]), resume=True)["checkpoint"].endswith("step_000004")


def test_full_disk_on_the_first_save_says_to_start_again(tmp_path, monkeypatch, nano, tok):
    def full_disk(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_file", full_disk)
    msg = _message(checkpoint.save, tmp_path, 1, nano, tok, error=TrainingHalted)
    assert msg.endswith("free space there or set out= on a bigger disk, then start the run again")
    assert list((tmp_path / "checkpoints").iterdir()) == []
    monkeypatch.setattr(checkpoint, "save_file", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "no")))
    msg = _message(checkpoint.save, tmp_path, 1, nano, tok, error=TrainingHalted)  # not disguised as a full disk
    assert msg == (
        f"writing checkpoint step_000001 in {tmp_path / 'checkpoints'} failed (PermissionError: [Errno 13] "
        "no; partial write removed, earlier checkpoints intact): fix the cause or set out= elsewhere, then "
        "start the run again"
    )
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_keep_last_retains_the_newest_checkpoints_with_policy_version(tmp_path, nano, tok):
    for step in range(1, 5):
        checkpoint.save(tmp_path, step, nano, tok, {"step": step, "extra": {"policy_version": step}}, keep_last=2)
    kept = [p.name for p in checkpoint.step_dirs(tmp_path)]
    assert kept == ["step_000003", "step_000004"]
    assert checkpoint.load_trainer_state(checkpoint.latest(tmp_path))["extra"] == {"policy_version": 4}
    assert json.loads((checkpoint.latest(tmp_path) / "meta.json").read_text())["step"] == 4


# ---- the whole table, as a user meets it: `posttrain ...` exits 2 with one line, before any work ----

ROOT = Path(__file__).resolve().parents[1]
RL = [
    "rl",
    "rollout.prompts_per_step=2",
    "rollout.samples_per_prompt=2",
    "eval.problems=2",
    "eval.samples=2",
    "threads=1",
    "tensorboard=false",
    *TINY_TASK,
]
LONG_ROW = {"prompt": "+".join(["1"] * 150), "chosen": "150", "rejected": "151"}

# case -> (arguments, what the one line must say: the key or file, and the fix)
TABLE = {
    "yaml_not_utf8": (["rl", "{tmp}/bad.yaml"], ["{tmp}/bad.yaml:2", "not UTF-8", "save the file as UTF-8"]),
    "steps_negative": ([*RL, "steps=-3"], ["steps=-3", "at least one optimizer step"]),
    "steps_zero": ([*RL, "steps=0"], ["steps=0", "posttrain eval CHECKPOINT"]),
    "lr_negative": ([*RL, "optim.lr=-1"], ["optim.lr=-1.0", "finite number in (0, 1]", "e.g. optim.lr=3e-5"]),
    "lr_nan": ([*RL, "optim.lr=nan"], ["optim.lr=nan", "finite number in (0, 1]"]),
    "lr_inf": ([*RL, "optim.lr=.inf"], ["optim.lr=inf", "finite number in (0, 1]"]),
    "samples_zero": ([*RL, "rollout.samples_per_prompt=0"], ["rollout.samples_per_prompt=0", "≥ 1"]),
    "prompts_zero": ([*RL, "rollout.prompts_per_step=0"], ["rollout.prompts_per_step=0", "≥ 1"]),
    "samples_one_grpo": (
        [*RL, "rollout.samples_per_prompt=1"],
        ["rollout.samples_per_prompt=1", "every advantage is 0", "samples_per_prompt >= 2"],
    ),
    "temperature_nan": ([*RL, "rollout.temperature=nan"], ["rollout.temperature=nan", "finite"]),
    "temperature_inf": ([*RL, "rollout.temperature=.inf"], ["rollout.temperature=inf", "finite"]),
    "max_new_negative": ([*RL, "rollout.max_new_tokens=-5"], ["rollout.max_new_tokens=-5", "≥ 0"]),
    "max_new_huge": (
        [*RL, "rollout.max_new_tokens=100000000"],
        ["rollout.max_new_tokens=100000000", "context", "use rollout.max_new_tokens <= "],
    ),
    "max_new_past_context": (
        [*RL, "rollout.max_new_tokens=250"],
        ["rollout.max_new_tokens=250", "(256 tokens)", "use rollout.max_new_tokens <= "],
    ),
    "save_every_negative": ([*RL, "save_every=-1"], ["save_every=-1", "≥ 0"]),
    "threads_negative": ([*RL, "threads=-1"], ["threads=-1", "≥ 0"]),
    "init_without_tokenizer": ([*RL, "init={tmp}/notok"], ["{tmp}/notok", "no tokenizer.posttrain.json"]),
    "resume_other_model_size": (
        ["pretrain", "--resume", "{tmp}/pt", "model.preset=micro"],
        [
            "--resume {tmp}/pt: model.preset='micro' but the run was trained with model.preset='nano'",
            "drop the model.preset override",
        ],
    ),
    "resume_truncated_trainer_pt": (
        ["pretrain", "--resume", "{tmp}/torn"],
        ["{tmp}/torn/checkpoints/step_000003/trainer.pt is unreadable", "start the run again"],
    ),
    "resume_mistyped": (["rl", "--resume", "{tmp}/no_such_run"], ["--resume {tmp}/no_such_run", "no such run"]),
    "resume_empty": (["rl", "--resume", "{tmp}/empty"], ["--resume {tmp}/empty", "no complete checkpoint"]),
    "out_under_a_file": ([*RL, "out={tmp}/a_file/run"], ["out={tmp}/a_file/run", "Not a directory", "writable"]),
    "out_read_only": ([*RL, "out={tmp}/ro/run"], ["out={tmp}/ro/run", "Read-only file system", "writable"]),
    "preference_row_too_long": (
        [
            "dpo",
            "pairs={tmp}/pairs.jsonl",
            "batch_size=2",
            "eval_problems=2",
            "eval_samples=2",
            "threads=1",
            "tensorboard=false",
        ],
        ["{tmp}/pairs.jsonl:2", "past the model's context of 256", "shorten or drop the row"],
    ),
}


@pytest.fixture(scope="module")
def bad_input_dir(tmp_path_factory, sft_ckpt):
    """What the table's cases point at: files and runs with one thing wrong each."""
    from posttrain.config import PretrainConfig
    from posttrain.recipes import pretrain

    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "bad.yaml").write_bytes(b"steps: 3\nseed: \xff\xfe\n")
    (tmp / "notok").mkdir()
    last = checkpoint.latest(sft_ckpt)
    for name in ("model.safetensors", "model.json"):
        (tmp / "notok" / name).write_bytes((last / name).read_bytes())
    pretrain.run(
        load_config(
            PretrainConfig,
            None,
            [
                f"out={tmp}/pt",
                "model.preset=nano",
                "steps=3",
                "batch_size=2",
                "seq_len=16",
                "corpus_chars=2000",
                "tensorboard=false",
                *TINY_TASK,
            ],
        )
    )
    shutil.copytree(tmp / "pt", tmp / "torn")
    trainer_pt = tmp / "torn" / "checkpoints" / "step_000003" / "trainer.pt"
    trainer_pt.write_bytes(trainer_pt.read_bytes()[:1000])  # killed mid-write
    (tmp / "empty").mkdir()
    (tmp / "a_file").write_text("")
    (tmp / "ro").mkdir()
    good = {"prompt": "1+2", "chosen": "3", "rejected": "4"}
    (tmp / "pairs.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(LONG_ROW) + "\n")
    return tmp


def _run_case(tmp: Path, sft_ckpt, case: str):
    """One case of the table as a user runs it: `posttrain ...` in its own process."""
    args, _ = TABLE[case]
    args = [a.format(tmp=tmp) for a in args]
    if args[0] in ("rl", "dpo") and not any(a.startswith(("init=", "--resume")) for a in args):
        args.append(f"init={sft_ckpt}")
    if not any(a.startswith(("out=", "--resume")) for a in args):
        args.append(f"out={tmp}/{case}")
    prefix = []
    if case == "out_read_only":  # a real read-only mount, by bubblewrap
        if shutil.which("bwrap") is None:
            return args, None
        prefix = ["bwrap", "--dev-bind", "/", "/", "--ro-bind", str(tmp / "ro"), str(tmp / "ro")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "POSTTRAIN_CACHE": str(tmp / "cache"), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [*prefix, sys.executable, "-m", "posttrain.cli", *args],
        capture_output=True,
        text=True,
        cwd=tmp,
        env=env,
        timeout=300,
        check=False,
    )
    return args, r


@pytest.fixture(scope="module")
def table_runs(bad_input_dir, sft_ckpt):
    """Every case of the table, run side by side (each process mostly imports; one per core)."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        futures = {case: pool.submit(_run_case, bad_input_dir, sft_ckpt, case) for case in TABLE}
        return {case: f.result() for case, f in futures.items()}


@pytest.mark.parametrize("case", sorted(TABLE))
def test_bad_input_table_exits_2_with_one_line_before_any_work(bad_input_dir, table_runs, case):
    tmp = bad_input_dir
    args, r = table_runs[case]
    if r is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"posttrain {args[0]}: error: "), r.stderr
    for needle in TABLE[case][1]:
        assert needle.format(tmp=tmp) in lines[0], lines[0]
    assert not (tmp / "cache").exists()  # never the default pretrain + SFT build
    assert "preset: nano" in (tmp / "pt" / "config.yaml").read_text()  # a refused resume changes nothing
    assert not (tmp / case / "metrics.jsonl").exists()  # nor a step, nor an evaluation
