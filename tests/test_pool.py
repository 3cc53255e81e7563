"""Verifier pool: raising, hanging, crashing verifiers score 0 with a reason, are counted,
never stop the step, and their workers are replaced; an RL run with 10% of verifier calls
raising and 5% hanging completes with exactly those counts in its metrics."""

import ctypes
import faulthandler
import gc
import json
import os
import time
from dataclasses import dataclass

import pytest

from posttrain.tasks import sandbox
from posttrain.tasks.arithmetic import ArithmeticTask, Problem
from posttrain.tasks.base import score_samples
from posttrain.tasks.pool import VerifierPool, make_pool


class Misbehaving:
    """item = (behaviour, value): the verifier does what the behaviour says."""

    name = "misbehaving"

    def reward(self, item, response):
        kind, value = item
        if kind == "raise":
            raise ValueError(f"bad item {value}")
        if kind == "hang":
            time.sleep(3600)
        if kind == "exit":
            os._exit(3)
        if kind == "segv":
            faulthandler.disable()  # pytest's traceback dump is noise here
            ctypes.string_at(0)
        if kind == "nan":
            from posttrain.tasks.base import RewardResult

            return RewardResult(float("nan"))
        from posttrain.tasks.arithmetic import verify
        from posttrain.tasks.base import RewardResult

        return RewardResult(verify(response, value))


def test_every_failure_kind_scores_zero_with_a_reason_and_is_counted():
    kinds = ["ok", "raise", "ok", "hang", "exit", "ok", "segv", "nan", "ok", "hang"]
    pairs = [((k, i), str(i)) for i, k in enumerate(kinds)]
    with VerifierPool(Misbehaving(), workers=2, timeout_s=3.0) as pool:  # slack for a loaded CI box
        results, stats = pool.score(pairs)
        assert [r.reward for r in results] == [1.0 if k == "ok" else 0.0 for k in kinds]
        reasons = [r.error for r in results]
        assert reasons[1] == "ValueError: bad item 1"
        assert reasons[3] == reasons[9] == "verifier timed out after 3s"
        assert reasons[4] == "verifier worker died (exit code 3)"
        assert reasons[6] == "verifier worker died (exit code -11)"
        assert reasons[7].startswith("verifier returned a non-finite reward")
        assert (stats["errors"], stats["timeouts"], stats["replaced"]) == (4, 2, 4)  # hang x2, exit, segv replaced
        assert 0 <= stats["latency_p50_s"] <= stats["latency_p99_s"]
        again, stats = pool.score([(("ok", 5), "5")] * 4)  # the replacements work
        assert [r.reward for r in again] == [1.0] * 4 and stats["replaced"] == 0
        os.kill(pool.workers[0].proc.pid, 9)  # an idle worker killed from outside
        pool.workers[0].proc.join()
        again, stats = pool.score([(("ok", 5), "5")] * 4)
        assert [r.reward for r in again] == [1.0] * 4 and stats["replaced"] == 1
        res, stats = pool.score([(("ok", lambda: 0), "0"), (("ok", 7), "7")])  # a lambda does not pickle
        assert res[0].error.startswith("cannot send the item") and res[1].reward == 1.0 and stats["errors"] == 1
        workers = [w.proc.pid for w in pool.workers]
    assert not any(p in sandbox.descendants(os.getpid()) for p in workers)  # closed: nothing left


@dataclass
class _Sample:
    item: object
    text: str
    finish_reason: str = "stop"


def test_pool_and_in_process_give_the_same_rewards():
    task = ArithmeticTask()
    items = task.items(12, "train", seed=3)
    samples = [_Sample(it, f"{{..}}{it.answer + (i % 3 == 0)}") for i, it in enumerate(items)]
    samples.append(_Sample(items[0], "", "error"))
    plain = score_samples(task, samples)
    rewards = [s.reward for s in samples]
    with VerifierPool(task, workers=3, timeout_s=5.0) as pool:
        pooled = score_samples(task, samples, pool)
    assert [s.reward for s in samples] == rewards == [0.0 if i % 3 == 0 else 1.0 for i in range(12)] + [0.0]
    assert plain["reward/errors"] == pooled["reward/errors"] == 1.0 and pooled["reward/timeouts"] == 0.0
    assert plain["reward/correct"] == pooled["reward/correct"] == pytest.approx(8 / 13)
    assert make_pool(task, 0, 1.0) is None


@dataclass(frozen=True)
class Tagged:
    index: int  # position of the item in its batch: decides the injected fault
    inner: Problem


class FaultInjecting:
    """Of every 20 train items handed out, item 0 and 1 raise and item 2 hangs, for each of
    their samples: 10% of verifier calls raise and 5% hang, deterministically. Held-out
    items are left alone (evaluation scores in-process)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def items(self, n, split="train", seed=0):
        items = self.inner.items(n, split, seed)
        return [Tagged(i, it) for i, it in enumerate(items)] if split == "train" else items

    def prompt(self, item):
        return self.inner.prompt(item.inner if isinstance(item, Tagged) else item)

    def reward(self, item, response):
        if isinstance(item, Tagged):
            if item.index % 20 in (0, 1):
                raise RuntimeError("injected fault")
            if item.index % 20 == 2:
                time.sleep(3600)
            item = item.inner
        return self.inner.reward(item, response)


def _rl_with_task(monkeypatch, factory):
    """`posttrain rl` builds its task with factory(cfg.task): the registry's `make` is replaced."""
    from posttrain import tasks
    from posttrain.recipes import rl

    monkeypatch.setattr(tasks, "make", factory)
    return rl


@pytest.mark.slow
def test_rl_run_with_faulty_verifier_completes_and_counts_match(sft_ckpt, tmp_path, monkeypatch):
    from posttrain.config import RLConfig, load_config

    from conftest import TINY_TASK

    rl = _rl_with_task(monkeypatch, lambda cfg: FaultInjecting(ArithmeticTask(cfg)))
    g = 2
    rl.run(
        load_config(
            RLConfig,
            None,
            [
                f"out={tmp_path}/rl",
                f"init={sft_ckpt}",
                "steps=2",
                "prompts_per_step=20",
                f"samples_per_prompt={g}",
                "max_new_tokens=24",
                "eval_problems=4",
                "eval_samples=2",
                "verifier_workers=2",
                "verifier_timeout_s=2.0",
                "threads=1",
                *TINY_TASK,
            ],
        )
    )
    steps = [json.loads(line) for line in open(tmp_path / "rl" / "metrics.jsonl")]
    train = [m for m in steps if m["step"] > 0]
    assert [m["step"] for m in train] == [1, 2]
    for m in train:  # 40 calls a step: 4 raise, 2 hang
        assert (m["reward/errors"], m["reward/timeouts"]) == (2 * g, 1 * g)
        assert m["reward/workers_replaced"] == 1 * g
        assert m["reward/latency_p99_s"] >= 2.0 > m["reward/latency_p50_s"]


def test_rl_step_on_the_code_task_scores_in_the_sandbox_through_the_pool(sft_ckpt, tmp_path, monkeypatch):
    """The whole path: rollout -> pool worker -> sandboxed candidate -> reward, in an RL run."""
    from posttrain.config import RLConfig, load_config
    from posttrain.tasks.code import CodeConfig, CodeTask

    rl = _rl_with_task(monkeypatch, lambda cfg: CodeTask(CodeConfig(timeout_s=2.0)))
    before = set(sandbox.descendants(os.getpid()))  # helpers earlier tests started are not the run's
    rl.run(
        load_config(
            RLConfig,
            None,
            [
                f"out={tmp_path}/rl",
                f"init={sft_ckpt}",
                "steps=1",
                "prompts_per_step=2",
                "samples_per_prompt=2",
                "max_new_tokens=16",
                "eval_problems=2",
                "eval_samples=2",
                "verifier_workers=2",
                "threads=1",
            ],
        )
    )
    m = [json.loads(line) for line in open(tmp_path / "rl" / "metrics.jsonl")][-1]
    assert m["step"] == 1 and m["reward/errors"] == 0.0 and m["reward/timeouts"] == 0.0
    assert m["reward/total"] == 8.0 and 0.0 <= m["reward/mean"] <= 1.0  # 8 hidden tests per problem, all run
    gc.collect()  # the run's pool is garbage now:
    assert set(sandbox.descendants(os.getpid())) <= before  # its workers and sandboxes are gone


# ---- containment: workers die with the trainer, memory is capped, workers are recycled ----------------

_TRAINER = """
import sys, time
from posttrain.tasks.base import RewardResult
from posttrain.tasks.pool import VerifierPool

class Task:
    name = "t"
    def reward(self, item, response):
        return RewardResult(1.0)

pool = VerifierPool(Task(), workers=int(sys.argv[1]), timeout_s=5.0)
pool.score([(i, "x") for i in range(8)])
print(" ".join(str(w.proc.pid) for w in pool.workers), flush=True)
time.sleep(3600)
"""


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_workers_die_with_a_sigkilled_trainer(tmp_path, workers):
    """SIGKILL leaves no Python cleanup to run: only the kernel's parent-death signal stops them."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "trainer.py"
    script.write_text(_TRAINER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    trainer = subprocess.Popen([sys.executable, str(script), str(workers)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pids = [int(p) for p in trainer.stdout.readline().split()]
        assert len(pids) == workers and all(_alive(p) for p in pids)
    finally:
        trainer.kill()
        trainer.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if _alive(p)]
    for p in left:  # a failing run leaves nothing behind either
        os.kill(p, 9)
    assert left == []


class Leaky:
    """Every call keeps 100 MB of address space (a verifier that caches what it should not; an
    anonymous mapping, so it costs no RAM); the reward carries the worker's pid."""

    name = "leaky"

    def __init__(self):
        self.kept = []

    def reward(self, item, response):
        import mmap

        from posttrain.tasks.base import RewardResult

        self.kept.append(mmap.mmap(-1, 100 << 20))
        return RewardResult(1.0, {"pid": float(os.getpid())})


def test_memory_cap_fails_the_call_that_crosses_it_and_replaces_the_worker():
    with VerifierPool(Leaky(), workers=1, timeout_s=30.0, memory_mb=250) as pool:
        results, stats = pool.score([(i, "x") for i in range(5)])
    rewards = [r.reward for r in results]
    assert rewards == [1.0, 1.0, 0.0, 1.0, 1.0]  # 100, 200 MB fit; 300 MB does not
    assert results[2].error.startswith("OSError: [Errno 12] Cannot allocate memory")  # mmap's MemoryError
    assert (stats["errors"], stats["replaced"]) == (1, 1)
    pids = [r.components.get("pid") for r in results]
    assert pids[0] == pids[1] != pids[3] == pids[4]  # a fresh worker after the failure


def test_workers_are_recycled_after_max_calls():
    with VerifierPool(Leaky(), workers=1, timeout_s=30.0, max_calls=3) as pool:
        results, stats = pool.score([(i, "x") for i in range(7)])
        first = [w.proc.pid for w in pool.workers]
    pids = [r.components["pid"] for r in results]
    assert all(r.error is None for r in results)
    assert pids[0] == pids[1] == pids[2] != pids[3] == pids[4] == pids[5] != pids[6]
    assert stats["replaced"] == 2 and first != [int(pids[0])]


def test_pool_limits_come_from_the_verifier_config():
    from posttrain.config import RLConfig, load_config

    cfg = load_config(RLConfig, None, ["verifier.workers=1", "verifier.memory_mb=512", "verifier.max_calls=100"])
    pool = make_pool(
        ArithmeticTask(), cfg.verifier.workers, cfg.verifier.timeout_s, cfg.verifier.memory_mb, cfg.verifier.max_calls
    )
    try:
        assert (pool.memory_mb, pool.max_calls) == (512, 100)
    finally:
        pool.close()


def test_reward_values_are_checked_in_the_workers_as_in_process():
    """The one validation (tasks/base.validate_reward) runs in the workers too: 10**400, ±1e308,
    string and infinite components score 0 with the same reason; numpy and torch scalars pass."""
    from test_bad_inputs import BAD_VERIFIERS, GOOD_VERIFIERS, Garbage

    from posttrain.tasks.base import RewardResult, safe_reward

    items = [r for r, _ in BAD_VERIFIERS] + [RewardResult(v) for v, _ in GOOD_VERIFIERS]
    with VerifierPool(Garbage(), workers=2, timeout_s=10.0) as pool:
        results, stats = pool.score([(it, "x") for it in items])
    expected = [safe_reward(Garbage(), it, "x") for it in items]
    assert [(r.reward, r.error) for r in results] == [(r.reward, r.error) for r in expected]
    assert stats["errors"] == len(BAD_VERIFIERS) and stats["timeouts"] == 0
