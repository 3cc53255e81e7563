"""Evaluation counts its verifier faults as training does (issue 30): a verifier that raises, hangs
past the deadline or kills its worker is counted in eval/errors, eval/timeouts and
eval/workers_replaced, for a user Task class (by path) and for a dataset's reward functions, in the
metrics, on the console, in `posttrain eval` and in the report. Your code scores in worker processes
by default, a batch there exactly as in-process; workers' memory is capped by default."""

import faulthandler
import json
import mmap
import shutil
import sys
from pathlib import Path

import pytest

from posttrain import tasks
from posttrain.config import RLConfig, build, load_config
from posttrain.eval import evaluate
from posttrain.models.tokenizer import CharTokenizer
from posttrain.report import verifier_faults
from posttrain.tasks.arithmetic import ArithmeticTask
from posttrain.tasks.base import RewardResult
from posttrain.tasks.dataset import DatasetConfig, DatasetTask
from posttrain.tasks.pool import AUTO_WORKERS, VerifierPool, make_pool, resolve_workers, verifier_args

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from faulty_verifiers import rows_with_faults  # noqa: E402

FAULTY = f"{ROOT}/benchmarks/faulty_verifiers.py"
TOK = CharTokenizer()


def faulty_task(fault: str, where: str = "eval"):
    """The misbehaving verifier as a user's Task class, loaded by path as `task.name=FILE.py:Class` is."""
    cfg = {"name": f"{FAULTY}:Faulty", "fault": fault, "where": where, "max_terms": 3}
    return tasks.make(build(tasks.config_class(cfg["name"]), cfg, "task."))


def _evaluate(nano, task, pool=None, problems=8, n=2):
    items = task.items(problems, "test", 0)
    fired = sum(task.fires(it) for it in items) if hasattr(task, "fires") else None
    res = evaluate(nano, TOK, task, items, n=n, ks=(1, n), max_new_tokens=4, pool=pool)
    return res, fired


@pytest.mark.parametrize(
    "fault, counts",
    [("raise", (1, 0, 0)), ("hang", (0, 1, 1)), ("exit", (1, 0, 1)), ("segfault", (1, 0, 1))],
)
def test_evaluation_counts_raise_hang_and_crash_in_workers(nano, fault, counts):
    """Each faulty call is one response of the greedy pass or of the n=2 sampled ones: 3 per faulty item."""
    task = faulty_task(fault)
    faulthandler.disable()  # forked with it off: pytest's traceback of each crash is noise here
    try:
        with VerifierPool(task, workers=2, timeout_s=2.0) as pool:
            res, fired = _evaluate(nano, task, pool)
    finally:
        faulthandler.enable(file=sys.__stderr__)
    calls = 3 * fired
    assert fired == 3
    errors, timeouts, replaced = (c * calls for c in counts)
    assert (res["eval/errors"], res["eval/timeouts"], res["eval/workers_replaced"]) == (errors, timeouts, replaced)


def test_evaluation_counts_bad_values_in_process_without_a_pool_key(nano):
    for fault in ("raise", "nan", "bigint", "none", "str_component"):
        res, fired = _evaluate(nano, faulty_task(fault))
        assert (res["eval/errors"], res["eval/timeouts"]) == (3 * fired, 0.0), fault
        assert "eval/workers_replaced" not in res  # no pool, nothing to replace
    healthy, _ = _evaluate(nano, faulty_task("raise", where="train"))  # the held-out items behave
    assert (healthy["eval/errors"], healthy["eval/timeouts"]) == (0.0, 0.0)


def _dataset(tmp_path, fault: str, correct: bool = False) -> DatasetTask:
    source = faulty_task(fault)
    for split, n in (("train", 40), ("test", 8)):
        rows = rows_with_faults(source, n, split)
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return DatasetTask(
        DatasetConfig(
            train=str(tmp_path / "train.jsonl"),
            test=str(tmp_path / "test.jsonl"),
            reward="" if correct else f"{FAULTY}:faulty",
            correct=f"{FAULTY}:faulty" if correct else "",
        )
    )


@pytest.mark.parametrize("fault", ["raise", "hang", "exit"])
def test_a_datasets_reward_function_faults_are_counted_in_evaluation(tmp_path, nano, fault):
    """In a worker the batch fails as a whole first (it raised, hung or died), then each response is
    scored alone: only the faulty rows fail, once each."""
    task = _dataset(tmp_path, fault)
    fired = sum(bool(r.columns["fault"]) for r in task.test)
    with VerifierPool(task, workers=2, timeout_s=2.0) as pool:
        res, _ = _evaluate(nano, task, pool)
    counted = {"raise": "eval/errors", "hang": "eval/timeouts", "exit": "eval/errors"}[fault]
    assert fired == 3 and res[counted] == 3 * fired
    assert res["eval/errors"] + res["eval/timeouts"] == 3 * fired
    if fault != "raise":  # the batch's worker, then each faulty response's
        assert res["eval/workers_replaced"] == 3 * fired + 2
    if fault == "raise":  # in-process alike
        inline, _ = _evaluate(nano, task)
        assert inline["eval/errors"] == 3 * fired and inline["eval/timeouts"] == 0.0


def test_a_correctness_function_that_raises_is_counted(tmp_path, nano):
    task = _dataset(tmp_path, "raise", correct=True)
    res, _ = _evaluate(nano, task)
    assert res["eval/errors"] == 3 * sum(bool(r.columns["fault"]) for r in task.test) == 9


def test_a_batch_scores_in_a_worker_exactly_as_in_process(tmp_path):
    """A TRL function that looks at its whole batch, logs a metric and reads the step: the pool
    sends the batch to one worker, so rewards, logged metrics and the step are the in-process ones."""
    (tmp_path / "r.py").write_text(
        "def ranked(completions, trainer_state, log_metric, **kw):\n"
        "    log_metric('batch_size', len(completions))\n"
        "    order = sorted(completions)\n"
        "    return [order.index(c) / len(c) + trainer_state.global_step for c in completions]\n"
    )
    (tmp_path / "rows.jsonl").write_text(
        "".join(json.dumps({"prompt": f"{i}+1", "answer": i + 1}) + "\n" for i in range(9))
    )
    task = DatasetTask(
        DatasetConfig(train=str(tmp_path / "rows.jsonl"), test_frac=0.0, reward=f"{tmp_path}/r.py:ranked")
    )
    items, texts = task.train[:5], ["b#", "a#", "d#", "c#", "e#"]
    ids = [TOK.encode(t) for t in texts]
    inline = task.reward_batch(items, texts, ids, step=7)
    logged = dict(task.logged)
    task.logged = {}
    with VerifierPool(task, workers=2, timeout_s=10.0) as pool:
        pooled, stats = pool.score_batch([(*a, None, None) for a in zip(items, texts, ids)], step=7)
    assert [r.reward for r in pooled] == [r.reward for r in inline] == [7.5, 7.0, 8.5, 8.0, 9.0]
    assert task.logged == logged == {"batch_size": 5.0} and stats == {"errors": 0, "timeouts": 0, "replaced": 0}


def test_your_code_scores_in_workers_by_default_the_built_in_tasks_in_process(tmp_path):
    cfg = load_config(RLConfig, None, [])
    assert verifier_args(cfg) == (-1, 30.0, 4096, 0)  # auto workers; a 4 GiB cap on each
    assert resolve_workers(ArithmeticTask(), -1) == 0  # arithmetic: ours
    assert resolve_workers(faulty_task("raise"), -1) == AUTO_WORKERS == 2  # a class by path: yours
    assert resolve_workers(_dataset(tmp_path, "raise"), -1) == 2  # reward functions: yours
    assert resolve_workers(_dataset(tmp_path, "raise", correct=True), -1) == 2  # a correctness function: yours
    (tmp_path / "plain.jsonl").write_text(
        "".join(json.dumps({"prompt": f"{i}+1", "answer": i + 1}) + "\n" for i in range(9))
    )
    plain = DatasetTask(DatasetConfig(train=str(tmp_path / "plain.jsonl"), test_frac=0.3))
    assert resolve_workers(plain, -1) == 0  # the answer column: scored by posttrain's own rule
    assert resolve_workers(faulty_task("raise"), 0) == 0 and resolve_workers(plain, 3) == 3  # explicit: as given
    with pytest.raises(Exception, match="verifier.workers=-2"):
        resolve_workers(plain, -2)


class Leaky:
    """Every call keeps 1.5 GiB of address space (an untouched mapping: no RAM)."""

    name = "leaky"

    def __init__(self):
        self.kept = []

    def reward(self, item, response):
        self.kept.append(mmap.mmap(-1, 3 << 29))
        return RewardResult(1.0)


def test_worker_memory_is_capped_by_default():
    """verifier.memory_mb defaults to 4096: two leaks of 1.5 GiB fit, the third fails, is counted,
    and its worker is replaced (under the old default, no cap, a worker grew without bound)."""
    pool = make_pool(Leaky(), workers=1)
    try:
        results, stats = pool.score([(i, "x") for i in range(5)])
    finally:
        pool.close()
    assert [r.reward for r in results] == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert results[2].error.startswith("OSError: [Errno 12]") and (stats["errors"], stats["replaced"]) == (1, 1)


def test_the_report_alarms_on_verifier_faults():
    clean = [{"step": 0, "eval/errors": 0.0, "eval/timeouts": 0.0}, {"step": 1, "reward/errors": 2.0}]
    assert verifier_faults(clean) is None  # training's faults have their own curves
    bad = [
        {"step": 0, "eval/errors": 2.0, "eval/timeouts": 1.0, "eval/workers_replaced": 1.0},
        {"step": 1, "reward/errors": 0.0, "eval/errors": 1.0, "eval/timeouts": 0.0},
    ]
    a = verifier_faults(bad)
    assert a.name == "verifier faults in evaluation" and a.message.startswith(
        "3 errors, 1 timeouts, 1 workers replaced (eval/errors, eval/timeouts, eval/workers_replaced): "
    )


def test_the_console_shows_evaluation_faults_at_the_step_they_happen(tmp_path, capsys):
    from posttrain.logging import RunLogger

    log = RunLogger(tmp_path, "rl", 100, log_every=10, show=("eval/pass@1",), tensorboard=False)
    log.log(3, {"eval/pass@1": 0.5, "eval/errors": 0.0})
    log.log(4, {"eval/pass@1": 0.25, "eval/errors": 2.0, "eval/timeouts": 0.0})
    out = capsys.readouterr().out
    assert "step 3/" not in out  # nothing to say off the log_every steps
    assert "rl step 4/100  eval/pass@1 0.2500  eval/errors 2.0000  eta" in out


def test_posttrain_eval_counts_and_warns(sft_ckpt, tmp_path, capsys):
    """`posttrain eval` on a run whose task is a user's class: scored in workers as the run was, the
    faults printed beside the accuracy, and a warning that the accuracy is a lower bound."""
    from posttrain import checkpoint, cli

    run = tmp_path / "run"
    shutil.copytree(checkpoint.latest(sft_ckpt), run / "checkpoints" / "step_000003")
    cfg = {"task": {"name": f"{FAULTY}:Faulty", "fault": "exit", "where": "eval", "max_terms": 3}}
    (run / "config.yaml").write_text(json.dumps(cfg))
    assert cli.main(["eval", str(run), "--problems", "8", "--k", "1,2"]) == 0
    captured = capsys.readouterr()
    lines = dict(line.split()[:2] for line in captured.out.splitlines() if line.startswith("eval/"))
    assert (lines["eval/errors"], lines["eval/timeouts"], lines["eval/workers_replaced"]) == (
        "9.0000",
        "0.0000",
        "9.0000",
    )
    assert "warning: the verifier failed on 9 responses" in captured.err


def test_an_rl_run_counts_the_faults_of_its_evaluations(sft_ckpt, tmp_path, capsys):
    """The issue's case, through the run: a user Task class whose held-out scoring kills its worker.
    Under the defaults it scores in workers, so the run goes on and each evaluation says how many
    responses the verifier failed, in the metrics and on the console; training is untouched."""
    from posttrain.logging import read_metrics
    from posttrain.recipes import rl

    task = [f"task.name={FAULTY}:Faulty", "task.fault=exit", "task.where=eval", "task.max_terms=3"]
    keys = ["steps=1", "threads=1", "tensorboard=false", "eval.problems=8", "eval.samples=1", *task]
    keys += ["rollout.prompts_per_step=2", "rollout.samples_per_prompt=2", "rollout.max_new_tokens=8"]
    rl.run(load_config(RLConfig, None, [f"init={sft_ckpt}", f"out={tmp_path}/rl", *keys]))
    evals = [m for m in read_metrics(tmp_path / "rl") if "eval/errors" in m]
    assert [m["step"] for m in evals] == [0, 1]
    for m in evals:  # 3 faulty held-out items × (greedy + 1 sample)
        assert (m["eval/errors"], m["eval/timeouts"], m["eval/workers_replaced"]) == (6.0, 0.0, 6.0)
    assert (evals[1]["reward/errors"], evals[1]["reward/workers_replaced"]) == (0.0, 0.0)
    out = capsys.readouterr().out
    assert "verifier_workers: 2" in out and "rl step 0/1  eval/pass@1" in out and "eval/errors 6.0000" in out
