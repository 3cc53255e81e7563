"""examples/: each runs as the README shows it (tiny step counts here), and the countdown written out
as JSONL scores value for value like the built-in task."""

import dataclasses
import json
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import posttrain
from posttrain.tasks.countdown import CountdownConfig, CountdownTask
from posttrain.tasks.dataset import DatasetConfig, DatasetTask

EX = Path(__file__).resolve().parents[1] / "examples"
TINY = dict(threads=1, tensorboard=False)


def script(path, *args):
    return runpy.run_path(str(EX / path), run_name="example")["main"](list(args))


@pytest.fixture(scope="module")
def math_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("math_word")
    script("math_word/make_data.py", "--out", str(out), "--train", "300", "--test", "30")
    return out


def test_math_word_data_and_rewards(math_data):
    rows = [json.loads(x) for x in (math_data / "train.jsonl").read_text().splitlines()]
    test = [json.loads(x) for x in (math_data / "test.jsonl").read_text().splitlines()]
    assert len(rows) == 300 and len(test) == 30 and not {r["prompt"] for r in rows} & {r["prompt"] for r in test}
    r = rows[0]
    assert r["completion"].endswith(f"the answer is ${r['answer']}$.") and r["solution"] == f"${r['answer']}$"
    rewards = runpy.run_path(str(EX / "math_word/rewards.py"))
    done = ["3+4=7. the answer is $7$.", "3+4=8. the answer is $8$.", "it is 7", "7 or 8"]  # as TRL hands them over
    assert rewards["correct"](["p"] * 4, done, answer=[7] * 4) == [1.0, 0.0, 1.0, 0.0]
    assert rewards["fmt"](done) == [1.0, 1.0, 0.0, 0.0]


def test_sort_digits_rows_and_exact_match_as_trl_hands_completions_over(tmp_path):
    """(the note of issue 29): chat rows with a system turn, disjoint splits, and the exact-match
    reward scoring each row's own demonstration 1 through the sampled path (gpt_mini's `#` skipped)."""
    from posttrain.framework.sample import Sample
    from posttrain.recipes.common import new_tokenizer
    from posttrain.tasks.base import score_samples

    script("sort_digits/make_data.py", "--out", str(tmp_path), "--train", "200", "--test", "20")
    rows = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    test = [json.loads(x) for x in (tmp_path / "test.jsonl").read_text().splitlines()]
    assert len(rows) == 200 and len(test) == 20
    assert not {json.dumps(r["prompt"]) for r in rows} & {json.dumps(r["prompt"]) for r in test}
    r = rows[0]
    assert [m["role"] for m in r["prompt"]] == ["system", "user"] and r["completion"] == r["answer"]
    digits = r["prompt"][1]["content"].split()
    assert r["answer"].split() == sorted(digits, reverse=r["order"] == "down") and 3 <= r["n"] == len(digits) <= 8
    reward = f"{EX}/sort_digits/rewards.py:exact"
    cfg = DatasetConfig(train=str(tmp_path / "train.jsonl"), test=str(tmp_path / "test.jsonl"), reward=reward)
    task = DatasetTask(dataclasses.replace(cfg, correct=reward))
    tok = new_tokenizer(SimpleNamespace(task=cfg), task)
    task.check(tok, 256, 24)

    def sample(row, text):
        ids = tok.encode(text)
        return Sample(
            [0],
            ids,
            [0.0] * len(ids),
            [1] * len(ids),
            "stop",
            0,
            0,
            0,
            row,
            tok.decode(ids),
            completion=tok.completion_text(ids),
        )

    items = task.test[:10]
    samples = [sample(row, row.completion + "#") for row in items] + [sample(items[0], items[0].completion[::-1] + "#")]
    score_samples(task, samples)
    wrong = float(items[0].completion[::-1].split() == items[0].completion.split())  # a palindrome is right
    assert [s.reward for s in samples] == [1.0] * 10 + [wrong]


def test_math_word_chain_runs_on_gpt_mini(math_data, tmp_path):
    """(a): pretrain → SFT → GRPO through the generic path, with the example's reward file."""
    task = {"name": "dataset", "train": str(math_data / "train.jsonl"), "test": str(math_data / "test.jsonl")}
    posttrain.pretrain(
        task=task, steps=2, batch_size=4, seq_len=64, corpus_chars=3000, out=str(tmp_path / "pt"), **TINY
    )
    posttrain.sft(
        task=task, init=str(tmp_path / "pt"), steps=2, batch_size=8, eval_problems=4, out=str(tmp_path / "sft"), **TINY
    )
    rewards = EX / "math_word/rewards.py"
    run = posttrain.rl(
        task={**task, "reward": f"{rewards}:correct,{rewards}:fmt", "reward_weights": [1.0, 0.1]},
        init=str(tmp_path / "sft"),
        steps=2,
        out=str(tmp_path / "rl"),
        eval={"problems": 4, "samples": 2},
        rollout={"prompts_per_step": 2, "samples_per_prompt": 4, "max_new_tokens": 24},
        **TINY,
    )
    step = run.metrics[1]
    assert {"reward/correct", "reward/fmt", "reward/errors"} <= set(step) and step["reward/errors"] == 0
    assert "$" in run.tokenizer.chars  # the vocabulary took the data's characters


@pytest.mark.slow
def test_trl_accuracy_reward_unchanged_in_a_run(math_data, tmp_path, sft_ckpt):
    """(b): `trl.rewards:accuracy_reward` reads the `solution` column of conversational rows, as in TRL
    (its completions are message lists there, so it needs message prompts here too)."""
    pytest.importorskip("math_verify")
    rows = [
        {"prompt": [{"role": "user", "content": f"{a}+{b}"}], "solution": f"${a + b}$"}
        for a in range(10)
        for b in range(10)
    ]
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "posttrain.cli",
            "rl",
            "task.name=dataset",
            f"task.train={data}",
            "task.reward=trl.rewards:accuracy_reward",
            f"init={sft_ckpt}",
            f"out={tmp_path}/rl",
            "steps=1",
            "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=4",
            "rollout.max_new_tokens=12",
            "eval.problems=4",
            "eval.samples=2",
            "threads=1",
            "tensorboard=false",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    metrics = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert "reward/accuracy_reward" in metrics[1] and metrics[1]["reward/errors"] == 0


def test_tool_env_in_the_users_module_runs_every_stage(tmp_path):
    """(c): a user's multi-turn Task class from a file: pretrain and SFT on its demonstrations, then RL episodes."""
    task = {"name": str(EX / "tool_env/calc_task.py") + ":CalcTask", "max_value": 300}
    posttrain.pretrain(
        task=task, steps=2, batch_size=4, seq_len=64, corpus_chars=3000, out=str(tmp_path / "pt"), **TINY
    )
    posttrain.sft(
        task=task,
        init=str(tmp_path / "pt"),
        steps=2,
        batch_size=8,
        num_problems=50,
        eval_problems=4,
        out=str(tmp_path / "sft"),
        **TINY,
    )
    run = posttrain.rl(
        task=task,
        init=str(tmp_path / "sft"),
        steps=2,
        out=str(tmp_path / "rl"),
        eval={"problems": 4, "samples": 2},
        rollout={"prompts_per_step": 2, "samples_per_prompt": 4},
        **TINY,
    )
    assert "agent/tool_call_rate" in run.metrics[1] and "eval/tool_call_rate" in run.metrics[0]
    from posttrain.tasks import config_class

    assert config_class(task["name"]).__name__ == "Config"


def test_countdown_as_jsonl_scores_like_the_built_in_task(tmp_path):
    """The control experiment's premise: same rows, same rewards, value for value."""
    script("countdown_jsonl/export.py", "--out", str(tmp_path), "--train", "200", "--test", "10")
    built_in = CountdownTask(CountdownConfig(min_numbers=2, max_numbers=3))
    rewards = EX / "countdown_jsonl/rewards.py"
    generic = DatasetTask(
        DatasetConfig(
            train=str(tmp_path / "train.jsonl"),
            test=str(tmp_path / "test.jsonl"),
            reward=f"{rewards}:correct,{rewards}:fmt",
            reward_weights=[1.0, 0.1],
            correct=f"{rewards}:correct",
        )
    )
    items = built_in.items(200, "train", 0)
    assert [it.question for it in items] == [r.prompt for r in generic.train]
    responses = [it.target(True) + "#" for it in items[:50]] + ["{1+1=2}2#", "(1+2#", "#"] * 50
    for it, row, resp in zip(items * 4, generic.train * 4, responses):
        a, b = built_in.reward(it, resp), generic.reward(row, resp)
        assert a.reward == pytest.approx(b.reward) and a.components["correct"] == b.components["correct"] == b.correct
