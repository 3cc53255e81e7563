"""The trainer as a 2-rank gloo group gives the gradient of 1 rank on the same global batch."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from posttrain import algorithms
from posttrain.config import OptimConfig
from posttrain.distributed.data_parallel import DataParallel
from posttrain.framework.batch import RolloutBatch
from posttrain.framework.trainer import Trainer, policy_loss_fn


def _model():
    from posttrain.models.gpt_mini import GPTMini, ModelConfig

    torch.manual_seed(0)
    return GPTMini(ModelConfig(preset="nano").resolved(64))


def _batch():
    g = torch.Generator().manual_seed(1)
    B, T = 5, 12  # 5 rows: shards of 3 and 2
    ids = torch.randint(1, 64, (B, T), generator=g)
    lengths = torch.tensor([12, 5, 9, 3, 11])  # uneven: the normaliser matters
    attn = (torch.arange(T)[None] < lengths[:, None]).float()
    loss_mask = attn.clone()
    loss_mask[:, :2] = 0  # a 2-token "prompt"
    return RolloutBatch(
        input_ids=ids * attn.long(),
        attention_mask=attn,
        loss_mask=loss_mask,
        old_logprobs=-torch.rand(B, T, generator=g) * loss_mask,  # off-policy: ratios ≠ 1, some clipped
        advantages=torch.randn(B, T, generator=g) * loss_mask,
    )


def _step(aggregation, dp=None, micro_batch_tokens=8192):
    model = _model()
    algo = algorithms.get("grpo")
    cfg = algo.Config(kl_coef=0.0, aggregation=aggregation)
    trainer = Trainer(model, OptimConfig(lr=1e-2, grad_clip=0.0, micro_batch_tokens=micro_batch_tokens), 10)
    trainer.dp = dp
    metrics = trainer.step(_batch(), policy_loss_fn(algo, cfg, 1.0))
    return {n: p.grad.clone() for n, p in model.named_parameters()}, metrics


AGGREGATIONS = ["token-mean", "seq-mean-token-mean"]


def _rank(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        res = {a: _step(a, DataParallel(), micro_batch_tokens=24) for a in AGGREGATIONS}  # + accumulation
        if rank == 0:
            torch.save(res, out)
        dist.barrier()  # no rank closes its gloo pairs while another still talks over them
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_gloo_ranks_give_the_gradient_of_one(tmp_path):
    out = tmp_path / "rank0.pt"
    mp.spawn(_rank, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    ranks = torch.load(out)
    for aggregation in AGGREGATIONS:
        one_grads, one = _step(aggregation)
        two_grads, two = ranks[aggregation]
        # an extra all-reduce, a mean over ranks or a per-rank normaliser would be off by ~×2
        assert max(float((two_grads[n] - g).abs().max()) for n, g in one_grads.items()) <= 1e-6
        assert max(float(g.abs().max()) for g in one_grads.values()) > 1e-3
        assert two["loss"] == pytest.approx(one["loss"], abs=1e-6)
        assert two["clip/frac"] == pytest.approx(one["clip/frac"], abs=1e-6)
        assert one["clip/frac"] > 0  # the clip branch was exercised


def test_data_parallel_needs_an_initialised_group():
    from posttrain import UsageError

    with pytest.raises(UsageError, match="torch.distributed"):
        DataParallel()
