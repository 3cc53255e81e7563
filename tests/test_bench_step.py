"""posttrain bench step (posttrain/bench/step.py, floor.py, hf_shapes.py): the named shapes'
parameter counts and family features, the step floor by hand, bad input, and a tiny run on CPU
whose JSON is checked for its structure and arithmetic. Nothing here asserts a speed."""

import json
import subprocess
import sys

import pytest
import torch

from posttrain import UsageError
from posttrain.bench.floor import step_floor
from posttrain.bench.hf_shapes import SHAPES, hf_config, spread_stops
from posttrain.bench.step import main
from posttrain.eval import evaluate
from posttrain.sizing.shapes import count_params, resolve_model


def _meta_params(name, arch):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):  # the real shapes, counted without allocating
        m = AutoModelForCausalLM.from_config(hf_config(SHAPES[name], arch))
    return m, sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize(
    "name, arch, params, cls",
    [
        # the model cards: Qwen2.5-0.5B 0.49B, Qwen3-0.6B 0.6B (0.44B without the embedding), Llama-3.2-1B 1.24B
        ("qwen2.5-0.5b", "native", 494_032_768, "Qwen2ForCausalLM"),
        ("qwen2.5-0.5b", "llama", 494_005_120, "LlamaForCausalLM"),  # − the q/k/v biases: 24 × (896 + 2·128)
        ("qwen3-0.6b", "native", 596_049_920, "Qwen3ForCausalLM"),
        ("qwen3-0.6b", "llama", 596_042_752, "LlamaForCausalLM"),  # − the q/k norms: 28 × 2 × 128
        ("llama-3.2-1b", "native", 1_235_814_400, "LlamaForCausalLM"),
    ],
)
def test_real_shapes_count_the_published_parameters(name, arch, params, cls):
    m, n = _meta_params(name, arch)
    assert (type(m).__name__, n) == (cls, params)
    if arch == "native" and name != "qwen3-0.6b":  # sizing's formula has no q/k norms (7,168 params)
        assert n == count_params(SHAPES[name].dims)
    if arch == "native" and name == "qwen2.5-0.5b":
        assert SHAPES[name].dims == resolve_model("qwen2.5-0.5b")  # sizing's preset, not a copy
        assert m.model.layers[0].self_attn.q_proj.bias is not None
    if arch == "native" and name == "qwen3-0.6b":
        assert m.model.layers[0].self_attn.q_proj.out_features == 16 * 128  # head_dim 128, not 1024 / 16
        assert hasattr(m.model.layers[0].self_attn, "q_norm")
    if name == "llama-3.2-1b":
        assert m.config.rope_parameters["rope_type"] == "llama3" and m.config.rope_parameters["factor"] == 32.0
    assert m.config.tie_word_embeddings


def test_step_floor_by_hand():
    m = {
        "rollout/prompt_tokens": 6,
        "rollout/generated_tokens": 4,
        "rollout/prefill_tokens": 3,  # a group's prompt once
        "rollout/decode_steps": 2,
        "rollout/kv_positions": 11,
        "train/tokens": 10,
        "train/optimizer_steps": 1.0,
        "time/step_s": 2136.0,
        "time/rollout_s": 536.0,
        "time/reference_s": 400.0,
        "time/train_s": 600.0,
    }
    # peaks of 1 FLOP/s and 1 B/s: seconds = FLOP and bytes
    f = step_floor(10, m, weight_bytes=2, kv_bytes=8, peak_tflops=1e-12, peak_gbs=1e-9)
    assert f["flop"] == {"train": 600, "reference": 200, "prefill": 60, "decode": 80, "total": 940}
    assert f["bytes"] == {"decode_weights": 2 * 10 * 2, "decode_kv": 11 * 8, "total": 128}
    assert f["floor_s"] == pytest.approx(
        {"flop": 940, "bytes": 128, "rollout": 60 + 80 + 128, "reference": 200, "train": 600, "step": 1068}
    )
    assert f["fraction"] == pytest.approx(
        {"step": 0.5, "flop": 940 / 2136, "bytes": 128 / 2136, "rollout": 0.5, "reference": 0.5, "train": 1.0}
    )
    # no reference in the step: nothing scored, no fraction; two optimizer passes train twice
    del m["time/reference_s"]
    f = step_floor(10, {**m, "train/optimizer_steps": 2.0}, 2, 8, 1e-12, 1e-9)
    assert f["tokens"]["reference"] == 0 and f["fraction"]["reference"] is None
    assert f["flop"]["train"] == 1200


def test_spread_stops_by_hand():
    s = spread_stops(151_936, 256, seed=0)
    assert s["count"] == 1187 == len(set(s["ids"])) and s["ids"] == sorted(s["ids"])  # round(2 · 151,936 / 256)
    assert 2 <= s["ids"][0] and s["ids"][-1] < 151_936  # never <pad> (0) nor <eos> (1)
    p = 1187 / 151_936
    assert s["p_stop"] == p and s["expected_truncated_frac"] == pytest.approx((1 - p) ** 256)
    assert s["expected_mean_tokens"] == pytest.approx(sum((1 - p) ** k for k in range(256)))  # E[min(L, 256)]
    assert 0.42 < s["expected_mean_tokens"] / 256 < 0.44 and 0.13 < s["expected_truncated_frac"] < 0.14
    assert spread_stops(151_936, 256, seed=0) == s and spread_stops(151_936, 256, seed=1)["ids"] != s["ids"]
    assert spread_stops(512, 1)["count"] == 510  # every id past <pad> and <eos>, at most


def test_no_heldout_problems_means_no_evaluation(nano, tok):
    from posttrain.tasks.arithmetic import ArithmeticTask

    assert evaluate(nano, tok, ArithmeticTask(), [], n=2) == {"per_k": {}}


@pytest.mark.parametrize(
    "argv, names",
    [
        (["--shape", "qwen9-1b"], "--shape 'qwen9-1b' is unknown"),
        (["--shape", "tiny-qwen2", "--arch", "gpt2"], "--arch 'gpt2' is unknown"),
        (["--shape", "tiny-qwen2", "--prompts", "0"], "--prompts must be at least 1"),
        (["--shape", "tiny-qwen2", "--device", "tpu"], "device='tpu' is not a device"),
        (["--shape", "tiny-qwen2", "--compile", "yes"], "--compile 'yes' is unknown; use false, true or auto"),
        (["--shape", "tiny-qwen2", "--attention", "sparse"], "--attention 'sparse' is unknown"),
    ],
)
def test_bad_input_is_one_line(argv, names):
    with pytest.raises(UsageError, match=names):
        main([*argv, "--threads", "1"])


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_cuda_without_a_gpu_exits_2_before_any_work(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "bench", "step", "--device", "cuda", "--out", str(tmp_path / "x.json")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "no CUDA GPU" in r.stderr
    assert not (tmp_path / "x.json").exists()


def _tiny(tmp_path, shape, arch, rows, device="cpu", extra=()):
    out = tmp_path / f"{shape}-{arch}.json"
    argv = ["--shape", shape, "--arch", arch, "--prompts", "2", "--samples", "4", "--new-tokens", "12"]
    argv += ["--steps", "2", "--rows", rows, "--prompt-len", "16", "--device", device, "--threads", "1"]
    result = main([*argv, *extra, "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))  # what was returned was written
    return result


def _check_arithmetic(r):
    model, g, f, peak = r["model"], r["grpo"], r["floor"], r["peak"]
    N, t = model["params"], g["timed"]
    # the timed mean is that of the steps after the warm-up
    assert [s["step"] for s in g["steps"]] == [1, 2] and g["timed_steps"] == [2]
    assert t["time/step_s"] == g["steps"][1]["time/step_s"]
    # the trainer trains every real token the engine produced: prompts (counted per sample) + responses
    assert t["train/tokens"] == t["rollout/prompt_tokens"] + t["rollout/generated_tokens"]
    assert t["rollout/samples"] == 8 and t["rollout/generated_tokens"] <= 8 * 12
    assert t["rollout/prefill_tokens"] * 4 == t["rollout/prompt_tokens"]  # each prompt prefilled once for 4 samples
    # the floor from counted params and tokens
    assert f["flop"]["train"] == 6 * N * t["train/tokens"]
    assert f["flop"]["reference"] == 2 * N * t["train/tokens"]  # GRPO's default has a reference
    assert f["flop"]["prefill"] == 2 * N * t["rollout/prefill_tokens"]
    assert f["flop"]["decode"] == 2 * N * t["rollout/generated_tokens"]
    assert f["bytes"]["decode_weights"] == t["rollout/decode_steps"] * N * model["weight_bytes"]
    assert f["bytes"]["decode_kv"] == t["rollout/kv_positions"] * model["kv_bytes"]
    step = f["flop"]["total"] / (peak["tflops"] * 1e12) + f["bytes"]["total"] / (peak["gbs"] * 1e9)
    assert f["floor_s"]["step"] == pytest.approx(step)
    assert f["fraction"]["step"] == pytest.approx(step / t["time/step_s"])
    assert f["fraction"]["train"] == pytest.approx(f["flop"]["train"] / (peak["tflops"] * 1e12) / t["time/train_s"])
    assert 0 < f["fraction"]["step"] < 1
    through = g["throughput"]
    assert through["samples_per_s"] == pytest.approx(8 / t["time/step_s"])
    assert through["train_tokens_per_s"] == pytest.approx(t["train/tokens"] / t["time/train_s"])
    assert g["computed_over_real"] == t["train/padded_tokens"] / t["train/tokens"] >= 1


@pytest.mark.slow
def test_tiny_qwen2_on_cpu_json(tmp_path):
    r = _tiny(tmp_path, "tiny-qwen2", "native", "2,4")
    assert (r["bench"], r["shape"], r["device"], r["compute_dtype"]) == ("step", "tiny-qwen2", "cpu", "float32")
    # 2 layers × (K, V) × 2 KV heads × head_dim 16 × 4 B (fp32 on CPU)
    assert r["model"] == {
        "class": "Qwen2ForCausalLM",
        "hidden": 64,
        "layers": 2,
        "heads": 4,
        "kv_heads": 2,
        "head_dim": 16,
        "intermediate": 128,
        "vocab": 512,
        "tied": True,
        "params": 107_072,
        "weight_bytes": 4,
        "kv_bytes": 2 * 2 * 2 * 16 * 4,
    }
    assert r["peak"]["source"] == "measured" and r["peak"]["tflops"] == r["peak"]["measured"]["matmul_tflops"] > 0
    _check_arithmetic(r)
    mem = r["grpo"]["memory"]
    assert set(mem) == {"peak_rss_gib"} and 0.05 < mem["peak_rss_gib"] < 4
    # the run's own prediction (RUN_DIR/memory.json), the whole process's resident set on a CPU
    assert 0.5 < r["grpo"]["predicted_peak_gib"] / mem["peak_rss_gib"] < 2
    assert r["grpo"]["predicted_note"].startswith("sizing/run_memory.predict_run_peak (resident set")
    rows = r["rollout_vs_generate"]["rows"]
    assert [x["rows"] for x in rows] == [2, 4]
    for x in rows:
        assert x["tokens"] == x["rows"] * 12
        assert x["engine_tokens_per_s"] == pytest.approx(x["tokens"] / x["engine_s"])
        assert x["ratio"] == pytest.approx(x["engine_tokens_per_s"] / x["hf_tokens_per_s"])
        assert x["engine_flop_frac"] == pytest.approx(
            2 * 107_072 * x["tokens"] / x["engine_s"] / (r["peak"]["tflops"] * 1e12)
        )


@pytest.mark.slow
def test_tiny_qwen3_as_llama_with_given_peaks(tmp_path):
    out = tmp_path / "q3.json"
    argv = ["--shape", "tiny-qwen3", "--arch", "llama", "--prompts", "2", "--samples", "4", "--new-tokens", "12"]
    argv += ["--steps", "2", "--rows", "", "--prompt-len", "16", "--device", "cpu", "--threads", "1"]
    knobs = ["--packing", "--attention", "dense", "--compile", "false", "--no-graphs", "--length-spread"]
    r = main([*argv, *knobs, "--peak-tflops", "0.5", "--peak-gbs", "20", "--out", str(out)])
    assert r["model"]["class"] == "LlamaForCausalLM" and r["model"]["params"] == 131_392
    run, t = r["run"], r["grpo"]["timed"]
    knobs_run = [run[k] for k in ("packing", "attention", "compile", "graphs", "async", "generate")]
    assert knobs_run == [True, "dense", "false", False, False, True]
    assert run["length_spread"]["count"] == round(2 * 512 / 12) == 85  # tiny-qwen3's vocabulary is 512
    assert t["length/mean"] < 12 and t["length/truncated_frac"] < 1  # answers end before the cap
    assert r["model"]["head_dim"] == 32 and r["model"]["kv_bytes"] == 2 * 2 * 2 * 32 * 4  # Qwen3's wide heads kept
    assert (r["peak"]["tflops"], r["peak"]["gbs"], r["peak"]["source"]) == (0.5, 20, "given")
    _check_arithmetic(r)
    assert "rollout_vs_generate" not in r  # --rows '' skips it


def test_the_profile_groups_ops_by_the_controller_s_phases():
    """bench/profile.phase_table on a real torch.profiler trace: an op belongs to the phase range that
    encloses it (the controller's `posttrain/NAME`), ops are sorted by time and cut at `top`."""
    from posttrain.bench.profile import format_table, phase_table
    from posttrain.framework.controller import timed

    a, b = torch.randn(64, 64), torch.randn(64, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with timed({}, "train"):
            for _ in range(3):
                a @ b
            (a + b).relu()
        with timed({}, "reference"):
            a.sum()
        a * 2  # outside any phase
    t = phase_table(prof.events(), top=2)
    assert set(t) == {"train", "reference", "other"} and t["train"]["wall_ms"] > 0
    names = {p: [r["name"] for r in t[p]["ops"]] for p in t}
    assert "aten::mm" in names["train"] or "aten::matmul" in names["train"]
    assert "aten::sum" in names["reference"] and "aten::mul" in names["other"]
    assert len(t["train"]["ops"]) == 2 and t["train"]["op_calls"] >= 5  # top 2 of them kept
    ms = [r["self_cpu_ms"] for r in t["train"]["ops"]]
    assert ms == sorted(ms, reverse=True) and t["train"]["kernels"] == []  # no kernels on a CPU
    text = format_table({"step": 1, "sort_by": "self_cpu_ms", "phases": t})
    assert text.startswith("profile of step 1") and "  train " in text


@pytest.mark.slow
def test_profile_of_a_tiny_run(tmp_path):
    """--profile: one more step under torch.profiler, left out of the timed mean; its table by phase."""
    r = _tiny(tmp_path, "tiny-llama", "native", "", extra=["--profile", "--profile-top", "4"])
    g = r["grpo"]
    assert r["run"]["profile"] is True and [s["step"] for s in g["steps"]] == [1, 2] and g["timed_steps"] == [2]
    prof = g["profile"]
    assert prof["step"] == 3 and prof["sort_by"] == "self_cpu_ms" and prof["activities"] == ["CPU"]
    assert {"rollout", "reward", "collate", "reference", "algorithm", "train", "sync"} <= set(prof["phases"])
    for phase, p in prof["phases"].items():
        assert len(p["ops"]) <= 4 and p["kernels"] == [] and p["wall_ms"] >= 0, phase
    for phase in ("rollout", "collate", "reference", "algorithm", "train"):  # reward: Python; sync: colocated
        assert {"name", "calls", "self_cpu_ms", "self_device_ms"} == set(prof["phases"][phase]["ops"][0])
    assert prof["phases"]["train"]["op_calls"] > prof["phases"]["reference"]["op_calls"] > 0


@pytest.mark.slow
def test_steps_0_measures_the_rollout_only(tmp_path):
    argv = ["--shape", "tiny-llama", "--steps", "0", "--rows", "3", "--new-tokens", "5", "--prompt-len", "4"]
    r = main([*argv, "--device", "cpu", "--threads", "1"])
    assert "grpo" not in r and "floor" not in r
    (row,) = r["rollout_vs_generate"]["rows"]
    assert (row["rows"], row["tokens"], row["prompt_len"]) == (3, 15, 4)
    assert r["rollout_vs_generate"]["fast_decode"] in (True, False)  # llama3 rope: the slow path at 7de35f4
    assert 0 < r["rollout_vs_generate"]["memory"]["peak_rss_gib"] < 4


@pytest.mark.gpu
def test_tiny_on_cuda_reports_allocator_peaks_at_h100_defaults(tmp_path):
    r = _tiny(
        tmp_path,
        "tiny-llama",
        "native",
        "2",
        device="cuda",
        extra=["--packing", "--attention", "dense", "--length-spread"],
    )
    assert r["grpo"]["timed"]["rollout/graph_replays"] > 0  # in-window decode steps replayed (rollout.cuda_graphs)
    assert r["compute_dtype"] == "bfloat16" and r["model"]["weight_bytes"] == 2
    assert (r["peak"]["tflops"], r["peak"]["gbs"], r["peak"]["source"]) == (800.0, 3000.0, "default")
    mem = r["grpo"]["memory"]
    assert set(mem) == {"peak_allocated_gib", "peak_reserved_gib"}
    assert 0 < mem["peak_allocated_gib"] <= mem["peak_reserved_gib"]
    _check_arithmetic(r)


def test_gpu_script_reads_pytest_summaries():
    from pathlib import Path

    from posttrain.bench import load_script

    gpu = load_script(Path(__file__).parents[1] / "benchmarks" / "gpu_part1.py", "gpu_part1")
    text = (
        "....F..E\n"
        "FAILED tests/test_recipes.py::test_dpo - RuntimeError: Expected all tensors to be on the same device\n"
        "ERROR tests/test_report.py - posttrain.UsageError: the report needs plotly\n"
        "ERROR tests/test_sandbox.py::test_escape[fork]\n"
        "21 failed, 1708 passed, 51 skipped, 20 errors in 70.48s (0:01:10)\n"
    )
    s = gpu.pytest_summary(text)
    assert s["counts"] == {"failed": 21, "passed": 1708, "skipped": 51, "errors": 20}
    assert s["failed"] == [
        "tests/test_recipes.py::test_dpo - RuntimeError: Expected all tensors to be on the same device"
    ]
    assert s["errors"] == [
        "tests/test_report.py - posttrain.UsageError: the report needs plotly",
        "tests/test_sandbox.py::test_escape[fork]",
    ]
    assert gpu.pytest_summary("1 passed in 0.01s")["counts"] == {"passed": 1}
    acc = gpu.acceptance(
        {
            "bench_qwen2": {"step_s": 2.2, "memory": {"peak_allocated_gib": 19.0}},
            "bench_llama": {"step_s": 2.0, "memory": {"peak_allocated_gib": 21.0}},
        }
    )
    assert acc["qwen2_over_llama_step"] == pytest.approx(1.1) and acc["qwen2_within_10pct_of_llama"] is True
    assert acc["peak_le_20_gib"] == {"qwen2": True, "llama": False}
    assert acc["pipeline_finished"] is None and acc["quick_lane_failed_or_errors"] is None


def test_gpu_part3_acceptance_by_hand():
    """benchmarks/gpu_part3.py's acceptance on made-up part results: the rates are the trained tokens
    over the train and reference seconds, each goal a comparison, a missing part None."""
    from pathlib import Path

    from posttrain.bench import load_script

    g3 = load_script(Path(__file__).parents[1] / "benchmarks" / "gpu_part3.py", "gpu_part3")
    after = {
        "step_s": 2.4,
        "split_s": {"time/rollout_s": 1.0, "time/reference_s": 0.4, "time/train_s": 1.5},
        "timed": {"train/tokens": 48_000.0},
        "memory": {"peak_allocated_gib": 31.0, "peak_reserved_gib": 40.0},
        "mismatch_logprob_abs": 0.005,
        "micro_batches": 2.0,
    }
    a = g3.acceptance({"after": after, "gpu_tests": {"counts": {"passed": 50, "skipped": 3}}})
    assert a["after_s"] == {"step": 2.4, "rollout": 1.0, "reference": 0.4, "train": 1.5}
    assert a["train_tokens_per_s"] == 32_000 and a["train_goal_met"] is True
    assert a["reference_tokens_per_s"] == 120_000 and a["reference_goal_met"] is True
    assert a["step_goal_met"] is True and a["peak_goal_met"] is False and a["mismatch_unchanged"] is True
    assert a["gpu_tests_all_passed"] is True and a["varlen_step_s"] is None and a["micro_batches"] == 2.0
    assert g3.acceptance({})["step_goal_met"] is None
    assert g3.BEFORE["features_off"]["step"] == 10.89  # the H200 at 27cdacc, issue 43's table
    cmd = g3.bench_cmd("after", type("A", (), {"tiny": False, "device": "cuda"})(), Path("x.json"))
    assert cmd[cmd.index("--shape") + 1] == "qwen2.5-0.5b" and "--profile" in cmd and "--length-spread" in cmd
