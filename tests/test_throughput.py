"""Throughput equation (lessons 19, 22, 22a, 22b, 22c, 28): SEED_SPEC Part C rows, by hand."""

import math

import numpy as np
import pytest

from posttrain import UsageError
from posttrain.sizing.throughput import (
    ASSUMES,
    EQUATIONS,
    TOPOLOGIES,
    compare_topologies,
    decode_tokens_per_s,
    from_metrics,
    max_of_k,
    max_of_k_envelope,
    role_model,
    step_time,
    train_time_s,
    train_tokens_per_s,
    useful_tokens_per_s,
)


def test_each_topology_by_hand():
    t = dict(rollout_s=20, reward_s=2, reference_s=3, train_s=10, sync_s=4)
    r = {topo: step_time(**t, topology=topo) for topo in TOPOLOGIES}
    assert r["colocated"]["step_s"] == 20 + 2 + 3 + 10 + 4 == 39
    assert r["disaggregated"]["step_s"] == 39  # on-policy: the pools take turns, nothing overlaps
    assert r["disaggregated"]["idle_s"] == {"rollout": 13, "trainer": 22}
    assert r["one_step_off"]["step_s"] == max(22, 13) + 4 == 26
    assert r["one_step_off"]["idle_s"] == {"rollout": 0, "trainer": 22 - 13}
    assert r["async"]["step_s"] == max(22 + 4, 13) == 26  # the sampler pays the load (async_rollout._produce)
    assert r["async_double_buffered"]["step_s"] == max(22, 13, 4) == 22
    assert r["colocated"]["bottleneck"] == "rollout" and r["colocated"]["shares"]["train"] == 10 / 39
    assert all(r[k]["equation"] == EQUATIONS[k] and r[k]["assumes"] == ASSUMES[k] for k in TOPOLOGIES)
    assert "stale" in ASSUMES["one_step_off"] and ASSUMES["disaggregated"].startswith("on-policy")
    # the trainer side bounds it when training is slower: the largest term there is named
    slow = step_time(rollout_s=5, train_s=12, reference_s=4, sync_s=1, topology="one_step_off")
    assert slow["step_s"] == 17 and slow["bottleneck"] == "train" and slow["idle_s"]["rollout"] == 11
    assert step_time(rollout_s=1, train_s=1, sync_s=9, topology="async_double_buffered")["bottleneck"] == "sync"
    assert step_time(rollout_s=1, train_s=1, sync_s=9, topology="async")["bottleneck"] == "sync"


def test_topologies_on_the_same_gpus_the_reviews_cases():
    """The 2026-11-28 review's hand-worked cases: per-role times on N + N GPUs, colocated on 2N."""
    r = compare_topologies(rollout_s=20, train_s=15, sync_s=2)  # lesson 19's step
    assert r["colocated"]["step_s"] == 20 / 2 + 15 / 2 + 2 == 19.5 and r["one_step_off"]["step_s"] == 22
    assert r["disaggregated"]["step_s"] == 37 and round(r["one_step_off"]["speedup_vs_colocated"], 2) == 0.89
    r = compare_topologies(rollout_s=20, train_s=8, sync_s=3)  # lesson 22c's step
    assert (r["disaggregated"]["step_s"], r["one_step_off"]["step_s"], r["async"]["step_s"]) == (31, 23, 23)
    assert r["async_double_buffered"]["step_s"] == 20 and r["colocated"]["step_s"] == 10 + 4 + 3
    r = compare_topologies(rollout_s=15, train_s=15, sync_s=10)  # heavy sync
    assert r["async"]["step_s"] == 25 == r["colocated"]["step_s"] and r["async_double_buffered"]["step_s"] == 15
    # a rollout that more GPUs do not shorten (a long tail): colocated keeps its full 20 s
    r = compare_topologies(rollout_s=20, train_s=15, sync_s=2, rollout_parallel=0.0)
    assert r["colocated"]["step_s"] == 20 + 7.5 + 2 and round(r["one_step_off"]["speedup_vs_colocated"], 2) == 1.34
    # the other way round: times measured by a colocated run, the split pools get half the GPUs each
    r = compare_topologies(rollout_s=3, reward_s=1, reference_s=0.5, train_s=2, sync_s=0.5, measured_on="colocated")
    assert r["colocated"]["step_s"] == 7.0 and r["disaggregated"]["step_s"] == 6 + 1 + 1 + 4 + 0.5
    assert r["one_step_off"]["step_s"] == max(6 + 1, 1 + 4) + 0.5 and r["async"]["step_s"] == max(7.5, 5)
    r = compare_topologies(rollout_s=8, train_s=4, rollout_share=0.75, measured_on="colocated")
    assert r["one_step_off"]["step_s"] == max(8 / 0.75, 4 / 0.25) == 16


def test_worked_example_row_68():
    r = step_time(rollout_s=30, reward_s=1, reference_s=3, train_s=8, sync_s=1, topology="one_step_off")  # 7B, 8×H100
    assert r["step_s"] == 32 and r["bottleneck"] == "rollout" and r["idle_s"]["trainer"] == 20
    assert useful_tokens_per_s(64, 16, 1024, r["step_s"]) == 64 * 16 * 1024 / 32 == 32_768  # "≈33k"
    assert useful_tokens_per_s(64, 16, 1024, 32, keep_rate=0.5) == 16_384


def test_per_role_widget_row_69():
    r = role_model()  # 7B, K16, L1024, disagg
    assert [round(r["terms"][k], 1) for k in ("rollout", "train", "reference", "reward", "sync")] == [
        10.1,
        2.1,
        0.7,
        1.0,
        1.3,
    ]
    assert round(r["step_s"], 1) == 12.4 and round(r["useful_tokens_per_s"] / 1e3, 1) == 84.7
    assert round(100 * r["shares"]["rollout"]) == 81
    assert round(100 * role_model(response_len=8192)["shares"]["rollout"]) == 98
    colo = role_model(topology="colocated")  # the same 8 GPUs: every phase on all of them
    assert colo["step_s"] == pytest.approx(
        r["terms"]["rollout"] / 2 + 1 + r["terms"]["reference"] / 2 + r["terms"]["train"] / 2 + r["terms"]["sync"]
    )
    assert round(100 * (colo["useful_tokens_per_s"] / r["useful_tokens_per_s"] - 1)) == 42
    assert role_model(params_b=70, topology="async")["terms"]["sync"] == pytest.approx(35.0)


def test_max_of_k_is_the_exact_expectation_within_2pct_of_monte_carlo():
    """E[longest of K log-normals]/mean against 40,000 seeded draws of K lengths (c = std/mean, the
    page's coefficient of variation); the course's √(2 ln K) envelope misses by 30–65%."""
    rng = np.random.default_rng(0)
    for k in (4, 16, 64, 256):
        for c in (0.5, 1.0, 2.0):
            s = math.sqrt(math.log1p(c * c))
            draws = np.exp(s * rng.standard_normal((40_000, k)) - s * s / 2)  # mean 1, CV c
            assert abs(draws.mean() - 1) < 0.02 and abs(draws.std() / draws.mean() - c) < 0.05 * c + 0.02
            mc = draws.max(axis=1).mean()
            assert abs(max_of_k(k, c) / mc - 1) < 0.02, (k, c, max_of_k(k, c), mc)
            assert max_of_k_envelope(k, c) / mc - 1 > 0.2  # the envelope is not the expectation
    assert round(max_of_k(16, 1.0), 2) == 3.44 and round(max_of_k_envelope(16, 1.0), 2) == 5.02  # the review's pair
    assert max_of_k(16, 0.0) == 1.0 and max_of_k(1, 2.0) == 1.0  # no spread, or one sample
    assert max_of_k(2, 1.0) == pytest.approx(1 + math.erf(math.sqrt(math.log(2)) / 2), rel=1e-6)  # closed form at k=2
    assert round(max_of_k(32, 1.0) / max_of_k(16, 1.0) - 1, 2) == 0.26  # K 16→32, c = 1


def test_max_of_k_envelope_course_rows_71_72():
    table = {4: (1.96, 2.83, 3.70), 16: (2.72, 5.02, 8.87), 64: (3.49, 7.80, 17.36), 256: (4.31, 11.31, 30.57)}
    for k, row in table.items():
        assert tuple(round(max_of_k_envelope(k, cv), 2) for cv in (0.5, 1.0, 2.0)) == row


def test_train_and_decode_rates_rows_62_65_93_94():
    assert [round(train_tokens_per_s(p)) for p in (7e9, 70e9, 405e9)] == [19_048, 1_905, 329]
    assert train_tokens_per_s(7e9, recompute=True) == 800e12 / (8 * 7e9)
    assert round(train_time_s(32_768, 7e9), 2) == 1.72 and round(train_time_s(32_768, 7e9, gpus=8), 2) == 0.22
    # row 65 decision: 1M tokens on 4 H100s take ≥ 13.8 s by the 6P rule, not the course's "~5 s at 200k tok/s"
    assert round(train_time_s(2**20, 7e9, gpus=4), 1) == 13.8
    # row 93: (14 GB weights + 32·2048·131,072 B KV) per step at 3.35 TB/s, 32 tokens a step → ≈4.7k tok/s
    assert round(decode_tokens_per_s(14e9, 32 * 2048 * 131_072, 32), -2) == 4_700


def test_from_metrics_maps_the_controller_timers():
    m = {
        "time/rollout_s": 2.0,
        "time/reward_s": 0.5,
        "time/reference_s": 0.25,
        "time/critic_s": 0.25,
        "time/collate_s": 0.125,
        "time/algorithm_s": 0.125,
        "time/train_s": 1.0,
        "time/sync_s": 0.05,
        "reward/mean": 0.3,
    }
    t = from_metrics(m)
    assert t == {"rollout_s": 2.0, "reward_s": 0.5, "reference_s": 0.5, "train_s": 1.25, "sync_s": 0.05}
    r = step_time(**t, topology="colocated")
    assert r["step_s"] == 4.3 and r["bottleneck"] == "rollout"
    assert from_metrics({}) == dict.fromkeys(t, 0.0)


def test_bad_topology_and_negative_times():
    with pytest.raises(UsageError, match="topology 'colo' is unknown"):
        step_time(1, 1, topology="colo")
    with pytest.raises(UsageError, match="topology 'disagg' is unknown"):
        role_model(topology="disagg")
    with pytest.raises(UsageError, match="measured_on='gpu' is unknown"):
        compare_topologies(1, 1, measured_on="gpu")
    with pytest.raises(UsageError, match="rollout_share=1"):
        compare_topologies(1, 1, rollout_share=1)
    with pytest.raises(ValueError):
        step_time(-1, 1)
