"""Micro-batches sized for the device (issue 43): the split's fixed cost of a micro-batch per device
(framework/batch.micro_batch_cost), and `optim.micro_batch_tokens=auto`, the largest budgets the run's
own memory prediction fits under the card (sizing/run_memory.auto_budgets), by hand on a CUDA-sized
card; the CPU keeps the numbers from before auto (8192, the reference 16,384)."""

import dataclasses

import pytest
import torch

from posttrain import UsageError
from posttrain.config import OptimConfig, PretrainConfig, RLConfig, load_config
from posttrain.framework.batch import _length_groups, budgets, micro_batch_cost, split_micro_batches
from posttrain.framework.reference import Reference
from posttrain.framework.trainer import Trainer
from posttrain.runtime import MicroBatches, Runtime
from posttrain.sizing.run_memory import AUTO_HEADROOM, AUTO_MAX_TOKENS, auto_budgets, predict_run_peak
from posttrain.sizing.shapes import ModelShape, count_params

SHAPE = ModelShape("hand", 64, 2, 4, 4, 128, 1000, tie_embeddings=True)  # d, layers, heads, kv heads, ff, vocab
CUDA = {"device": "cuda", "compute_dtype": "float32", "hf": False}  # fp32: the hand count below is 4 B a value


def test_a_micro_batch_costs_what_its_device_says():
    """128 tokens on the CPU (its launches), 16,384 on CUDA (issue 43's H200: ~220 ms fixed a
    micro-batch); a test's fakegpu is priced as the CPU, so its runs split as the CPU's."""
    assert micro_batch_cost("cpu") == 128 and micro_batch_cost(torch.device("cuda", 0)) == 16384
    assert micro_batch_cost("meta") == 128
    # the DP by hand: widths 100, 100, 20 × 4 under a budget of 1000. One group: 6·100 + c; two:
    # 2·100 + 4·20 + 2c. The CPU's c = 128 splits (536 < 728), CUDA's keeps one (16,984 < 33,048)
    widths = [100, 100, 20, 20, 20, 20]
    assert _length_groups(widths, 1000, 1, 128) == [(0, 2), (2, 6)]
    assert _length_groups(widths, 1000, 1, 16384) == [(0, 6)]
    mask = torch.zeros(6, 100)
    for i, w in enumerate(widths):
        mask[i, :w] = 1
    assert len(split_micro_batches({"attention_mask": mask}, 1000)) == 2  # on the CPU


def test_the_setting_as_the_forwards_read_it():
    assert OptimConfig().micro_batch_tokens == "auto" and RLConfig().optim.micro_batch_tokens == "auto"
    assert budgets("auto") == MicroBatches(train=8192, score=8192, reference=16384)  # before auto: the CPU's
    assert budgets(512) == MicroBatches(train=512, score=512, reference=16384)  # a number: the trainer's
    rt = Runtime(torch.device("cpu"), torch.float32, torch.float32, MicroBatches(4096, 9000, 20000))
    assert budgets("auto", rt) == MicroBatches(4096, 9000, 20000) and budgets(300, rt).train == 300
    trainer = Trainer(torch.nn.Linear(2, 2), OptimConfig(), 1, rt)
    assert trainer.budgets.train == 4096
    assert load_config(RLConfig, None, ["optim.micro_batch_tokens=1024"]).optim.micro_batch_tokens == 1024
    with pytest.raises(UsageError, match=r"^optim.micro_batch_tokens=0: the micro-batch token budget is auto or"):
        load_config(RLConfig, None, ["optim.micro_batch_tokens=0"])
    with pytest.raises(UsageError, match="micro-batch token budget is auto or a number"):
        load_config(RLConfig, None, ["optim.micro_batch_tokens=max"])


def test_the_reference_scores_by_the_run_s_reference_budget(monkeypatch):
    import posttrain.framework.reference as reference

    seen = []
    monkeypatch.setattr(reference, "score_logprobs", lambda model, batch, t, tokens, *a: seen.append(tokens))
    rt = Runtime(torch.device("cpu"), torch.float32, torch.float32)
    ref = Reference(torch.nn.Linear(2, 2), runtime=rt)
    ref.score({})
    rt.micro_batches = MicroBatches(4096, 9000, 20000)
    ref.score({})
    ref.score({}, 77)
    assert seen == [16384, 20000, 77]


def _pretrain(rows: int, **over):
    cfg = load_config(PretrainConfig, None, [f"batch_size={rows}", "seq_len=64"])
    return dataclasses.replace(cfg, **over) if over else cfg


def test_auto_fits_the_trainer_under_the_card_by_hand():
    """Pretraining, 256 rows of 64 tokens, a 146,240-parameter model in fp32 on a card of 302 MB:
    persistent 12·P (weights, Adam m and v) = 1,754,880 B; a micro-batch of k rows (64k tokens) holds
    11,060 B a token (2 layers × 4·(4·64 + 4·64 + 4·64 + 4·128 + 4 + 2) saved + 12·64 + 4) and 6
    copies of its logit chunk (64k × 1000 logits × 4 B): 2,243,840·k B. 1,754,880 + 2,243,840·k ≤
    0.75 × 302,000,000 up to k = 100: 6,400 tokens. No pass without gradient: the whole step."""
    P = count_params(SHAPE)
    assert P == 1000 * 64 + 2 * (64 * 64 * 4 + 3 * 64 * 128 + 2 * 64) + 64 == 146_240
    b = auto_budgets(_pretrain(256), "pretrain", SHAPE, capacity=302_000_000, seq_len=64, **CUDA)
    assert b == {"train": 6400, "score": 16384, "reference": 16384}
    est = predict_run_peak(_pretrain(256), "pretrain", SHAPE, seq_len=64, capacity=302_000_000, **CUDA)
    assert est["budgets"] == b and est["micro_batch_tokens"] == 6400
    assert est["tensor_bytes"] == 1_754_880 + 2_243_840 * 100 <= (1 - AUTO_HEADROOM) * 302_000_000
    # a card where one row does not fit: one row (the peak it has there), not less
    assert auto_budgets(_pretrain(256), "pretrain", SHAPE, capacity=1e6, seq_len=64, **CUDA)["train"] == 64
    # a card with room for everything: the whole step (16,384), or AUTO_MAX_TOKENS of a longer one
    assert auto_budgets(_pretrain(256), "pretrain", SHAPE, capacity=1e12, seq_len=64, **CUDA)["train"] == 16384
    assert auto_budgets(_pretrain(2048), "pretrain", SHAPE, capacity=1e12, seq_len=64, **CUDA)["train"] == 65536
    assert AUTO_MAX_TOKENS == 4 * micro_batch_cost("cuda")  # the fixed cost at most a fifth of a micro-batch


def test_auto_on_the_cpu_or_without_a_card_is_the_numbers_from_before():
    cpu = predict_run_peak(_pretrain(256), "pretrain", SHAPE, seq_len=64, capacity=302_000_000)
    assert cpu["budgets"] == {"train": 8192, "score": 8192, "reference": 16384} and cpu["micro_batch_tokens"] == 8192
    unknown = predict_run_peak(_pretrain(256), "pretrain", SHAPE, seq_len=64, **CUDA)  # no card given
    assert unknown["budgets"]["train"] == 8192
    n = _pretrain(256)
    n.optim.micro_batch_tokens = 640
    given = predict_run_peak(n, "pretrain", SHAPE, seq_len=64, capacity=302_000_000, **CUDA)
    assert given["budgets"] == {"train": 640, "score": 640, "reference": 16384}


def test_auto_rl_budgets_are_the_largest_that_fit():
    """An RL run (the reference on, 128 rows of 300 tokens, bf16 on a Qwen2.5-0.5B-like shape) on
    cards of 24 and 80 GiB: the trainer's budget fits and one more row does not; the reference's, sized
    after it, the same (or the whole step)."""
    shape = ModelShape("half-b", 896, 24, 14, 2, 4864, 151936, tie_embeddings=True, qkv_bias=True)
    cfg = load_config(RLConfig, None, ["rollout.prompts_per_step=16", "rollout.samples_per_prompt=8"])
    cfg.rollout.max_new_tokens = 256
    where = {"device": "cuda", "compute_dtype": "bfloat16", "hf": True, "prompt_len": 44}
    step = 128 * 300
    for gib in (24, 80):
        cap = gib * 2**30
        b = auto_budgets(cfg, "rl", shape, capacity=cap, seq_len=300, **where)

        def tensors(train, ref):
            got = {"train": train, "score": ref, "reference": ref}
            return predict_run_peak(cfg, "rl", shape, seq_len=300, budgets=got, **where)["tensor_bytes"]

        assert b["train"] % 300 == 0 and b["score"] == b["reference"]
        assert tensors(b["train"], 300) <= 0.75 * cap < tensors(b["train"] + 300, 300)
        assert tensors(b["train"], b["reference"]) <= 0.75 * cap
        assert b["reference"] == step or tensors(b["train"], b["reference"] + 300) > 0.75 * cap
    assert auto_budgets(cfg, "rl", shape, capacity=24 * 2**30, seq_len=300, **where)["train"] < b["train"]


def test_a_run_resolves_auto_once_its_memory_is_predicted(tmp_path):
    """recipes/common.predict_memory puts the budgets on the run's runtime, where the trainer and the
    reference read them; on the CPU they are the numbers from before auto, and nothing is resolved for
    a number the config gives."""
    from posttrain.models.gpt_mini import GPTMini, ModelConfig
    from posttrain.recipes.common import Run, predict_memory

    model = GPTMini(ModelConfig(preset="nano").resolved(60))
    r = Run(load_config(PretrainConfig, None, [f"out={tmp_path}/a", "device=cpu"]), "pretrain")
    predict_memory(r, "pretrain", model, 96)
    assert r.rt.micro_batches == MicroBatches() and r.predicted_peak["budgets"]["train"] == 8192
    r = Run(
        load_config(PretrainConfig, None, [f"out={tmp_path}/b", "device=cpu", "optim.micro_batch_tokens=96"]),
        "pretrain",
    )
    predict_memory(r, "pretrain", model, 96)
    assert r.rt.micro_batches is None and r.predicted_peak["micro_batch_tokens"] == 96
