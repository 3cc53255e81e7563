"""Packed micro-batches (framework/packing.py, issue 33): the plan by hand, and the same per-token
logprobs, losses and gradients as the padded forward (≤1e-5 in fp32) for gpt_mini and random
Hugging Face Llama / Qwen2 models, through every trainer path that reads logprobs (GRPO's
policy loss, SFT's next-token loss, DPO's pairs) and the reference's scores."""

import copy
import dataclasses

import pytest
import torch

from posttrain import UsageError, algorithms
from posttrain.config import OptimConfig, RLConfig, load_config
from posttrain.framework.batch import MICRO_BATCH_COST_TOKENS, RolloutBatch, collate, split_micro_batches, view
from posttrain.framework.logprobs import micro_logprobs, sequence_logprobs
from posttrain.framework.packing import Packed, computed_tokens, first_fit, pack_index, packed_shape, plan_groups
from posttrain.framework.reference import score_logprobs
from posttrain.framework.trainer import Trainer, policy_loss_fn
from posttrain.models.gpt_mini import GPTMini, ModelConfig
from posttrain.preference.dpo import DPOLossConfig
from posttrain.recipes.common import lm_loss
from posttrain.recipes.dpo import dpo_loss_fn

TOL = 1e-5


def test_first_fit_decreasing_and_the_plan_by_hand():
    # lengths 6, 4, 3, 2 into rows of 8: 6 → row 0; 4 → row 1; 3 → row 1 after 4; 2 → row 0 after 6
    assert first_fit([6, 4, 3, 2], 8) == [(0, 0), (1, 0), (1, 4), (0, 6)]
    mask = collate([[1] * 6, [1] * 3, [1] * 2, [1] * 4], [[]] * 4, 0)["attention_mask"]  # rows of 6, 3, 2, 4
    index = pack_index(mask)  # [4, 6, 2]: packed rows of width 6: 6 | 4 + 2 | 3
    flat = torch.where(index[..., 0] >= 0, index[..., 0] * 6 + index[..., 1], -1)
    assert flat[0].tolist() == [0, 1, 2, 3, 4, 5]
    assert flat[3].tolist() == [6, 7, 8, 9, -1, -1]  # the 4 opens row 1
    assert flat[2].tolist() == [10, 11, -1, -1, -1, -1]  # the 2 fills it
    assert flat[1].tolist() == [12, 13, 14, -1, -1, -1]  # the 3 does not fit: row 2
    assert computed_tokens({"attention_mask": mask, "pack_index": index}) == 18  # 3 rows × 6, not 4 × 6
    wide = pack_index(mask, width=9)  # rows of 9: 6 + 3 | 4 + 2, the fullest row 9 wide
    assert wide[1, :3].tolist() == [[0, 6], [0, 7], [0, 8]] and wide[2, :2].tolist() == [[1, 4], [1, 5]]
    assert computed_tokens({"attention_mask": mask, "pack_index": wide}) == 18  # 2 rows × 9
    assert plan_groups([6, 3, 2, 4], 18, cost=100, width=9) == [[0, 3, 1, 2]]
    # the fewest micro-batches within 6 computed tokens: 6 | 4 | 3 and 2 in 2 rows of 3
    assert plan_groups([6, 3, 2, 4], 6, cost=100) == [[0], [3], [1, 2]]
    assert plan_groups([6, 3, 2, 4], 100, cost=100) == [[0, 3, 1, 2]]
    assert plan_groups([6, 3, 2, 4], 12, unit=2, cost=100) == [[0], [1]]  # pairs (6, 3) and (2, 4) stay whole


def packed_rows(lengths, width):
    """The rows first-fit decreasing fills with these lengths at this width."""
    return len({row for row, _ in first_fit(sorted(lengths, reverse=True), width)})


def _brute(lengths, max_tokens, cost):
    """The least Σ rows·width + cost over every cut of the sorted units into consecutive groups."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    best = {0: 0.0}
    for b in range(1, len(order) + 1):
        sizes = [
            (a, packed_rows([lengths[i] for i in order[a:b]], lengths[order[a]]) * lengths[order[a]]) for a in range(b)
        ]
        best[b] = min(best[a] + s + cost for a, s in sizes if b - a == 1 or s <= max_tokens)
    return best[len(order)]


def test_the_plan_is_the_cheapest_and_never_computes_more_than_padding():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        lengths = torch.randint(1, 30, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist()
        budget, cost = int(torch.randint(20, 120, (1,), generator=g)), int(torch.randint(0, 40, (1,), generator=g))
        groups = plan_groups(lengths, budget, cost=cost)
        sizes = [
            packed_rows([lengths[i] for i in grp], max(lengths[i] for i in grp)) * max(lengths[i] for i in grp)
            for grp in groups
        ]
        assert sum(sizes) + cost * len(groups) == _brute(lengths, budget, cost)
        mask = collate([[7] * n for n in lengths], [[]] * len(lengths), 0)["attention_mask"]
        packed, padded = (split_micro_batches({"attention_mask": mask}, budget, packed=p) for p in (True, False))
        assert sum(computed_tokens(mb) + MICRO_BATCH_COST_TOKENS for mb in packed) <= sum(
            computed_tokens(mb) + MICRO_BATCH_COST_TOKENS for mb in padded
        )


def test_packed_rows_restart_positions_and_never_attend_across():
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0], [11, 12, 0, 0]])
    index = pack_index((ids > 0).float())
    p = Packed.build(ids, index)
    assert p.ids.tolist() == [[5, 6, 7, 8], [9, 10, 11, 12]]
    assert p.positions.tolist() == [[0, 1, 2, 3], [0, 1, 0, 1]]
    row1 = p.mask[1, 0].int().tolist()
    assert row1 == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]  # two causal blocks
    lp = torch.arange(8.0).view(2, 4) + 1  # packed outputs, aligned as logprobs
    assert p.unpack(lp).tolist() == [[0, 2, 3, 4], [0, 6, 0, 0], [0, 8, 0, 0]]  # column 0 and padding: 0


def test_a_row_tail_is_its_own_block():
    ids = torch.tensor([[5, 6, 7], [8, 0, 0]])
    p = Packed.build(ids, pack_index((ids > 0).float()))
    assert p.ids.tolist() == [[5, 6, 7], [8, 0, 0]] and p.positions[1].tolist() == [0, 0, 1]
    assert p.mask[1, 0].int().tolist() == [[1, 0, 0], [0, 1, 0], [0, 1, 1]]  # every query sees a key: no NaN


def _lengths_batch(n=10, seed=0, vocab=40):
    """Prompts of 3-6 tokens and answers of 1-14: a realistic spread, most far from the cap."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(6, vocab, (int(torch.randint(3, 7, (1,), generator=g)),), generator=g) for _ in range(n)]
    answers = [torch.randint(6, vocab, (int(torch.randint(1, 15, (1,), generator=g)),), generator=g) for _ in range(n)]
    return collate([p.tolist() for p in prompts], [a.tolist() for a in answers], 0)


def _hf(arch, tmp_path):
    pytest.importorskip("transformers")
    from posttrain.models.hf import load_hf, write_tiny

    return load_hf(write_tiny(tmp_path / arch, arch, seed=1))[0]


def _models(tmp_path):
    torch.manual_seed(0)
    gqa = GPTMini(ModelConfig(preset="nano", vocab_size=40, n_kv_heads=2).resolved())
    return {"gpt_mini": gqa, "llama": _hf("llama", tmp_path), "qwen2": _hf("qwen2", tmp_path)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return _models(tmp_path_factory.mktemp("packing"))


@pytest.mark.parametrize("name", ["gpt_mini", "llama", "qwen2"])
def test_packed_logprobs_and_entropy_equal_padded(models, name):
    model = models[name].eval()
    batch = _lengths_batch(16)
    mbs = split_micro_batches(batch, 80, packed=True)
    assert len(mbs) > 1 and any("pack_index" in mb for mb in mbs)  # some share rows (the others run padded)
    for mb in mbs:
        real = mb["attention_mask"].bool()  # [b, w]
        with torch.no_grad():
            lp, ent = micro_logprobs(model, mb, 0.7, with_entropy=True)
            want_lp, want_ent = sequence_logprobs(model, mb["input_ids"], 0.7, with_entropy=True)
        if "pack_index" in mb:
            assert packed_shape(mb["pack_index"])[0] < len(real)  # fewer rows than sequences
            assert (lp[~real] == 0).all() and (ent[~real] == 0).all()
        assert (lp[real] - want_lp[real]).abs().max() <= TOL and (ent[real] - want_ent[real]).abs().max() <= TOL
    packed = score_logprobs(model, batch, 0.7, 80, packed=True)  # the reference's scores
    assert (packed - score_logprobs(model, batch, 0.7, 80)).abs().max() <= TOL and packed.abs().sum() > 0


def _grpo_batch(n=16):
    b = _lengths_batch(n, seed=1)
    g = torch.Generator().manual_seed(2)
    mask = b["loss_mask"]
    old = (-torch.rand(mask.shape, generator=g) * 3) * mask  # behaviour logprobs
    adv = torch.randn(n, 1, generator=g) * mask
    return RolloutBatch(**b, old_logprobs=old, advantages=adv)


def _sft_loss(model, mb, norm):
    return lm_loss(model, mb, norm)


def _step(model, batch, loss_fn, packing, budget, unit=1):
    model = copy.deepcopy(model).train()
    trainer = Trainer(model, OptimConfig(lr=0.0, grad_clip=0.0, micro_batch_tokens=budget, packing=packing), 10)
    metrics = trainer.step(batch, loss_fn, unit=unit)
    return metrics, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["gpt_mini", "llama", "qwen2"])
@pytest.mark.parametrize("stage", ["grpo", "sft", "dpo"])
def test_packed_training_gives_the_padded_losses_and_gradients(models, name, stage):
    algo = algorithms.get("grpo")
    if stage == "grpo":
        batch, fn, unit = _grpo_batch(), policy_loss_fn(algo, algo.Config(kl_coef=0.0), 1.0), 1
    elif stage == "sft":
        batch, fn, unit = _lengths_batch(16, seed=3), _sft_loss, 1
    else:
        b = _lengths_batch(16, seed=4)
        batch, fn, unit = {**b, "ref_logps": -torch.rand(16) * 20}, dpo_loss_fn(DPOLossConfig()), 2
    padded, g_padded = _step(models[name], batch, fn, False, 100, unit)
    packed, g_packed = _step(models[name], batch, fn, True, 100, unit)
    assert packed["train/padded_tokens"] < padded["train/padded_tokens"]  # fewer computed tokens
    assert packed["train/tokens"] == padded["train/tokens"]
    for k in ("loss", "grad/norm", "mismatch/logprob_abs", "entropy", "train/nll"):  # not grouping-weighted
        if k in padded:
            assert abs(packed[k] - padded[k]) <= TOL * max(1.0, abs(padded[k])), k
    assert g_padded.keys() == g_packed.keys() and sum(g.abs().sum() for g in g_padded.values()) > 0
    for n, g in g_padded.items():
        assert (g_packed[n] - g).abs().max() <= TOL, n


@pytest.mark.parametrize("name", ["gpt_mini", "llama"])
def test_wide_packed_rows_give_the_padded_gradients(models, name):
    """Rows of 48 tokens (more than twice the longest sequence): several sequences a row."""
    algo = algorithms.get("grpo")
    batch, fn = _grpo_batch(), policy_loss_fn(algo, algo.Config(kl_coef=0.0), 1.0)
    padded, want = _step(models[name], batch, fn, False, 100)
    model = copy.deepcopy(models[name]).train()
    cfg = OptimConfig(lr=0.0, grad_clip=0.0, micro_batch_tokens=100, packing=True, packing_width=48)
    packed = Trainer(model, cfg, 10).step(batch, fn)
    assert packed["train/padded_tokens"] < padded["train/padded_tokens"]
    assert abs(packed["loss"] - padded["loss"]) <= TOL
    for n, g in want.items():
        assert (model.get_parameter(n).grad - g).abs().max() <= TOL, n


@pytest.mark.parametrize("name", ["gpt_mini", "llama"])
def test_packing_with_grad_checkpointing_gives_the_same_gradient(models, name):
    batch, fn = _lengths_batch(seed=5), _sft_loss
    model = copy.deepcopy(models[name])
    _, want = _step(model, batch, fn, True, 60)
    model.grad_checkpointing = True
    _, got = _step(model, batch, fn, True, 60)
    assert all((got[n] - g).abs().max() <= 1e-6 for n, g in want.items())


def test_packing_is_a_boolean_config_key():
    assert load_config(RLConfig, None, ["optim.packing=true"]).optim.packing is True
    with pytest.raises(UsageError, match="optim.packing"):
        load_config(RLConfig, None, ["optim.packing=sometimes"])
    with pytest.raises(UsageError, match="packing_width"):
        load_config(RLConfig, None, ["optim.packing_width=-1"])


def test_packed_micro_batches_keep_the_budget_and_every_row_once():
    batch = _lengths_batch(24, seed=6)
    for budget, unit in ((40, 1), (64, 2), (1, 1)):
        mbs = split_micro_batches(batch, budget, unit, packed=True)
        rows = torch.cat([mb["row_index"] for mb in mbs]).sort().values
        assert rows.tolist() == list(range(24))
        for mb in mbs:
            assert computed_tokens(mb) <= budget or mb["input_ids"].shape[0] == unit
            if unit == 2:
                assert (mb["row_index"][0::2] + 1 == mb["row_index"][1::2]).all()  # pairs together
    assert dataclasses.fields(RolloutBatch)[-1].name == "pack_index"


def test_the_sampler_trainer_mismatch_stays_at_the_padded_level():
    """The built-in engine's behaviour logprobs against the packed trainer's: the same ~1e-7 as padded."""
    from posttrain.algorithms.core import batch_norm
    from posttrain.framework.batch import collate_samples
    from posttrain.framework.rollout import Engine, SamplingParams
    from posttrain.models.tokenizer import CharTokenizer

    tok = CharTokenizer()
    torch.manual_seed(0)
    model = GPTMini(ModelConfig(preset="nano").resolved(tok.vocab_size))
    prompts = [tok.encode(tok.chat_prompt(q)) for q in ("12+3", "4+56+7", "1+1")]
    samples = Engine(model, tok, max_slots=8).generate(prompts, 4, SamplingParams(max_new_tokens=12), seed=2)
    batch = collate_samples(samples, tok.pad_id)
    algo = algorithms.get("grpo")
    batch = dataclasses.replace(batch, advantages=torch.randn(len(samples), 1) * batch.loss_mask)
    norm = batch_norm(batch.loss_mask, batch.loss_mask.shape[1])
    fn = policy_loss_fn(algo, algo.Config(kl_coef=0.0), 1.0)
    mismatch = {}
    for packed in (False, True):
        mbs = split_micro_batches(batch, 10_000, packed=packed, pack_width=96)  # rows of 96: several samples each
        assert len(mbs) == 1 and ("pack_index" in view(mbs[0])) == packed
        mismatch[packed] = fn(model, mbs[0], norm)[1]["mismatch/logprob_abs"]
    assert mismatch[False] < 1e-6 and mismatch[True] < 1e-6


def test_an_rl_run_packed_learns_the_padded_step(sft_ckpt, tmp_path):
    """Through the recipe (reference on: KL 0.01): step 1 samples the same batch both ways, and
    its loss, KL and gradient norm agree; the packed trainer computed fewer tokens."""
    from posttrain.logging import read_metrics
    from posttrain.recipes import rl

    from conftest import TINY_TASK

    common = [f"init={sft_ckpt}", "prompts_per_step=2", "samples_per_prompt=4", "steps=1", "eval_every=0"]
    common += ["eval_problems=0", "device=cpu", "threads=1", *TINY_TASK]
    rows = {}
    for packed in ("false", "true"):
        rl.run(load_config(RLConfig, None, [f"out={tmp_path}/{packed}", f"optim.packing={packed}", *common]))
        rows[packed] = read_metrics(tmp_path / packed)[-1]
    off, on = rows["false"], rows["true"]
    assert off["rollout/generated_tokens"] == on["rollout/generated_tokens"]
    for k in ("loss", "grad/norm", "kl/ref", "mismatch/logprob_abs"):
        assert abs(on[k] - off[k]) <= TOL * max(1.0, abs(off[k])), k
    assert on["train/padded_tokens"] <= off["train/padded_tokens"]


@pytest.mark.parametrize("critic", ["shared", "separate"])
def test_ppo_packed_gives_the_padded_policy_and_value_gradients(critic):
    """PPO's one forward (logprobs, entropy and values with gradient) on packed rows."""
    from posttrain.algorithms import ppo
    from posttrain.models.heads import ActorCritic

    torch.manual_seed(0)
    ac = ActorCritic(GPTMini(ModelConfig(preset="nano", vocab_size=40).resolved()), critic)
    torch.nn.init.normal_(ac.value_head.proj.weight, 0.0, 0.1)  # V ≠ 0, so the value loss reaches the trunk
    b = _grpo_batch()
    g = torch.Generator().manual_seed(3)
    values, returns = (torch.randn(b.loss_mask.shape, generator=g) * b.loss_mask for _ in range(2))
    batch = dataclasses.replace(b, values=values, returns=returns)
    fn = policy_loss_fn(ppo, ppo.Config(), 1.0)
    padded, want = _step(ac, batch, fn, False, 100)
    packed, got = _step(ac, batch, fn, True, 100)
    assert packed["train/padded_tokens"] < padded["train/padded_tokens"]
    assert abs(packed["loss"] - padded["loss"]) <= TOL and want.keys() == got.keys()
    assert any("value_head" in n for n in want) and all((got[n] - g).abs().max() <= TOL for n, g in want.items())


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gpt_mini", "llama"])
def test_packed_logprobs_equal_padded_on_cuda(models, name):
    """The same comparison on the card, fp32 (SDPA takes its masked kernel there)."""
    model = copy.deepcopy(models[name]).cuda().eval()
    batch = {k: v.cuda() for k, v in _lengths_batch(16).items()}
    for mb in split_micro_batches(batch, 80, packed=True):
        real = mb["attention_mask"].bool()
        with torch.no_grad():
            lp, _ = micro_logprobs(model, mb)
            want, _ = sequence_logprobs(model, mb["input_ids"])
        assert (lp[real] - want[real]).abs().max() <= 1e-4
