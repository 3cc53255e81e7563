"""The peak memory of ONE posttrain run, predicted from its config and its model's shape, to be
held against the peak the run measures (`memory/peak_gib` in its metrics; issue 31).

    est = predict_run_peak(cfg, "rl", shape, device="cuda", seq_len=150, prompt_len=22)
    est["peak_bytes"], est["phases"], est["components"]          # bytes
    posttrain memory RUN_DIR | CONFIG.yaml | HF_DIR --stage rl     # the same, as a table (memory_cli.py)

memory.py plans any framework's run on GPUs the way the course counts it (bf16 weights + an
fp32 master, a micro-batch of `seq_len` sequences, the logits whole). This file counts what
posttrain allocates, role by role, in one process:

  persistent  fp32 weights 4 B/param; once training started, AdamW m, v 8 per trainable param; the
              reference held in the compute dtype (2 B under bf16 autocast, 4 on the CPU's fp32); a
              separate critic's trunk (16 B/param); a sampler copy (weight_sync=separate, async); a
              Hugging Face model's fused q/k/v and gate/up copies for the one-token decode path; the
              engine's slot KV cache (kept between calls) in the compute dtype; the decode loop's slot
              state (fp32 next-token logits of every slot, kept between calls) and, on CUDA, the pool of
              the decode graphs captured over it (one step's sampler temporaries); a distillation teacher.
  train       one micro-batch (`optim.micro_batch_tokens` padded tokens, whole rows): the tensors
              autograd saves per token and layer (`saved_bytes_per_token`; with grad_checkpointing a
              layer's input each and one layer's recomputed tensors), the final hidden states,
              and the logits' working set. Logits are made in chunks of `LOGIT_CHUNK_ELEMENTS`
              (framework/logprobs.py): a chunk's forward holds 6 copies of it (logits, log-softmax,
              the entropy's softmax, clamp and product), its backward 4 beside the head's gradient
              (the only gradient while the chunks run) and the next chunk's share of it. Under
              autocast, the bf16 copies of the weights autocast caches.
  step        the fp32 gradients (4 B per trainable param, alive until the next step's zero_grad:
              in the rollout and reference phases too) and AdamW's foreach temporaries (4 B).
  reference   the no-grad forward of a reference micro-batch (16,384 tokens, or auto's budget): one
              layer's intermediates, the hidden states and two logit chunks; an RL run without a
              reference that scores without gradient (PPO's V_old, the off-policy correction) the same.
  rollout     fp32 next-token logits of every prompt, the sampler's temporaries on the slots' logits
              (log-softmax, probabilities, an fp64 cumulative sum: 24 B per entry), the prompt
              cache; under autocast, the cached bf16 weights.

peak = persistent + the largest phase (each phase frees its buffers before the next).

`optim.micro_batch_tokens=auto` is sized here (`auto_budgets`): on CUDA, the largest trainer budget
(whole units of rows of the step's width) whose predicted tensors fit AUTO_HEADROOM short of the card,
at most AUTO_MAX_TOKENS, and then the largest budget of the passes without gradient (the reference,
PPO's V_old, the off-policy correction) that still fits, at most the whole step; a run that does not
fit at one row keeps the peak it has there. On any other device, or with the card unknown, the
numbers from before auto (MicroBatches' defaults in runtime.py: 8192 and 16,384). On a CPU
the process itself (interpreter, torch, transformers: its RSS when the run starts, less the
model) adds to it, `baseline_bytes`; a process that already peaked higher (loading the model)
keeps that peak, `peak_so_far`. The counts of chunk copies and AdamW temporaries were measured
phase by phase (peak RSS reset before each) in benchmarks/vocab_memory.py's GRPO run, which also
holds the whole prediction against the measured peak.
"""

from __future__ import annotations

from posttrain.errors import UsageError
from posttrain.sizing.shapes import (
    ModelShape,
    count_params,
    head_free_params,
    kv_bytes_per_token,
    lora_params,
    resolve_model,
)

GiB = 2**30
STAGES = ("pretrain", "sft", "rl", "dpo", "rm", "distill")
# The runtime numbers the prediction follows, written here so that sizing stays paper (no torch); each is
# held equal to its runtime twin by tests/test_run_memory.py.
LOGIT_CHUNK_ELEMENTS = 2**24  # logits made at once (models/heads.LOGIT_CHUNK_ELEMENTS)
DEFAULTS = {"train": 8192, "score": 8192, "reference": 16384}  # runtime.MicroBatches(): the CPU's, and before auto
# auto leaves a quarter of the card to what the prediction does not count: the CUDA context (~0.5 GiB),
# the allocator's cached and fragmented blocks (reserved ÷ allocated was 1.09-1.18 on the H200 at
# micro-batches of ~3,100 tokens, issue 43) and the prediction's own error (measured/predicted 1.08)
AUTO_HEADROOM = 0.25
# a micro-batch needs no more tokens than 4 × its fixed cost on CUDA (framework/batch.CUDA_MICRO_BATCH_COST_TOKENS,
# 16,384): the cost is then at most a fifth of it, and a bigger one only holds more activations
AUTO_MAX_TOKENS = 65536
PREFILL_BATCH = 64  # prompts per prefill forward (framework/decode_loop.PREFILL_BATCH)
CHUNK_FORWARD, CHUNK_BACKWARD = 6, 4  # logit-chunk copies live in a chunk's forward / backward (measured)


def predict_run_peak(
    cfg,
    stage: str,
    shape: ModelShape,
    *,
    device: str = "cpu",
    compute_dtype: str = "float32",
    seq_len: int = 0,
    prompt_len: int = 0,
    hf: bool = False,
    baseline_bytes: float = 0.0,
    peak_so_far: float = 0.0,
    capacity: float | None = None,
    budgets: dict | None = None,
    ranks: int = 1,
    shard: str = "replicate",
) -> dict:
    """Predicted peak memory of one posttrain run: the bytes its tensors hold at the worst moment
    of a step (the module docstring says what is counted), plus `baseline_bytes` (a CPU process's
    own RSS), or `peak_so_far` (what the process already peaked at, loading the model) when that is
    more. The peak the start-of-run card warning and the out-of-memory line quote (framework/card.py).

    cfg: the stage's config, a dataclass or its dict (a run's config.yaml); stage: one of STAGES.
    shape: the model's ModelShape (sizing.shapes.resolve_model, or `model_shape(model)` of a live one).
    device, compute_dtype: where and in what it computes ("float32" or "bfloat16": bf16 autocast).
    seq_len: the longest row of a step (prompt + response); 0 = the shape's context is not known,
    the config's own length or 512. prompt_len: RL/distill prompt tokens (0 = seq_len − max_new).
    hf: a Hugging Face model (the decode path's fused weight copies).
    capacity: the card's bytes (framework/card.card_bytes), which optim.micro_batch_tokens=auto fits on
    CUDA (`auto_budgets`); budgets: {"train", "score", "reference"} tokens given, the config's ignored.
    ranks, shard: the run's ranks (one GPU each) and how the trainer holds the policy over them
    (distributed/ranks.py): per rank, a block of the step's rows; with "fsdp" the master weights,
    gradients and AdamW moments 1/N each (16·P/N) beside the sampler's plain copy in the compute dtype.

    Returns {"peak_bytes", "peak_gib", "tensor_bytes", "baseline_bytes", "peak_so_far", "phases",
    "components", "device", "compute_dtype", "stage", "micro_batch_tokens", "budgets"}: components by
    phase, bytes; micro_batch_tokens the largest trainer micro-batch's padded tokens, budgets the ones used.
    """
    if stage not in STAGES:
        raise ValueError(f"stage {stage!r} is not one of {', '.join(STAGES)}")
    get = _getter(cfg)
    c = 2 if compute_dtype in ("bfloat16", "bf16") else 4  # compute bytes
    bf16 = c == 2
    P = count_params(shape)
    lora_r = int(get("lora.r", 0) or 0)
    Pt = lora_params(shape, lora_r) if lora_r > 0 else P
    if stage == "rm":  # a scalar head on the trunk: the LM head gets no gradient, so no AdamW state
        Pt = min(Pt, head_free_params(shape))
    d, V = shape.hidden, shape.vocab
    max_new = int(get("rollout.max_new_tokens", 0) or get("max_new_tokens", 0) or 0)
    width = seq_len or int(get("seq_len", 0) or 0) or 512
    plen = prompt_len or max(1, width - max_new)
    rows, unit = _rows(get, stage, ranks)  # this rank's block of whole units
    if budgets is None:
        where = {"device": device, "compute_dtype": compute_dtype, "seq_len": width, "prompt_len": plen, "hf": hf}
        budgets = resolve_budgets(cfg, stage, shape, capacity=capacity, ranks=ranks, shard=shard, **where)
    micro = _micro_tokens(int(budgets["train"]), rows, width, unit)
    sharded = ranks if ranks > 1 and shard == "fsdp" else 1  # what the trainer's state is divided by

    persistent = {"weights (fp32)": 4.0 * P + (4.0 * Pt if lora_r else 0.0), "AdamW m, v (fp32)": 8.0 * Pt / sharded}
    if sharded > 1:  # the fp32 master weights 1/N a rank; the sampler's plain copy in the compute dtype
        persistent["master shard (fp32)"] = 4.0 * Pt / sharded
        if not lora_r:  # (with LoRA it stays fp32: distributed/ranks.ShardedTrainer)
            del persistent["weights (fp32)"]
            persistent["sampler weights (compute dtype)"] = float(c * P)
    if stage == "rl" and _has_reference(get):
        persistent["reference"] = float(c * P)
    if stage == "rl" and get("algo.name", "") == "ppo" and get("algo.critic", "shared") == "separate":
        persistent["critic trunk"] = 16.0 * (head_free_params(shape) - d - 1)
    if stage == "rl" and (get("scale.weight_sync", "colocated") == "separate" or get("scale.async_", False)):
        persistent["sampler copy"] = 4.0 * P
    if stage == "distill":
        persistent["teacher"] = 4.0 * P
    samples = _sampled_rows(get, stage, ranks)
    if samples:
        if hf:
            q, kv = shape.heads * shape.hd, shape.kv_heads * shape.hd
            persistent["decode fused copies"] = 4.0 * shape.layers * d * (q + 2 * kv + 2 * shape.intermediate)
        slots = min(int(get("rollout.max_slots", 256)), max(samples))
        persistent["KV cache (slots)"] = float(kv_bytes_per_token(shape, c) * slots * (plen + max_new))
        # the decode loop's slot state, kept between calls (framework/decode_state.py), and on CUDA the
        # memory pool of the graphs captured over it: one decode step's sampler temporaries
        persistent["slot logits (fp32)"] = 4.0 * V * slots
        if str(device).startswith("cuda"):
            persistent["decode graph pool"] = 24.0 * V * slots + (4.0 * V * slots if bf16 else 0.0)

    autocast_cache = 2.0 * P if bf16 else 0.0  # bf16 copies of the fp32 weights, cached per autocast region
    grads = 4.0 * Pt / sharded  # fp32, from a backward until the next step's zero_grad(set_to_none)
    chunk = min(micro * V, LOGIT_CHUNK_ELEMENTS) * 4.0
    head_grad = 4.0 * V * d if stage != "rm" and not lora_r else 0.0  # the only gradient while chunks run
    phases = {
        "train": {
            "activations": float(
                micro * (_saved_per_token(shape, c, hf, bool(get("grad_checkpointing"))) + 12 * d + 4)
            ),
            # forward: a chunk's logits, log-softmax, the entropy's softmax and product; backward: their
            # gradients beside the head's gradient and its next chunk's share (measured, module doc)
            "logit chunks": 0.0
            if stage == "rm"
            else max(CHUNK_FORWARD * chunk, CHUNK_BACKWARD * chunk + 2 * head_grad),
            "autocast weight copies": autocast_cache,
            **({"gathered blocks": 2.0 * c * P / max(shape.layers, 1)} if sharded > 1 else {}),  # FSDP's prefetch
        },
        "step": {"gradients (fp32)": grads, "AdamW temporaries": 4.0 * Pt / sharded},
    }
    if stage == "rl" and _scores_without_grad(get) or stage == "dpo":
        ref_tokens = min(int(budgets["reference"]), rows * width)
        ref = {
            "gradients (fp32)": grads if stage == "rl" else 0.0,
            "activations (no grad)": float(ref_tokens * (3 * d + shape.heads * shape.hd + 3 * shape.intermediate) * c),
            "hidden states": ref_tokens * d * 8.0,
            "logit chunks": 2 * min(ref_tokens * V, LOGIT_CHUNK_ELEMENTS) * 4.0,
        }
        if stage == "dpo":  # scored once, before training: a copy beside the policy, no optimizer yet
            ref["reference copy"] = float(c * P) - 8.0 * Pt
        phases["reference"] = ref
    if samples:
        n = min(int(get("rollout.max_slots", 256)), max(samples))
        groups = min(n + PREFILL_BATCH, max(samples))  # prompt rows alive at once (the engine's ring)
        phases["rollout"] = {
            "gradients (fp32)": grads if stage in ("rl", "distill") else 0.0,
            "next-token logits (fp32)": 4.0 * V * groups,  # the prompts'; the slots' are persistent
            "sampler temporaries": 0.0
            if str(device).startswith("cuda")  # in the graph pool
            else 24.0 * V * n + (4.0 * V * n if bf16 else 0.0),
            "prompt cache": float(kv_bytes_per_token(shape, c) * groups * plen),
            "autocast weight copies": autocast_cache,
        }
    totals = {k: sum(v.values()) for k, v in phases.items()}
    tensors = sum(persistent.values()) + max(totals.values())
    peak = max(tensors + baseline_bytes, peak_so_far)
    return {
        "stage": stage,
        "device": device,
        "compute_dtype": "bfloat16" if bf16 else "float32",
        "micro_batch_tokens": micro,
        "budgets": {k: int(v) for k, v in budgets.items()},
        "ranks": ranks,
        "shard": shard if ranks > 1 else "",
        "peak_bytes": peak,
        "peak_gib": peak / GiB,
        "tensor_bytes": tensors,
        "baseline_bytes": float(baseline_bytes),
        "peak_so_far": float(peak_so_far),
        "components": {"persistent": persistent, **phases},
        "phases": {"persistent": sum(persistent.values()), **totals},
    }


def resolve_budgets(cfg, stage: str, shape: ModelShape, *, capacity: float | None = None, **where) -> dict:
    """{"train", "score", "reference"}: the micro-batch budgets of optim.micro_batch_tokens (as
    framework/batch.budgets reads it): a number N is the trainer's and its passes' without gradient,
    the reference keeping 16,384; auto, `auto_budgets` on CUDA with the card known, else DEFAULTS.
    `where`: predict_run_peak's device, compute_dtype, seq_len, prompt_len, hf, ranks and shard."""
    setting = _getter(cfg)("optim.micro_batch_tokens", "auto")
    if setting != "auto":
        return {"train": int(setting), "score": int(setting), "reference": DEFAULTS["reference"]}
    if capacity is None or not str(where.get("device", "cpu")).startswith("cuda"):
        return dict(DEFAULTS)
    return auto_budgets(cfg, stage, shape, capacity=capacity, **where)


def auto_budgets(cfg, stage: str, shape: ModelShape, *, capacity: float, seq_len: int = 0, **where) -> dict:
    """optim.micro_batch_tokens=auto on a card of `capacity` bytes (the module docstring): the trainer's
    budget, the largest whole number of units of rows of the step's width whose predicted tensors fit
    (1 − AUTO_HEADROOM) of the card (less vLLM's `gpu_memory_utilization` with rollout.backend=vllm), at
    most AUTO_MAX_TOKENS; then the passes without gradient (score,
    reference) the largest that still fits, at most the whole step. Where even one unit of rows does not
    fit, nothing may raise the peak above the one it has there."""
    get = _getter(cfg)
    width = seq_len or int(get("seq_len", 0) or 0) or 512
    rows, unit = _rows(get, stage, int(where.get("ranks", 1)))  # this rank's
    units = max(1, rows // unit)

    def tensors(train_units: int, no_grad_units: int) -> float:
        b = {"train": train_units * unit * width, "reference": no_grad_units * unit * width}
        b["score"] = b["reference"]
        return predict_run_peak(cfg, stage, shape, seq_len=width, budgets=b, **where)["tensor_bytes"]

    if get("rollout.backend", "posttrain") == "vllm":  # vLLM's share of the card is not the trainer's
        capacity *= 1 - float(get("rollout.vllm.gpu_memory_utilization", 0.3))
    target = max(capacity * (1 - AUTO_HEADROOM), tensors(1, 1))
    train = _largest(units, lambda k: tensors(k, 1) <= target)
    train_tokens = max(unit * width, min(train * unit * width, AUTO_MAX_TOKENS // (unit * width) * unit * width))
    no_grad = _largest(units, lambda k: tensors(train_tokens // (unit * width), k) <= target)
    return {"train": train_tokens, "score": no_grad * unit * width, "reference": no_grad * unit * width}


def _largest(n: int, fits) -> int:
    """The largest k in 1..n with fits(k) (fits is monotone: true up to some k, false after); 1 if none."""
    lo, hi = 1, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _saved_per_token(s: ModelShape, c: int, hf: bool, checkpointing: bool) -> float:
    """Bytes autograd holds per token over all layers during a backward: every layer's saved tensors,
    or with `grad_checkpointing` each layer's fp32 input (the checkpoint's only saved tensor) plus
    one layer's saved tensors, recomputed for its backward (models/gpt_mini.py, models/hf.py)."""
    per_layer = saved_bytes_per_token(s, c, hf)
    return s.layers * 4.0 * s.hidden + per_layer if checkpointing else s.layers * per_layer


def saved_bytes_per_token(s: ModelShape, c: int = 4, hf: bool = False) -> float:
    """Bytes autograd saves per token and layer in posttrain's Llama-shaped models, in fp32 (c = 4):
    4·(4d + 4q + 4kv + 4ff + h + 2) for gpt_mini (its k and v are saved again repeated to the query
    heads), 2kv fewer for a Hugging Face Llama; both exact against saved-tensor hooks
    (tests/test_run_memory.py). Under bf16 autocast (c = 2), shapes.activation_bytes' count of a
    bf16 Hugging Face Llama (each RMSNorm keeps an fp32 upcast)."""
    q, kv = s.heads * s.hd, s.kv_heads * s.hd
    if c == 4:
        return 4.0 * (4 * s.hidden + 4 * q + (2 if hf else 4) * kv + 4 * s.intermediate + s.heads + 2)
    return 2.0 * (8 * s.hidden + 4) + 4 * q + 4 * kv + 4 * s.heads + 8 * s.intermediate


def model_shape(model, name: str = "model") -> ModelShape:
    """The ModelShape of a live posttrain model (gpt_mini or models/hf.HFCausalLM: their `.config`)."""
    c = model.config
    hd = getattr(c, "head_dim", 0) or c.d_model // c.n_heads
    return ModelShape(
        name, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.d_ff, c.vocab_size, bool(c.tie_embeddings), hd
    )


def init_shape(init: str, fallback: ModelShape | None = None) -> tuple[ModelShape, bool]:
    """(shape, is a Hugging Face model) of a run's `init`: a Hugging Face directory (its config.json),
    a posttrain run or checkpoint (model.json), or `fallback` (a run from scratch: its `model:`)."""
    import json
    from pathlib import Path

    from posttrain import checkpoint  # entry: no torch until called

    if init:
        ckpt = checkpoint.resolve(init)
        if (ckpt / "config.json").exists():
            return resolve_model(str(ckpt / "config.json")), True
        if (ckpt / "model.json").exists():
            c = json.loads((ckpt / "model.json").read_text())
            hd = c["d_model"] // c["n_heads"]
            shape = ModelShape(
                Path(init).name, c["d_model"], c["n_layers"], c["n_heads"], c["n_kv_heads"], c["d_ff"],
                c["vocab_size"], bool(c.get("tie_embeddings", False)), hd,
            )  # fmt: skip
            return shape, False
        raise UsageError(f"init={init}: no config.json or model.json in {ckpt}; give a run or a model directory")
    if fallback is None:
        raise UsageError("the run starts from no init and no model shape was given")
    return fallback, False


def _getter(cfg):
    """get("a.b", default) over a config dataclass or its nested dict."""

    def get(key: str, default=None):
        node = cfg
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
            if node is None:
                return default
        return node

    return get


def _has_reference(get) -> bool:
    """RL builds the reference when the algorithm's KL coefficient is > 0 or an RM run measures KL."""
    return float(get("algo.kl_coef", 0.0) or 0.0) > 0 or bool(get("reward_model", ""))


def _scores_without_grad(get) -> bool:
    """An RL step with a forward of its whole batch without gradient: the reference's, PPO's V_old, or
    the off-policy correction's (async, vLLM, or asked for by scale.off_policy_correction)."""
    correction = str(get("scale.off_policy_correction", "auto"))
    asynchronous = get("scale.async_", False) or get("scale.async", False)  # a dataclass, or config.yaml's key
    off_policy = asynchronous or get("rollout.backend", "posttrain") == "vllm"
    corrected = correction not in ("auto", "none") or (correction == "auto" and off_policy)
    return _has_reference(get) or get("algo.name", "") == "ppo" or corrected


def _rows(get, stage: str, ranks: int = 1) -> tuple[int, int]:
    """(rows of one optimizer step on one of `ranks` ranks, rows that stay together in a micro-batch)."""
    if stage in ("rl", "distill"):
        prompts = int(get("rollout.prompts_per_step", 0) or get("prompts_per_step", 16))
        k = int(get("rollout.samples_per_prompt", 0) or get("samples_per_prompt", 8))
        rows = prompts * (k + int(get("rollout.overprovision", 0) or 0)) // max(1, int(get("optim.minibatches", 1)))
        return -(-rows // ranks), 1
    unit = 2 if stage in ("dpo", "rm") else 1
    return -(-int(get("batch_size", 32)) // ranks) * unit, unit


def _micro_tokens(budget: int, rows: int, width: int, unit: int) -> int:
    """Padded tokens of the largest micro-batch: whole units of rows up to the token budget."""
    per = max(unit, budget // width // unit * unit)
    return min(rows, per) * width


def _sampled_rows(get, stage: str, ranks: int = 1) -> list[int]:
    """Rows each generate() call of the run decodes at once: rollout (RL: this rank's block of the groups)
    and evaluation (rank 0: every held-out problem)."""
    out = []
    if stage in ("rl", "distill"):
        out.append(_rows(get, stage, ranks if stage == "rl" else 1)[0] * max(1, int(get("optim.minibatches", 1))))
    problems = int(get("eval.problems", 0) or get("eval_problems", 0) or 0)
    samples = int(get("eval.samples", 0) or get("eval_samples", 0) or (1 if stage == "sft" else 0))  # SFT: greedy
    if problems and samples and stage != "pretrain":
        out.append(problems * samples)
    return out
