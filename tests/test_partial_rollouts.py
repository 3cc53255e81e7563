"""Partial rollouts (async_rollout.py, `partial_rollouts: true`): a weight update lands between two
decode steps, the sample goes on with the new weights, and every token carries its version."""

import copy

import pytest
import torch

from posttrain.distributed.async_rollout import AsyncRollout, token_staleness
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.framework.sample import Sample
from posttrain.framework.weight_sync.snapshots import WeightPublisher

M = 8  # tokens per response (ignore_eos: all full length)
SP = SamplingParams(temperature=1.0, max_new_tokens=M, ignore_eos=True)
PROMPTS = [[5, 6, 7], [8, 9]]


def _mid_update(engine, trainer_model, publisher, at_call=3):
    """A hook that plays the trainer: before the `at_call`-th decode forward it perturbs and
    publishes the trainer's weights, then hands over to the engine's own hook (the producer's)."""
    inner, calls = engine.on_decode_step, [0]

    def hook():
        calls[0] += 1
        if calls[0] == at_call:
            with torch.no_grad():
                for p in trainer_model.parameters():
                    p.add_(0.5 * torch.randn_like(p))
            publisher.publish()
        inner()

    return hook


def test_a_sample_spanning_an_update_carries_two_versions(nano, tok):
    trainer_model = nano
    engine = Engine(copy.deepcopy(nano).eval().requires_grad_(False), tok)
    before = Engine(copy.deepcopy(nano).eval().requires_grad_(False), tok).generate(PROMPTS, 2, SP, seed=1, step=1)
    publisher = WeightPublisher(trainer_model)
    src = AsyncRollout(lambda step: None, engine, publisher, max_staleness=1, partial=True)  # installs _catch_up
    engine.on_decode_step = _mid_update(engine, trainer_model, publisher)
    samples = engine.generate(PROMPTS, 2, SP, seed=1, step=1)
    for s, b in zip(samples, before):
        # token 0 from the prefill logits, tokens 1-2 from decode forwards 1-2: version 0; the update
        # lands before forward 3, so tokens 3… were sampled from the new weights (version 1)
        assert s.token_versions == [0, 0, 0] + [1] * (M - 3) and s.policy_version == 0
        assert s.response_ids[:3] == b.response_ids[:3]  # same keyed draws, old weights
        assert s.response_logprobs[:3] == pytest.approx(b.response_logprobs[:3], abs=1e-5)
        # ... and from token 3 on, tokens or behaviour logprobs are the new weights', recorded as sampled
        assert (
            s.response_ids[3:] != b.response_ids[3:]
            or max(abs(x - y) for x, y in zip(s.response_logprobs[3:], b.response_logprobs[3:])) > 1e-3
        )
    assert engine.policy_version == 1 and src.rollout_sync > 0
    # staleness counts tokens: the trainer is at version 1, so 3 of every 8 tokens are 1 behind
    ages, spans = token_staleness(samples, publisher.version)
    assert sum(ages) / len(ages) == 3 / M and max(ages) == 1 and spans == len(samples)


def test_token_staleness_worked_values():
    def smp(vers, mask, version=None):
        return Sample(
            [1],
            [9] * len(mask),
            [0.0] * len(mask),
            mask,
            "stop",
            vers[0] if vers else version,
            0,
            0,
            token_versions=vers,
        )

    samples = [
        smp([3, 3, 4, 4], [1, 1, 1, 1]),  # spans 3 → 4
        smp([4, 4, 5], [1, 0, 1]),  # an observation token (mask 0) is not counted
        smp(None, [1, 1], version=5),
    ]  # no per-token record: all of policy_version
    ages, spans = token_staleness(samples, 5)
    assert sorted(ages) == [0, 0, 0, 1, 1, 1, 2, 2] and spans == 2


def test_partial_rollouts_in_an_async_run(sft_ckpt, tmp_path):
    from test_async import COMMON

    from posttrain.config import RLConfig, load_config
    from posttrain.logging import read_metrics
    from posttrain.recipes import rl

    rl.run(
        load_config(
            RLConfig,
            None,
            [f"out={tmp_path}", f"init={sft_ckpt}", "async=true", "max_staleness=1", "partial_rollouts=true", *COMMON],
        )
    )
    rows = read_metrics(tmp_path)[1:]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["staleness/max"] <= 1 and 0 <= r["staleness/partial_frac"] <= 1 for r in rows)


def test_partial_rollouts_need_the_async_in_process_placement(tmp_path):
    from posttrain import UsageError
    from posttrain.config import RLConfig, load_config
    from posttrain.recipes import rl

    for keys in (["partial_rollouts=true"], ["partial_rollouts=true", "async=true", "stale=fixed"]):
        with pytest.raises(UsageError, match="partial_rollouts"):
            rl.run(load_config(RLConfig, None, [f"out={tmp_path}/x", "init=nowhere", *keys]))
