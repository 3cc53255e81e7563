"""Memory planner: the course's worked numbers (SEED_SPEC Part C), hand-computed breakdowns,
model shapes against published parameter counts, and the CLI as a subprocess."""

import json
import subprocess
import sys

import pytest

from posttrain import UsageError
from posttrain.sizing.memory import ROLES, envelope, min_gpus, plan, train_bytes_per_param
from posttrain.sizing.shapes import (
    MINI_PRESETS,
    PRESETS,
    ModelShape,
    activation_bytes,
    count_params,
    course_activation_bytes,
    kv_bytes_per_token,
    logits_bytes,
    lora_params,
    resolve_model,
)

GB = 1e9
P7 = 6_738_415_616  # Llama-2-7B parameters (model card)


# ---- shapes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,params",
    [
        ("llama-7b", 6_738_415_616),
        ("llama-13b", 13_015_864_320),
        ("llama-70b", 68_976_648_192),
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
        ("llama3-405b", 405_853_388_800),
        ("mistral-7b", 7_241_732_096),
        ("qwen2.5-0.5b", 494_032_768),
        ("qwen2.5-1.5b", 1_543_714_304),
        ("qwen2.5-7b", 7_615_616_512),
        ("qwen2.5-72b", 72_706_203_648),
    ],
)
def test_preset_param_counts_match_model_cards(name, params):
    assert count_params(PRESETS[name]) == params


def test_course_minigpt_param_count_row_97():
    # gpt_mini 01: d128 h4 L4 V29 T_max 11 -> 796,416 (the lesson's "≈793,000" is a rounding slip);
    # per block 12·128² + 9·128 = 197,760; Wte 29·128 = 3,712; Wpe 11·128 = 1,408; ln_f 256
    s = PRESETS["course-minigpt"]
    assert count_params(s) == 4 * 197_760 + 3_712 + 1_408 + 256 == 796_416
    assert count_params(ModelShape("w", 128, 4, 4, 4, 512, 29, True, arch="gpt2", positions=64)) == 803_200
    assert 4 * 197_760 / (3_712 + 1_408) == 154.5  # "blocks dominate by ~150×" (spec: ≈155)


def test_gpt_mini_presets_match_the_module():
    from posttrain.models import gpt_mini
    from posttrain.models.tokenizer import CharTokenizer

    assert MINI_PRESETS == tuple(gpt_mini.PRESETS)
    for name in gpt_mini.PRESETS:
        c = gpt_mini.ModelConfig(preset=name).resolved(CharTokenizer().vocab_size)
        assert count_params(resolve_model(name)) == gpt_mini.count_params(c)


def test_lora_params_llama_7b_rank_16():
    # per layer r·(in+out): q,k,v,o 4·16·8192 = 524,288; gate, up, down 3·16·(4096+11008) = 724,992
    assert lora_params(PRESETS["llama-7b"], 16) == 32 * (524_288 + 724_992) == 39_976_960


def test_model_from_hf_config_json_and_yaml(tmp_path):
    cfg = {
        "model_type": "qwen2",
        "hidden_size": 3584,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    }
    (tmp_path / "qwen").mkdir()
    (tmp_path / "qwen" / "config.json").write_text(json.dumps(cfg))
    assert count_params(resolve_model(str(tmp_path / "qwen" / "config.json"))) == 7_615_616_512
    (tmp_path / "run.yaml").write_text("steps: 3\nmodel:\n  preset: micro\n  n_layers: 2\n")
    s = resolve_model(str(tmp_path / "run.yaml"))
    assert (s.hidden, s.layers, s.heads) == (256, 2, 8)
    (tmp_path / "rl.yaml").write_text("algorithm: grpo\nsteps: 3\n")
    with pytest.raises(UsageError, match="has no model: section"):
        resolve_model(str(tmp_path / "rl.yaml"))
    del cfg["intermediate_size"]
    (tmp_path / "bad.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match="lacks 'intermediate_size'"):
        resolve_model(str(tmp_path / "bad.json"))


def test_unknown_model_is_a_usage_error():
    with pytest.raises(UsageError, match="model 'llama-9b' is unknown"):
        resolve_model("llama-9b")


# ---- the course's numbers (SEED_SPEC Part C) --------------------------------------------


def test_kv_bytes_per_token_row_51():
    assert kv_bytes_per_token(PRESETS["llama3-8b"]) == 32 * 2 * 8 * 128 * 2 == 131_072
    assert kv_bytes_per_token(PRESETS["llama3-70b"]) == 80 * 2 * 8 * 128 * 2 == 327_680
    assert kv_bytes_per_token(PRESETS["qwen2.5-7b"]) == 28 * 2 * 4 * 128 * 2 == 57_344
    assert kv_bytes_per_token(PRESETS["llama-7b"]) == 524_288  # MHA 32L d4096: "524 KB"
    assert kv_bytes_per_token(ModelShape("mha", 8192, 80, 64, 64, 28672, 32000)) == 2_621_440  # "2.6 MB"


def test_70b_kv_for_256_by_8k_row_52():
    # decision: the exact value, in decimal GB (687.2) and GiB (640); the course's "≈670 GB" is a slip
    kv = kv_bytes_per_token(PRESETS["llama3-70b"]) * 256 * 8192
    assert kv == 687_194_767_360 and kv / 2**30 == 640.0


def test_bytes_per_param_row_59():
    assert [train_bytes_per_param(p) for p in ("mixed", "no-master", "bf16-adam")] == [18, 16, 12]


def test_train_memory_and_gpu_count_row_60():
    assert [min_gpus(18 * p) for p in (7e9, 70e9, 405e9)] == [2, 16, 96]  # 126 GB, 1.26 TB, 7.29 TB
    assert min_gpus(18 * 7e9, "h200") == 1


def test_activations_row_61():
    # 32·8192·4·(12·4096 + 2·8192)·2 = 137.4 GB
    assert course_activation_bytes(32, 4096, 8192, 4) == 137_438_953_472
    assert course_activation_bytes(32, 4096, 8192, 4, checkpointing=True) == 137_438_953_472 / 8


def test_memory_widget_row_64():
    e = envelope(7)  # 7B, L 8192, B 4, G 8, ckpt on
    assert round(e["train_gb"], 1) == 32.9 and round(e["infer_gb"], 1) == 2.3
    assert e["kv_kb_per_token"] == 128 and e["fits_h100"]
    assert round(envelope(7, checkpointing=False)["train_gb"], 1) == 153.2
    e70 = envelope(70, gpus=16)
    assert round(e70["train_gb"], 1) == 153.9 and not e70["fits_h100"]


def test_worked_7b_on_8_h100_row_65():
    # trainer 4 GPUs FSDP, reference 1 GPU, rollout 3 GPUs TP=1; course activations with checkpointing
    r = plan(
        "7b",
        algo="grpo",
        gpus=4,
        micro_batch=8,
        seq_len=4096,
        checkpointing=True,
        activations="course",
        placement="split",
        ref_gpus=1,
        rollout_gpus=3,
        rollout_seqs=256,
    )
    t = r["pools"]["trainer"]["components"]
    assert sum(t[k] for k in ("policy weights", "master weights", "gradients", "optimizer (Adam m, v)")) == 126e9 / 4
    assert t["activations"] == 32 * 4096 * 8 * (12 * 4096 + 2 * 4096) * 2 / 8 == 15_032_385_536  # "~15 GB"
    assert round(r["pools"]["trainer"]["peak_bytes"] / GB, 1) == 46.5  # "≈47 GB"
    assert r["pools"]["reference"]["peak_bytes"] == 14e9
    # decision: 256·4096 tokens × 131,072 B = 137.4 GB (the course's "131 GB" mixes units): 45.8 GB per GPU
    roll = r["pools"]["rollout"]
    assert roll["components"]["KV cache"] == 131_072 * 256 * 4096 / 3
    assert round(roll["peak_bytes"] / GB, 1) == 59.8 and r["fits"]  # course "~58"


def test_70b_on_8_h100_is_not_colocated_row_84():
    # 70B × 18 B = 1.26 TB > 8 × 80 GB: a full fine-tune cannot fit; LoRA with a wider rollout TP can
    base = {"algo": "grpo", "gpus": 8, "checkpointing": True, "activations": "course"}
    r = plan("70b", **base)
    assert not r["fits"] and r["pools"]["colocated"]["phases"]["persistent"] == (18 + 2) * 70e9 / 8
    on_8 = [s for s in r["suggestions"] if s["overrides"].get("gpus", 8) == 8]
    assert on_8 and all(s["overrides"]["lora"] == 16 for s in on_8)
    assert plan("70b", **{**base, **on_8[0]["overrides"]})["fits"]


def test_logits_memory_row_86():
    assert logits_bytes(32_768, 131_072) == 8_589_934_592  # 8.6 GB = 8 GiB
    assert logits_bytes(32_768, 131_072, vocab_chunk=1024) == 67_108_864  # 67 MB
    assert logits_bytes(32_768, 131_072) / logits_bytes(32_768, 131_072, vocab_chunk=4096) == 32


# ---- llama-7b GRPO on H100, by hand ---------------------------------------------------------


def test_llama_7b_grpo_h100_one_gpu_by_hand():
    r = plan("llama-7b", algo="grpo", gpu="h100")  # defaults: 1 GPU, micro-batch 1 × 4096, 64 × 4096 rollout
    c = r["pools"]["colocated"]["components"]
    assert r["params"] == P7 and r["roles"] == {
        "rollout": True,
        "reference": True,
        "critic": False,
        "reward_model": False,
    }
    assert c["policy weights"] == 2 * P7 == 13_476_831_232  # bf16
    assert c["master weights"] == 4 * P7 == 26_953_662_464  # fp32
    assert c["gradients"] == 4 * P7 == 26_953_662_464  # fp32
    assert c["optimizer (Adam m, v)"] == 8 * P7 == 53_907_324_928  # fp32 m and v
    assert c["reference"] == 2 * P7 == 13_476_831_232  # GRPO's kl_coef 0.04 > 0: bf16 reference
    assert c["critic"] == 0 and c["reward model"] == 0
    # per token per layer: 2 norms 2·(8·4096 + 4) + q 4·4096 + kv 4·4096 + lse 4·32 + MLP 8·11008 = 186,504 B;
    # × 32 layers, + final norm and head input 8·4096 + 4 = 32,772: 6,000,900 B/token × 4096 tokens
    assert c["activations"] == 4096 * (32 * 186_504 + 32_772) == 24_579_686_400
    assert c["logits"] == 4096 * 32_000 * 6 == 786_432_000  # bf16 logits + fp32 log-softmax
    assert c["FSDP gather buffers"] == 0 and c["rollout weights"] == 0  # one GPU: the sampler shares the weights
    # KV: 32 layers × 2 × 32 heads × 128 × 2 B = 524,288 B/token × 64 × 4096 tokens
    assert c["KV cache"] == 524_288 * 64 * 4096 == 137_438_953_472
    # peak = 20·P persistent + max(train 26.29 GB, rollout 137.44 GB)
    assert r["peak_bytes"] == 20 * P7 + 137_438_953_472 == 272_207_265_792 and not r["fits"]
    # checkpointing: each layer's bf16 input 2·4096 B + one layer recomputed + the head's 32,772
    assert r["notes"]["activations_with_checkpointing"] == 4096 * (32 * 8192 + 186_504 + 32_772) == 1_971_896_320


def test_llama_7b_grpo_h100_fsdp_8_by_hand():
    r = plan("llama-7b", algo="grpo", gpu="h100", gpus=8)
    c = r["pools"]["colocated"]["components"]
    assert c["optimizer (Adam m, v)"] == 8 * P7 / 8 and c["reference"] == 2 * P7 / 8  # ZeRO-3: all sharded
    layer = 4096 * (4096 * 3 + 4096) + 3 * 4096 * 11008 + 2 * 4096  # 202,383,360 params
    assert c["FSDP gather buffers"] == 2 * 2 * layer == 809_533_440  # 2 layers in bf16
    assert c["rollout weights"] == 2 * P7  # gathered for TP=1 decode
    assert c["KV cache"] == 137_438_953_472 / 8
    ph = r["pools"]["colocated"]["phases"]
    assert ph["persistent"] == 20 * P7 / 8 and ph["train"] == 24_579_686_400 + 786_432_000 + 809_533_440
    assert r["peak_bytes"] == 20 * P7 / 8 + 2 * P7 + 137_438_953_472 / 8 == 47_502_739_456 and r["fits"]
    assert r["fits_on"] == {"H100 80GB": True, "H200 141GB": True, "A100 80GB": True}
    assert plan("llama-7b", gpus=4)["fits_on"] == {"H100 80GB": False, "H200 141GB": True, "A100 80GB": False}


@pytest.mark.parametrize("checkpointing", [False, True])
def test_activation_formula_matches_saved_tensors_of_a_hf_llama(checkpointing):
    """The "llama" activation model against what autograd really saves in a bf16 HF Llama
    (GQA, SDPA): every saved storage counted once, parameters excluded."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    d, n, h, kv, ff, v, T, B = 64, 3, 4, 2, 176, 100, 32, 2
    torch.manual_seed(0)
    m = LlamaForCausalLM(
        LlamaConfig(
            hidden_size=d,
            num_hidden_layers=n,
            num_attention_heads=h,
            num_key_value_heads=kv,
            intermediate_size=ff,
            vocab_size=v,
            max_position_embeddings=64,
            use_cache=False,
            attn_implementation="sdpa",
        )
    ).to(torch.bfloat16)
    if checkpointing:
        getattr(m, "activation_checkpointing_enable", m.gradient_checkpointing_enable)()
    m.train()
    params, saved = {p.untyped_storage().data_ptr() for p in m.parameters()}, {}

    def pack(x):
        if x.untyped_storage().data_ptr() not in params:
            saved[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        m(torch.randint(0, v, (B, T)))
    s = ModelShape("tiny", d, n, h, kv, ff, v)
    expected = activation_bytes(s, T, B, checkpointing)
    if checkpointing:  # the forward keeps only layer inputs; backward adds one layer
        expected -= B * T * (2 * (8 * d + 4) + 4 * d + 4 * kv * (d // h) + 4 * h + 8 * ff)
    rotary = 2 * T * (d // h) * 2  # cos and sin tables, shared by every layer and sequence
    assert expected <= sum(saved.values()) <= expected + rotary + 16 * B * T


def test_sharding_invariances():
    one, two = plan("llama-7b", gpus=4, shard="dp"), plan("llama-7b", gpus=4, shard="dp", tp=2)
    a, b = one["pools"]["colocated"]["components"], two["pools"]["colocated"]["components"]
    for k in ("policy weights", "optimizer (Adam m, v)", "reference", "activations", "logits"):
        assert b[k] == a[k] / 2, k  # TP=2 halves weights, activations and logits
    assert b["KV cache"] == a["KV cache"] == 137_438_953_472 / 4  # batch over 2 replicas × heads over TP=2
    assert a["optimizer (Adam m, v)"] == 8 * P7  # dp replicates the optimizer
    mqa = plan(ModelShape("mqa", 4096, 32, 32, 1, 11008, 32000), gpus=4, tp=2)["pools"]["colocated"]["components"]
    assert mqa["KV cache"] == 32 * 2 * 128 * 2 * 64 * 4096 / 2  # one KV head: replicated across TP


def test_lora_ppo_dpo_roles():
    lora = plan("llama-7b", algo="grpo", lora=16)["pools"]["colocated"]["components"]
    assert lora["reference"] == 0 and lora["optimizer (Adam m, v)"] == 8 * 39_976_960 and lora["critic"] == 0
    assert lora["policy weights"] == 2 * P7 + 2 * 39_976_960
    ppo = plan("llama-7b", algo="ppo")["pools"]["colocated"]["components"]
    critic = P7 - 32_000 * 4096 + 4096 + 1  # trunk without the LM head, plus the value head
    assert ppo["critic"] == 18 * critic == 118_932_258_834 and ppo["critic activations"] == ppo["activations"]
    shared = plan("llama-7b", algo="ppo", critic="shared")["pools"]["colocated"]["components"]
    assert shared["critic"] == 18 * 4097 and shared["critic activations"] == 0
    lora_ppo = plan("llama-7b", algo="ppo", lora=16)["pools"]["colocated"]["components"]
    assert lora_ppo["critic"] == 2 * critic + 18 * 39_976_960  # its own frozen trunk + its adapters
    rlhf = plan("llama-7b", algo="rlhf", reward_model="qwen2.5-1.5b")["pools"]["colocated"]["components"]
    assert rlhf["reward model"] == 2 * (1_543_714_304 + 1536 + 1)  # tied: the embedding stays
    dpo = plan("llama-7b", algo="dpo")
    assert dpo["pools"]["colocated"]["components"]["KV cache"] == 0 and dpo["notes"]["kv_cache_total"] == 0
    assert plan("llama-7b", algo="grpo", reference="cpu")["pools"]["colocated"]["components"]["reference"] == 0


def test_roles_match_the_algorithms_defaults():
    from posttrain import algorithms

    for name, mod in algorithms.ALGORITHMS.items():
        assert ROLES[name].reference == mod.needs_reference(mod.Config()), name
        assert ROLES[name].critic == (name == "ppo") and ROLES[name].rollout


def test_suggestions_fit_when_applied():
    for model, base in [
        ("qwen2.5-1.5b", {"micro_batch": 8}),
        ("llama-7b", {"micro_batch": 4}),
        ("llama-70b", {"algo": "ppo", "gpus": 8}),
    ]:
        r = plan(model, **base)
        assert not r["fits"] and r["suggestions"]
        for s in r["suggestions"]:
            again = plan(model, **{**base, **s["overrides"]})
            assert again["fits"] and round(again["peak_bytes"] / GB, 1) == s["peak_gb"], s
    split = {"algo": "grpo", "placement": "split", "gpus": 2, "ref_gpus": 1, "rollout_gpus": 1}
    r = plan("llama-7b", **split)  # each pool grows on its own; the fewest GPUs in all wins
    assert not r["pools"]["trainer"]["fits"] and not r["pools"]["rollout"]["fits"] and r["pools"]["reference"]["fits"]
    for s in r["suggestions"]:
        assert plan("llama-7b", **{**split, **s["overrides"]})["fits"], s
    one_gpu = [s["overrides"] for s in plan("llama-7b")["suggestions"] if s["overrides"].get("gpus", 1) == 1]
    assert one_gpu == [{"checkpointing": True, "lora": 16, "rollout_seqs": 16}]  # KV of 64 × 4096 is 137 GB
    singles = [s["change"] for s in plan("qwen2.5-1.5b", micro_batch=8)["suggestions"]]
    assert singles[:2] == ["gradient checkpointing on", "micro-batch 1 (more accumulation steps)"]
    assert plan("nano", algo="grpo")["suggestions"] == []


def test_bad_inputs_are_usage_errors():
    for model, kw, msg in [
        ("llama-7b", {"algo": "gpro"}, "did you mean 'grpo'"),
        ("llama-7b", {"gpu": "h300"}, "--gpu 'h300' is unknown"),
        ("llama-7b", {"gpus": 3, "tp": 2}, "must divide the pool"),
        ("llama-7b", {"precision": "fp8"}, "'fp8'"),
        ("qwen2.5-1.5b", {"gpus": 8, "tp": 8}, "must divide qwen2.5-1.5b's 12 attention heads"),
        ("llama-7b", {"lora": -1}, "lora=-1 and rollout_len=0 must be ≥ 0"),
        ("llama-7b", {"micro_batch": 0}, "micro_batch=0 must be ≥ 1"),
    ]:
        with pytest.raises(UsageError, match=msg):
            plan(model, **kw)


# ---- the command line ---------------------------------------------------------------------


def posttrain(*args):
    return subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "memory", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_prints_the_breakdown():
    r = posttrain("llama-7b", "--algo", "grpo", "--gpu", "h100")
    assert r.returncode == 0, r.stderr
    for line in [
        "colocated pool: 1 × H100 80GB (one GPU)",
        "  master weights                    26.95",
        "  optimizer (Adam m, v)             53.91",
        "  KV cache                         137.44",
        "  peak                             272.21   = persistent 134.8 + max(train 25.4, rollout 137.4)",
        "fits on H100 80GB (≤ 80 GB per GPU): NO (peak 272.2 GB)  [H100 80GB: no, H200 141GB: no, A100 80GB: no]",
        "to fit, change one of:",
    ]:
        assert line in r.stdout, r.stdout
    j = posttrain("llama-7b", "--algo", "grpo", "--gpus", "8", "--json")
    assert j.returncode == 0 and json.loads(j.stdout)["peak_bytes"] == 47_502_739_456


def test_cli_bad_model_is_one_line_exit_2():
    r = posttrain("llama-9b", "--algo", "grpo")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("posttrain memory: error: model 'llama-9b' is unknown")
