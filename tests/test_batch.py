"""The typed RL batch (framework/batch.py): a loss reads a RolloutBatch and leaves every field as
it was, bit for bit, for every registered algorithm; advantages and the off-policy correction
leave their input alone too; micro-batches of a RolloutBatch are RolloutBatches."""

import dataclasses

import pytest
import torch

from posttrain import UsageError, algorithms
from posttrain.algorithms import core
from posttrain.framework.batch import RolloutBatch, collate_samples, split_micro_batches
from posttrain.framework.off_policy import correct_off_policy
from posttrain.framework.sample import Sample
from posttrain.models.gpt_mini import GPTMini, ModelConfig

F64 = torch.float64


def _full_batch(seed: int = 0, B: int = 6, T: int = 9) -> RolloutBatch:
    """Every field present, random, with some rows truncated and junk nowhere (all finite)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([9, 4, 7, 3, 8, 6])[:B]
    attn = (torch.arange(T)[None] < lengths[:, None]).to(F64)  # [B, T]
    mask = attn.clone()
    mask[:, :2] = 0  # a 2-token prompt
    r = lambda *s: torch.rand(*s, generator=g, dtype=F64)  # noqa: E731
    return RolloutBatch(
        input_ids=torch.randint(1, 60, (B, T), generator=g),
        attention_mask=attn,
        loss_mask=mask,
        old_logprobs=-r(B, T) * mask,
        rewards=(r(B) > 0.5).to(F64),
        group_index=torch.arange(B) // 3,
        policy_version=torch.zeros(B, dtype=torch.long),
        truncated=torch.tensor([True, False] * (B // 2)),
        ref_logprobs=-r(B, T) * mask,
        values=r(B, T) * mask,
        advantages=(r(B, T) - 0.5) * mask,
        returns=r(B, T) * mask,
        behaviour_logprobs=-r(B, T) * mask,
        new_values=r(B, T) * mask,
        row_index=torch.arange(B),
    )


def _snapshot(batch: RolloutBatch) -> dict:
    return {k: v.clone() for k, v in batch.tensors().items()}


def _unchanged(batch: RolloutBatch, before: dict) -> None:
    now = batch.tensors()
    assert now.keys() == before.keys()
    for k, v in before.items():
        assert now[k].dtype == v.dtype and torch.equal(now[k], v), k  # bitwise, every field


def _config(mod):
    """The algorithm with every optional term that reads the batch switched on."""
    fields = {f.name for f in dataclasses.fields(mod.Config)}
    want = {"kl_coef": 0.05, "entropy_coef": 0.01, "mask_truncated": True}
    return mod.Config(**{k: v for k, v in want.items() if k in fields})


@pytest.mark.parametrize("name", sorted(algorithms.ALGORITHMS))
def test_a_loss_leaves_every_field_of_the_batch_unchanged(name):
    mod = algorithms.get(name)
    batch = _full_batch()
    before = _snapshot(batch)
    cfg = _config(mod)
    g = torch.Generator().manual_seed(1)
    lp = (batch.old_logprobs + 0.1 * torch.randn(batch.loss_mask.shape, generator=g, dtype=F64)).requires_grad_(True)
    ent = torch.rand(batch.loss_mask.shape, generator=g, dtype=F64)
    new_values = batch.new_values.clone().requires_grad_(True)
    batch = dataclasses.replace(batch, new_values=new_values)  # the trainer's forward, with gradient
    before["new_values"] = new_values.detach().clone()
    loss, metrics = mod.loss(lp, batch, cfg, core.batch_norm(batch.loss_mask), ent)
    loss.backward()  # a backward writes no batch field either
    assert torch.isfinite(loss) and metrics
    _unchanged(batch, before)


@pytest.mark.parametrize("name", sorted(algorithms.ALGORITHMS))
def test_advantages_leave_the_batch_unchanged(name):
    mod = algorithms.get(name)
    batch = _full_batch(2)
    before = _snapshot(batch)
    adv = mod.advantages(batch.rewards, batch.group_index, _config(mod), batch=batch)
    assert torch.isfinite(adv).all()
    if name == "ppo":  # the critic's target: a new tensor too
        assert torch.isfinite(mod.value_targets(batch.rewards, batch, _config(mod))).all()
    _unchanged(batch, before)


def test_the_off_policy_correction_returns_a_new_batch():
    model = GPTMini(ModelConfig(preset="nano").resolved(64))
    batch = dataclasses.replace(_full_batch(3), behaviour_logprobs=None, row_index=None).map(
        lambda v: v.float() if v.is_floating_point() else v
    )
    before = _snapshot(batch)
    new, metrics = correct_off_policy(model, batch, "tis", 2.0, 1.0)
    _unchanged(batch, before)
    assert new is not batch and torch.equal(new.behaviour_logprobs, batch.old_logprobs)
    assert not torch.equal(new.old_logprobs, batch.old_logprobs) and metrics["offpolicy/weight_mean"] > 0
    assert torch.equal(new.input_ids, batch.input_ids) and torch.equal(new.rewards, batch.rewards)
    with pytest.raises(UsageError, match="old_logprobs and advantages"):
        correct_off_policy(model, dataclasses.replace(batch, advantages=None), "tis", 2.0, 1.0)


def test_the_batch_is_frozen_and_micro_batches_keep_its_type():
    batch = _full_batch(4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.advantages = None  # type: ignore[misc]
    parts = split_micro_batches(dataclasses.replace(batch, row_index=None), 30)
    assert len(parts) > 1 and all(isinstance(p, RolloutBatch) for p in parts)
    rows = torch.cat([p.row_index for p in parts])
    assert sorted(rows.tolist()) == list(range(6))
    for p in parts:  # rows as in the batch, columns trimmed
        w = p.loss_mask.shape[1]
        assert torch.equal(p.advantages, batch.advantages[p.row_index, :w])
        assert torch.equal(p.rewards, batch.rewards[p.row_index]) and torch.equal(
            p.truncated, batch.truncated[p.row_index]
        )
        assert int(p.attention_mask.sum(1).max()) == w


def test_collate_samples_fills_every_rollout_field():
    s = [
        Sample([1, 2], [3, 4, 5], [-0.1, -0.2, -0.3], [1, 1, 1], "length", 2, 0, 0, reward=1.0),
        Sample([1], [6], [-0.5], [1], "stop", 2, 1, 0, reward=0.0),
    ]
    b = collate_samples(s, 0)
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 5], [1, 6, 0, 0, 0]]
    assert b.loss_mask.tolist() == [[0, 0, 1, 1, 1], [0, 1, 0, 0, 0]]
    assert b.old_logprobs[0, 2:].tolist() == pytest.approx([-0.1, -0.2, -0.3]) and b.old_logprobs[1, 1].item() == -0.5
    assert b.rewards.tolist() == [1.0, 0.0] and b.group_index.tolist() == [0, 1] and b.policy_version.tolist() == [2, 2]
    assert b.truncated.tolist() == [True, False]  # finish_reason "length": DAPO's mask_truncated
    assert b.advantages is None and b.ref_logprobs is None and b.values is None
