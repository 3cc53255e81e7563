"""optim.compile (framework/compiled.py, issue 33 part 2): the compiled trunk gives the eager losses and
gradients (≤1e-5 in fp32) through the trainer's GRPO step, compiles a bounded number of graphs over
steps whose micro-batch widths all differ, and the key's values are checked in one line.

Inductor on the CPU generates and compiles C++: about a minute a graph, cold, on CI's two loaded
cores, so its exactness (gpt_mini) is in the slow lane. What dynamo decides
(graphs, guards, recompiles) does not depend on the backend: the counts and the Hugging Face paths
(LoRA, gradient checkpointing, packing) trace through `aot_eager` (dynamo and autograd's graphs, run
by eager kernels, no code generation): the counts in the quick lane, the Hugging Face model (~3 min of
tracing: padded and packed graphs) in the slow one."""

import copy

import pytest
import torch

from posttrain import UsageError, algorithms
from posttrain.config import OptimConfig, RLConfig, SFTConfig, load_config
from posttrain.framework import compiled
from posttrain.framework.batch import map_batch, split_micro_batches, view
from posttrain.framework.compiled import graphs, resolve
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


def _llama(tmp_path):
    """A random one-layer Hugging Face Llama (dynamo's time is per layer traced)."""
    pytest.importorskip("transformers")
    from posttrain.models.hf import load_hf, write_tiny

    return load_hf(write_tiny(tmp_path / "llama", "llama", n_layers=1, seed=1))[0]


def _step(model, batch, compile, packing=False, budget=400):
    """One trainer step on a copy of `model`: (metrics, gradients by name)."""
    model = copy.deepcopy(model).train()
    cfg = OptimConfig(lr=0.0, grad_clip=0.0, micro_batch_tokens=budget, packing=packing, compile=compile)
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


def test_the_setting_is_auto_true_or_false_and_auto_is_cuda_only():
    assert load_config(RLConfig, None, ["optim.compile=true"]).optim.compile is True
    assert load_config(RLConfig, None, ["optim.compile=auto"]).optim.compile == "auto"
    assert load_config(SFTConfig, None, ["optim.compile=false"]).optim.compile is False
    assert load_config(RLConfig, None, []).optim.compile is False
    with pytest.raises(UsageError, match=r"optim.compile='sometimes': .* auto, true or false"):
        load_config(RLConfig, None, ["optim.compile=sometimes"])
    assert [resolve("auto", d) for d in ("cpu", "cuda", "cuda:1")] == [False, True, True]
    assert resolve(True, "cpu") and not resolve(False, "cuda")
    with pytest.raises(UsageError, match="optim.compile"):
        Trainer(_nano(), OptimConfig(compile="yes"), 10)  # from Python, without the config's check


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
    ref = Reference(model, compile=True)
    for b in batches:
        ref.score(b, 400)
    assert graphs() - start == 2  # + the reference's no-grad graph
    for b in batches:
        _step(model, b, True, packing=True)
    assert graphs() - start == 3  # + packed rows (positions, a block mask)


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
def test_the_inductor_compiled_grpo_step_gives_the_eager_loss_and_gradients():
    """Inductor generates C++ on the CPU (~1 min a graph, cold, on 2 loaded cores: the slow lane).
    gpt_mini only: the Hugging Face trunk's graphs are the test above's, and inductor's code for them
    differs in nothing this test would catch but a minute more of CI."""
    _check(_nano(), _grpo_batch(12))


def _check(model, batch, packing=False, budget=400):
    start = graphs()
    got = _step(model, batch, True, packing, budget)
    assert graphs() > start  # the trunk did go through the compiler
    _assert_same(_step(model, batch, False, packing, budget), got)


def test_the_compiled_reference_reads_packed_rows_through_a_flex_block_mask(monkeypatch):
    """A packed micro-batch's flex BlockMask (models/attention.py) goes into the compiled trunk as it
    is (only tensors are copied): the reference's scores equal the eager dense-mask ones ≤1e-5."""
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    model = _nano(layers=1)
    batch = _grpo_batch(12)
    dense = Reference(model, packing=True).score(batch, 400)
    model.packing_attention = "flex"  # eager flex on the CPU: forward only, as the reference needs
    start = graphs()
    flex = Reference(model, packing=True, compile=True).score(batch, 400)
    assert graphs() > start and dense.abs().sum() > 0
    assert (flex - dense).abs().max() <= TOL
