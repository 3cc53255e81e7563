"""optim.compile (framework/compiled.py, issue 33 part 2): the compiled trunk, or its compiled
blocks, give the eager losses and gradients (≤1e-5 in fp32) through the trainer's GRPO step, compile
a bounded number of graphs over steps whose micro-batch widths all differ (blocks: as many for 4
layers as for 1), and the keys' values are checked in one line.

Inductor on the CPU generates and compiles C++: about a minute a graph of the trunk, cold, on CI's
two loaded cores, so its exactness (gpt_mini) is in the slow lane. What dynamo decides
(graphs, guards, recompiles) does not depend on the backend: the counts and the Hugging Face paths
(LoRA, gradient checkpointing, packing) trace through `aot_eager` (dynamo and autograd's graphs, run
by eager kernels, no code generation): the counts and the blocks of a Hugging Face model (a layer
traced once) in the quick lane, its whole trunk (~3 min of tracing: padded and packed graphs) in the
slow one."""

import copy

import pytest
import torch

from posttrain import UsageError, algorithms
from posttrain.config import OptimConfig, RLConfig, SFTConfig, load_config
from posttrain.framework import compiled
from posttrain.framework.batch import map_batch, split_micro_batches, view
from posttrain.framework.compiled import blocks_of, graphs, resolve
from posttrain.framework.reference import Reference
from posttrain.framework.trainer import Trainer, policy_loss_fn
from posttrain.models.gpt_mini import GPTMini, ModelConfig

from test_packing import _grpo_batch

TOL = 1e-5
GRPO = algorithms.get("grpo")
LOSS = policy_loss_fn(GRPO, GRPO.Config(kl_coef=0.0), 1.0)


def _nano(layers=2):
    torch.manual_seed(0)
    return GPTMini(ModelConfig(preset="nano", vocab_size=40, n_layers=layers, n_kv_heads=2).resolved())


def _llama(tmp_path, layers=1):
    """A random Hugging Face Llama, one layer unless asked (dynamo's time is per layer traced)."""
    pytest.importorskip("transformers")
    from posttrain.models.hf import load_hf, write_tiny

    return load_hf(write_tiny(tmp_path / "llama", "llama", n_layers=layers, seed=1))[0]


def _step(model, batch, compile, packing=False, budget=400, scope="trunk"):
    """One trainer step on a copy of `model`: (metrics, gradients by name)."""
    model = copy.deepcopy(model).train()
    cfg = OptimConfig(
        lr=0.0, grad_clip=0.0, micro_batch_tokens=budget, packing=packing, compile=compile, compile_scope=scope
    )
    metrics = Trainer(model, cfg, 10).step(batch, LOSS)
    return metrics, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(eager, compiled_):
    (m_e, g_e), (m_c, g_c) = eager, compiled_
    for k in ("loss", "grad/norm", "entropy"):
        assert abs(m_c[k] - m_e[k]) <= TOL * max(1.0, abs(m_e[k])), k
    assert g_e.keys() == g_c.keys() and sum(float(g.abs().sum()) for g in g_e.values()) > 0
    for n, g in g_e.items():
        assert (g_c[n] - g).abs().max() <= TOL, n


def _batches(widths):
    """GRPO batches of 12 sequences cut to these widths (longer answers lose their tails)."""
    b = _grpo_batch(12)
    return [map_batch(b, lambda v, w=w: v[:, :w] if v.dim() == 2 else v) for w in widths]


def test_the_settings_are_auto_true_or_false_and_blocks_or_trunk():
    assert load_config(RLConfig, None, ["optim.compile=true"]).optim.compile is True
    assert load_config(RLConfig, None, ["optim.compile=auto"]).optim.compile == "auto"
    assert load_config(SFTConfig, None, ["optim.compile=false"]).optim.compile is False
    assert load_config(RLConfig, None, []).optim.compile is False
    assert load_config(RLConfig, None, []).optim.compile_scope == "blocks"
    assert load_config(SFTConfig, None, ["optim.compile_scope=trunk"]).optim.compile_scope == "trunk"
    with pytest.raises(UsageError, match=r"optim.compile='sometimes': .* auto, true or false"):
        load_config(RLConfig, None, ["optim.compile=sometimes"])
    with pytest.raises(UsageError, match=r"optim.compile_scope='layers': use one of \['blocks', 'trunk'\]"):
        load_config(RLConfig, None, ["optim.compile_scope=layers"])
    assert [resolve("auto", d) for d in ("cpu", "cuda", "cuda:1")] == ["", "blocks", "blocks"]
    assert resolve(True, "cpu", "trunk") == "trunk" and resolve(False, "cuda") == ""
    with pytest.raises(UsageError, match="optim.compile"):
        Trainer(_nano(), OptimConfig(compile="yes"), 10)  # from Python, without the config's check
    with pytest.raises(UsageError, match=r"optim.compile_scope='layer' is unknown; use one of \['blocks', 'trunk'\]"):
        Trainer(_nano(), OptimConfig(compile=True, compile_scope="layer"), 10)
    with pytest.raises(UsageError, match="has no repeated blocks .* use optim.compile_scope=trunk"):
        blocks_of(torch.nn.Linear(2, 2))
    assert blocks_of(_nano(layers=3)) is not None and len(blocks_of(_nano(layers=3))) == 3


def test_graphs_are_compiled_once_per_kind_of_forward_whatever_the_widths(monkeypatch):
    """Expected graphs, each compiled once (framework/compiled.py): the trainer's padded forward
    with gradient (1), the reference's without (1), packed rows with gradient (1); a micro-batch of
    one row would add its own, so every micro-batch here has at least two. Six steps of six widths."""
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    model = _nano(layers=1)  # dynamo's time is per layer traced
    batches = _batches([18, 11, 15, 9, 13, 16])
    micro = [mb for b in batches for p in (False, True) for mb in split_micro_batches(b, 400, packed=p)]
    assert len({view(mb)["input_ids"].shape[1] for mb in micro}) >= 6
    assert all(len(view(mb)["input_ids"]) >= 2 for mb in micro)
    start = graphs()
    for b in batches:
        _step(model, b, True)
    assert graphs() - start == 1  # the first step's, reused by the other five
    ref = Reference(model, compile="trunk")
    for b in batches:
        ref.score(b, 400)
    assert graphs() - start == 2  # + the reference's no-grad graph
    for b in batches:
        _step(model, b, True, packing=True)
    assert graphs() - start == 3  # + packed rows (positions, a block mask)


def test_the_blocks_of_every_layer_share_graphs_and_recompute_compiled_inside_checkpoints(monkeypatch):
    """compile_scope=blocks on 4 checkpointed layers, steps as in the test above: the same 3 graphs
    (every layer reuses its block's), the first padded and packed steps equal eager's, and every
    block runs compiled twice a micro-batch with gradient, in the forward and in backward's recompute
    (gpt_mini checkpoints around the block's call: framework/compiled.py), once without."""
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    calls: list[bool] = []  # with gradient or not, a call of a compiled block each
    region = compiled._region

    def counted(cls, grad, backend):
        def call(*args, **kwargs):
            calls.append(grad)
            return region(cls, grad, backend)(*args, **kwargs)

        return call

    monkeypatch.setattr(compiled, "_region", counted)
    model = _nano(layers=4)
    model.grad_checkpointing = True
    batches = _batches([18, 11, 15])  # (the widths: the test above)
    micro = sum(len(split_micro_batches(b, 400)) for b in batches)
    start = graphs()
    for i, b in enumerate(batches):
        got = _step(model, b, True, scope="blocks")
        if i == 0:
            _assert_same(_step(model, b, False), got)
    assert graphs() - start == 1
    assert calls == [True] * (2 * 4 * micro)  # 4 layers × (forward + recompute) × micro-batches
    ref = Reference(model, compile="blocks")
    for b in batches:
        ref.score(b, 400)
    assert graphs() - start == 2 and calls.count(False) == 4 * micro  # no gradient: no checkpoint
    for i, b in enumerate(batches):
        got = _step(model, b, True, packing=True, scope="blocks")
        if i == 0:
            _assert_same(_step(model, b, False, packing=True), got)
    assert graphs() - start == 3


def test_hugging_face_blocks_with_lora_checkpointing_and_packing_give_the_same_gradients(tmp_path, monkeypatch):
    """Two Llama layers with LoRA adapters and gradient checkpointing (transformers checkpoints inside
    each layer's forward: the compiled block holds it) through compiled blocks: the eager losses and
    gradients, padded and packed, in 2 graphs, one a kind, both layers reusing it."""
    pytest.importorskip("peft")
    from posttrain.models.lora import LoraConfig, apply_lora

    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    model = _llama(tmp_path, layers=2)
    apply_lora(model, LoraConfig(r=4))
    model.grad_checkpointing = True
    before = graphs()
    _check(model, _grpo_batch(16), packing=True, budget=100, scope="blocks")  # padded and packed micro-batches
    assert graphs() - before == 2


@pytest.mark.slow
def test_hugging_face_lora_checkpointing_and_packing_trace_to_the_same_gradients(tmp_path, monkeypatch):
    pytest.importorskip("peft")
    from posttrain.models.lora import LoraConfig, apply_lora

    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    model = _llama(tmp_path)
    apply_lora(model, LoraConfig(r=4))
    model.grad_checkpointing = True
    before = graphs()
    _check(model, _grpo_batch(16), packing=True, budget=100)  # micro-batches of 3 and 5 rows, 8 packed in 7
    # padded and packed, each with gradient; + 1: transformers' hook that sets requires_grad on the
    # embeddings' output (LoRA with checkpointing) breaks the padded graph once, before the layers
    assert graphs() - before == 3


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["trunk", "blocks"])
def test_the_inductor_compiled_grpo_step_gives_the_eager_loss_and_gradients(scope):
    """Inductor generates C++ on the CPU (~1 min a graph of the trunk, cold, on 2 loaded cores; ~30 s
    of the block: the slow lane). gpt_mini only: the Hugging Face trunk's graphs are the tests above,
    and inductor's code for them differs in nothing this test would catch but a minute more of CI."""
    _check(_nano(), _grpo_batch(12), scope=scope)


def _check(model, batch, packing=False, budget=400, scope="trunk"):
    start = graphs()
    got = _step(model, batch, True, packing, budget, scope)
    assert graphs() > start  # the trunk did go through the compiler
    _assert_same(_step(model, batch, False, packing, budget), got)


@pytest.mark.parametrize("scope", ["trunk", "blocks"])
def test_the_compiled_reference_reads_packed_rows_through_a_flex_block_mask(scope, monkeypatch):
    """A packed micro-batch's flex BlockMask (models/attention.py) goes into the compiled trunk or
    blocks as it is (only tensors are copied): the reference's scores equal the eager dense-mask ones ≤1e-5."""
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    model = _nano(layers=1)
    batch = _grpo_batch(12)
    dense = Reference(model, packing=True).score(batch, 400)
    model.packing_attention = "flex"  # eager flex on the CPU: forward only, as the reference needs
    start = graphs()
    flex = Reference(model, packing=True, compile=scope).score(batch, 400)
    assert graphs() > start and dense.abs().sum() > 0
    assert (flex - dense).abs().max() <= TOL
