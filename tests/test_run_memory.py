"""The predicted peak of one posttrain run (sizing/run_memory.py, issue 31): hand-computed components,
the activation count against what autograd saves, and `posttrain memory` on a run's config, a
Hugging Face directory and a run directory (predicted vs measured). The prediction against real
runs at a 151,936 vocabulary is benchmarks/vocab_memory.py's."""

import json

import pytest
import torch

from posttrain.config import RLConfig, load_config
from posttrain.models.heads import LOGIT_CHUNK_ELEMENTS
from posttrain.sizing.run_memory import CHUNK_BACKWARD, CHUNK_FORWARD, predict_run_peak, saved_bytes_per_token
from posttrain.sizing.run_memory_cli import format_prediction
from posttrain.sizing.run_memory_cli import main as cli
from posttrain.sizing.shapes import ModelShape, count_params, kv_bytes_per_token

TINY = ModelShape("tiny", 256, 2, 8, 8, 688, 151936)  # benchmarks/vocab_memory.py's model


@pytest.mark.parametrize("hf", [False, True])
def test_saved_bytes_per_token_is_what_autograd_saves(hf):
    """Per token and layer, the fp32 count equals the storages a block saves for backward (every
    saved storage once, parameters excluded: 3 layers minus 1, halved), in gpt_mini (GQA) and in a
    Hugging Face Llama."""
    from posttrain.models.gpt_mini import GPTMini, ModelConfig

    d, h, kv, ff, B, T = 64, 4, 2, 176, 2, 32

    def build(n):
        if not hf:
            return GPTMini(
                ModelConfig(d_model=d, n_layers=n, n_heads=h, n_kv_heads=kv, d_ff=ff, vocab_size=50).resolved()
            )
        transformers = pytest.importorskip("transformers")
        from posttrain.models.hf import HFCausalLM

        c = transformers.LlamaConfig(
            hidden_size=d, num_hidden_layers=n, num_attention_heads=h, num_key_value_heads=kv, intermediate_size=ff,
            vocab_size=50, max_position_embeddings=64, use_cache=False, attn_implementation="sdpa",
        )  # fmt: skip
        return HFCausalLM(transformers.LlamaForCausalLM(c))

    per_model = []
    for n in (1, 3):
        m = build(n)
        params, saved = {p.untyped_storage().data_ptr() for p in m.parameters()}, {}

        def pack(x, params=params, saved=saved):
            if x.untyped_storage().data_ptr() not in params:
                saved[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
            return x

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            m.hidden(torch.randint(0, 50, (B, T)))
        per_model.append(sum(saved.values()))
    per_layer = (per_model[1] - per_model[0]) / 2 / (B * T)
    assert per_layer == saved_bytes_per_token(ModelShape("t", d, 1, h, kv, ff, 50), 4, hf) == (5144 if hf else 5400)


def test_grpo_prediction_by_hand():
    """Every component of a GRPO run's prediction, from the shape and the config alone."""
    cfg = load_config(RLConfig, None, ["rollout.prompts_per_step=4", "rollout.samples_per_prompt=4"])
    cfg.rollout.max_new_tokens = 128
    est = predict_run_peak(cfg, "rl", TINY, seq_len=142, prompt_len=14, hf=True, baseline_bytes=1e8)
    P, V, d = count_params(TINY), 151936, 256
    assert P == 79_373_568
    c = est["components"]
    assert c["persistent"]["weights (fp32)"] == c["persistent"]["reference"] == 4 * P
    assert c["persistent"]["AdamW m, v (fp32)"] == 8 * P
    assert c["persistent"]["decode fused copies"] == 4 * 2 * d * (3 * d + 2 * 688)
    # the slots: min(max_slots 256, the larger call: the evaluation's 200 problems × 8 samples)
    assert c["persistent"]["KV cache (slots)"] == kv_bytes_per_token(TINY, 4) * 256 * (14 + 128)
    # the decode loop's slot state outlives a call (framework/decode_state.py); the rollout phase keeps
    # the prompts' logits (256 slots + the 64 prompts prefilled ahead of them) and the sampler's temporaries
    assert c["persistent"]["slot logits (fp32)"] == 4 * V * 256 and "decode graph pool" not in c["persistent"]
    assert c["rollout"]["next-token logits (fp32)"] == 4 * V * (256 + 64)
    assert c["rollout"]["sampler temporaries"] == 24 * V * 256
    gpu = predict_run_peak(cfg, "rl", TINY, device="cuda", seq_len=142, prompt_len=14, hf=True)["components"]
    assert gpu["persistent"]["decode graph pool"] == 24 * V * 256 and gpu["rollout"]["sampler temporaries"] == 0
    assert est["micro_batch_tokens"] == 16 * 142  # all 16 rows fit micro_batch_tokens=8192
    chunk = LOGIT_CHUNK_ELEMENTS * 4  # 16 × 142 × V entries are far more than a chunk
    head_grad = 4 * V * d
    assert c["train"]["logit chunks"] == max(CHUNK_FORWARD * chunk, CHUNK_BACKWARD * chunk + 2 * head_grad)
    assert c["train"]["activations"] == 16 * 142 * (2 * saved_bytes_per_token(TINY, 4, hf=True) + 12 * d + 4)
    assert c["train"]["autocast weight copies"] == 0  # fp32 on the CPU
    assert c["step"] == {"gradients (fp32)": 4 * P, "AdamW temporaries": 4 * P}
    assert c["rollout"]["gradients (fp32)"] == c["reference"]["gradients (fp32)"] == 4 * P  # until zero_grad
    ph = est["phases"]
    assert est["tensor_bytes"] == ph["persistent"] + max(v for k, v in ph.items() if k != "persistent")
    assert est["peak_bytes"] == est["tensor_bytes"] + 1e8
    loaded = predict_run_peak(cfg, "rl", TINY, seq_len=142, prompt_len=14, peak_so_far=1e12)
    assert loaded["peak_bytes"] == 1e12  # the process already peaked higher: that is the peak


def test_bf16_holds_the_reference_and_kv_in_two_bytes_and_lora_shrinks_the_training_state():
    cfg = load_config(RLConfig, None, ["rollout.max_new_tokens=64"])
    fp32 = predict_run_peak(cfg, "rl", TINY, seq_len=100)
    bf16 = predict_run_peak(cfg, "rl", TINY, seq_len=100, device="cuda", compute_dtype="bfloat16")
    p32, p16 = fp32["components"]["persistent"], bf16["components"]["persistent"]
    assert p16["reference"] * 2 == p32["reference"] and p16["KV cache (slots)"] * 2 == p32["KV cache (slots)"]
    assert bf16["components"]["train"]["autocast weight copies"] == 2 * count_params(TINY)
    lora = predict_run_peak(load_config(RLConfig, None, ["lora.r=8"]), "rl", TINY, seq_len=100)
    assert lora["components"]["persistent"]["AdamW m, v (fp32)"] < p32["AdamW m, v (fp32)"] / 50


def test_cli_predicts_a_config_and_a_hugging_face_directory(tmp_path, capsys):
    pytest.importorskip("transformers")
    from posttrain.models.hf import write_tiny

    cli(["configs/grpo_arith.yaml", "--stage", "rl", "--device", "cpu", "--json"])
    est = json.loads(capsys.readouterr().out)["predicted"]
    assert est["stage"] == "rl" and est["device"] == "cpu" and est["peak_bytes"] > 0
    d = write_tiny(tmp_path / "m", vocab_size=4096)
    cli([str(d), "rollout.max_new_tokens=32", "--device", "cuda", "--seq-len", "64", "--json"])
    est = json.loads(capsys.readouterr().out)["predicted"]
    assert est["compute_dtype"] == "bfloat16" and est["components"]["persistent"]["decode fused copies"] > 0
    text = format_prediction(est, measured=est["peak_gib"] / 2)
    assert "predicted / measured = 2.00" in text and "max_memory_allocated" in text
    assert est["budgets"]["train"] == 8192  # auto without a card: the numbers from before auto
    fitted = {}
    for gib in ("100", "0.3"):  # --card-gib: auto fits the card (128 rows of 96 tokens a step)
        cli([str(d), "rollout.max_new_tokens=32", "--device", "cuda", "--seq-len", "96", "--card-gib", gib, "--json"])
        fitted[gib] = json.loads(capsys.readouterr().out)["predicted"]
    assert fitted["100"]["budgets"]["train"] == 128 * 96  # the whole step
    train = fitted["0.3"]["budgets"]["train"]
    assert 96 < train < 128 * 96 and train % 96 == 0 and fitted["0.3"]["tensor_bytes"] <= 0.75 * 0.3 * 2**30


def test_a_run_prints_its_prediction_and_logs_its_measured_peak(tmp_path, capsys):
    """A stage writes its prediction at start (RUN_DIR/memory.json, the printed line) and logs
    `memory/peak_gib` (the process's peak RSS on a CPU: at least the RSS it started from) beside
    `memory/predicted_gib` every step; `posttrain memory RUN_DIR` puts the two side by side."""
    from posttrain import runtime
    from posttrain.config import PretrainConfig
    from posttrain.logging import read_metrics
    from posttrain.recipes import pretrain

    out = tmp_path / "pt"
    keys = [f"out={out}", "steps=2", "batch_size=4", "seq_len=32", "corpus_chars=4000", "task.max_terms=3"]
    pretrain.run(load_config(PretrainConfig, None, [*keys, "device=cpu"]))
    assert "[pretrain memory] predicted peak" in capsys.readouterr().out
    est = json.loads((out / "memory.json").read_text())
    assert est["stage"] == "pretrain" and est["micro_batch_tokens"] == 4 * 32 and est["baseline_bytes"] > 0
    rows = [m for m in read_metrics(out) if m["step"] > 0]
    peak_now = runtime.peak_memory_bytes("cpu") / 2**30  # the same reading (VmHWM), later: never lower
    assert all(0 < m["memory/peak_gib"] <= peak_now and m["memory/predicted_gib"] == est["peak_gib"] for m in rows)
    cli([str(out)])
    text = capsys.readouterr().out
    assert f"predicted peak {est['peak_gib']:.2f} GiB" in text and "peak RSS); predicted / measured = " in text


def test_the_predictions_runtime_numbers_are_the_runtimes():
    """sizing stays paper (no torch), so run_memory writes down the runtime numbers it predicts with; each
    must be its runtime twin's value, or the prediction follows a run that no longer exists."""
    import dataclasses

    from posttrain import runtime
    from posttrain.framework import decode_loop
    from posttrain.models import heads
    from posttrain.sizing import run_memory

    assert run_memory.LOGIT_CHUNK_ELEMENTS == heads.LOGIT_CHUNK_ELEMENTS == 2**24
    assert run_memory.PREFILL_BATCH == decode_loop.PREFILL_BATCH == 64
    assert (
        run_memory.DEFAULTS
        == dataclasses.asdict(runtime.MicroBatches())
        == {
            "train": 8192,
            "score": 8192,
            "reference": 16384,
        }
    )


def test_per_rank_the_sharded_state_is_divided_by_the_ranks_and_the_sampler_copy_is_not():
    """scale.gpus=2 with FSDP under bf16: master weights, gradients and AdamW 1/2 a rank, the sampler's plain
    copy 2 bytes a parameter on every rank, each rank's rows half the step's (hand-worked from the counts)."""
    from posttrain.config import RLConfig

    shape = ModelShape("t", hidden=64, layers=2, heads=4, kv_heads=4, intermediate=128, vocab=100, tie_embeddings=True)
    cfg = load_config(RLConfig, None, ["rollout.prompts_per_step=4", "rollout.samples_per_prompt=4"])
    kw = dict(device="cuda", compute_dtype="bfloat16", seq_len=40, prompt_len=20)
    one = predict_run_peak(cfg, "rl", shape, **kw)
    two = predict_run_peak(cfg, "rl", shape, **kw, ranks=2, shard="fsdp")
    P = count_params(shape)
    p1, p2 = one["components"]["persistent"], two["components"]["persistent"]
    assert p1["weights (fp32)"] == 4 * P and p1["AdamW m, v (fp32)"] == 8 * P
    assert "weights (fp32)" not in p2 and p2["sampler weights (compute dtype)"] == 2 * P
    assert p2["master shard (fp32)"] == 4 * P / 2 and p2["AdamW m, v (fp32)"] == 8 * P / 2
    assert two["components"]["step"]["gradients (fp32)"] == 4 * P / 2
    assert two["micro_batch_tokens"] * 2 == one["micro_batch_tokens"]  # 8 of the 16 rows a rank, 40 tokens each
    assert two["ranks"] == 2 and two["shard"] == "fsdp" and one["shard"] == ""
    rep = predict_run_peak(cfg, "rl", shape, **kw, ranks=2, shard="replicate")
    assert rep["components"]["persistent"] == p1  # replicas hold the whole state
