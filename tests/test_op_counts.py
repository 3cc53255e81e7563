"""The CPU's proxy for a GPU's per-micro-batch overheads (issue 43), counted on tests/fakegpu.py's
device with posttrain.bench.profile.OpCount: no host read of a device tensor (a sync on CUDA, where
the card then idles until the host launches again) grows with the micro-batches of a trainer step or
of the reference's scores, and a logit chunk makes one log-softmax for its logprob and its entropy.
benchmarks/op_counts.py records the counts before and after (benchmarks/results/op_counts.json)."""

import pytest
import torch

import posttrain.framework.batch as B
from posttrain import algorithms
from posttrain.bench.profile import OpCount
from posttrain.config import OptimConfig
from posttrain.framework.batch import RolloutBatch, split_micro_batches, to_device
from posttrain.framework.reference import score_logprobs
from posttrain.framework.trainer import Trainer, policy_loss_fn
from posttrain.models.gpt_mini import GPTMini, ModelConfig

from fakegpu import install


@pytest.fixture(scope="module")
def dev():
    return install()


def _batch(dev, rows=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = (8 + torch.randint(4, 30, (rows,), generator=g)).tolist()
    T = max(lengths)
    ids, attn, loss = torch.randint(1, 60, (rows, T), generator=g), torch.zeros(rows, T), torch.zeros(rows, T)
    for i, n in enumerate(lengths):
        attn[i, :n], loss[i, 8:n] = 1, 1
    old = -torch.rand(rows, T, generator=g) * loss
    adv = torch.randn(rows, 1, generator=g) * loss
    fields = dict(input_ids=ids, attention_mask=attn, loss_mask=loss, old_logprobs=old, advantages=adv)
    return to_device(RolloutBatch(**fields, ref_logprobs=old - 0.01 * loss), dev)


def _budget_for(batch, n: int) -> int:
    return next(b for b in range(20, 5000, 4) if len(split_micro_batches(batch, b)) == n)


def _syncs(fn) -> dict:
    with OpCount() as c:
        fn()
    return dict(c.syncs)


def test_a_trainer_step_reads_the_device_once_whatever_its_micro_batches(dev, monkeypatch):
    """Before issue 43 each micro-batch read its loss, its loss tokens and every metric (float()), and
    copied its row indices to the device once per field: 20 syncs a micro-batch; now the step's reads
    are one stack after the loop, the indices one copy per split."""
    monkeypatch.setattr(B, "MICRO_BATCH_COST_TOKENS", 10**9)  # the fewest micro-batches, as CUDA's cost gives
    algo = algorithms.get("grpo")
    loss_fn = policy_loss_fn(algo, algo.Config(kl_coef=0.01), 1.0)
    batch = _batch(dev)
    counts = {}
    for n in (1, 4):
        torch.manual_seed(0)
        model = GPTMini(ModelConfig(preset="nano", n_layers=1).resolved(60)).to(dev)
        trainer = Trainer(model, OptimConfig(lr=1e-4, micro_batch_tokens=_budget_for(batch, n)), 10)
        trainer.step(batch, loss_fn)  # AdamW's state, made at the first step
        counts[n] = _syncs(lambda t=trainer: t.step(batch, loss_fn))
        assert trainer.step(batch, loss_fn)["train/micro_batches"] == n
    assert counts[4] == counts[1] and sum(counts[1].values()) <= 6, counts


def test_the_reference_reads_nothing_back_per_micro_batch(dev, monkeypatch):
    monkeypatch.setattr(B, "MICRO_BATCH_COST_TOKENS", 10**9)
    batch = _batch(dev)
    torch.manual_seed(0)
    model = GPTMini(ModelConfig(preset="nano", n_layers=1).resolved(60)).to(dev).eval().requires_grad_(False)
    budgets = {n: _budget_for(batch, n) for n in (1, 4)}
    counts = {n: _syncs(lambda n=n: score_logprobs(model, batch, 1.0, budgets[n])) for n in (1, 4)}
    assert counts[4] == counts[1] and sum(counts[1].values()) <= 2, counts


def test_a_logit_chunk_makes_one_log_softmax_for_its_logprob_and_entropy(dev, monkeypatch):
    """Forward, the backward's recompute, and one log-softmax backward per chunk (with the entropy
    out of the loss, as every algorithm's default entropy_coef = 0): 3 ops of them a chunk, not 6."""
    import posttrain.framework.logprobs as L

    V, d = 512, 16
    head = torch.nn.Linear(d, V, bias=False).to(dev)
    h0, ids = torch.randn(1, 65, d).to(dev), torch.randint(0, V, (1, 65)).to(dev)
    monkeypatch.setattr(L, "LOGIT_CHUNK_ELEMENTS", 16 * V)  # 4 chunks of 16 rows
    with OpCount() as c:
        h = h0.clone().requires_grad_(True)
        lp, ent = L.hidden_logprobs(h, head, ids, 0.7, with_entropy=True)
        lp.sum().backward()
    assert ent is not None and c.ops["_log_softmax"] == 2 * 4 and c.ops["_log_softmax_backward_data"] == 4
    assert sum(c.syncs.values()) == 0
