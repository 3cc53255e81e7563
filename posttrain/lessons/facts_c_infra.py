"""Facts of lessons 24 and 25: sizing (memory.plan), correctness traps checked on a real engine
and trainer, and kernel-level savings (shapes.logits_bytes, prefix sharing in the engine)."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from posttrain.framework.batch import collate_samples
from posttrain.framework.logprobs import sequence_logprobs
from posttrain.framework.reference import Reference
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.framework.sampler import token_logprobs
from posttrain.lessons import claims, units
from posttrain.lessons.facts_b_hw import h100_run
from posttrain.lessons.facts_c_common import GIB, MIB, kpi, table
from posttrain.models.gpt_mini import GPTMini, ModelConfig
from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
from posttrain.sizing import memory, shapes
from posttrain.sizing import throughput as tp
from posttrain.sizing.shapes import logits_bytes

# ---- 24 · the RL infra engineer -------------------------------------------------------------

SIZING = [  # (model, GPUs, LoRA rank, rollout TP): the whiteboard question and the planner's ways out
    ("llama3-8b", 8, 0, 1),
    ("llama-70b", 8, 0, 1),
    ("llama-70b", 8, 0, 8),
    ("llama-70b", 8, 16, 4),
    ("llama-70b", 32, 0, 8),
]


def rl24_plan(model: str, gpus: int, lora: int, rollout_tp: int) -> dict:

    return memory.plan(model, algo="grpo", gpus=gpus, lora=lora, checkpointing=True, rollout_tp=rollout_tp)


def rl24_sizing_table() -> dict:
    rows = []
    for model, gpus, lora, rtp in SIZING:
        p = rl24_plan(model, gpus, lora, rtp)
        ph = p["pools"]["colocated"]["phases"]
        rows.append(
            [
                model,
                gpus,
                lora or "full",
                rtp,
                f"{ph['persistent'] / GIB:.1f}",
                f"{p['peak_bytes'] / GIB:.1f}",
                "yes" if p["fits"] else "no",
            ]
        )
    return table(
        [
            "model",
            "H100s",
            "LoRA rank",
            "rollout TP",
            "persistent state, GiB/GPU",
            "peak, GiB/GPU",
            "fits the 74.5 GiB budget?",
        ],
        rows,
    )


def rl24_state_tib() -> float:
    """18 B per parameter for the 70B's full training state, in TiB."""

    return memory.train_bytes_per_param() * shapes.count_params(shapes.resolve_model("llama-70b")) / 2**40


@lru_cache(maxsize=1)
def rl24_traps() -> dict:
    """Three correctness traps checked on a real engine + trainer pair (random tiny gpt_mini, fp32):
    sampler vs trainer log-probs on the same tokens, a reference that cannot be trained, and the
    stop token in the loss of every response that stopped."""
    import torch

    tok = CharTokenizer(BASE_CHARS)
    torch.manual_seed(0)
    model = GPTMini(ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=64).resolved(tok.vocab_size))
    prompts = [tok.encode(tok.chat_prompt(f"{i}+{i + 3}")) for i in range(6)]
    T = 0.8
    samples = Engine(model, tok, max_slots=64).generate(
        prompts, 4, SamplingParams(temperature=T, max_new_tokens=24), seed=0
    )
    for s in samples:
        s.reward = 0.0
    batch = collate_samples(samples, tok.pad_id)
    with torch.no_grad():
        lp, _ = sequence_logprobs(model.eval(), batch.input_ids, T)  # [B, T]
    mask = batch.loss_mask
    gap = float(((lp - batch.old_logprobs) * mask).abs().max())
    with torch.no_grad():
        lp_t1, _ = sequence_logprobs(model, batch.input_ids, 1.0)  # the trainer forgot T
    wrong_t = float(((lp_t1 - batch.old_logprobs).abs() * mask).sum() / mask.sum())
    ref = Reference(model)
    stopped = [i for i, s in enumerate(samples) if s.finish_reason == "stop"]
    eos_in_loss = sum(int(mask[i, len(samples[i].prompt_ids) + len(samples[i].response_ids) - 1]) for i in stopped)
    return {
        "gap": gap,
        "tokens": int(mask.sum()),
        "ref_trainable": sum(p.requires_grad for p in ref.model.parameters()),
        "ref_params": sum(1 for _ in ref.model.parameters()),
        "stopped": len(stopped),
        "eos_in_loss": eos_in_loss,
        "samples": len(samples),
        "wrong_t": wrong_t,
        "T": T,
    }


# ---- 25 · kernels for RL ---------------------------------------------------------------------


def rl25_chunk_table() -> dict:
    """Logits held at once for 32,768 tokens × a 131,072-token vocabulary in bf16 (shapes.logits_bytes)."""

    full = logits_bytes(32768, 131072)
    rows = [["none (full logits)", f"{full / GIB:.2f} GiB", "1×"]]
    for c in (16384, 4096, 1024):
        b = logits_bytes(32768, 131072, vocab_chunk=c)
        rows.append([f"{c:,} columns", f"{b / MIB:,.0f} MiB", f"{full / b:.0f}×"])
    return table(["vocabulary chunk", "logits held at once", "smaller by"], rows)


def rl25_prefix_table() -> dict:
    """K samples share one prefill of a prompt of P tokens; each writes G response tokens (G/P = 0.1)."""
    g = 0.1
    return table(
        [
            "K",
            "prompt tokens computed, unshared / shared",
            "course's ratio K/(1 + K·G/P)",
            "all tokens, K(1 + G/P)/(1 + K·G/P)",
        ],
        [[k, f"{k}×", f"{k / (1 + k * g):.2f}×", f"{k * (1 + g) / (1 + k * g):.2f}×"] for k in (4, 16, 64)],
    )


@lru_cache(maxsize=1)
def rl25_engine_prefix() -> dict:
    """posttrain's engine: 4 prompts × 16 samples; prompt tokens prefilled vs. as if unshared."""
    import torch

    tok = CharTokenizer(BASE_CHARS)
    torch.manual_seed(0)
    model = GPTMini(
        ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=64).resolved(tok.vocab_size)
    ).eval()
    prompts = [tok.encode(tok.chat_prompt(q)) for q in ("3+4+5", "12+7+9+1", "6+6", "18+2+11")]
    eng = Engine(model, tok, max_slots=16)
    eng.generate(prompts, 16, SamplingParams(max_new_tokens=8), seed=0)
    return {
        k.split("/")[1]: eng.stats[k] for k in ("rollout/prompt_tokens", "rollout/prefill_tokens", "rollout/prefills")
    }


def rl25_chunked_exact() -> float:
    """A vocabulary-chunked log-softmax (a running logsumexp over 8 chunks) against posttrain's
    token_logprobs on the same logits: the largest difference, in nats (fp32)."""
    import torch

    g = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(64, 4096, generator=g)  # [N, V]
    y = torch.randint(0, 4096, (64,), generator=g)
    lse = torch.full((64,), -float("inf"))
    for chunk in logits.split(512, dim=-1):  # [N, 512] at a time
        lse = torch.logaddexp(lse, torch.logsumexp(chunk, -1))
    chunked = logits.gather(-1, y[:, None]).squeeze(1) - lse
    return float((chunked - token_logprobs(logits, y, 1.0)).abs().max())


def _lab(fmt: str, key: str) -> float:
    """The precision lab (lesson 27; claims.json): a sampler in `fmt` against an fp32 trainer."""
    return claims.recorded()["precision"]["mismatch"][fmt][key]


RATIO = "course's prompt-token ratio K/(1 + K·G/P)"  # the kernels widget's KPI

FACTS: dict[str, Callable[[], object]] = {
    "rl24_tokens_per_step": lambda: 1024 * 64 * 16,
    "rl24_decode_tok_s": lambda: tp.decode_tokens_per_s(14e9, 8.6e9, 32),
    "rl24_train_tok_s": lambda: tp.train_tokens_per_s(7e9),
    "rl24_speed_ratio": lambda: tp.train_tokens_per_s(7e9) / tp.decode_tokens_per_s(14e9, 8.6e9, 32),
    "rl24_speed_ratio_400": lambda: tp.train_tokens_per_s(7e9, 400e12) / tp.decode_tokens_per_s(14e9, 8.6e9, 32),
    "rl24_decode_128_tok_s": lambda: tp.decode_tokens_per_s(14e9, 128 * 2048 * 131072, 128),  # 7B, GQA KV
    "rl24_speed_ratio_128": lambda: tp.train_tokens_per_s(7e9) / tp.decode_tokens_per_s(14e9, 128 * 2048 * 131072, 128),
    "rl24_speed_ratio_128_400": lambda: (
        tp.train_tokens_per_s(7e9, 400e12) / tp.decode_tokens_per_s(14e9, 128 * 2048 * 131072, 128)
    ),
    "rl24_sizing_table": rl24_sizing_table,
    "rl24_state_tib": rl24_state_tib,
    "rl24_hbm_gib": lambda: 8 * units.H100_REPORTED_GIB,  # what nvidia-smi reports, 81,559 MiB a card
    "rl24_gap": lambda: rl24_traps()["gap"],
    "rl24_gap_tokens": lambda: rl24_traps()["tokens"],
    "rl24_ref_trainable": lambda: rl24_traps()["ref_trainable"],
    "rl24_ref_params": lambda: rl24_traps()["ref_params"],
    "rl24_stopped": lambda: rl24_traps()["stopped"],
    "rl24_eos_in_loss": lambda: rl24_traps()["eos_in_loss"],
    "rl25_logits_gib": lambda: __import__("posttrain.sizing.shapes", fromlist=["x"]).logits_bytes(32768, 131072) / GIB,
    "rl25_chunk_table": rl25_chunk_table,
    "rl25_prefix_table": rl25_prefix_table,
    "rl25_engine_prompt_tokens": lambda: rl25_engine_prefix()["prompt_tokens"],
    "rl25_engine_prefill_tokens": lambda: rl25_engine_prefix()["prefill_tokens"],
    "rl25_engine_prefills": lambda: rl25_engine_prefix()["prefills"],
    "rl25_chunked_exact": rl25_chunked_exact,
    "rl25_wrong_t_gap": lambda: rl24_traps()["wrong_t"],
    "rl25_sampler_t": lambda: rl24_traps()["T"],
    "rl25_lab_fp32": lambda: _lab("fp32", "delta_abs_mean"),
    "rl25_lab_fp16": lambda: _lab("fp16", "delta_abs_mean"),
    "rl25_lab_bf16": lambda: _lab("bf16", "delta_abs_mean"),
    "rl25_lab_bf16_max": lambda: _lab("bf16", "delta_abs_max"),
    "rl25_h100_mismatch": lambda: round(h100_run()["grpo"]["mismatch_logprob_abs"], 4),
    "rl25_cast_ms": lambda: (140e9 + 70e9) / 3.35e12 * 1000,  # read the bf16, write the FP8
    "rl25_w_gp05": lambda: kpi("kernels", RATIO, gp=0.5),
    "rl25_w_k64": lambda: kpi("kernels", RATIO, K=64, gp=0.05),
}
