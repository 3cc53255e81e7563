"""LoRA adapters through peft (posttrain/models/lora.py) on a tiny random HF Llama."""

import json

import pytest
import torch

pytest.importorskip("peft")
from transformers import AutoModelForCausalLM  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from posttrain import UsageError, checkpoint  # noqa: E402
from posttrain.config import OptimConfig, RLConfig, load_config  # noqa: E402
from posttrain.framework.rollout import Engine  # noqa: E402
from posttrain.framework.trainer import Trainer  # noqa: E402
from posttrain.models.hf import load_hf, write_tiny  # noqa: E402
from posttrain.models.lora import LoraConfig, LoraSync, apply_lora, lora_layers  # noqa: E402

R, ALPHA = 4, 8.0
IDS = torch.tensor([[1, 9, 16, 10, 2, 14, 20], [1, 12, 13, 2, 30, 31, 0]])


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    # d 64, 2 layers, 4 heads of 16, 2 kv heads, SwiGLU 128
    return write_tiny(tmp_path_factory.mktemp("lora") / "llama", "llama", seed=1)


def _lora_model(hf_dir, seed=0):
    model, tok = load_hf(hf_dir)
    counts = apply_lora(model, LoraConfig(r=R, alpha=ALPHA))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():   # B = 0 at init would hide mistakes in the merge: give B values too
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    return model, tok, counts


def test_trainable_parameters_are_the_adapters_only(hf_dir):
    base = load_hf(hf_dir)[0].num_params()
    model, _, counts = _lora_model(hf_dir)
    # per layer r·(in + out) for q (64→64), k, v (64→32), o (64→64), gate, up (64→128), down (128→64)
    per_layer = R * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 3 * (64 + 128))
    assert counts["params/trainable"] == 2 * per_layer == 8192
    assert counts["params/total"] == base + 8192
    trainer = Trainer(model, OptimConfig(lr=1e-2), total_steps=1)

    def loss_fn(m, mb, norm):
        return -torch.log_softmax(m(mb["input_ids"]), -1)[:, :-1].gather(
            -1, mb["input_ids"][:, 1:, None]).mean(), {}

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.step({"input_ids": IDS, "attention_mask": torch.ones(2, 7), "loss_mask": torch.ones(2, 7)}, loss_fn)
    got_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert got_grad and all("lora_" in n for n in got_grad)
    assert got_grad == {n for n, _ in model.named_parameters() if "lora_" in n}
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == got_grad                                            # base weights never move
    # AdamW moments exist for the adapters only: 2 × 8192 floats instead of 2 × all parameters
    moments = sum(s["exp_avg"].numel() + s["exp_avg_sq"].numel() for s in trainer.optimizer.state.values())
    assert moments == 2 * 8192


def test_separate_sync_gives_the_sampler_base_plus_scaled_BA(hf_dir):
    model, tok, _ = _lora_model(hf_dir)
    engine = Engine(model, tok)
    sync = LoraSync(model, engine, "separate")
    assert engine.model is not model and not lora_layers(engine.model)   # a plain model, no adapter path
    with torch.no_grad():
        for name, p in model.named_parameters():                     # the trainer moves the adapters
            if "lora_A" in name:
                p.add_(0.01)
    out = sync.sync()
    layer = model.hf.model.layers[1].self_attn.q_proj
    A, B, W0 = layer.lora_A["default"].weight, layer.lora_B["default"].weight, layer.base_layer.weight
    want = W0 + (ALPHA / R) * B @ A                                       # [64, 64] by hand
    assert torch.allclose(engine.model.hf.model.layers[1].self_attn.q_proj.weight, want, atol=1e-7)
    assert out["sync/bytes"] == 4 * 2 * (64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 64 * 128)
    assert engine.policy_version == 1
    with torch.no_grad():
        assert torch.allclose(engine.model(IDS), model(IDS), atol=1e-5)


def test_lora_checkpoint_is_a_plain_hf_directory(hf_dir, tmp_path):
    model, tok, _ = _lora_model(hf_dir)
    model.save(tmp_path)
    tok.save(tmp_path)
    assert not [k for k in load_file(tmp_path / "model.safetensors") if "lora" in k or "base_layer" in k]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True).eval()
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=IDS).logits, model(IDS), atol=1e-5)


def test_grpo_with_lora_end_to_end(hf_dir, tmp_path):
    from posttrain.recipes import rl
    args = [f"init={hf_dir}", f"out={tmp_path}/rl", "steps=2", "prompts_per_step=4", "samples_per_prompt=6",
            "max_new_tokens=8", "eval_problems=2", "eval_samples=1", "optim.lr=1e-2", "lora.r=4",
            "weight_sync=separate", "task.min_terms=1", "task.max_terms=1", "task.max_value=9"]
    rl.run(load_config(RLConfig, None, args))
    rows = [json.loads(line) for line in open(tmp_path / "rl" / "metrics.jsonl")][1:]
    for r in rows:     # sampler (merged weights) and trainer (adapter path) agree to float noise
        assert abs(r["ratio/mean"] - 1) < 1e-5 and r["mismatch/logprob_abs"] < 1e-5
    assert max(r["grad/norm"] for r in rows) > 0
    trained = load_file(checkpoint.latest(tmp_path / "rl") / "model.safetensors")
    start = load_file(hf_dir / "model.safetensors")
    assert trained.keys() == start.keys()
    moved = {k for k in start if not torch.equal(trained[k], start[k])}
    assert moved and all(k.endswith(("proj.weight")) for k in moved)    # embeddings and norms untouched
    with pytest.raises(UsageError, match="--resume of a LoRA run"):
        rl.run(load_config(RLConfig, None, args + ["steps=3"]), resume=True)
