import copy

import pytest
import torch

from posttrain.algorithms.core import AGGREGATIONS, aggregate
from posttrain.config import OptimConfig
from posttrain.framework.batch import collate, split_micro_batches
from posttrain.framework.logprobs import sequence_logprobs
from posttrain.framework.trainer import Trainer, lr_factor


def _batch(tok, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(6, 40, (int(torch.randint(3, 7, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]
    responses = [
        torch.randint(6, 40, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]
    b = collate(prompts, responses, tok.pad_id)
    b["advantages"] = torch.randn(n, 1, generator=g).expand_as(b["loss_mask"]).contiguous()
    return b


def _pg_loss(mode):
    def loss_fn(model, mb, norm):
        lp, _ = sequence_logprobs(model, mb["input_ids"])
        return aggregate(-mb["advantages"] * lp, mb["loss_mask"], mode, norm), {}

    return loss_fn


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
@pytest.mark.slow
def test_accumulation_equals_one_big_batch(nano, tok, mode):
    """k micro-batches of gradient accumulation give the gradient of one big batch."""
    batch = _batch(tok)
    grads = []
    for budget in (10_000, 30, 12):  # one micro-batch, a few, one row each
        model = copy.deepcopy(nano)
        t = Trainer(model, OptimConfig(lr=0.0, grad_clip=0.0, micro_batch_tokens=budget), 10)
        m = t.step(batch, _pg_loss(mode))
        assert (m["train/micro_batches"] == 1) == (budget == 10_000)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert grads[0].abs().sum() > 0
    for g in grads[1:]:
        assert torch.allclose(g, grads[0], atol=1e-6, rtol=1e-4)


def test_micro_batches_respect_budget_and_trim(tok):
    batch = _batch(tok, n=8)
    for mb in split_micro_batches(batch, 30):
        rows, width = mb["input_ids"].shape
        assert rows == 1 or rows * width <= 30
        assert mb["attention_mask"][:, -1].any()  # no all-padding column left
    assert sum(mb["input_ids"].shape[0] for mb in split_micro_batches(batch, 30)) == 8


def test_nonfinite_step_is_skipped_and_counted(nano, tok):
    before = [p.detach().clone() for p in nano.parameters()]
    t = Trainer(nano, OptimConfig(lr=1e-2), 10)

    def nan_loss(model, mb, norm):
        return model(mb["input_ids"]).sum() * float("nan"), {}

    m = t.step(_batch(tok), nan_loss)
    assert m["train/nonfinite_skipped"] == 1.0 and m["train/nonfinite_total"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, nano.parameters()))


def test_lr_schedule():
    cfg = OptimConfig(lr=1.0, warmup_steps=10, schedule="cosine", min_lr_frac=0.1)
    assert lr_factor(0, cfg, 110) == pytest.approx(0.1)
    assert lr_factor(9, cfg, 110) == pytest.approx(1.0)
    assert lr_factor(60, cfg, 110) == pytest.approx(0.55)
    assert lr_factor(110, cfg, 110) == pytest.approx(0.1)
    assert lr_factor(50, OptimConfig(schedule="constant"), 100) == 1.0


def test_adamw_hyperparameters(nano):
    t = Trainer(nano, OptimConfig(weight_decay=0.1), 10)
    g = t.optimizer.param_groups
    assert g[0]["betas"] == (0.9, 0.95) and g[0]["weight_decay"] == 0.1 and g[1]["weight_decay"] == 0.0
    assert all(p.dim() < 2 for p in g[1]["params"])  # norms are not decayed


def test_micro_batches_keep_units_of_two_together():
    """Preference pairs (rows 2i, 2i+1) never straddle a micro-batch boundary; pairs of similar
    widths share a micro-batch, and row_index says where each row came from."""
    lengths = [3, 9, 4, 4, 8, 2, 5, 5]
    mask = torch.zeros(8, 10)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    batch = {"input_ids": torch.arange(80).view(8, 10), "attention_mask": mask, "loss_mask": mask}
    parts = split_micro_batches(batch, 36, unit=2)  # pair widths 9, 4, 8, 5
    rows = [mb["input_ids"][:, 0].div(10, rounding_mode="floor").tolist() for mb in parts]
    assert rows == [[0, 1, 4, 5], [2, 3, 6, 7]]  # widths 9 and 8 together (36), 4 and 5 (20)
    assert [mb["row_index"].tolist() for mb in parts] == rows
    assert [mb["input_ids"].shape[1] for mb in parts] == [9, 5]
    with pytest.raises(ValueError):
        split_micro_batches({k: v[:3] for k, v in batch.items()}, 20, unit=2)


def test_length_grouping_covers_every_row_once_and_pads_less(tok):
    """Rows sorted by length and cut optimally compute fewer padded tokens than rows cut in
    batch order, within the same budget; every row lands in exactly one micro-batch."""
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(2, 40, (64,), generator=g)
    mask = (torch.arange(40) < lengths[:, None]).float()
    batch = {"input_ids": torch.arange(64)[:, None].expand(64, 40).clone(), "attention_mask": mask, "loss_mask": mask}
    parts = split_micro_batches(batch, 400)
    seen = torch.cat([mb["row_index"] for mb in parts])
    assert sorted(seen.tolist()) == list(range(64))
    assert all(torch.equal(mb["input_ids"][:, 0], mb["row_index"]) for mb in parts)
    assert all(mb["input_ids"].numel() <= 400 and mb["attention_mask"][:, -1].any() for mb in parts)
    padded = sum(mb["attention_mask"].numel() for mb in parts)
    in_order, start = 0, 0  # greedy consecutive cut, the old rule
    while start < 64:
        end, w = start + 1, int(lengths[start])
        while end < 64 and (end + 1 - start) * max(w, int(lengths[end])) <= 400:
            w, end = max(w, int(lengths[end])), end + 1
        in_order, start = in_order + (end - start) * w, end
    assert padded < 0.8 * in_order and padded >= int(lengths.sum())


def test_step_counts_real_and_padded_tokens(nano, tok):
    batch = _batch(tok, n=8)
    m = Trainer(nano, OptimConfig(lr=0.0, micro_batch_tokens=10_000), 10).step(batch, _pg_loss("token-mean"))
    assert m["train/tokens"] == float(batch["attention_mask"].sum())
    assert m["train/tokens"] <= m["train/padded_tokens"] <= batch["attention_mask"].numel()
    assert m["train/pad_frac"] == pytest.approx(1 - m["train/tokens"] / m["train/padded_tokens"])
