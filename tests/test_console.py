"""What the console says: the busy-machine hint, kept pipeline timings, no run directory left by a refused start."""

import json
import subprocess
import sys

from posttrain import runtime
from posttrain.recipes.pipeline import _earlier_walls


def test_busy_machine_hint_says_once_to_use_one_thread(monkeypatch, capsys):
    monkeypatch.setattr(runtime, "_HINTED", [])
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    assert runtime.busy_machine_hint() == ""  # quiet: nothing
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (2.4, 1.0, 1.0))
    assert runtime.busy_machine_hint() == ""  # the pipeline's next stage: the load is our own threads
    monkeypatch.setattr(runtime, "_HINTED", [])  # a new process on a busy machine
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (9.1, 8.0, 7.0))
    runtime.resolve("cpu", "auto", threads=0)
    runtime.resolve("cpu", "auto", threads=0)
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "note: the load average (9.1) is above this machine's 2 cores: other jobs share it, and with a "
        "thread per core each job runs several times slower; pass threads=1 (its sums run in another order, "
        "so the numbers differ from a default run's, the README's pipeline table among them)"
    ]
    runtime.resolve("cpu", "auto", threads=1)  # the user chose: no hint
    assert capsys.readouterr().out == ""


def test_a_rerun_keeps_the_stage_times_of_the_first_run(tmp_path):
    rows = [{"stage": "pretrain", "wall_s": 40.3}, {"stage": "sft", "wall_s": 78.2}]
    (tmp_path / "summary.json").write_text(json.dumps(rows))
    assert _earlier_walls(tmp_path) == {"pretrain": 40.3, "sft": 78.2}
    assert _earlier_walls(tmp_path / "nowhere") == {}


def test_a_refused_start_leaves_no_run_directory(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "what is 1+1?", "answer": 2}) + "\n")  # SFT needs a completion: refused
    out = tmp_path / "run"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "posttrain.cli",
            "sft",
            "task.name=dataset",
            f"task.train={data}",
            "task.test_frac=0",
            f"task.test={data}",
            "init=",
            f"out={out}",
            "threads=1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2 and "rows.jsonl:1: no completion to learn from" in p.stderr, p.stderr
    assert not out.exists()


def test_chunked_generation_under_a_progress_bar_samples_what_one_call_samples(nano, tok, capsys):
    from posttrain.framework.rollout import Engine, SamplingParams
    from posttrain.progress import generate_with_progress
    from posttrain.tasks.arithmetic import ArithmeticTask

    items = ArithmeticTask().items(10, "test", 0)
    prompts = [tok.encode(tok.chat_prompt(it.question)) for it in items]
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    whole = Engine(nano, tok).generate(prompts, 3, sp, seed=4, items=items)
    parts = generate_with_progress(Engine(nano, tok), prompts, 3, sp, "test phase", chunk=4, seed=4, items=items)
    assert [(s.group, s.index, s.response_ids) for s in parts] == [(s.group, s.index, s.response_ids) for s in whole]
    worst = max(abs(a - b) for p, w in zip(parts, whole) for a, b in zip(p.response_logprobs, w.response_logprobs))
    assert worst < 1e-5  # the same tokens; logprobs to float rounding
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "test phase: 10 prompts ..." and out[1].startswith("test phase: 10 prompts in ")


def test_the_eta_starts_after_the_starting_evaluation(tmp_path, capsys, monkeypatch):
    from posttrain import logging as plog

    clock = iter([0.0, 100.0, 101.0, 102.0])  # the step-0 evaluation takes 100 s
    monkeypatch.setattr(plog.time, "time", lambda: next(clock))
    logger = plog.RunLogger(None, "rl", 10, log_every=1, tensorboard=False)
    logger.log(0, {"eval/pass@1": 0.5})
    logger.log(1, {"loss": 1.0})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "rl step 0/10  " and lines[1].endswith("eta 0:09")  # 1 s a step, 9 to go
