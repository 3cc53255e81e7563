"""Your own data: rows from every format, TRL and verl reward functions unchanged, correctness apart
from reward. Its bad inputs are in test_dataset_bad_inputs.py."""

import json
import subprocess
import sys

import pytest

from posttrain import UsageError
from posttrain.chat import DEFAULT_CHARS, SYSTEM, render_builtin
from posttrain.config import RLConfig, load_config
from posttrain.eval import evaluate
from posttrain.models.tokenizer import CharTokenizer
from posttrain.tasks.base import correctness, safe_reward
from posttrain.tasks.dataset import DatasetConfig, DatasetTask, last_number

TOK = CharTokenizer()


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def task_of(tmp_path, rows, **keys):
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    return DatasetTask(DatasetConfig(train=train, test_frac=0.0 if "test" in keys else 0.1, **keys))


ROWS = [
    {"prompt": f"what is {a} plus {b}?", "answer": a + b, "level": a % 3} for a in range(1, 11) for b in range(1, 4)
]


def test_jsonl_rows_keep_every_column_and_split_by_a_stable_hash(tmp_path):
    t = task_of(tmp_path, ROWS)
    assert len(t.train) + len(t.test) == 30 and t.test  # test_frac 0.1 of 30, by hash
    assert {r.prompt for r in t.train}.isdisjoint({r.prompt for r in t.test})
    again = task_of(tmp_path, ROWS)
    assert [r.prompt for r in again.test] == [r.prompt for r in t.test]  # stable
    r = t.train[0]
    assert r.columns == ROWS[[x["prompt"] for x in ROWS].index(r.prompt)] and r.answer == r.columns["answer"]
    # train items: pure in the seed, every row once before any twice
    items = t.items(len(t.train) + 3, "train", "0/1/0")
    assert {id(x) for x in items[: len(t.train)]} == {id(x) for x in t.train}
    assert [x.prompt for x in t.items(5, "train", "0/1/0")] == [x.prompt for x in items[:5]]


def test_the_built_in_reward_is_the_answers_last_number(tmp_path):
    t = task_of(tmp_path, ROWS)
    row = next(r for r in t.train if r.answer == 7)
    assert t.reward(row, "{3+4=7}7#").reward == 1.0 and t.reward(row, "{3+4=7}8#").reward == 0.0
    assert t.reward(row, "no number#").reward == 0.0
    assert last_number("a 1,234.50 b") == "1234.5" and last_number("-3 then 12#99") == "12"


def test_csv_json_parquet_and_a_datasets_folder_read_the_same_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Dataset, DatasetDict

    rows = [{"prompt": r["prompt"], "answer": str(r["answer"])} for r in ROWS]
    (tmp_path / "d.json").write_text(json.dumps(rows))
    with open(tmp_path / "d.csv", "w") as f:
        f.write("prompt,answer\n" + "".join(f'"{r["prompt"]}",{r["answer"]}\n' for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    DatasetDict({"train": Dataset.from_list(rows), "test": Dataset.from_list(rows[:4])}).save_to_disk(tmp_path / "dd")
    Dataset.from_list(rows).save_to_disk(tmp_path / "one")
    want = [(r["prompt"], r["answer"]) for r in rows]
    for path in ("d.json", "d.csv", "d.parquet", "dd", "one"):
        t = DatasetTask(DatasetConfig(train=str(tmp_path / path), test_frac=0.0, test=str(tmp_path / "d.json")))
        assert [(r.prompt, r.answer) for r in t.train] == want, path
    t = DatasetTask(DatasetConfig(train=str(tmp_path / "dd"), test=str(tmp_path / "dd")))  # a DatasetDict's splits
    assert len(t.train) == 30 and [r.prompt for r in t.test] == [r["prompt"] for r in rows[:4]]


VERL_ROW = {  # the row verl's examples/data_preprocess/gsm8k.py writes, as it is
    "data_source": "openai/gsm8k",
    "prompt": [
        {
            "role": "user",
            "content": "Natalia sold 48 clips in April and half as many in May. How many in all? "
            'Let\'s think step by step and output the final answer after "####".',
        }
    ],
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": "72"},
    "extra_info": {
        "split": "train",
        "index": 0,
        "answer": "48/2 = 24, 48+24 = 72\n#### 72",
        "question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
    },
}

VERL_SCORE = """
import re
def compute_score(data_source, solution_str, ground_truth, extra_info=None, method="strict", format_score=0.0, score=1.0):
    # verl.utils.reward_score.gsm8k, shape for shape: the answer after "####"
    found = re.search("#### (\\\\-?[0-9\\\\.\\\\,]+)", solution_str)
    if found is None:
        return 0.0
    answer = found.group(1).replace(",", "")
    assert data_source == "openai/gsm8k" and extra_info["index"] == 0
    return score if answer == ground_truth else format_score
"""


def test_a_verl_parquet_row_is_read_as_it_is_and_scored_by_compute_score(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([VERL_ROW]), tmp_path / "train.parquet")
    (tmp_path / "gsm8k.py").write_text(VERL_SCORE)
    t = DatasetTask(
        DatasetConfig(
            train=str(tmp_path / "train.parquet"),
            test=str(tmp_path / "train.parquet"),
            reward=f"{tmp_path}/gsm8k.py:compute_score",
        )
    )
    row = t.train[0]
    assert row.prompt == VERL_ROW["prompt"] and row.answer == "72"  # reward_model.ground_truth
    assert row.columns["extra_info"]["answer"].endswith("#### 72")
    assert t.fns[0].style == "verl"
    assert t.reward(row, "24 + 48 = 72 #### 72").reward == 1.0
    assert t.reward(row, "#### 71").reward == 0.0 and t.reward(row, "72").reward == 0.0
    assert t.reward(row, "#### 72").components == {"compute_score": 1.0}


def test_trl_reward_functions_run_unchanged(tmp_path):
    """trl.rewards as TRL's GRPOTrainer calls them: conversational completions, the `solution`
    column by name, completion_ids; None (an unparseable gold) is left out of that function."""
    pytest.importorskip("math_verify")
    rows = [
        {
            "prompt": [
                {"role": "system", "content": "Put the answer in $...$."},
                {"role": "user", "content": "what is 3 plus 4?"},
            ],
            "solution": "$7$",
        },
        {"prompt": [{"role": "user", "content": "what is 1 plus 1?"}], "solution": "no gold here"},
    ]
    t = task_of(
        tmp_path,
        rows,
        test=write_jsonl(tmp_path / "t.jsonl", rows),
        reward="trl.rewards:accuracy_reward,trl.rewards:think_format_reward",
        reward_weights=[1.0, 0.5],
    )
    a, b = t.train
    res = t.reward_batch(
        [a, a, b], ["the answer is $7$", "<think>x</think>it is $8$", "$2$"], ids=[[1] * 5, [1] * 9, [1]]
    )
    assert [r.components for r in res] == [
        {"accuracy_reward": 1.0, "think_format_reward": 0.0},
        {"accuracy_reward": 0.0, "think_format_reward": 1.0},
        {"think_format_reward": 0.0},
    ]  # None: left out
    assert [r.reward for r in res] == [1.0, 0.5, 0.0]
    # a factory's callable object on completion_ids: trl's soft overlong punishment, unchanged
    from trl.rewards import get_soft_overlong_punishment

    t2 = DatasetTask(
        DatasetConfig(train=str(tmp_path / "train.jsonl"), test=str(tmp_path / "t.jsonl")),
        reward_funcs=[get_soft_overlong_punishment(max_completion_len=10, soft_punish_cache=4)],
    )
    got = [r.reward for r in t2.reward_batch([a] * 3, ["x"] * 3, ids=[[0] * 5, [0] * 8, [0] * 12])]
    assert got == [0.0, pytest.approx(-0.5), -1.0]  # ≤ L−cache: 0; ramp: (6−8)/4; over L: −1


def test_weights_none_async_and_metrics_per_function(tmp_path):
    (tmp_path / "r.py").write_text("""
import asyncio
def correct(prompts, completions, answer, **kw):
    return [1.0 if c.strip("#") == str(a) else 0.0 for c, a in zip(completions, answer)]
async def brief(completions, **kw):
    await asyncio.sleep(0)
    return [None if len(c) > 4 else 1.0 for c in completions]
""")
    t = task_of(tmp_path, ROWS, reward=f"{tmp_path}/r.py:correct,{tmp_path}/r.py:brief", reward_weights=[1.0, 0.1])
    row = next(r for r in t.train if r.answer == 7)
    from posttrain.framework.sample import Sample

    samples = [
        Sample(
            prompt_ids=[1],
            response_ids=TOK.encode(x),
            response_logprobs=[0.0] * len(x),
            response_mask=[1] * len(x),
            finish_reason="stop",
            policy_version=0,
            group=0,
            index=i,
            item=row,
            text=x,
        )
        for i, x in enumerate(["7#", "8#", "longer 7#"])
    ]
    from posttrain.tasks.base import score_samples

    m = score_samples(t, samples)
    assert [s.reward for s in samples] == [pytest.approx(1.1), pytest.approx(0.1), 0.0]
    assert m["reward/correct"] == pytest.approx(1 / 3) and m["reward/brief"] == 1.0  # None left out of brief's mean
    assert m["reward/errors"] == 0.0


def test_a_failing_function_costs_only_its_sample_and_is_counted(tmp_path):
    (tmp_path / "r.py").write_text("""
def picky(completions, **kw):
    if any("boom" in c for c in completions):
        raise ValueError("cannot score boom")
    return [1.0] * len(completions)
""")
    t = task_of(tmp_path, ROWS, reward=f"{tmp_path}/r.py:picky")
    res = t.reward_batch(t.train[:3], ["7#", "boom#", "8#"])
    assert [r.reward for r in res] == [1.0, 0.0, 1.0]
    assert res[1].error == "reward function picky: ValueError: cannot score boom" and res[0].error is None


def test_correct_is_not_reward(tmp_path):
    """A format bonus raises the reward, never the accuracy: greedy accuracy stays ≤ 1."""
    (tmp_path / "r.py").write_text("""
def answer(completions, answer, **kw):
    return [1.0 if c.rstrip("#").endswith(str(a)) else 0.0 for c, a in zip(completions, answer)]
def fmt(completions, **kw):
    return [1.0 if c.endswith("#") else 0.0 for c in completions]
def exact(completions, answer, **kw):
    return [c == f"{a}#" for c, a in zip(completions, answer)]
""")
    base = dict(reward=f"{tmp_path}/r.py:answer,{tmp_path}/r.py:fmt", reward_weights=[1.0, 0.7])
    row = next(r for r in task_of(tmp_path, ROWS).train if r.answer == 7)
    by_answer = task_of(tmp_path, ROWS, **base)  # answers exist: last number
    res = by_answer.reward(row, "so 7#")
    assert res.reward == pytest.approx(1.7) and correctness(res) == 1.0
    assert correctness(by_answer.reward(row, "so 8#")) == 0.0 and by_answer.reward(row, "so 8#").reward == 0.7
    by_fn = task_of(tmp_path, ROWS, **base, correct=f"{tmp_path}/r.py:exact")
    assert correctness(by_fn.reward(row, "so 7#")) == 0.0 and correctness(by_fn.reward(row, "7#")) == 1.0
    by_threshold = task_of(tmp_path, ROWS, **base, correct_threshold=1.5)
    assert correctness(by_threshold.reward(row, "so 7#")) == 1.0 and correctness(by_threshold.reward(row, "7")) == 0.0
    no_answers = [{"prompt": r["prompt"]} for r in ROWS]
    blind = task_of(tmp_path, no_answers, reward=f"{tmp_path}/r.py:fmt")
    assert blind.correctness is None and blind.reward(blind.train[0], "x#").correct is None


def test_eval_reports_accuracy_from_correctness_and_leaves_majority_out_without_answers(tmp_path, nano):
    (tmp_path / "r.py").write_text("def fmt(completions, **kw):\n    return [1.5 for c in completions]\n")
    t = task_of(tmp_path, ROWS, reward=f"{tmp_path}/r.py:fmt")
    res = evaluate(nano, TOK, t, t.test, n=2, ks=(1, 2), max_new_tokens=4)
    assert res["eval/greedy_reward"] == 1.5 and res["eval/greedy_acc"] <= 1.0 and res["eval/pass@1"] <= 1.0
    assert "eval/maj@2" in res  # answers: last number vs answer
    blind = task_of(tmp_path, [{"prompt": r["prompt"]} for r in ROWS], reward=f"{tmp_path}/r.py:fmt")
    res = evaluate(nano, TOK, blind, blind.test, n=2, ks=(1, 2), max_new_tokens=4)
    assert res["eval/reward_mean"] == 1.5 and not any(
        k in res for k in ("eval/pass@1", "eval/greedy_acc", "eval/maj@2")
    )


def test_messages_render_with_a_system_role_in_both_templates(tmp_path):
    """The built-in template and the exported Hugging Face jinja template give the same text."""
    from transformers import AutoTokenizer

    from posttrain.models.hf import write_tiny

    hf = AutoTokenizer.from_pretrained(write_tiny(tmp_path / "m"))
    convos = [
        [{"role": "user", "content": "3+4"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "3+4"}],
        [{"role": "user", "content": "3+4"}, {"role": "assistant", "content": "7"}, {"role": "user", "content": "+1"}],
        [
            {"role": "user", "content": "12+30"},
            {"role": "assistant", "content": "⟦12+30⟧"},
            {"role": "tool", "content": "42"},
        ],
    ]
    for c in convos:
        assert hf.apply_chat_template(c, add_generation_prompt=True, tokenize=False) == render_builtin(c), c
    assert CharTokenizer(DEFAULT_CHARS + SYSTEM).chat_prompt(convos[1]) == "§be brief<3+4>"
    with pytest.raises(UsageError, match="this vocabulary has no system marker"):
        TOK.chat_prompt(convos[1])
    assert TOK.chat_prompt(convos[2]) == "<3+4>7#<+1>"
    assert TOK.chat_prompt(convos[3]) == "<12+30>⟦12+30⟧⟨42⟩"


def test_rl_config_sections_old_names_and_trl_names():
    cfg = load_config(RLConfig, None, ["samples_per_prompt=4", "algo.name=dapo", "eval.samples=2"])
    assert (cfg.rollout.samples_per_prompt, cfg.algo.eps_high, cfg.eval.samples) == (4, 0.28, 2)
    with pytest.raises(
        UsageError, match="unknown config key 'beta' for RLConfig: that is TRL's name; posttrain's is 'algo.kl_coef'"
    ):
        load_config(RLConfig, None, ["beta=0.1"])
    with pytest.raises(UsageError, match="'samples_per_prompt' and 'rollout.samples_per_prompt' are the same key"):
        load_config(RLConfig, None, ["samples_per_prompt=4", "rollout.samples_per_prompt=8"])


def test_help_lists_every_key_with_its_value_and_doc():
    p = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "rl", "rollout.samples_per_prompt=4", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0
    lines = p.stdout.splitlines()
    line = next(ln for ln in lines if ln.strip().startswith("rollout.samples_per_prompt ="))
    assert line.split()[:3] == ["rollout.samples_per_prompt", "=", "4"] and "group size G" in line
    from posttrain.config_load import _dotted_keys

    for key in _dotted_keys(load_config(RLConfig)):
        assert any(ln.strip().startswith(f"{key.replace('async_', 'async')} =") for ln in lines), key
    algos = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "rl", "--help", "algo"], capture_output=True, text=True, timeout=120
    ).stdout
    assert "algo.name=dapo:" in algos and "algo.overlong_buffer = 0" in algos


def test_safe_reward_passes_ids_to_tasks_that_want_them(tmp_path):
    (tmp_path / "r.py").write_text("def n(completion_ids, **kw):\n    return [float(len(i)) for i in completion_ids]\n")
    t = task_of(tmp_path, ROWS, reward=f"{tmp_path}/r.py:n")
    assert safe_reward(t, t.train[0], "abc", [5, 6, 7]).reward == 3.0


def test_reward_functions_run_in_the_verifier_pool_under_its_deadline(tmp_path):
    """verifier.workers > 0: the same rewards as in-process; a batch that hangs is scored again one
    response at a time, so only the hanging response scores 0, as a timeout."""
    from posttrain.framework.sample import Sample
    from posttrain.tasks.base import score_samples
    from posttrain.tasks.pool import VerifierPool

    (tmp_path / "r.py").write_text("""
import time
def correct(completions, answer, completion_ids, **kw):
    if "hang#" in completions:
        time.sleep(60)
    return [float(c.rstrip("#") == str(a)) + 0.01 * len(i) for c, a, i in zip(completions, answer, completion_ids)]
""")
    t = task_of(tmp_path, ROWS, reward=f"{tmp_path}/r.py:correct")
    row = next(r for r in t.train if r.answer == 7)
    texts = ["7#", "8#", "77#", "hang#"]

    def samples():
        return [
            Sample(
                prompt_ids=[1],
                response_ids=TOK.encode(x),
                response_logprobs=[0.0] * len(x),
                response_mask=[1] * len(x),
                finish_reason="stop",
                policy_version=0,
                group=0,
                index=i,
                item=row,
                text=x,
            )
            for i, x in enumerate(texts)
        ]

    with VerifierPool(t, workers=2, timeout_s=2.0) as pool:
        pooled = samples()
        m = score_samples(t, pooled, pool)
    assert [s.reward for s in pooled] == [pytest.approx(1.02), pytest.approx(0.02), pytest.approx(0.03), 0.0]
    assert m["reward/timeouts"] == 1.0 and pooled[3].reward_error.startswith("verifier timed out")
    inline = samples()[:3]
    score_samples(t, inline)
    assert [s.reward for s in inline] == [s.reward for s in pooled[:3]]
