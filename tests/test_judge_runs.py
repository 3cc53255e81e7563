"""Judge rewards in runs (reward_models/judge.py): the frozen template, config keys and their one-line errors,
a judge over dataset rows, the judge served by `posttrain serve`, RL with a judge (logs, freezing,
exact resume) and what RL refuses. Parsing and the backends are in test_judge.py."""

import json
import re
import socket
import time

import pytest
from test_judge import Scripted, _batch, _task

from posttrain import UsageError
from posttrain.recipes.common import make_task
from posttrain.reward_models.judge import JudgeTask, render
from posttrain.tasks.base import JudgeConfig


def test_template_is_frozen_in_the_run_dir(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("Q {question} R {response} score?")
    b.write_text("Other {question} {response}")
    run = tmp_path / "run"
    run.mkdir()
    JudgeTask(_task(), JudgeConfig(model="x", template=str(a)), Scripted(str)).start(run, False, 4)
    assert (run / "judge_prompt.txt").read_text() == a.read_text()
    JudgeTask(_task(), JudgeConfig(model="x", template=str(a)), Scripted(str)).start(run, True, 4)  # same: fine
    with pytest.raises(UsageError, match="judge_prompt.txt differs"):
        JudgeTask(_task(), JudgeConfig(model="x", template=str(b)), Scripted(str)).start(run, True, 4)


@pytest.mark.parametrize(
    "keys,msg",
    [
        (["task.judge.mode=triple"], "task.judge.mode='triple' is unknown"),
        (["task.judge.template=nope.txt"], "file 'nope.txt' not found"),
        (["task.judge.pairs=0"], "need pairs >= 1"),
        (["task.judge.opponent=crowd"], "task.judge.opponent='crowd' is unknown"),
        (["task.judge.mode=pairwise", "task.judge.template=T"], "needs the fields {response_a}, {response_b}"),
    ],
)
def test_bad_judge_config_is_one_line(tmp_path, keys, msg):
    from posttrain.config import RLConfig, load_config

    t = tmp_path / "t.txt"
    t.write_text("{question} {response}")
    cfg = load_config(
        RLConfig, None, ["task.judge.model=http://127.0.0.1:1/v1", *[k.replace("=T", f"={t}") for k in keys]]
    )
    with pytest.raises(UsageError, match=re.escape(msg)):
        make_task(cfg)


def test_config_wraps_any_task_and_records_the_judge(tmp_path):
    from posttrain.config import RLConfig, load_config, save_config

    cfg = load_config(
        RLConfig, None, ["task.name=countdown", "task.judge.model=http://127.0.0.1:1/v1", "task.judge.mode=pairwise"]
    )
    task = make_task(cfg)  # the recipes' one place: the task, wrapped with its judge
    assert isinstance(task, JudgeTask) and task.name == "judge/countdown"
    assert task.items(3, "test", 0) == task.task.items(3, "test", 0)  # the task's own problems
    save_config(cfg, tmp_path / "config.yaml")
    assert "judge:\n    model: http://127.0.0.1:1/v1\n    mode: pairwise" in (tmp_path / "config.yaml").read_text()
    assert not isinstance(make_task(load_config(RLConfig, None, [])), JudgeTask)  # no model: no judge
    with pytest.raises(UsageError, match="multi-turn episodes"):
        make_task(load_config(RLConfig, None, ["task.name=tool_arith", "task.judge.model=x"]))


def test_dataset_rows_without_answers_train_on_a_judge(tmp_path):
    from posttrain import tasks
    from posttrain.config import RLConfig, load_config

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"say hi to {n}"}) + "\n" for n in "abcdefghij"))
    keys = ["task.name=dataset", f"task.train={rows}", "task.test_frac=0.2"]
    with pytest.raises(UsageError, match="no answer column"):
        tasks.make(load_config(RLConfig, None, keys).task)
    task = make_task(load_config(RLConfig, None, [*keys, "task.judge.model=http://127.0.0.1:1/v1"]))
    task._backend = Scripted(lambda p: "Score: 8" if "hi a" in p else "Score: 2")
    res = task.reward_batch(task.items(2, "train", 0), ["hi a", "hi b"], step=0)
    assert [r.reward for r in res] == [0.8, 0.2]
    assert "judge_agreement" not in task.logged  # no verifier to agree with


@pytest.mark.slow
def test_judge_through_posttrain_serve_equals_the_in_process_judge(sft_ckpt, tmp_path):
    """The same checkpoint as a judge two ways: `posttrain serve` (a subprocess, OpenAI chat API on
    127.0.0.1) and in this process. Greedy, so the replies are the same text and the verdicts, errors
    and counts match one for one."""
    import os
    import subprocess
    import sys

    import httpx

    from posttrain.models.tokenizer import CharTokenizer

    pytest.importorskip("fastapi")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "posttrain.cli", "serve", str(sft_ckpt), "--port", str(port), "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        url, deadline = f"http://127.0.0.1:{port}/v1", time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        template = tmp_path / "t.txt"
        template.write_text("judge {question} answer {response} score")
        keys = dict(template=str(template), scale=1.0, max_tokens=24, timeout_s=60)
        remote = JudgeTask(_task(), JudgeConfig(model=url, **keys))
        local = JudgeTask(_task(), JudgeConfig(model=str(sft_ckpt), **keys))
        items, texts = _batch(remote, 4, 2)
        for t in (remote, local):
            t.check(CharTokenizer())
            t.start(tmp_path, False, 2)
        assert remote.backend.name == str(sft_ckpt)  # what the server lists
        prompts = [render(remote.template, response=x, **remote._fields(it)) for it, x in zip(items, texts)]
        assert remote.backend.complete(prompts) == local.backend.complete(prompts)
        a, b = remote.reward_batch(items, texts, step=0), local.reward_batch(items, texts, step=0)
        assert [(r.reward, r.error) for r in a] == [(r.reward, r.error) for r in b]
        assert remote.logged == local.logged and remote.logged["judge_calls"] == 8.0
    finally:
        proc.terminate()
        proc.wait(20)


def test_rl_with_a_pairwise_judge_logs_and_freezes(sft_ckpt, tmp_path):
    """Two GRPO steps rewarded by a checkpoint judge, pairwise, through the Python API: the judge's
    counts per step are the hand-computed ones (2 prompts × a ring of 4 with pairs=2: 6 comparisons
    each), every failure is scored 0 and counted, the verifier is logged beside, evaluation keeps
    the verifier, and the template sits in the run directory."""
    import posttrain

    template = tmp_path / "t.txt"
    template.write_text("{question} a {response_a} b {response_b} better")
    run = posttrain.rl(
        init=str(sft_ckpt),
        out=str(tmp_path / "rl"),
        steps=2,
        eval_every=0,
        threads=1,
        tensorboard=False,
        rollout={"prompts_per_step": 2, "samples_per_prompt": 4},
        eval={"problems": 4, "samples": 2},
        task={
            "name": "arithmetic",
            "max_terms": 3,
            "judge": {"model": str(sft_ckpt), "mode": "pairwise", "template": str(template), "max_tokens": 8},
        },
    )
    steps = [m for m in run.metrics if m["step"] > 0]
    assert len(steps) == 2
    for m in steps:
        assert m["reward/judge_calls"] == 12.0
        assert 0 <= m["reward/judge_errors"] <= 12
        assert {"reward/judge", "reward/verifier", "reward/errors"} <= set(m)
        if m["reward/judge_errors"] == 12:  # every comparison failed: every sample scored 0
            assert m["reward/mean"] == 0.0 and m["reward/errors"] == 8.0
    assert "eval/pass@1" in run.metrics[-1]  # the verifier's evaluation
    assert (tmp_path / "rl" / "judge_prompt.txt").read_text() == template.read_text()
    assert "judge:\n    model: " + str(sft_ckpt) in (tmp_path / "rl" / "config.yaml").read_text()


def test_rl_with_a_judge_resumes_to_the_same_numbers(sft_ckpt, tmp_path, monkeypatch):
    """A judge-rewarded run killed in step 3 and resumed logs what the uninterrupted run logs: the
    judge samples greedily and the order coin flips are pure in (step, group, pair)."""
    from posttrain.config import RLConfig, load_config
    from posttrain.recipes import rl

    from test_recipes import _metrics_without_time, run_killed

    template = tmp_path / "t.txt"
    template.write_text("{question} a {response_a} b {response_b} better")
    common = [
        f"init={sft_ckpt}",
        "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=4",
        "eval.problems=2",
        "eval.samples=1",
        "save_every=1",
        "eval_every=0",
        "steps=3",
        "threads=1",
        "device=cpu",  # the same numbers after a resume: the CPU's fp32 (a GPU's bf16 and atomics differ)
        "task.max_terms=3",
        f"task.judge.model={sft_ckpt}",
        "task.judge.mode=pairwise",
        f"task.judge.template={template}",
        "task.judge.max_tokens=8",
        "task.judge.temperature=1.0",
    ]
    rl.run(load_config(RLConfig, None, [f"out={tmp_path}/full", *common]))
    cfg = load_config(RLConfig, None, [f"out={tmp_path}/half", *common])
    run_killed(monkeypatch, rl, cfg, die_on_step=3)
    rl.run(cfg, resume=True)
    full = _metrics_without_time(tmp_path / "full")
    assert [m["step"] for m in full] == [0, 1, 2, 3] and all(m["reward/judge_calls"] == 12.0 for m in full[1:])
    assert full == _metrics_without_time(tmp_path / "half")


def test_rl_refuses_a_judge_in_verifier_workers(sft_ckpt, tmp_path):
    from posttrain.config import RLConfig, load_config
    from posttrain.recipes import rl

    cfg = load_config(
        RLConfig,
        None,
        [
            f"init={sft_ckpt}",
            f"out={tmp_path}/rl",
            "verifier.workers=2",
            "steps=1",
            "task.judge.model=http://127.0.0.1:1/v1",
        ],
    )
    with pytest.raises(UsageError, match=r"verifier.workers > 0.*set verifier.workers=0"):
        rl.run(cfg)
