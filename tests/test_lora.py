"""LoRA adapters through peft (posttrain/models/lora.py) on a tiny random HF Llama."""

import json

import pytest
import torch

pytest.importorskip("peft")
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from posttrain import checkpoint  # noqa: E402
from posttrain.config import OptimConfig, RLConfig, load_config  # noqa: E402
from posttrain.framework.backends import make_engine  # noqa: E402
from posttrain.framework.trainer import Trainer  # noqa: E402
from posttrain.framework.weight_sync import LoraSync  # noqa: E402
from posttrain.models.hf import load_hf, write_tiny  # noqa: E402
from posttrain.models.lora import LoraConfig, apply_lora, lora_layers  # noqa: E402

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
    with torch.no_grad():  # B = 0 at init would hide mistakes in the merge: give B values too
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
        return -torch.log_softmax(m(mb["input_ids"]), -1)[:, :-1].gather(-1, mb["input_ids"][:, 1:, None]).mean(), {}

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.step({"input_ids": IDS, "attention_mask": torch.ones(2, 7), "loss_mask": torch.ones(2, 7)}, loss_fn)
    got_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert got_grad and all("lora_" in n for n in got_grad)
    assert got_grad == {n for n, _ in model.named_parameters() if "lora_" in n}
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == got_grad  # base weights never move
    # AdamW moments exist for the adapters only: 2 × 8192 floats instead of 2 × all parameters
    moments = sum(s["exp_avg"].numel() + s["exp_avg_sq"].numel() for s in trainer.optimizer.state.values())
    assert moments == 2 * 8192


def test_separate_sync_gives_the_sampler_base_plus_scaled_BA(hf_dir):
    model, tok, _ = _lora_model(hf_dir)
    engine = make_engine(model, tok, copy=True)  # the placement's separate sampler: a plain merged copy
    sync = LoraSync(model, engine, "separate")
    assert engine.model is not model and not lora_layers(engine.model)  # a plain model, no adapter path
    with torch.no_grad():
        for name, p in model.named_parameters():  # the trainer moves the adapters
            if "lora_A" in name:
                p.add_(0.01)
    out = sync.sync()
    layer = model.hf.model.layers[1].self_attn.q_proj
    A, B, W0 = layer.lora_A["default"].weight, layer.lora_B["default"].weight, layer.base_layer.weight
    want = W0 + (ALPHA / R) * B @ A  # [64, 64] by hand
    assert torch.allclose(engine.model.hf.model.layers[1].self_attn.q_proj.weight, want, atol=1e-7)
    assert out["sync/bytes"] == 4 * 2 * (64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 64 * 128)
    assert engine.policy_version == 1
    with torch.no_grad():
        assert torch.allclose(engine.model(IDS), model(IDS), atol=1e-5)


def test_whole_sync_pushes_the_merged_state_under_plain_names(hf_dir):
    """rollout.backend=vllm's sync (mode "whole"): every weight of the plain model, adapters merged;
    here into a built-in plain copy, which must then compute the adapted policy."""
    from posttrain.framework.weight_sync import WeightSync

    model, tok, _ = _lora_model(hf_dir)
    engine = make_engine(model, tok, copy=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name:
                p.add_(0.01)
    out = WeightSync(model, engine, "whole").sync()
    assert out["sync/bytes"] == 4 * sum(p.numel() for p in engine.model.state_dict().values())
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

    args = [
        f"init={hf_dir}",
        f"out={tmp_path}/rl",
        "steps=2",
        "prompts_per_step=4",
        "samples_per_prompt=6",
        "max_new_tokens=8",
        "eval_problems=2",
        "eval_samples=1",
        "optim.lr=1e-2",
        "lora.r=4",
        "weight_sync=separate",
        "task.min_terms=1",
        "task.max_terms=1",
        "task.max_value=9",
        "device=cpu",  # merged sampler = adapter trainer to 1e-5: fp32, not a GPU's bf16
    ]
    rl.run(load_config(RLConfig, None, args))
    rows = [json.loads(line) for line in open(tmp_path / "rl" / "metrics.jsonl")][1:]
    for r in rows:  # sampler (merged weights) and trainer (adapter path) agree to float noise
        assert abs(r["ratio/mean"] - 1) < 1e-5 and r["mismatch/logprob_abs"] < 1e-5
    assert max(r["grad/norm"] for r in rows) > 0
    trained = load_file(checkpoint.latest(tmp_path / "rl") / "model.safetensors")
    start = load_file(hf_dir / "model.safetensors")
    assert trained.keys() == start.keys()
    moved = {k for k in start if not torch.equal(trained[k], start[k])}
    assert moved and all(k.endswith("proj.weight") for k in moved)  # embeddings and norms untouched
    # the adapters in PEFT's format beside the merged weights: PeftModel on the base gives the same policy
    from peft import PeftModel

    ckpt = checkpoint.latest(tmp_path / "rl")
    config = json.loads((ckpt / "adapter" / "adapter_config.json").read_text())
    assert (
        config["peft_type"] == "LORA"
        and config["r"] == 4
        and config["base_model_name_or_path"] == str(hf_dir.resolve())
    )
    assert all(
        k.startswith("base_model.model.") and ".lora_" in k
        for k in load_file(ckpt / "adapter" / "adapter_model.safetensors")
    )
    base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"], local_files_only=True)
    peft = PeftModel.from_pretrained(base, ckpt / "adapter").eval()
    merged = AutoModelForCausalLM.from_pretrained(ckpt, local_files_only=True).eval()
    with torch.no_grad():
        assert torch.allclose(peft(input_ids=IDS).logits, merged(input_ids=IDS).logits, atol=1e-5)


def test_a_lora_run_resumes_to_the_same_numbers(hf_dir, tmp_path):
    from posttrain.recipes import rl

    args = [
        f"init={hf_dir}",
        "prompts_per_step=2",
        "samples_per_prompt=4",
        "max_new_tokens=6",
        "eval_problems=2",
        "eval_samples=1",
        "optim.lr=1e-2",
        "lora.r=4",
        "task.min_terms=1",
        "task.max_terms=1",
        "task.max_value=9",
        "eval_every=2",
        "tensorboard=false",
        "device=cpu",  # the same numbers after a resume: the CPU's fp32 (a GPU's bf16 and atomics differ)
    ]
    rl.run(load_config(RLConfig, None, [*args, f"out={tmp_path}/full", "steps=4"]))
    rl.run(load_config(RLConfig, None, [*args, f"out={tmp_path}/cut", "steps=2"]))
    rl.run(load_config(RLConfig, None, [*args, f"out={tmp_path}/cut", "steps=4"]), resume=True)
    full, cut = (
        load_file(checkpoint.latest(tmp_path / d) / "adapter" / "adapter_model.safetensors") for d in ("full", "cut")
    )
    assert full.keys() == cut.keys() and all(torch.equal(full[k], cut[k]) for k in full)
    rows = lambda d: [json.loads(x) for x in open(tmp_path / d / "metrics.jsonl")]
    assert [r["reward/mean"] for r in rows("full") if "reward/mean" in r] == [
        r["reward/mean"] for r in rows("cut") if "reward/mean" in r
    ]


def test_sft_and_dpo_take_lora_keys(hf_dir, tmp_path):
    from posttrain.config import SFTConfig
    from posttrain.recipes import dpo, sft
    from posttrain.recipes.dpo import DPOConfig

    common = [
        f"init={hf_dir}",
        "steps=2",
        "lora.r=2",
        "lora.target_modules=[q_proj,v_proj]",
        "tensorboard=false",
        "task.min_terms=1",
        "task.max_terms=2",
        "task.max_value=9",
    ]
    sft.run(
        load_config(
            SFTConfig, None, [*common, f"out={tmp_path}/sft", "batch_size=4", "num_problems=20", "eval_problems=2"]
        )
    )
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(json.dumps({"prompt": f"{a}+1", "chosen": f"{a + 1}", "rejected": f"{a + 2}"}) + "\n" for a in range(8))
    )
    dpo.run(
        load_config(
            DPOConfig,
            None,
            [*common, f"out={tmp_path}/dpo", f"pairs={pairs}", "batch_size=4", "eval_problems=0", "optim.lr=1e-2"],
        )
    )
    for stage in ("sft", "dpo"):
        ckpt = checkpoint.latest(tmp_path / stage)
        adapter = load_file(ckpt / "adapter" / "adapter_model.safetensors")
        assert adapter and all(("q_proj" in k or "v_proj" in k) for k in adapter)
        trained, start = load_file(ckpt / "model.safetensors"), load_file(hf_dir / "model.safetensors")
        moved = {k for k in start if not torch.equal(trained[k], start[k])}
        assert moved and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in moved), stage
