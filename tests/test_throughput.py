"""Throughput equation (lessons 19, 22, 22a, 22b, 22c, 28): SEED_SPEC Part C rows, by hand."""

import pytest

from posttrain import UsageError
from posttrain.sizing.throughput import (
    compare_topologies,
    decode_tokens_per_s,
    from_metrics,
    max_of_k,
    role_model,
    step_time,
    train_time_s,
    train_tokens_per_s,
    useful_tokens_per_s,
)


def test_three_topologies_by_hand():
    t = dict(rollout_s=20, reward_s=2, reference_s=3, train_s=10, sync_s=4)
    r = compare_topologies(**t)
    assert r["colocated"]["step_s"] == 20 + 2 + 3 + 10 + 4 == 39
    assert r["disaggregated"]["step_s"] == max(22, 13) + 4 == 26
    assert r["async"]["step_s"] == max(22, 13, 4) == 22
    assert r["disaggregated"]["idle_s"] == {"rollout": 0, "trainer": 22 - 13}
    assert r["colocated"]["bottleneck"] == "rollout" and r["colocated"]["shares"]["train"] == 10 / 39
    assert r["async"]["speedup_vs_colocated"] == 39 / 22
    # the trainer side bounds it when training is slower: the largest term there is named
    slow = step_time(rollout_s=5, train_s=12, reference_s=4, sync_s=1)
    assert slow["step_s"] == 17 and slow["bottleneck"] == "train" and slow["idle_s"]["rollout"] == 11
    assert step_time(rollout_s=1, train_s=1, sync_s=9, topology="async")["bottleneck"] == "sync"


def test_topology_widget_rows_49_and_78():
    r = compare_topologies(rollout_s=20, train_s=15, sync_s=2)  # lesson 19 defaults
    assert [round(r[t]["steps_per_hour"]) for t in ("colocated", "disaggregated", "async")] == [97, 164, 180]
    assert round(r["async"]["speedup_vs_colocated"], 2) == 1.85
    r = compare_topologies(rollout_s=20, train_s=8, sync_s=3)  # lesson 22c tries
    assert [r[t]["step_s"] for t in ("colocated", "disaggregated", "async")] == [31, 23, 20]
    assert round(r["disaggregated"]["speedup_vs_colocated"], 2) == 1.35
    assert round(r["async"]["speedup_vs_colocated"], 2) == 1.55
    assert r["disaggregated"]["idle_s"]["trainer"] == 12


def test_worked_example_row_68():
    r = step_time(rollout_s=30, reward_s=1, reference_s=3, train_s=8, sync_s=1)  # 7B, 8×H100, disaggregated
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
    colo = role_model(topology="colocated")
    assert round(100 * (colo["useful_tokens_per_s"] / r["useful_tokens_per_s"] - 1)) == -18
    assert role_model(params_b=70, topology="async")["terms"]["sync"] == pytest.approx(35.0)


def test_max_of_k_table_rows_71_72():
    table = {4: (1.96, 2.83, 3.70), 16: (2.72, 5.02, 8.87), 64: (3.49, 7.80, 17.36), 256: (4.31, 11.31, 30.57)}
    for k, row in table.items():
        assert tuple(round(max_of_k(k, cv), 2) for cv in (0.5, 1.0, 2.0)) == row
    assert round(max_of_k(32, 0.5) / max_of_k(16, 0.5) - 1, 2) == 0.14  # "K 16→32 adds ~15%": c=.5 only
    assert round(max_of_k(32, 1.0) / max_of_k(16, 1.0) - 1, 2) == 0.26
    assert max_of_k(16, 0.0) == 1.0 and max_of_k(1, 2.0) == 1.0  # no spread, or one sample


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
    with pytest.raises(ValueError):
        step_time(-1, 1)
