"""benchmarks/gpu_part2.py, the one prepared GPU run of issue 33: its parts' command lines and its
acceptance arithmetic, on hand-made inputs (no subprocess, no training). Its plumbing end to end is
`python benchmarks/gpu_part2.py --tiny --device cpu`; nothing here asserts a speed."""

import argparse
from pathlib import Path

import pytest

from posttrain.bench import load_script

ROOT = Path(__file__).resolve().parents[1]
G2 = load_script(ROOT / "benchmarks" / "gpu_part2.py", "posttrain_bench_gpu_part2")


def _cmd(name, tiny=False):
    cmd = G2.bench_cmd(name, argparse.Namespace(tiny=tiny, device="cuda"), Path("/o/x.json"))
    assert cmd[1:5] == ["-m", "posttrain.cli", "bench", "step"] and cmd[-2:] == ["--out", "/o/x.json"]
    args = cmd[5:-2]
    flags = {f: args[i + 1] for i, f in enumerate(args) if f.startswith("--") and i + 1 < len(args)}
    flags = {f: v for f, v in flags.items() if not v.startswith("--") or v == ""}
    return set(args), flags


def _values(flags, *names):
    return [flags[f"--{n}"] for n in names]


def test_the_parts_run_bench_step_with_their_features():
    for name in ("before", "after", "async", "no_compile", "no_packing", "varlen"):
        words, flags = _cmd(name)
        assert _values(flags, "shape", "prompts", "samples", "new-tokens") == ["qwen2.5-0.5b", "32", "8", "256"]
        assert "--length-spread" in words and flags["--device"] == "cuda"
    words, flags = _cmd("before")  # every issue 33 feature off; the engine alone at 64 and 256 rows
    assert "--packing" not in words and {"--no-graphs", "--no-generate"} <= words
    assert _values(flags, "compile", "attention", "steps", "rows") == ["false", "dense", "3", "64,256"]
    words, flags = _cmd("after")  # every feature on; generate beside the rollout
    assert {"--packing", "--graphs"} <= words and not {"--no-generate", "--async"} & words
    assert _values(flags, "compile", "attention", "steps", "rows") == ["true", "auto", "4", "64,256"]
    words, flags = _cmd("async")
    assert {"--packing", "--graphs", "--async"} <= words and (flags["--compile"], flags["--rows"]) == ("true", "")
    words, flags = _cmd("no_compile")  # one feature off at a time
    assert {"--packing", "--graphs"} <= words and flags["--compile"] == "false"
    words, flags = _cmd("no_packing")
    assert "--packing" not in words and "--graphs" in words and flags["--compile"] == "true"
    words, flags = _cmd("varlen")  # the after step, its packed rows through varlen attention
    after_words, after_flags = _cmd("after")
    assert words == after_words - {"auto", "64,256"} | {"varlen", ""}
    assert flags == after_flags | {"--attention": "varlen", "--rows": ""}
    assert G2.PARTS.index("varlen") > max(G2.PARTS.index(p) for p in ("before", "after", "gpu_tests"))
    words, flags = _cmd("after", tiny=True)
    assert _values(flags, "shape", "new-tokens", "rows", "threads") == ["tiny-qwen2", "12", "2,4", "1"]


def test_the_gpu_tests_are_the_files_that_exist(tmp_path):
    cmd, missing = G2.tests_cmd()
    assert cmd[1:7] == ["-m", "pytest", "-q", "-m", "gpu", "-p"] and missing == []
    assert [c for c in cmd if c.startswith("tests/")] == [f"tests/{n}.py" for n in G2.GPU_TESTS]
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_gpu.py").write_text("")
    cmd, missing = G2.tests_cmd(tmp_path)
    assert [c for c in cmd if c.startswith("tests/")] == ["tests/test_gpu.py"] and "test_packing" in missing


def _part(step, rollout, reference, train, **kw):
    split = {"time/rollout_s": rollout, "time/reference_s": reference, "time/train_s": train, "time/reward_s": 0.1}
    return {"step_s": step, "split_s": split, **kw}


def test_acceptance_by_hand():
    before = _part(10.0, 5.0, 2.0, 3.0, fraction={"step": 0.05}, computed_over_real=1.4, mismatch_logprob_abs=0.005)
    before["rollout_vs_generate"] = {
        "rows": [{"rows": 64, "engine_tokens_per_s": 2500}, {"rows": 256, "engine_tokens_per_s": 15000}]
    }
    before["memory"] = {"peak_allocated_gib": 50.0, "peak_reserved_gib": 70.0}
    before["timed"] = {"length/mean": 110.0, "length/truncated_frac": 0.14}
    after = _part(2.0, 1.0, 0.5, 0.5, fraction={"step": 0.3}, computed_over_real=1.05, mismatch_logprob_abs=0.004)
    rows = [
        {"rows": 64, "engine_tokens_per_s": 20000, "ratio": 30.0},
        {"rows": 256, "engine_tokens_per_s": 64000, "ratio": 12.0},
    ]
    after["rollout_vs_generate"] = {"rows": rows}
    res = {"before": before, "after": after, "gpu_tests": {"counts": {"passed": 12, "skipped": 1}}}
    res |= {"async": {"step_s": 1.6}, "no_compile": {"step_s": 3.0}, "no_packing": {"step_s": 2.5}}
    res["varlen"] = _part(1.8, 1.0, 0.4, 0.35)
    acc = G2.acceptance(res)
    assert acc["step_s"] == {"before": 10.0, "after": 2.0} and acc["step_goal_met"] is True
    assert acc["speedup"] == pytest.approx({"step": 5.0, "rollout": 5.0, "reference": 4.0, "train": 6.0})
    assert acc["split_s"]["after"] == {"rollout": 1.0, "reference": 0.5, "train": 0.5}
    assert acc["rollout_rows"] == 256 and acc["rollout_goal_met"] is True
    assert acc["rollout_tokens_per_s"] == {64: {"before": 2500, "after": 20000}, 256: {"before": 15000, "after": 64000}}
    assert acc["generate_ratio"] == 12.0 and acc["generate_goal_met"] is True
    assert acc["floor_fraction"] == {"before": 0.05, "after": 0.3}
    assert acc["computed_over_real"] == {"before": 1.4, "after": 1.05}
    assert acc["peak_gib"]["before"] == {"peak_allocated_gib": 50.0, "peak_reserved_gib": 70.0}
    assert acc["lengths"]["before"] == {"length/mean": 110.0, "length/truncated_frac": 0.14}
    assert acc["mismatch_logprob_abs"] == {"before": 0.005, "after": 0.004}
    assert acc["gpu_tests_all_passed"] is True
    assert acc["async_speedup_over_after"] == pytest.approx(1.25)
    assert acc["toggle_over_after"] == pytest.approx({"no_compile": 1.5, "no_packing": 1.25})
    assert acc["varlen_over_after"] == pytest.approx(0.9)  # varlen's step 1.8 s against flex's 2.0
    assert acc["varlen_split_s"] == {
        "after": {"reference": 0.5, "train": 0.5},
        "varlen": {"reference": 0.4, "train": 0.35},
    }
    # short of the goals: a slower step and rollout, a failed test; missing parts read None, not a guess
    after.update(step_s=3.0)
    rows[1].update(engine_tokens_per_s=59_000, ratio=9.5)
    res["gpu_tests"] = {"counts": {"passed": 11, "failed": 1}}
    acc = G2.acceptance(res)
    assert (acc["step_goal_met"], acc["rollout_goal_met"], acc["generate_goal_met"]) == (False, False, False)
    assert acc["gpu_tests_all_passed"] is False and acc["speedup"]["step"] == pytest.approx(10 / 3)
    acc = G2.acceptance({"before": before, "after": {"skipped": "budget"}})
    assert acc["step_goal_met"] is None and acc["speedup"] == dict.fromkeys(("step", "rollout", "reference", "train"))
    assert (
        acc["rollout_rows"] is None and acc["gpu_tests_all_passed"] is None and acc["async_speedup_over_after"] is None
    )
    assert acc["rollout_tokens_per_s"][256] == {"before": 15000, "after": None}
    assert acc["varlen_over_after"] is None and acc["varlen_split_s"]["varlen"] == {"reference": None, "train": None}


def test_timeouts_cover_the_estimates_within_the_budget():
    assert set(G2.ESTIMATE_S) == set(G2.TIMEOUTS) == set(G2.PARTS)
    assert all(G2.TIMEOUTS[p] >= 1.2 * G2.ESTIMATE_S[p] for p in G2.PARTS)
    # the three parts that matter most fit the default budget on the estimates
    assert sum(G2.ESTIMATE_S[p] for p in ("before", "after", "gpu_tests")) <= 420
