"""A dying run leaves a word and a checkpoint (issue 30): a verifier that segfaults or calls os._exit in
the training process is named on stderr and in RUN_DIR/crash.log, and a run SIGKILLed mid-way resumes
from a checkpoint it never asked for (`save_minutes`) to the numbers of a run that was never killed.
Every run here is the real `posttrain rl` command in a subprocess."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posttrain import checkpoint
from posttrain.logging import read_jsonl, read_metrics

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from faulty_verifiers import Faulty, FaultyConfig, rows_with_faults  # noqa: E402

FAULTY = f"{ROOT}/benchmarks/faulty_verifiers.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
TINY = [
    "steps=2",
    "threads=1",
    "tensorboard=false",
    "rollout.prompts_per_step=4",
    "rollout.samples_per_prompt=2",
    "rollout.max_new_tokens=8",
    "eval.problems=8",
    "eval.samples=1",
    "verifier.workers=0",
]


def _rl(args: list[str], runner: list[str] | None = None, **kw) -> subprocess.CompletedProcess:
    cmd = [sys.executable, *(runner or ["-m", "posttrain.cli"]), "rl", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600, **kw)


def test_a_segfault_in_an_in_process_verifier_is_named(sft_ckpt, tmp_path):
    """The issue's case: the step-0 evaluation segfaults in a user Task class (exit −11, nothing said)."""
    out = tmp_path / "run"
    task = [f"task.name={FAULTY}:Faulty", "task.fault=segfault", "task.where=eval", "task.max_terms=3"]
    done = _rl([f"init={sft_ckpt}", f"out={out}", *TINY, *task])
    assert done.returncode == -signal.SIGSEGV
    said = (
        "posttrain: the rl run died during the evaluation of the starting weights (step 0), while scoring 8 "
        f"responses in-process with Faulty.reward ({FAULTY})\nFatal Python error: Segmentation fault"
    )
    assert said in done.stderr
    assert "in reward\n" in done.stderr.split(said)[1]  # faulthandler's traceback: the verifier's frame
    assert "no checkpoint was written yet" in done.stderr
    assert said in (out / "crash.log").read_text()


def test_os_exit_in_a_reward_function_is_named(sft_ckpt, tmp_path):
    """os._exit runs no handler at all (exit 3): the watcher outside the process still names the function."""
    source = Faulty(FaultyConfig(fault="exit", where="train", every=1, max_terms=3))  # every train row...
    for split, n in (("train", 200), ("test", 20)):
        rows = rows_with_faults(source, n, split)
        if split == "train":  # ...but the two of the startup's dry call: it dies in step 1
            rows[0]["fault"] = rows[1]["fault"] = ""
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = [
        "task.name=dataset",
        f"task.train={tmp_path}/train.jsonl",
        f"task.test={tmp_path}/test.jsonl",
        f"task.reward={FAULTY}:faulty",
    ]
    done = _rl([f"init={sft_ckpt}", f"out={tmp_path}/run", *TINY, *task])
    assert done.returncode == 3
    assert (
        f"posttrain: the rl run died during step 1 of 2, while calling reward function {FAULTY}:faulty on 8 "
        "responses (no Python traceback" in done.stderr
    )


# A clock 600 times fast: save_minutes=10 (the default) passes in one real second.
FAST_CLOCK = """
import sys, time, types
import posttrain.framework.loop as loop
t0 = time.monotonic()
loop.time = types.SimpleNamespace(perf_counter=time.perf_counter, monotonic=lambda: t0 + 600 * (time.monotonic() - t0))
from posttrain.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _without_time(rows):
    """Metrics without the clocks and the memory gauges (a process's own: a resumed one differs)."""
    skip = ("time/", "rollout/", "train/tokens_per_s", "memory/")
    return [{k: v for k, v in m.items() if not k.startswith(skip)} for m in rows]


@pytest.mark.slow
def test_a_killed_run_resumes_from_a_checkpoint_it_did_not_ask_for(sft_ckpt, tmp_path):
    """Nothing in the config asks for checkpoints (save_every=0). The default save_minutes writes one
    anyway; SIGKILL (nothing runs: no handler, no final save) after it, --resume from it, and the run
    ends with the numbers of a run that was never killed."""
    common = [f"init={sft_ckpt}", *TINY, "steps=30", "eval_every=0", "task.max_terms=3"]
    full = _rl([f"out={tmp_path}/full", *common])
    assert full.returncode == 0 and "run died" not in full.stderr
    assert [p.name for p in checkpoint.step_dirs(tmp_path / "full")] == ["step_000030"]  # the final one only
    run = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-c", FAST_CLOCK, "rl", f"out={run}", *common],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    saved = None
    while proc.poll() is None:  # kill it two steps after its first periodic checkpoint
        saved = checkpoint.latest(run)
        logged = [m["step"] for m in read_jsonl(run / "metrics.jsonl")] if saved else []
        if saved and logged and logged[-1] >= int(saved.name.split("_")[1]) + 2:
            proc.kill()
            break
        time.sleep(0.05)
    stderr = proc.communicate(timeout=60)[1]
    assert proc.returncode == -signal.SIGKILL and saved is not None
    saved = checkpoint.latest(run)  # (one more may have landed before the kill)
    at = int(saved.name.split("_")[1])
    assert 1 <= at < 28
    assert "posttrain: the rl run died during step" in stderr and f"last checkpoint: {saved}" in stderr
    resumed = _rl([f"out={run}", *common, "--resume", str(run)], runner=["-c", FAST_CLOCK])
    assert resumed.returncode == 0 and f"resumed from {saved} at step {at}" in resumed.stdout
    assert _without_time(read_metrics(run)) == _without_time(read_metrics(tmp_path / "full"))
    assert read_jsonl(run / "samples.jsonl") == read_jsonl(tmp_path / "full" / "samples.jsonl")


def test_checkpoints_by_steps_and_by_minutes_at_most_5_percent_of_the_time():
    import dataclasses

    from posttrain.config import RLConfig, load_config
    from posttrain.framework.loop import save_due

    cfg = load_config(RLConfig, None, ["steps=100"])
    assert (cfg.save_every, cfg.save_minutes) == (0, 10.0)  # on by default, by time
    assert not save_due(cfg, 5, 599.0, 0.1) and save_due(cfg, 5, 600.0, 0.1)
    assert not save_due(cfg, 5, 759.0, 40.0) and save_due(cfg, 5, 760.0, 40.0)  # a 40 s save: every 19 × 40 s
    assert not save_due(cfg, 100, 1e9, 0.0)  # the last step's checkpoint is the final one
    steps = dataclasses.replace(cfg, save_every=10, save_minutes=0.0)
    assert save_due(steps, 10, 0.0, 0.0) and not save_due(steps, 15, 1e9, 0.0)
