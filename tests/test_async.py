"""Asynchronous mode (distributed/async_rollout.py) and the off-policy correction (core.off_policy_weights)."""

import json
import math
import time

import pytest
import torch

from posttrain import UsageError
from posttrain.algorithms.core import off_policy_weights
from posttrain.config import RLConfig, load_config
from posttrain.distributed.async_rollout import AsyncRollout
from posttrain.logging import read_metrics
from posttrain.recipes import rl

from conftest import TINY_TASK

# ---------------------------------------------------------------------- the correction, worked values


def _case():
    # ratios π_prox/μ = 4, 0.5, 1 on three loss tokens; the 4th position is padding holding NaN
    prox = torch.tensor([[math.log(0.8), math.log(0.2), math.log(0.9), float("nan")]])
    behav = torch.tensor([[math.log(0.2), math.log(0.4), math.log(0.9), float("nan")]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    return prox, behav, mask


@pytest.mark.parametrize(
    "mode,expected,capped",
    [
        ("none", [1.0, 1.0, 1.0, 0.0], 0.0),
        ("tis", [3.0, 0.5, 1.0, 0.0], 1 / 3),  # min(w_t, 3)
        ("seq_tis", [2.0, 2.0, 2.0, 0.0], 0.0),  # Π w_t = 4 · 0.5 · 1 = 2 < 3
        ("mask", [0.0, 0.5, 1.0, 0.0], 1 / 3),  # 4 is outside [1/3, 3]: zeroed
    ],
)
def test_off_policy_weights_worked_values(mode, expected, capped):
    prox, behav, mask = _case()
    w, m = off_policy_weights(prox, behav, mask, mode, cap=3.0)
    assert w[0].tolist() == pytest.approx(expected, abs=1e-6)
    assert float(m["offpolicy/capped_frac"]) == pytest.approx(capped, abs=1e-6)
    assert float(m["offpolicy/log_ratio_abs"]) == pytest.approx((math.log(4) + math.log(2)) / 3, abs=1e-6)
    assert not w.requires_grad


def test_seq_tis_truncates_the_sequence_product():
    prox, behav, mask = _case()
    w, m = off_policy_weights(prox, behav, mask, "seq_tis", cap=1.5)
    assert w[0].tolist() == pytest.approx([1.5, 1.5, 1.5, 0.0])
    assert float(m["offpolicy/capped_frac"]) == 1.0


@pytest.mark.parametrize("mode", ["none", "tis", "seq_tis", "mask"])
def test_importance_weights_are_one_on_policy(mode):
    lp = torch.log(torch.rand(3, 5).clamp_min(1e-3))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.float32)
    w, m = off_policy_weights(lp, lp.clone(), mask, mode, cap=2.0)
    assert torch.equal(w, mask)
    assert float(m["offpolicy/weight_mean"]) == 1.0 and float(m["offpolicy/capped_frac"]) == 0.0


def test_bad_correction_settings_are_usage_errors():
    prox, behav, mask = _case()
    with pytest.raises(UsageError, match="off_policy_correction"):
        off_policy_weights(prox, behav, mask, "is", cap=2.0)
    with pytest.raises(UsageError, match="off_policy_cap"):
        off_policy_weights(prox, behav, mask, "tis", cap=1.0)


# ---------------------------------------------------------------------- the producer, with stand-ins


class _Publisher:
    """A WeightPublisher stand-in: versions only."""

    def __init__(self):
        self.version = 0

    def publish(self):
        self.version += 1
        return {"sync/policy_version": float(self.version)}

    def latest(self, at_most=None):
        return (self.version if at_most is None else min(self.version, at_most)), []


class _Engine:
    def __init__(self):
        self.policy_version = 0

    def load_weights(self, version, buckets):
        self.policy_version = version


class _Sample:
    def __init__(self, version):
        self.policy_version = version
        self.response_ids, self.response_mask = [7, 8], [1, 1]  # two tokens, both of `version`


def _drive(K, stale, steps=12, fail_at=None):
    engine, pub = _Engine(), _Publisher()

    def collect(step):
        if step == fail_at:
            raise ValueError("verifier exploded")
        return [_Sample(engine.policy_version) for _ in range(3)], {"step": step}

    src = AsyncRollout(collect, engine, pub, K, stale)
    seen = []
    try:
        for step in range(1, steps + 1):
            _, metrics = src.get(step)
            seen.append(metrics)
            time.sleep(0.01)  # the trainer is the slow role: the producer runs ahead
            src.sync()
    finally:
        src.close()
    return seen


@pytest.mark.parametrize("K", [0, 1, 3])
def test_paced_staleness_never_exceeds_max_staleness(K):
    seen = _drive(K, "pace")
    assert [m["step"] for m in seen] == list(range(1, 13))  # pacing: in order, none lost
    assert max(m["staleness/max"] for m in seen) <= K
    assert max(m["staleness/max"] for m in seen[2:]) == K  # ... and the producer did run ahead
    assert all(m["staleness/dropped_batches"] == 0 for m in seen)


def test_fixed_mode_samples_exactly_max_staleness_versions_behind():
    seen = _drive(2, "fixed")
    assert [m["staleness/max"] for m in seen] == [0, 1] + [2] * 10  # warm-up, then exactly K
    assert all(m["staleness/mean"] == m["staleness/max"] for m in seen)


def test_drop_mode_discards_batches_older_than_max_staleness():
    seen = _drive(1, "drop")
    assert max(m["staleness/max"] for m in seen) <= 1
    assert seen[-1]["step"] >= 12  # steps of dropped batches were skipped


def test_a_producer_error_reaches_the_trainer():
    with pytest.raises(RuntimeError, match="verifier exploded"):
        _drive(1, "pace", fail_at=3)


# ---------------------------------------------------------------------- long tail


def test_straggler_cut_off_keeps_the_first_to_finish(nano, tok):
    from posttrain.framework.rollout import Engine, SamplingParams

    stops = tuple(range(4, tok.vocab_size, 6))  # an untrained model then stops at random
    prompts, sp = [[5, 6, 7], [8, 9], [10, 11, 12]], SamplingParams(temperature=1.0, max_new_tokens=16, stop_ids=stops)
    whole = Engine(nano, tok)
    full = whole.generate(prompts, 6, sp, seed=3, step=1)
    engine = Engine(nano, tok)
    cut = engine.generate(prompts, 6, sp, seed=3, step=1, keep=4)
    assert len({len(s.response_ids) for s in full}) > 3  # lengths vary: there is a tail to cut
    assert engine.stats["rollout/cancelled"] == 3 * 2
    assert engine.stats["rollout/decode_steps"] < whole.stats["rollout/decode_steps"]  # the wait got shorter
    for g in range(3):
        # every sample starts at once (enough slots), so "first to finish" = shortest, ties by index
        first = sorted((len(s.response_ids), s.index) for s in full if s.group == g)[:4]
        got = [(s.index, s.response_ids) for s in cut if s.group == g]
        assert sorted(i for i, _ in got) == sorted(i for _, i in first)
        assert all(ids == full[g * 6 + i].response_ids for i, ids in got)  # same keyed draws


def test_max_of_k_metrics_worked_values():
    import numpy as np

    from posttrain.framework.controller import max_of_k_metrics
    from posttrain.sizing.throughput import max_of_k

    m = max_of_k_metrics(np.array([1.0, 1, 1, 1, 6]))  # mean 2, population std 2
    assert m["length/max_of_k"] == 3.0 and m["length/cv"] == 1.0
    # the exact expectation for K = 5 samples at CV 1 (throughput.max_of_k, held to Monte Carlo in
    # test_throughput), not the √(2 ln K) envelope, which reads 3.15 here and would hide this tail
    assert m["length/max_of_k_expected"] == pytest.approx(max_of_k(5, 1.0)) and round(max_of_k(5, 1.0), 2) == 2.2


def test_throughput_summary_worked_values():
    from posttrain.distributed.run_summary import summarize

    row = {
        "time/rollout_s": 3.0,
        "time/reward_s": 1.0,
        "time/reference_s": 0.25,
        "time/proximal_s": 0.25,
        "time/train_s": 2.0,
        "time/sync_s": 0.5,
        "time/step_s": 7.0,
        "time/trainer_idle_s": 3.5,
    }
    rows = [{"step": 0, "eval/pass@1": 0.1}, {"step": 1, **row}, {"step": 2, **row}]
    s = summarize(rows, "colocated", samples_per_step=14)
    assert s["steps"] == 2 and s["equation_step_s"] == 7.0 and s["bottleneck"] == "rollout"
    assert s["samples_per_s"] == 2.0 and s["trainer_idle_frac"] == 0.5
    # every topology on this run's GPUs: a split pool gets half of them, so rollout 6, reference 1, train 4
    assert s["equation_by_topology_s"] == {
        "colocated": 7.0,
        "disaggregated": 6 + 1 + 1 + 4 + 0.5,  # on-policy: the pools take turns
        "one_step_off": max(6 + 1, 1 + 4) + 0.5,
        "async": max(6 + 1 + 0.5, 1 + 4),  # the sampler pays the load
        "async_double_buffered": max(6 + 1, 1 + 4, 0.5),
    }
    assert s["assumes_by_topology"]["one_step_off"].startswith("samples one version stale")


# ---------------------------------------------------------------------- whole runs

COMMON = [
    "prompts_per_step=2",
    "samples_per_prompt=4",
    "eval_problems=4",
    "eval_samples=2",
    "eval_every=0",
    "steps=3",
    "device=cpu",  # async = sync to the bit, ratios to 1e-4: the CPU's fp32 (a GPU's bf16 and atomics differ)
    "threads=1",
    *TINY_TASK,
]


def test_async_with_staleness_zero_equals_sync(sft_ckpt, tmp_path):
    rl.run(load_config(RLConfig, None, [f"out={tmp_path}/sync", f"init={sft_ckpt}", *COMMON]))
    rl.run(
        load_config(
            RLConfig,
            None,
            [
                f"out={tmp_path}/async",
                f"init={sft_ckpt}",
                "async=true",
                "max_staleness=0",
                "off_policy_correction=none",
                *COMMON,
            ],
        )
    )
    sync, asyn = read_metrics(tmp_path / "sync")[1:], read_metrics(tmp_path / "async")[1:]
    for a, b in zip(sync, asyn):
        for k in ("reward/mean", "length/mean", "loss", "grad/norm", "eval/pass@1"):
            assert a.get(k) == b.get(k), k
        assert b["staleness/max"] == 0.0
    assert _same_weights(tmp_path / "sync", tmp_path / "async")


def test_async_run_with_staleness_and_correction(sft_ckpt, tmp_path):
    out = tmp_path / "a1"
    rl.run(
        load_config(
            RLConfig,
            None,
            [
                f"out={out}",
                f"init={sft_ckpt}",
                "async=true",
                "max_staleness=1",
                "off_policy_correction=tis",
                "overprovision=2",
                *COMMON,
            ],
        )
    )
    rows = read_metrics(out)[1:]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["staleness/max"] <= 1 for r in rows)
    assert all(r["rollout/cancelled"] == 2 * 2 for r in rows)  # 6 started per prompt, first 4 kept
    for key in (
        "queue/size",
        "time/trainer_idle_s",
        "time/rollout_idle_s",
        "rollout/tokens_per_s",
        "train/tokens_per_s",
        "offpolicy/weight_mean",
    ):
        assert key in rows[-1], key
    summary = json.loads((out / "throughput.json").read_text())
    assert (
        summary["topology"] == "async"
        and summary["steps"] == 3
        and summary["bottleneck"] in ("rollout", "reward", "reference", "train", "sync")
    )
    fresh = [r for r in rows if r["staleness/max"] == 0]
    assert fresh and all(abs(r["offpolicy/weight_mean"] - 1) < 1e-4 for r in fresh)  # on-policy: w = 1
    assert all(abs(r["ratio/mean"] - 1) < 1e-4 for r in rows)  # the ratio is taken against π_prox


@pytest.mark.slow
def test_sync_run_with_correction_has_unit_weights(sft_ckpt, tmp_path):
    rl.run(
        load_config(
            RLConfig,
            None,
            [
                f"out={tmp_path}/s",
                f"init={sft_ckpt}",
                "off_policy_correction=mask",
                "steps=2",
                *COMMON[:-2],
                *TINY_TASK,
            ],
        )
    )
    rows = read_metrics(tmp_path / "s")[1:]
    assert all(abs(r["offpolicy/weight_mean"] - 1) < 1e-4 and r["offpolicy/capped_frac"] == 0 for r in rows)


def test_bad_scale_keys_are_usage_errors(tmp_path):
    for bad, match in [
        ("placement=mpi", "placement"),
        ("stale=keep", "stale"),
        ("max_staleness=-1", "max_staleness"),
        ("off_policy_correction=is", "off_policy_correction"),
    ]:
        with pytest.raises(UsageError, match=match):
            rl.run(load_config(RLConfig, None, [f"out={tmp_path}/x", "init=nowhere", bad]))


def _same_weights(a, b):
    from safetensors.torch import load_file

    from posttrain import checkpoint

    wa, wb = (load_file(checkpoint.latest(d) / "model.safetensors") for d in (a, b))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("stale", ["pace", "fixed"])
def test_async_resume_is_exact(sft_ckpt, tmp_path, monkeypatch, stale):
    """A killed async run resumed from its checkpoint gives the uninterrupted run's numbers: the
    first batch after the resume is sampled by the weights one version behind (staleness 1, as
    without the kill), which the checkpoint keeps, not by the resumed weights (staleness 0)."""
    from test_recipes import _metrics_without_time, _same_weights, run_killed

    common = [
        f"init={sft_ckpt}",
        "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=4",
        "eval.problems=4",
        "eval.samples=2",
        "eval_every=0",
        "steps=4",
        "save_every=2",
        "threads=1",
        "device=cpu",  # resume = the uninterrupted run, bit for bit
        "scale.async=true",
        "scale.max_staleness=1",
        f"scale.stale={stale}",
        *TINY_TASK,
    ]
    rl.run(load_config(RLConfig, None, [f"out={tmp_path}/full", *common]))
    cfg = load_config(RLConfig, None, [f"out={tmp_path}/half", *common])
    run_killed(monkeypatch, rl, cfg, die_on_step=4)
    rl.run(cfg, resume=True)
    full = read_metrics(tmp_path / "full")
    assert [m["staleness/max"] for m in full[1:]] == [0.0, 1.0, 1.0, 1.0]
    timing = ("queue/", "staleness/dropped")  # how far the producer ran ahead: wall-clock
    same = [{k: v for k, v in m.items() if not k.startswith(timing)} for m in _metrics_without_time(tmp_path / "full")]
    half = [{k: v for k, v in m.items() if not k.startswith(timing)} for m in _metrics_without_time(tmp_path / "half")]
    assert half == same
    assert _same_weights(tmp_path / "full", tmp_path / "half")
