"""Hub datasets where a user names data (tasks/hub_data.py): `task.train=openai/gsm8k task.subset=main`
read by `datasets` by id, with HF_HUB_OFFLINE=1 from the copy `datasets` keeps under HF_HOME (laid out
by tests/hub_util.py as an online read leaves it); columns mapped as for files, `task.columns` renames
and `task.prompt_template`. Bad names are one line, exit 2, before any model is loaded."""

import json

import pytest

pytest.importorskip("datasets")
pytest.importorskip("transformers")
import hub_util  # noqa: E402
from hub_util import COMMITS, GSM8K, QWEN, hub_home, offline  # noqa: E402, F401  (fixtures)

from posttrain import UsageError  # noqa: E402
from posttrain.cli import main  # noqa: E402
from posttrain.tasks import hub_data  # noqa: E402
from posttrain.tasks.dataset import DatasetConfig, DatasetTask  # noqa: E402
from posttrain.tasks.hub_data import parse_spec  # noqa: E402
from posttrain.tasks.rows import read_rows  # noqa: E402

VERL_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'  # verl's gsm8k.py
ROWS = hub_util.GSM8K_ROWS


@pytest.mark.parametrize(
    "spec,want",
    [
        ("openai/gsm8k", ("openai/gsm8k", None, "", "")),
        ("openai/gsm8k:main", ("openai/gsm8k", None, "main", "")),
        ("openai/gsm8k:main:test", ("openai/gsm8k", None, "main", "test")),
        ("openai/gsm8k@abc:main:test", ("openai/gsm8k", "abc", "main", "test")),
        ("data/train.jsonl", None),  # a file name, missing or not, is a file
        ("train.jsonl", None),
    ],
)
def test_a_dataset_id_may_carry_its_subset_split_and_revision(spec, want):
    assert parse_spec(spec) == want


def test_rows_are_read_by_id_with_the_subset_and_split_and_the_commit_is_recorded(offline):
    test = read_rows(GSM8K, "task.test", "test", "main")
    assert [r for _, r in test] == ROWS[9:] and test[0][0] == "openai/gsm8k[main/test] row 0"
    assert [r for _, r in read_rows("openai/gsm8k:main:train", "task.train")] == ROWS[:9]
    assert hub_data.RECORDS[("task.test", GSM8K)] == {
        "hub_id": GSM8K,
        "subset": "main",
        "split": "test",
        "revision": COMMITS[GSM8K],
        "requested_revision": "main",
        "rows": 3,
    }
    assert len(read_rows(GSM8K, "task.train", "train", "main", limit=4)) == 4


def test_a_prompt_template_and_the_question_and_answer_columns_make_verls_gsm8k_rows(offline):
    """verl's examples/data_preprocess/gsm8k.py: prompt = question + " " + instruction, one user
    message; here the template does the same from the hub rows, the answer column is the gold."""
    t = DatasetTask(
        DatasetConfig(
            train=GSM8K,
            test=GSM8K,
            subset="main",
            prompt_template="{question} " + VERL_INSTRUCTION,
            reward="posttrain.tasks.gsm8k:compute_score",
        )
    )
    assert [r.prompt for r in t.test] == [r["question"] + " " + VERL_INSTRUCTION for r in ROWS[9:]]
    assert [r.answer for r in t.test] == [r["answer"] for r in ROWS[9:]] and len(t.train) == 9
    plain = DatasetTask(DatasetConfig(train=GSM8K, subset="main", test_frac=0.0, test=GSM8K))
    assert [r.prompt for r in plain.test] == [r["question"] for r in ROWS[9:]]  # `question`: a prompt column


def test_columns_rename_and_the_fallback_columns(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = [{"query": f"q{i}", "final": i, "solution": f"s{i}"} for i in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = DatasetTask(DatasetConfig(train=str(path), test_frac=0.0, test=str(path), columns={"prompt": "query"}))
    assert [(r.prompt, r.answer) for r in t.test] == [(f"q{i}", f"s{i}") for i in range(10)]  # answer: `solution`
    assert t.test[0].columns["query"] == "q0"  # the original column stays, for reward functions
    t = DatasetTask(
        DatasetConfig(train=str(path), test=str(path), test_frac=0.0, columns={"prompt": "query", "answer": "final"})
    )
    assert [r.answer for r in t.test] == list(range(10))
    t = DatasetTask(DatasetConfig(train=str(path), test=str(path), test_frac=0.0, prompt_template="{{x}} {query}!"))
    assert t.test[3].prompt == "{x} q3!"  # doubled braces are literal


@pytest.mark.parametrize(
    "keys,line",
    [
        (["task.split=validation"], "task.train='openai/gsm8k': openai/gsm8k@main subset 'main' has splits train, test, not 'validation'; set task.split"),
        (["task.test_split=dev"], "task.test='openai/gsm8k': openai/gsm8k@main subset 'main' has splits train, test, not 'dev'; set task.test_split"),
        (["task.columns.prompt=query"], "openai/gsm8k[main/train] row 0: task.columns.prompt='query', but the row has no 'query' column (columns: question, answer)"),
        (["task.prompt_template=Solve {problem}"], "openai/gsm8k[main/train] row 0: task.prompt_template names {problem}, not a column of the row (columns: question, answer)"),
        (["task.subset=socratic"], "task.train='openai/gsm8k': openai/gsm8k has no subset 'socratic'"),
        (["task.train=openai/gsm9k"], "task.train='openai/gsm9k': no local path"),
    ],
)  # fmt: skip
def test_a_bad_split_column_subset_or_id_is_one_line_before_any_model_loads(
    offline, tmp_path, capsys, monkeypatch, keys, line
):
    from posttrain.models import hub

    resolved = []
    monkeypatch.setattr(hub, "resolve_model", lambda *a, **k: resolved.append(a))  # the first step of any load
    base = [f"init={QWEN}", "task.name=dataset", f"task.train={GSM8K}", f"task.test={GSM8K}", "task.subset=main"]
    assert main(["rl", *base, *keys, f"out={tmp_path}/run", "device=cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("posttrain rl: error: " + line), err[-1]
    assert resolved == [] and not (tmp_path / "run").exists()


def test_a_missing_extra_is_one_line(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_datasets(name, *a, **k):
        if name == "datasets":
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(
        UsageError, match=r"^task.train='openai/gsm8k': .*needs `datasets`: pip install 'posttrain\[data\]'$"
    ):
        read_rows(GSM8K, "task.train")
