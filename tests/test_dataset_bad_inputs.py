"""Your own data, bad: each bad file, row, column or reward function is one line naming it and the
fix, before any training (the `posttrain rl` command line included)."""

import subprocess
import sys

import pytest
from test_dataset import ROWS, TOK, task_of, write_jsonl

from posttrain import UsageError
from posttrain.tasks import make
from posttrain.tasks.dataset import DatasetConfig

BAD = [
    (dict(train="nowhere.jsonl"), "task.train='nowhere.jsonl': no such file or directory"),
    (dict(train="{p}/rows.txt"), "task.train='{p}/rows.txt': unknown format '.txt'; use one of .jsonl"),
    (
        dict(train="{p}/q.jsonl"),
        "{p}/q.jsonl:2: no 'prompt', messages or question column (columns: query, answer); "
        "set task.columns.prompt=COLUMN (or task.prompt_template)",
    ),
    (
        dict(train="{p}/roles.jsonl"),
        "{p}/roles.jsonl:1 prompt: message 0 has the unknown role 'human'; use one of system, user, assistant, tool",
    ),
    (
        dict(reward="{p}/broken.py:f"),
        "task.reward: {p}/broken.py does not import: NameError: name 'undefined' is not defined",
    ),
    (
        dict(reward="{p}/r.py:nope"),
        "task.reward='{p}/r.py:nope': {p}/r.py has no function 'nope' (it has: few, many, words, wrong)",
    ),
    (dict(reward="{p}/r.py:wrong"), "task.reward: wrong(x, y) has neither TRL's reward signature"),
    (dict(reward="{p}/missing.py:f"), "task.reward: file '{p}/missing.py' not found"),
    (
        dict(reward="{p}/r.py:few", reward_weights=[1.0, 2.0]),
        "task.reward_weights has 2 weights for 1 reward function; give one per function, in their order: "
        "task.reward_weights=[1.0]",
    ),
    (
        dict(reward="{p}/r.py:few,{p}/r.py:many", reward_weights=[0.5]),
        "task.reward_weights has 1 weight for 2 reward functions; give one per function, in their order: "
        "task.reward_weights=[0.5,1.0]",
    ),
]


@pytest.fixture
def bad_dir(tmp_path):
    write_jsonl(tmp_path / "ok.jsonl", ROWS)
    (tmp_path / "rows.txt").write_text("x")
    write_jsonl(tmp_path / "q.jsonl", [{"prompt": "a", "answer": 1}, {"query": "b", "answer": 2}])
    write_jsonl(tmp_path / "roles.jsonl", [{"prompt": [{"role": "human", "content": "hi"}], "answer": 1}])
    (tmp_path / "broken.py").write_text("x = undefined\n")
    (tmp_path / "r.py").write_text("""
def few(completions, **kw):
    return [1.0]
def many(completions, **kw):
    return [1.0] * (len(completions) + 1)
def words(completions, **kw):
    return ["good"] * len(completions)
def wrong(x, y):
    return 0
""")
    return tmp_path


@pytest.mark.parametrize("keys,message", BAD)
def test_bad_dataset_inputs_are_one_line(bad_dir, keys, message):
    keys = {k: (v.format(p=bad_dir) if isinstance(v, str) else v) for k, v in keys.items()}
    keys.setdefault("train", str(bad_dir / "ok.jsonl"))
    with pytest.raises(UsageError) as e:
        make(DatasetConfig(**keys))
    assert str(e.value).startswith(message.format(p=bad_dir)), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "fn,message",
    [
        (
            "few",
            "reward function few ({m}:few) failed on a dry call with the first training rows ({p}/ok.jsonl:1): "
            "ValueError: few returned 1 values for 2 completions (one per completion)",
        ),
        (
            "words",
            "reward function words ({m}:words) failed on a dry call with the first training rows ({p}/ok.jsonl:1): "
            "ValueError: words returned 'good' (str), not a number",
        ),
    ],
)
def test_a_function_that_answers_wrongly_fails_the_dry_call(bad_dir, fn, message):
    t = make(DatasetConfig(train=str(bad_dir / "ok.jsonl"), reward=f"{bad_dir}/r.py:{fn}"))
    with pytest.raises(UsageError) as e:
        t.check(TOK, 256, 16)
    module = t.fns[0].fn.__module__
    assert str(e.value) == message.format(p=bad_dir, m=module)


def test_rows_the_model_cannot_take_are_named(tmp_path):
    long = task_of(tmp_path, [*ROWS[:3], {"prompt": "what is " + "1 plus " * 60 + "1?", "answer": 61}])
    with pytest.raises(
        UsageError,
        match=r"train.jsonl:4: the prompt is 432 tokens; with max_new_tokens=16 it exceeds "
        r"the model's context \(256\); shorten or drop the row",
    ):
        long.check(TOK, 256, 16)
    odd = task_of(tmp_path, [*ROWS[:3], {"prompt": "what is 1 ¥ 1?", "answer": 2}])
    with pytest.raises(UsageError, match=r"train.jsonl:4: character '¥' is not in the tokenizer vocabulary"):
        odd.check(TOK, 256, 16)


def _rl_cli(*keys: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "rl", *keys], capture_output=True, text=True, timeout=120
    )


def test_the_cli_refuses_bad_data_before_any_work(bad_dir):
    out = bad_dir / "run"
    p = _rl_cli("task.name=dataset", f"task.train={bad_dir}/q.jsonl", f"out={out}")
    assert p.returncode == 2 and p.stderr.strip() == (
        f"posttrain rl: error: {bad_dir}/q.jsonl:2: no 'prompt', messages or question column (columns: query, "
        "answer); set task.columns.prompt=COLUMN (or task.prompt_template)"
    )
    assert not out.exists()


def test_rl_on_your_rows_without_init_is_refused_before_any_work(bad_dir):
    """The default checkpoint knows only the built-in sums: RL on your rows without init= is one line
    naming the commands that warm a model up on them, not minutes spent building the wrong one."""
    out = bad_dir / "run"
    p = _rl_cli("task.name=dataset", f"task.train={bad_dir}/ok.jsonl", f"out={out}")
    keys = f"task.name=dataset task.train={bad_dir}/ok.jsonl"
    assert p.returncode == 2 and p.stderr.strip() == (
        "posttrain rl: error: task.name=dataset without init= would start from the default "
        f"checkpoint, which knows only the built-in sums; warm a model up on your task first (posttrain pretrain "
        f"{keys} out=runs/my/pt, then posttrain sft {keys} init=runs/my/pt out=runs/my/sft) and give "
        "init=runs/my/sft, or init= a Hugging Face model directory"
    )
    assert not out.exists() and "training the default" not in p.stdout
