"""The systems lessons' widgets produce the numbers of SEED_SPEC Part C (rows marked F or W): topology,
KV cache, the scheduler, memory, the throughput equation, the planner, stragglers, kernels and the
budget (the algorithm rows are in test_lessons_rows.py)."""

from __future__ import annotations

import pytest

from lessons_util import kpis


def test_rows_49_77_78_topology():
    """Row 49 (the lesson-19 timeline's defaults) and row 78 (lesson 22c's tries, R20/T8/S3). The
    course's rows put the split on a second pool and overlap an on-policy split (colo 31 s,
    disaggregated 23 s, async 20 s with the sync hidden); the widgets now compare on the same GPUs
    and say what each equation assumes (the 2026-11-28 review's #2–#4). Row 77's modelled clip
    fraction 1 − e^(−Δ/20) is replaced by clip fractions measured in recorded runs (test_lesson_widgets)."""
    k = kpis("topology", R=20, T=15, S=2, par=1.0)
    assert [k[f"{n} step"].split(" (")[0] for n in ("colocated", "disaggregated", "one_step_off", "async")] == [
        "19.5 s",  # 20/2 + 15/2 + 2 on the same 2N GPUs
        "37 s",  # on-policy: the pools take turns
        "22 s",
        "22 s",  # max(20 + 2, 15): the sampler loads the weights
    ]
    assert k["async_double_buffered step"].startswith("20 s") and k["one step off / colocated"] == 0.89
    k = kpis("topology", R=20, T=15, S=2, par=0.0)  # a rollout bound by its tail: colocated keeps 20 s
    assert k["colocated step"].startswith("29.5 s") and k["one step off / colocated"] == 1.34
    k = kpis("topology", R=20, T=8, S=3, par=1.0)
    assert k["disaggregated step"].startswith("31 s") and k["one_step_off step"].startswith("23 s")
    assert k["async step"].startswith("23 s") and k["trainer pool idle (one step off)"] == f"{100 * 12 / 23:.0f}%"
    assert kpis("async_pipe", R=20, T=8, S=3, delta=0)["step time"] == "31 s"  # on-policy: 20 + 8 + 3
    assert kpis("async_pipe", R=20, T=8, S=3, delta=1)["step time"] == "23 s"  # one step off
    assert kpis("async_pipe", R=20, T=8, S=3, delta=2)["step time"] == "23 s"  # async, the load on the sampler
    assert kpis("async_pipe", R=20, T=8, S=3, delta=2)["step time, colocated on the same GPUs"] == "17 s"


def test_rows_51_53_kv_cache():
    """Row 53 in binary units: 7B GQA, B = 32, L = 2048 → 128 KiB/token, 8.0 GiB; the read time is
    the bytes at 3.35e12 B/s (8.59e9 / 3.35e12 = 2.56 ms; the course divided GiB by GB/s: 2.4)."""
    k = kpis("kv", model="7b", B=32, L=2048, gqa=True)
    assert (k["KV per token"], k["KV total"], k["weights"], k["time to read the KV once"]) == (
        "128 KiB",
        "8.0 GiB",
        "13.0 GiB",
        "2.6 ms",
    )
    assert k["free HBM after weights"] == f"{(80e9 - 14e9) / 2**30:.1f} GiB"
    assert k["bottleneck"] == "weight bandwidth dominates KV"
    k = kpis("kv", model="7b", B=32, L=2048, gqa=False)
    assert (k["KV per token"], k["KV total"], k["time to read the KV once"]) == ("512 KiB", "32.0 GiB", "10.3 ms")
    k = kpis("kv", model="70b", B=256, L=8192, gqa=True)
    assert k["KV total"] == "640.0 GiB" and k["bottleneck"].startswith("HBM capacity")
    assert k["H100s the KV alone needs"] == f"{640 * 2**30 / 80e9:.1f}"
    # posttrain's own cache: nano = 4 layers × 4 KV heads × 32 dims × K and V × 4 bytes
    assert k["posttrain's gpt_mini nano KV per token (fp32, measured)"] == f"{4 * 4 * 32 * 2 * 4} B"


def test_scheduler_runs_the_engine():
    """Rows 56–58 on posttrain's engine: refilling beats waiting; the K samples of a prompt share one
    prefill (K× fewer prompt tokens than each sample prefilling its own); speculative decoding pays
    more at T = 0 than at T = 1 (its acceptance rate, measured between two recorded models, falls)."""
    k = kpis("scheduler", slots=8, cbatch=True, share=True, chunked=False, spec=False, temperature=1.0)
    assert k["decode forwards (engine)"] < k["static batching would need"]
    naive = kpis("scheduler", slots=8, cbatch=True, share=False, chunked=False, spec=False, temperature=1.0)
    assert naive["prompt tokens prefilled"] == 4 * k["prompt tokens prefilled"]
    a0, a1 = (
        kpis("scheduler", spec=True, temperature=t)["draft acceptance α at this T (measured)"] for t in (0.0, 1.0)
    )
    assert 0 < a1 < a0 <= 1
    sp = lambda t: float(
        kpis("scheduler", spec=True, temperature=t)["speed-up over static batches without tricks"][:-1]
    )
    assert sp(0.0) > sp(1.0)
    chunk = kpis("scheduler", chunked=True)["longest decode stall (tokens in one prefill forward)"]
    assert chunk == 16 < k["longest decode stall (tokens in one prefill forward)"]


def test_rows_59_to_64_memory_envelope():
    """Row 64 in GiB: the course's 32.9 GB / 2.3 GB / 153.2 GB are 30.7 / 2.1 / 142.7 GiB."""
    k = kpis("memory", P=7, L=8192, B=4, G=8, ckpt=True)
    assert (k["per-GPU training"], k["per-GPU inference"], k["KV per token"], k["fits on H100s?"]) == (
        f"{32.93e9 / 2**30:.1f} GiB",
        "2.1 GiB",
        "128 KiB",
        "yes",
    )
    assert k["training state, whole model (18 B/param)"] == f"{126e9 / 2**30:.2f} GiB"
    assert kpis("memory", P=7, L=8192, B=4, G=8, ckpt=False)["per-GPU training"] == f"{153.2e9 / 2**30:.1f} GiB"
    k = kpis("memory", P=70, L=8192, B=4, G=16, ckpt=True)
    assert k["per-GPU training"] == f"{153.9e9 / 2**30:.1f} GiB" and k["fits on H100s?"] == "no"
    assert k["training state, whole model (18 B/param)"] == f"{1.26e12 / 2**40:.2f} TiB"


def test_rows_68_69_throughput_equation():
    k = kpis("throughput", P=7, K=16, L=1024, topo="1off")  # the course's "disaggregated": one step off
    assert [k[f"τ_{n}"] for n in ("rollout", "train", "reference", "reward", "sync")] == [
        "10.1 s",
        "2.1 s",
        "0.7 s",
        "1.0 s",
        "1.3 s",
    ]
    assert (k["τ_step"], k["useful tokens/s"], k["rollout share of the step"]) == ("12.4 s", "84.7k", "81%")
    assert k["the text's worked example (30/1/3/8/1 s)"] == "32 s, trainer idle 20 s, 32.8k tok/s"
    assert kpis("throughput", P=7, K=16, L=8192, topo="1off")["rollout share of the step"] == "98%"
    # colocated on the same 8 GPUs halves the rollout, reference and training bars
    colo = kpis("throughput", P=7, K=16, L=1024, topo="colo")
    assert (colo["τ_rollout"], colo["τ_train"]) == ("5.0 s", "1.0 s")  # 10.08 / 2, 2.10 / 2
    assert float(colo["useful tokens/s"][:-1]) / 84.7 - 1 == pytest.approx(0.42, abs=0.01)
    assert k["colocated on the same 8 GPUs / this placement"] == round(12.38 / 8.74, 2)
    assert kpis("throughput", P=7, K=16, L=1024, topo="disagg")["τ_step"] == "15.2 s"  # on-policy: the sum
    assert kpis("throughput", P=70, K=16, L=1024, topo="async")["τ_sync"] == "35.0 s"


def test_planner_widget_is_the_memory_planner():
    from posttrain.sizing import memory

    k = kpis("planner", model="llama-70b", algo="ppo", gpus=8, lora=0, ckpt=False)
    p = memory.plan("llama-70b", algo="ppo", gpus=8)
    assert k["peak per GPU"] == f"{p['peak_bytes'] / 2**30:.1f} GiB" and k["fits on H100?"] == "no"
    assert "LoRA" in k["cheapest change that fits"]
    assert kpis("planner", model="llama3-8b", algo="grpo", gpus=8, lora=0, ckpt=False)["fits on H100?"] == "yes"


def test_rows_71_72_73_stragglers():
    # row 71's √(2 ln K) envelope (4: 2.83, 16: 5.02, 64: 7.80 at c = 1) replaced by the exact expectation
    table = {4: (1.54, 1.99, 2.54), 16: (2.13, 3.44, 5.49), 64: (2.77, 5.37, 10.54)}
    for K, row in table.items():
        for cv, want in zip((0.5, 1.0, 2.0), row):
            assert (
                kpis("stragglers", K=K, mu=800, cv=cv, cap=False, dynk=False, rule="fixed")["expected max-of-K (× μ)"]
                == want
            )
    base = {"K": 16, "mu": 800, "cv": 1.0, "dynk": False, "rule": "course"}
    k = kpis("stragglers", cap=False, **base)
    assert (k["τ_R = longest response"], k["mean response"], k["straggler tax max/mean − 1"]) == (
        "4015 tok",
        "994 tok",
        "304%",
    )
    assert kpis("stragglers", cap=True, **base)["τ_R = longest response"] == "4015 tok"  # the course's no-op cap
    k = kpis("stragglers", K=16, mu=800, cv=1.0, cap=True, dynk=True, rule="course")
    assert (k["τ_R = longest response"], k["straggler tax max/mean − 1"], k["decode saved"]) == (
        "2409 tok",
        "242%",
        "29%",
    )
    assert (
        kpis("stragglers", K=16, mu=800, cv=2.0, cap=False, dynk=False, rule="course")["straggler tax max/mean − 1"]
        == "818%"
    )
    fixed = kpis("stragglers", K=16, mu=800, cv=1.0, cap=True, dynk=False, rule="fixed")  # decision: the cap bites
    assert int(fixed["τ_R = longest response"].split()[0]) < 4015


def test_rows_85_86_87_kernels():
    """Row 86 in binary units: 32,768 × 131,072 × 2 B = 8.6 GB = 8.0 GiB; a 1k chunk = 64 MiB."""
    k = kpis("kernels", K=16, gp=0.1, tokens=32768, vocab=131072, chunk=1024)
    assert (k["course's prompt-token ratio K/(1 + K·G/P)"], k["full logits"], k["logits held at once"]) == (
        "6.15×",
        "8.0 GiB",
        "64 MiB",
    )
    assert k["all tokens computed, unshared / shared"] == f"{16 * 1.1 / 2.6:.2f}×"  # 6.77×
    # the course's 42 ms counts the read only; the cast also writes 70 GB of FP8
    assert k["bf16→fp8 cast of 140 GB at 3.35 TB/s (read + write)"] == f"{210 / 3.35:.0f} ms" == "63 ms"
    assert (
        kpis("kernels", K=64, gp=0.1, tokens=32768, vocab=131072, chunk=4096)[
            "course's prompt-token ratio K/(1 + K·G/P)"
        ]
        == "8.65×"
    )
    assert kpis("kernels", K=16, gp=0.1, tokens=32768, vocab=131072, chunk=4096)["chunking saves"] == "32×"


def test_row_95_budget():
    k = kpis(
        "budget", prefix=True, cbatch=True, spec=False, fp8=False, train_opts=True, sync="every step", refpool=False
    )
    assert (k["optimised step"], k["speed-up"], k["largest remaining slice"]) == ("43.9 s", "2.28×", "rollout 33%")
    assert (
        kpis(
            "budget",
            prefix=True,
            cbatch=False,
            spec=False,
            fp8=False,
            train_opts=False,
            sync="every step",
            refpool=False,
        )["speed-up"]
        == "1.56×"
    )
    assert (
        kpis(
            "budget",
            prefix=False,
            cbatch=False,
            spec=False,
            fp8=False,
            train_opts=True,
            sync="every step",
            refpool=False,
        )["speed-up"]
        == "1.12×"
    )
    k = kpis("budget", prefix=True, cbatch=True, spec=True, fp8=True, train_opts=True, sync="overlapped", refpool=True)
    assert (k["optimised step"], k["speed-up"], k["largest remaining slice"]) == ("21.6 s", "4.63×", "train 44%")
