"""The profiling and before/after benchmarks' arithmetic (posttrain/bench/__init__.py op_seconds,
benchmarks/train_profile.py, benchmarks/before_after.py table). Nothing here asserts a speed."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from posttrain.bench import best_of, finish, load_script, op_seconds, run_header

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _own_sys_path(monkeypatch):
    """The scripts put the repo root on sys.path; give it back as it was after each test."""
    monkeypatch.setattr(sys, "path", list(sys.path))


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_op_seconds_puts_each_op_in_its_group_and_the_rest_in_python():
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            (a @ b).relu_()
    spent = op_seconds(prof, {"matmul": ("aten::mm",)}, wall=10.0)
    mm = sum(ev.self_cpu_time_total for ev in prof.key_averages() if ev.key == "aten::mm") / 1e6
    assert spent["matmul"] == mm > 0
    assert spent["other_ops"] > 0  # relu_ is in no group
    assert abs(sum(spent.values()) - 10.0) < 1e-9  # python = the wall time not inside any op
    assert op_seconds(prof, {}, wall=0.0)["python"] == 0.0  # never negative


def test_run_header_and_finish_record_the_load_and_write_atomically(tmp_path):
    r = run_header("x", 2, preset="nano")
    assert list(r)[:2] == ["bench", "preset"] and r["threads"] == 2 and len(r["load_avg_before"]) == 3
    out = tmp_path / "r.json"
    finish(r, out, load_key="load_after")
    assert json.loads(out.read_text())["load_after"] == list(r["load_after"])
    assert not (tmp_path / "r.json.tmp").exists()


def test_train_profile_measures_the_rl_stage_shape():
    tp = _load("train_profile")
    step, params, real = tp.setup()
    m = step()
    assert params == 806_528  # nano on the character vocabulary
    assert real == 5_348 and m["train/padded_tokens"] == 5_932  # benchmarks/results/train_profile.json
    assert m["train/padded_tokens"] >= real


def test_before_after_table_reads_the_committed_result():
    ba = _load("before_after")
    result = json.loads((ROOT / "benchmarks" / "results" / "before_after.json").read_text())
    lines = ba.table(result).splitlines()
    r64 = {
        s: next(r for r in result["runs"]["rollout"][s]["result"]["rows"] if r["batch"] == 64)
        for s in result["runs"]["rollout"]
    }
    row = next(x for x in lines if x.strip().startswith("64:"))
    assert f"{r64['before']['ratio']:.2f}x" in row and f"{r64['after']['ratio']:.2f}x" in row
    assert f"ours {r64['after']['ours_tokens_per_s'] / r64['before']['ours_tokens_per_s']:.2f}x" in row
    trl = next(x for x in lines if x.strip().startswith("64x16:"))
    assert f"{result['runs']['trl']['after']['result']['shapes']['64x16']['speedup']:.2f}x" in trl
    whole = {s: result["runs"]["pipeline"][s]["wall_s"] for s in ("before", "after")}
    assert any(f"whole {whole['after']:.0f} s" in x for x in lines)
    assert any(f"whole {whole['before']:.0f} s" in x for x in lines)


def test_best_of_times_every_call_but_the_warm_up_and_keeps_the_shortest():
    calls = []
    assert best_of(lambda: calls.append(1), 3, warmup=True) >= 0.0
    assert len(calls) == 4  # one untimed, three timed
    assert best_of(lambda: calls.append(1), 2) >= 0.0 and len(calls) == 6


def test_load_script_imports_a_benchmark_once_by_path():
    a = load_script(ROOT / "benchmarks" / "ab_refs.py", "posttrain_test_ab_refs")
    assert load_script(ROOT / "benchmarks" / "nowhere.py", "posttrain_test_ab_refs") is a  # cached by name
    assert callable(a.rl_batch) and sys.modules.pop("posttrain_test_ab_refs") is a
