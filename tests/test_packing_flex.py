"""Packed rows through flex attention (models/attention.py, issue 33): the BlockMask skips the tiles
no query of a sequence sees, by hand; it gives the dense mask's and the padded forward's logprobs
(≤1e-5 fp32) for gpt_mini (GQA) and random Hugging Face Llama / Qwen2 models, through torch's eager
flex on the CPU (forward only: flex has no backward there); the knob's values and its refusals.
Training through compiled flex is compared on CUDA (@pytest.mark.gpu)."""

import copy
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from posttrain import UsageError, algorithms
from posttrain.config import OptimConfig, RLConfig, SFTConfig, load_config
from posttrain.framework.batch import split_micro_batches, to_device
from posttrain.framework.logprobs import micro_logprobs, sequence_logprobs
from posttrain.framework.packing import Packed, pack_index
from posttrain.framework.reference import score_logprobs
from posttrain.framework.trainer import Trainer, policy_loss_fn
from posttrain.models import attention
from posttrain.models.attention import document_mask

from test_packing import TOL, _grpo_batch, _lengths_batch, models  # noqa: F401  (models: the module fixture)


@pytest.fixture(autouse=True)
def _eager_flex_is_expected():
    with warnings.catch_warnings():  # torch warns that eager flex is its slow reference: here it is the point
        warnings.filterwarnings("ignore", message=".*flex_attention.*")
        yield


def test_the_block_mask_skips_the_tiles_no_query_sees():
    # one row of 8 tokens, two sequences of 4, tiles of 2 × 2: a 4 × 4 grid of tiles
    seq_id = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]])
    m = document_mask(seq_id, "flex", block=2)
    assert isinstance(m, BlockMask)
    # per query tile, the key tiles computed: its own diagonal (partial) and, for the second tile of
    # a sequence, the sequence's first tile (full); nothing across the sequences
    assert m.kv_num_blocks[0, 0].tolist() == [1, 1, 1, 1] and m.full_kv_num_blocks[0, 0].tolist() == [0, 1, 0, 1]
    assert m.sparsity() == 100 * (1 - 6 / 16)  # 6 of 16 tiles computed; one causal sequence of 8: 10
    assert document_mask(torch.zeros(1, 8, dtype=torch.long), "flex", block=2).sparsity() == 100 * (1 - 10 / 16)
    dense = document_mask(seq_id, "dense")  # [1, 1, 8, 8]
    tiles = dense.view(1, 1, 4, 2, 4, 2).any(-1).any(-2)  # [1, 1, 4, 4]: a tile with any visible key
    assert torch.equal(m.to_dense().bool(), tiles)


def test_the_tiles_from_the_spans_are_create_block_masks():
    """document_tiles reads the sequences' spans; create_block_mask evaluates every (query, key) pair."""
    g = torch.Generator().manual_seed(0)
    for W, block in ((37, 4), (64, 16), (300, 128), (260, 8)):
        seq_id = torch.repeat_interleave(torch.randperm(W, generator=g), torch.randint(1, 30, (W,), generator=g))
        seq_id = seq_id[: 2 * W].view(2, W).clone()
        seq_id[1, W - 5 :] = -1  # a row's tail

        def same_sequence_causal(b, h, q, kv, seq_id=seq_id):
            return (seq_id[b, q] == seq_id[b, kv]) & (kv <= q)

        want = create_block_mask(same_sequence_causal, 2, None, W, W, device="cpu", BLOCK_SIZE=block)
        got = document_mask(seq_id, "flex", block)
        assert torch.equal(got.to_dense(), want.to_dense())
        assert torch.equal(got.full_kv_num_blocks, want.full_kv_num_blocks)
        assert torch.equal(got.kv_num_blocks, want.kv_num_blocks)


def test_a_packed_batch_skips_blocks_at_the_default_tile():
    """Answers of 20-60 tokens in rows of 512: most of the row's tiles are skipped."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(20, 61, (40,), generator=g).tolist()
    ids = torch.zeros(40, 60, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = 7
    p = Packed.build(ids, pack_index((ids > 0).float(), width=512), "flex")
    causal = document_mask(torch.zeros_like(p.seq_id), "flex")  # the same rows as one sequence each
    assert p.ids.shape[1] == 512 and p.mask.sparsity() > causal.sparsity() > 0
    assert torch.equal(p.seq_id[p.seq_id >= 0].unique(), torch.arange(40))


@pytest.mark.parametrize("name", ["gpt_mini", "llama", "qwen2"])
def test_flex_gives_the_dense_and_the_padded_logprobs(models, name):  # noqa: F811
    model = copy.deepcopy(models[name]).eval()
    dense = copy.deepcopy(model)
    model.packing_attention, dense.packing_attention = "flex", "dense"
    batch = _lengths_batch(16)
    mbs = [mb for mb in split_micro_batches(batch, 80, packed=True, pack_width=32) if "pack_index" in mb]
    assert mbs
    for mb in mbs:
        real = mb["attention_mask"].bool()  # [b, w]
        with torch.no_grad():
            lp, ent = micro_logprobs(model, mb, 0.7, with_entropy=True)
            d_lp, d_ent = micro_logprobs(dense, mb, 0.7, with_entropy=True)
            want_lp, want_ent = sequence_logprobs(model, mb["input_ids"], 0.7, with_entropy=True)
        assert (lp - d_lp).abs().max() <= TOL and (ent - d_ent).abs().max() <= TOL
        assert (lp[real] - want_lp[real]).abs().max() <= TOL and (ent[real] - want_ent[real]).abs().max() <= TOL
    with torch.no_grad():  # the reference's scores, as the trainer packs them
        packed = score_logprobs(model, batch, 0.7, 80, packed=True, pack_width=32)
    assert (packed - score_logprobs(model, batch, 0.7, 80)).abs().max() <= TOL and packed.abs().sum() > 0


def test_the_kernel_knob():
    assert load_config(RLConfig, None, []).optim.packing_attention == "auto"
    assert load_config(RLConfig, None, ["optim.packing_attention=flex"]).optim.packing_attention == "flex"
    with pytest.raises(
        UsageError, match=r"^optim.packing_attention='sdpa': use one of \['auto', 'dense', 'flex', 'varlen'\]"
    ):
        load_config(RLConfig, None, ["optim.packing_attention=sdpa"])
    # auto: flex only inside a compiled trunk on CUDA (eager flex: 8.52 s where padded dense took 3.60, issue 43)
    assert attention.kernel("auto", "cpu") == "dense" and attention.kernel("auto", "cuda") == "dense"
    assert attention.kernel("auto", "cuda", compiled=True) == "flex"
    assert attention.kernel("auto", "cpu", compiled=True) == "dense"
    assert attention.kernel("dense", "cuda") == "dense" and attention.check("auto", "cpu") == "auto"
    with pytest.raises(UsageError, match="flex needs CUDA"):
        attention.check("flex", "cpu")


def test_auto_asks_for_flex_only_inside_a_compiled_trunk(models, monkeypatch):  # noqa: F811
    """Logprob scoring tells the packed rows' mask whether the trunk that reads it runs compiled
    (framework/compiled.active): auto is flex there on CUDA, and dense in an eager trunk, where flex
    was slower than padded rows (issue 43); PPO's value forward (`hidden_and_values`) is never compiled."""
    import posttrain.framework.logprobs as logprobs
    import posttrain.framework.packing as packing
    from posttrain.framework.compiled import compiling

    asked = []
    monkeypatch.setattr(packing, "auto_kernel", lambda device, compiled: asked.append(compiled) or "dense")
    eager_trunk = lambda trunk, ids, positions=None, attn_mask=None: trunk.hidden(
        ids, positions=positions, attn_mask=attn_mask
    )
    monkeypatch.setattr(logprobs, "trunk_hidden", eager_trunk)  # no compile on the CPU
    model = copy.deepcopy(models["gpt_mini"]).eval()
    mb = next(
        mb for mb in split_micro_batches(_lengths_batch(16), 80, packed=True, pack_width=32) if "pack_index" in mb
    )
    with torch.no_grad():
        eager = micro_logprobs(model, mb, 1.0)[0]
        with compiling("blocks"):
            compiled = micro_logprobs(model, mb, 1.0)[0]
    assert asked == [False, True] and torch.equal(eager, compiled)
    model.packing_attention = "dense"  # a kernel named by the user is not auto's to change
    with torch.no_grad(), compiling("blocks"):
        micro_logprobs(model, mb, 1.0)
    assert asked == [False, True]


def test_a_run_carries_the_knob_to_its_model_and_refuses_flex_on_the_cpu(tmp_path):
    from posttrain.recipes.common import Run, init_model

    cfg = load_config(RLConfig, None, [f"out={tmp_path}/flex", "device=cpu", "optim.packing_attention=flex"])
    with pytest.raises(UsageError, match="optim.packing_attention=flex needs CUDA"):
        Run(cfg, "rl")
    assert not (tmp_path / "flex").exists()  # refused before the run directory is written
    cfg = load_config(SFTConfig, None, [f"out={tmp_path}/dense", "device=cpu", "optim.packing_attention=dense"])
    model, _ = init_model(cfg, "", Run(cfg, "sft"))
    assert model.packing_attention == "dense" and copy.deepcopy(model).packing_attention == "dense"


def test_hf_models_keep_sdpa_and_save_without_the_switch(models, tmp_path):  # noqa: F811
    """The "posttrain" attention function is sdpa's for every mask but a BlockMask; it is not saved."""
    from transformers import AutoConfig

    hf = models["llama"]
    assert hf.hf.config._attn_implementation == attention.HF_NAME
    ids = torch.randint(6, 40, (2, 9))
    with torch.no_grad():
        got = hf(ids)
        hf.hf.config._attn_implementation = "sdpa"
        want = hf(ids)
        hf.hf.config._attn_implementation = attention.HF_NAME
    assert torch.equal(got, want)
    hf.save(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path)._attn_implementation in (None, "sdpa", "eager")


def test_a_model_without_the_posttrain_attention_refuses_a_flex_mask(models):  # noqa: F811
    hf = copy.deepcopy(models["llama"]).eval()
    hf.hf.config._attn_implementation, hf.packing_attention = "eager", "flex"
    mb = next(mb for mb in split_micro_batches(_lengths_batch(16), 80, packed=True) if "pack_index" in mb)
    with pytest.raises(UsageError, match="attn_implementation='eager'.*optim.packing_attention=dense"):
        micro_logprobs(hf, mb)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gpt_mini", "llama"])
def test_compiled_flex_trains_as_padded_on_cuda(models, name):  # noqa: F811
    """A GRPO step on packed rows through compiled flex attention (auto on CUDA), fp32: the padded
    loss and gradients, and the dense mask's loss."""
    algo = algorithms.get("grpo")
    batch = to_device(_grpo_batch(), "cuda")
    fn = policy_loss_fn(algo, algo.Config(kl_coef=0.0), 1.0)
    out = {}
    for packing, kernel in ((False, "dense"), (True, "dense"), (True, "flex")):
        model = copy.deepcopy(models[name]).cuda().train()
        model.packing_attention = kernel
        cfg = OptimConfig(lr=0.0, grad_clip=0.0, micro_batch_tokens=100, packing=packing, packing_width=48)
        metrics = Trainer(model, cfg, 10).step(batch, fn)
        out[packing, kernel] = metrics, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    (want, g_want), (got, g_got) = out[False, "dense"], out[True, "flex"]
    assert abs(got["loss"] - want["loss"]) <= 1e-4 and abs(got["grad/norm"] - want["grad/norm"]) <= 1e-4
    assert all((g_got[n] - g).abs().max() <= 1e-4 for n, g in g_want.items())
    assert abs(out[True, "dense"][0]["loss"] - got["loss"]) <= 1e-4
