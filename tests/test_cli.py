"""Every CLI entry point as a subprocess: bad input is one line on stderr and exit code 2."""

import subprocess
import sys

import pytest


def posttrain(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "posttrain.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["sft", "lrr=0.1"], "posttrain sft: error: unknown config key 'lrr' for SFTConfig; did you mean 'optim.lr'?"),
        (["sft", "steps=abc"], "posttrain sft: error: config key 'steps' expects int, got 'abc' (str)"),
        (["pretrain", "missing.yaml"], "posttrain pretrain: error: config file 'missing.yaml' not found"),
        (["rl", "algo.name=gpro"], "posttrain rl: error: unknown algorithm 'gpro'; did you mean 'grpo'?"),
        (
            ["eval", "no/such/run"],
            "posttrain eval: error: checkpoint 'no/such/run' does not exist; give a run directory",
        ),
        (["rll", "steps=3"], "posttrain: error: unknown command 'rll'; did you mean 'rl'? (commands: pretrain, sft,"),
        (["pipline"], "posttrain: error: unknown command 'pipline'; did you mean 'pipeline'?"),
        (["frobnicate"], "posttrain: error: unknown command 'frobnicate' (commands: pretrain, sft, rm, dpo, rl,"),
        (
            ["rl", "task.name=dataset", "task.reward_weights=1.0,0.1"],
            "posttrain rl: error: config key 'task.reward_weights' expects a list, got '1.0,0.1'; write it in "
            "brackets: task.reward_weights=[1.0,0.1]",
        ),
        (
            ["rl", "task.name=dataset", "task.reward_weights=0.5"],
            "posttrain rl: error: config key 'task.reward_weights' expects a list, got 0.5; write it in "
            "brackets: task.reward_weights=[0.5]",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(tmp_path, args, message):
    r = posttrain(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), r.stderr


def test_an_unknown_command_names_every_command_the_parser_has():
    """The list comes from the parser itself: a command added later is named too."""
    from posttrain import cli

    p = cli.parser()
    line = cli.unknown_command(p, ["evl", "runs/rl"])
    assert line.startswith("posttrain: error: unknown command 'evl'; did you mean 'eval'?")
    for name in ("pipeline", "eval", "serve", "lessons", "memory"):
        assert f" {name}," in line or f" {name};" in line
    assert cli.unknown_command(p, ["rl", "steps=3"]) is None and cli.unknown_command(p, ["--version"]) is None


def test_version_names_posttrain_and_torch(tmp_path):
    import re
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M)[1]  # tomllib is Python 3.11+
    r = posttrain("--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.startswith(f"posttrain {version} (torch ") and ", Python 3." in r.stdout


def test_unreadable_checkpoint(tmp_path):
    ckpt = tmp_path / "run" / "checkpoints" / "step_000001"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"not a safetensors file")
    (ckpt / "model.json").write_text("{}")
    from posttrain.models.tokenizer import CharTokenizer

    CharTokenizer().save(ckpt)  # the tokenizer is there: the weights are what is broken
    r = posttrain("eval", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().startswith(f"posttrain eval: error: checkpoint '{ckpt}' is unreadable (")
    assert r.stderr.strip().endswith("point to a complete checkpoints/step_N written by posttrain")


@pytest.mark.slow
def test_existing_run_dir_needs_resume_or_overwrite(tmp_path):
    ok = posttrain(
        "pretrain",
        "steps=2",
        "model.preset=nano",
        "out=run",
        "batch_size=4",
        "seq_len=32",
        "corpus_chars=5000",
        cwd=tmp_path,
    )
    assert ok.returncode == 0, ok.stderr
    again = posttrain("pretrain", "steps=2", "out=run", cwd=tmp_path)
    assert again.returncode == 2
    assert "already holds checkpoints; pass --resume run to continue" in again.stderr


@pytest.mark.slow
def test_eval_uses_the_runs_task_and_nested_overrides(tmp_path):
    task = [
        "task.name=reasoning_gym",
        "task.dataset=chain_sum",
        "task.options.min_digits=1",
        "task.options.max_digits=1",
    ]
    ok = posttrain(
        "pretrain",
        "steps=1",
        "model.preset=nano",
        "out=run",
        "batch_size=2",
        "seq_len=32",
        "corpus_chars=3000",
        *task,
        cwd=tmp_path,
    )
    assert ok.returncode == 0, ok.stderr
    r = posttrain(
        "eval", "run", "--problems", "4", "--k", "1,2", "task.options.max_terms=2", "--out", "res.json", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert "eval/pass@1" in r.stdout and "eval/maj@2" in r.stdout and "number of terms" not in r.stdout
    bad = posttrain(
        "eval", "run", "task.dataset=no_such_gym", cwd=tmp_path
    )  # the reasoning-gym config, not arithmetic's
    assert bad.returncode == 2 and "no_such_gym" in bad.stderr and "ArithmeticConfig" not in bad.stderr
