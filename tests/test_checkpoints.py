"""Checkpoints and resume when things break: a full disk under every writer, a run killed while
writing a log or rewriting it, and a run whose last steps were skipped as non-finite."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posttrain import checkpoint, cli
from posttrain.config import SFTConfig, load_config
from posttrain.logging import read_jsonl, read_metrics, truncate_jsonl
from posttrain.recipes import sft

from conftest import TINY_TASK
from test_recipes import _metrics_without_time, _same_weights, run_killed

ROOT = Path(__file__).resolve().parents[1]
SFT = ["batch_size=4", "num_problems=50", "eval_problems=4", "threads=1", "tensorboard=false", *TINY_TASK]


# ---- a full disk, for real: a tmpfs just too small for the second checkpoint ------------------------


@pytest.mark.parametrize("writer", ["trainer.pt", "model.safetensors"])
def test_disk_full_in_any_writer_is_one_line_and_frees_the_partial_write(sft_ckpt, tmp_path, writer):
    """bubblewrap mounts a tmpfs of a chosen size as the run directory: step 2's checkpoint fits,
    step 4's runs out of space in `writer` (torch.save raises a RuntimeError that never says
    ENOSPC, safetensors a SafetensorError): one line, exit 1, no step_000004.tmp left, the space
    given back, step 2 intact."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    last = checkpoint.latest(sft_ckpt)
    weights, state = (last / "model.safetensors").stat().st_size, (last / "trainer.pt").stat().st_size
    one = weights + state + (256 << 10)  # a checkpoint, config and logs
    size = one + (weights + state // 2 if writer == "trainer.pt" else weights // 2)
    out = tmp_path / "out"
    out.mkdir()
    script = (
        f"{sys.executable} -m posttrain.cli sft init={sft_ckpt} steps=4 save_every=2 out=/disk/run "
        f"{' '.join(SFT)} 2>{out}/stderr; echo $? >{out}/rc; cp -r /disk/run/checkpoints {out}/; "
        f"{sys.executable} -c \"import os; s = os.statvfs('/disk'); print(s.f_bavail * s.f_frsize)\" >{out}/free"
    )
    subprocess.run(
        ["bwrap", "--dev-bind", "/", "/", "--size", str(size), "--tmpfs", "/disk", "sh", "-c", script],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
        timeout=600,
        check=True,
    )
    err = (out / "stderr").read_text().strip().splitlines()
    assert (out / "rc").read_text().strip() == "1", err
    assert err == [
        (
            "posttrain sft: stopped: disk full while writing checkpoint step_000004 in /disk/run/checkpoints "
            "(partial write removed, earlier checkpoints intact): free space there or set out= on a bigger "
            "disk, then --resume /disk/run"
        )
    ]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000002"]
    assert checkpoint.load_trainer_state(out / "checkpoints" / "step_000002")["step"] == 2
    assert checkpoint.load_model(out / "checkpoints" / "step_000002")[0] is not None
    assert int((out / "free").read_text()) > weights // 2  # the partial write was given back


def test_a_writer_that_fails_otherwise_is_named(tmp_path, monkeypatch, nano, tok):
    from safetensors import SafetensorError

    monkeypatch.setattr(
        checkpoint,
        "save_file",
        lambda *a, **k: (_ for _ in ()).throw(SafetensorError("Error while serializing: invalid tensor")),
    )
    with pytest.raises(Exception) as e:
        checkpoint.save(tmp_path, 1, nano, tok)
    assert str(e.value) == (
        f"writing checkpoint step_000001 in {tmp_path / 'checkpoints'} failed (SafetensorError: "
        "Error while serializing: invalid tensor; partial write removed, earlier checkpoints "
        "intact): fix the cause or set out= elsewhere, then start the run again"
    )
    assert list((tmp_path / "checkpoints").iterdir()) == []


# ---- a run killed while writing its logs --------------------------------------------------------------


def test_resume_tolerates_a_torn_last_metrics_row_and_stays_exact(sft_ckpt, tmp_path, monkeypatch):
    common = [f"init={sft_ckpt}", "steps=4", "save_every=2", "device=cpu", *SFT]  # exact: the CPU's fp32
    sft.run(load_config(SFTConfig, None, [f"out={tmp_path}/full", *common]))
    cfg = load_config(SFTConfig, None, [f"out={tmp_path}/half", *common])
    run_killed(monkeypatch, sft, cfg, die_on_step=4)
    with open(tmp_path / "half" / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "loss": 1.23')  # killed mid-write
    assert read_metrics(tmp_path / "half")[-1]["step"] == 3  # the torn tail is not a row
    sft.run(cfg, resume=True)
    assert _metrics_without_time(tmp_path / "full") == _metrics_without_time(tmp_path / "half")
    assert _same_weights(tmp_path / "full", tmp_path / "half")


def test_rl_resume_with_resampled_groups_is_exact(sft_ckpt, tmp_path, monkeypatch):
    """degenerate=resample draws extra prompts by (step, attempt): a resumed run draws the same."""
    from posttrain.config import RLConfig
    from posttrain.recipes import rl

    common = [
        f"init={sft_ckpt}",
        "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=4",
        "rollout.degenerate=resample",
        "eval.problems=4",
        "eval.samples=2",
        "eval_every=0",
        "steps=3",
        "save_every=1",
        "threads=1",
        "tensorboard=false",
        "device=cpu",  # the same numbers after a resume: the CPU's fp32 (a GPU's bf16 and atomics differ)
        *TINY_TASK,
    ]
    rl.run(load_config(RLConfig, None, [f"out={tmp_path}/full", *common]))
    cfg = load_config(RLConfig, None, [f"out={tmp_path}/half", *common])
    from posttrain.framework.controller import Controller

    real, calls = Controller.step, {"n": 0}

    def dying(self, step):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyError("killed")  # mid-step, nothing saved
        return real(self, step)

    with monkeypatch.context() as m:
        m.setattr(Controller, "step", dying)
        with pytest.raises(KeyError):
            rl.run(cfg)
    rl.run(cfg, resume=True)
    full = read_metrics(tmp_path / "full")
    assert max(m.get("rollout/attempts", 0) for m in full) > 1  # resampling did happen
    assert _metrics_without_time(tmp_path / "full") == _metrics_without_time(tmp_path / "half")
    assert _same_weights(tmp_path / "full", tmp_path / "half")


def test_weights_of_another_model_are_refused_by_name(tmp_path, nano, tok):
    """The backstop behind the config check: a checkpoint whose tensors differ from the model."""
    from posttrain import UsageError
    from posttrain.models.gpt_mini import GPTMini, ModelConfig

    path = checkpoint.save(tmp_path, 1, nano, tok)
    micro = GPTMini(ModelConfig(preset="micro").resolved(tok.vocab_size))
    with pytest.raises(UsageError) as e:
        checkpoint.restore_weights(micro, path)
    assert str(e.value).startswith(f"--resume: {path} holds another model than this config builds (embed.weight: ")
    assert str(e.value).endswith("resume with the run's own config (drop model.* and init= overrides)")


def test_a_bad_row_before_the_end_is_named(tmp_path):
    from posttrain import UsageError

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2\n{"step": 3}\n')
    with pytest.raises(UsageError, match=r"metrics.jsonl:2: not a JSON row \(.*\); delete that line"):
        read_jsonl(path)


_REWRITE = """
import resource, signal, sys
from pathlib import Path
from posttrain.logging import truncate_jsonl
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)          # Python ignores it; the kernel's default kills
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
truncate_jsonl(Path(sys.argv[1]), 10 ** 6)
"""


def test_a_kill_during_the_resume_rewrite_leaves_the_log_whole(tmp_path):
    """The rewrite is stopped by the kernel after 64 KB (RLIMIT_FSIZE: SIGXFSZ kills the process
    at that byte, as a kill mid-write would): the log still holds every row. Rewritten in place,
    it would have been cut to 64 KB."""
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "loss": 1.0 / s, "note": "x" * 100} for s in range(1, 3001)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = path.read_bytes()
    script = tmp_path / "rewrite.py"
    script.write_text(_REWRITE)
    r = subprocess.run(
        [sys.executable, str(script), str(path), str(64 << 10)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == -25  # SIGXFSZ, mid-write
    assert path.read_bytes() == before
    truncate_jsonl(path, 1500)  # the next resume: the tmp file is rewritten
    assert read_jsonl(path) == rows[:1500] and not Path(f"{path}.tmp").exists()


# ---- a run that skipped non-finite steps ---------------------------------------------------------------


def test_skipped_nonfinite_steps_are_said_and_marked(sft_ckpt, tmp_path, monkeypatch, capsys):
    from posttrain.recipes import common

    real, calls = common.lm_loss, {"n": 0}

    def nan_on_step_2(model, mb, norm):
        calls["n"] += 1
        loss, m = real(model, mb, norm)
        return (loss * float("nan"), m) if calls["n"] == 2 else (loss, m)

    monkeypatch.setattr(sft, "lm_loss", nan_on_step_2)
    summary = sft.run(load_config(SFTConfig, None, [f"init={sft_ckpt}", "steps=3", f"out={tmp_path}/run", *SFT]))
    said = "1 of 3 steps had a non-finite loss or gradient and were skipped; the final weights are finite"
    assert summary["warning"] == said
    assert f"warning: {said} ({summary['checkpoint']})" in capsys.readouterr().out
    meta = json.loads((Path(summary["checkpoint"]) / "meta.json").read_text())
    assert (meta["nonfinite_steps"], meta["weights_finite"]) == (1, True)


def test_a_run_ending_with_non_finite_weights_exits_1_and_marks_the_checkpoint(sft_ckpt, tmp_path, monkeypatch, capsys):
    """Step 1's update leaves an infinite weight (as an overflowing update would); steps 2 and 3
    are then skipped (non-finite loss) and the run ends on destroyed weights."""
    from posttrain.framework.trainer import Trainer

    real = Trainer.step

    def overflowing(self, *a, **k):
        out = real(self, *a, **k)
        if self.scheduler.last_epoch == 1:
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("inf"))
        return out

    monkeypatch.setattr(Trainer, "step", overflowing)
    run = tmp_path / "run"
    assert cli.main(["sft", f"init={sft_ckpt}", "steps=3", f"out={run}", *SFT]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    last = checkpoint.latest(run)
    assert err == [
        (
            f"posttrain sft: stopped: 2 of 3 steps had a non-finite loss or gradient and were skipped; the "
            f"final weights are NOT finite (NaN or inf); the checkpoint {last} is marked weights_finite=false "
            "in meta.json: lower optim.lr and resume from an earlier checkpoint, or start again"
        )
    ]
    meta = json.loads((last / "meta.json").read_text())
    assert (last.name, meta["nonfinite_steps"], meta["weights_finite"]) == ("step_000003", 2, False)
