"""Memory math: what an RL post-training run holds on each GPU, and whether it fits.

    plan("llama-7b", algo="grpo", gpu="h100", gpus=8)   # -> plain dict, bytes per GPU
    posttrain memory llama-7b --algo grpo --gpu h100 [--gpus 8 --shard fsdp --lora 16 ...] [--json]

The command line and the plan's table live in memory_cli.py; this file is the arithmetic.

A model is a named shape (`PRESETS`: real Llama / Qwen / Mistral sizes; gpt_mini's nano,
micro, mini; the course's round sizes "7b", "70b", ... from lesson 22's table), a Hugging
Face config.json, or one of our YAML configs (its `model:` section). An algorithm decides
the roles (`ROLES`): a reference when its default KL coefficient is non-zero, a critic for
PPO, a reward model for RLHF, no rollout for offline preference losses.

Accounting, per GPU (all bytes; "GB" below is 1e9 bytes, as the course writes it):

  persistent   policy weights (bf16, 2 B/param) + fp32 master (4) + fp32 grads (4) + Adam m, v
               (8): 18 B per trainable param under the default `mixed` recipe (lesson 22);
               reference and reward model in bf16 (2 B/param, inference only); a separate
               critic is a second training state of the trunk + value head (no LM head), a
               shared one only the head. Sharded by FSDP (ZeRO-3) degree × TP degree.
  train phase  activations of one micro-batch (+ logits, + FSDP all-gather buffers); a
               separate critic adds its trunk's activations (posttrain steps policy and critic
               in one backward, models/heads.py).
  rollout      KV cache = layers × 2 × kv_heads × head_dim × tokens × 2 B, split over the
               pool; under FSDP the sampler also needs the gathered bf16 weights (÷ rollout TP).
  peak         colocated: persistent + max(train phase, rollout phase) (each phase frees its
               buffers before the other runs); split placement: each pool on its own.

Decisions where the course is loose or inconsistent (docs/architecture.md §11):
  * 18 / 16 / 12 B/param (row 59): 18 = 2+4+4+8 is the course's own breakdown. 18 − 4 is
    14, not 16, so we read "16 without the master" as training the fp32 weights directly
    (4 weights + 4 grads + 8 Adam) and "12 with bf16 Adam" as that with 2-byte m and v.
  * Activations: the course formula N·L·B·(12d + 2L)·2 B with checkpointing = ÷8 (rows 61,
    64, 65) is `activations="course"`. It ignores the MLP width and the logits, so the
    planner's default `"llama"` counts the tensors a bf16 Hugging Face Llama saves for
    backward, ≈(16d + 4·q + 4·kv + 8·ff) B/token/layer (each RMSNorm keeps its fp32 upcast);
    a test measures them with saved-tensor hooks. With checkpointing it keeps each layer's
    input (2d B) plus one layer recomputed. Logits: 6 B per vocab entry per token (bf16
    logits + the fp32 log-softmax the trainer saves). The course mode reproduces the course.
  * Row 52 (70B × 256 × 8k KV "≈670 GB"): exact is 687.2 GB = 640 GiB; we print decimal GB
    and the tests pin both; 670 is the course's rounding slip.
  * Row 65 (7B on 8 H100): its "131 GB KV total" is 1,048,576 tokens × 131,072 B =
    137.4 GB (128 GiB); the rollout GPUs hold 14 + 45.8 = 59.8 GB, not 58. Its 200k train
    tok/s breaks the 6P ceiling (throughput.py).
  * Row 84 ("70B on 8 H100 → colocated"): 70B × 18 B = 1.26 TB > 640 GB, so a full
    fine-tune does not fit; the planner says so and points to LoRA (the reference is then
    the base with the adapter off: no second copy) with a rollout TP that holds the weights.
  * Capacity: an H100 is 80 GB and an H200 141 GB as sold (decimal). The cards really hold
    85.5 / 150.7 GB (nvidia-smi: 81,559 / 143,771 MiB); the difference is the margin for the
    CUDA context and allocator fragmentation.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from posttrain.errors import UsageError
from posttrain.sizing.shapes import (
    ModelShape,
    activation_bytes,
    count_params,
    course_activation_bytes,
    course_shape,
    head_free_params,
    kv_bytes_per_token,
    layer_params,
    logits_bytes,
    lora_params,
    resolve_model,
)

GB = 1e9
GPUS = {"h100": ("H100 80GB", 80e9), "h200": ("H200 141GB", 141e9), "a100": ("A100 80GB", 80e9)}  # bytes as sold
# bytes per TRAINABLE param: (compute weights, fp32 master, grads, optimizer states). Row 59.
PRECISION = {
    "mixed": (2, 4, 4, 8),  # bf16 weights + fp32 master + fp32 grads + fp32 Adam m, v = 18
    "no-master": (4, 0, 4, 8),  # fp32 weights are the master (bf16 only inside autocast) = 16
    "bf16-adam": (4, 0, 4, 4),  # as no-master with bf16 Adam m, v = 12
}


def train_bytes_per_param(precision: str = "mixed") -> int:
    """18 (mixed), 16 (no-master), 12 (bf16-adam): row 59."""
    return sum(_precision(precision))


def min_gpus(total_bytes: float, gpu: str = "h100") -> int:
    """GPUs to hold `total_bytes` evenly sharded: a power of two up to 8, whole 8-GPU nodes
    beyond. 126 GB → 2, 1.26 TB → 16, 7.29 TB → 96 H100s (row 60)."""
    n = max(1, math.ceil(total_bytes / _gpu(gpu)[1]))
    return 1 << (n - 1).bit_length() if n <= 8 else -(-n // 8) * 8


def envelope(params_b: float, seq_len: int = 8192, batch: int = 4, gpus: int = 8, checkpointing: bool = True) -> dict:
    """Lesson 22's "memory envelope" widget, exactly: train/GPU = 18P/G + activations (not
    sharded; ÷8 with checkpointing); inference/GPU = (2P + KV of B×L tokens) / min(G, 8).
    Defaults → 32.9 GB train, 2.3 GB infer, 128 KB/token, fits (row 64)."""
    s = course_shape(params_b)
    p, act = count_params(s), course_activation_bytes(s.layers, s.hidden, seq_len, batch, checkpointing)
    tp, kv_tok = min(gpus, 8), kv_bytes_per_token(s)
    train = train_bytes_per_param() * p / gpus + act
    infer = (2 * p + batch * seq_len * kv_tok) / tp
    return {
        "train_gb": train / GB,
        "infer_gb": infer / GB,
        "kv_kb_per_token": kv_tok / 1024,
        "activations_gb": act / GB,
        "fits_h100": train < 80e9 and infer < 80e9,
    }


# ---- the planner -------------------------------------------------------------------------


@dataclass(frozen=True)
class Roles:
    rollout: bool  # generates samples (a KV cache); False for offline losses
    reference: bool  # its default config has a KL to the reference (needs_reference)
    critic: bool = False  # a learned value model, trained alongside
    reward_model: bool = False  # a learned reward model scores samples (RLHF)


_RL, _RL_REF = Roles(True, False), Roles(True, True)
ROLES = {  # RL algorithms as posttrain.algorithms defaults them; the test pins it to needs_reference
    "reinforce": _RL,
    "rloo": _RL,
    "grpo": _RL_REF,
    "mgpo": _RL_REF,
    "dr_grpo": _RL,
    "dapo": _RL,
    "gspo": _RL,
    "cispo": _RL,
    "maxrl": _RL,
    "dppo": _RL,
    "reinforce_pp": _RL_REF,
    "ppo": Roles(True, True, critic=True),
    "rlhf": Roles(True, True, critic=True, reward_model=True),
    "dpo": Roles(False, True),
    "ipo": Roles(False, True),
    "kto": Roles(False, True),
    "simpo": Roles(False, False),
    "orpo": Roles(False, False),
    "sft": Roles(False, False),
    "rm": Roles(False, False),
}


@dataclass
class PlanConfig:
    algo: str = "grpo"  # which roles exist (ROLES)
    gpu: str = "h100"  # h100 | h200 | a100
    gpus: int = 1  # GPUs of the pool (the trainer pool under placement=split)
    shard: str = "fsdp"  # fsdp: ZeRO-3 shards params, grads, optimizer over data-parallel GPUs | dp
    tp: int = 1  # tensor-parallel degree of the trainer (splits weights, activations, logits)
    rollout_tp: int = 0  # tensor-parallel degree of the sampler; 0 = tp
    micro_batch: int = 1  # sequences per GPU per forward/backward (DPO: count chosen + rejected)
    seq_len: int = 4096  # training tokens per sequence (prompt + response)
    rollout_seqs: int = 64  # sequences decoding at once over the whole rollout pool (prompts × K in flight)
    rollout_len: int = 0  # tokens per rollout sequence in the KV cache; 0 = seq_len
    checkpointing: bool = False  # gradient checkpointing: recompute each layer in backward (~33% more compute)
    lora: int = 0  # LoRA rank on every linear (0 = full fine-tune); the reference is the base
    precision: str = "mixed"  # mixed (18 B/param) | no-master (16) | bf16-adam (12)
    reference: str = "auto"  # auto (as the algorithm needs) | gpu | cpu (offloaded: 0 on GPU) | none
    reward_model: str = ""  # a learned reward model's shape ("" = none, or the policy's under rlhf)
    critic: str = "separate"  # PPO's critic: separate (trunk copy + value head) | shared (head on the policy)
    activations: str = "llama"  # llama (saved tensors + logits + FSDP buffers) | course (lesson 22's formula only)
    placement: str = "colocated"  # colocated (all roles share the pool) | split (trainer / reference / rollout pools)
    ref_gpus: int = 1  # placement=split: GPUs of the reference (+ reward model) pool
    rollout_gpus: int = 1  # placement=split: GPUs of the rollout pool


def _gpu(name):
    if name not in GPUS:
        raise UsageError(f"--gpu {name!r} is unknown; use one of {', '.join(GPUS)}")
    return GPUS[name]


def _precision(name):
    if name not in PRECISION:
        raise UsageError(f"precision {name!r} is unknown; use one of {', '.join(PRECISION)}")
    return PRECISION[name]


def plan(model, cfg: PlanConfig | None = None, suggest: bool = True, **overrides) -> dict:
    """Bytes per GPU of every component for `model` trained with `cfg.algo`; plain dict.

    Keys: model, params, trainable_params, roles, config, gpu, capacity_bytes, pools
    ({name: {gpus, components, phases, peak_bytes, fits}}), peak_bytes, fits, fits_on (every
    GPU kind), notes (activation and KV sizes) and suggestions (changes that make it fit).
    """
    s = resolve_model(model)
    c = replace(cfg or PlanConfig(), **overrides)
    roles = _roles(c)
    label, capacity = _gpu(c.gpu)
    bw, bm, bg, bo = _precision(c.precision)
    _check(c, s)
    p = count_params(s)
    pt = lora_params(s, c.lora) if c.lora else p
    rtp = c.rollout_tp or c.tp
    shard = c.tp * (c.gpus // c.tp if c.shard == "fsdp" else 1)  # how many ways each weight is split
    train_state = {
        "policy weights": (2 * p + bw * pt if c.lora else bw * p) / shard,
        "master weights": bm * pt / shard,
        "gradients": bg * pt / shard,
        "optimizer (Adam m, v)": bo * pt / shard,
    }
    per_param = bw + bm + bg + bo
    critic = 0.0  # a second training state: trunk + value head (or the head)
    if roles.critic and c.critic == "shared":
        critic = per_param * (s.hidden + 1) / shard
    elif roles.critic:
        pc = head_free_params(s)
        critic = (2 * pc + per_param * lora_params(s, c.lora) if c.lora else per_param * pc) / shard
    ref_on_gpu = roles.reference and c.reference != "cpu" and not c.lora  # LoRA: base with the adapter off
    rm = head_free_params(resolve_model(c.reward_model) if c.reward_model else s)  # trunk + scalar head
    frozen = {"reference": 2 * p if ref_on_gpu else 0.0, "reward model": 2 * rm if roles.reward_model else 0.0}

    seq, mb, rlen = c.seq_len, c.micro_batch, c.rollout_len or c.seq_len
    logits = gather = 0.0  # the course's formula counts neither
    if c.activations == "llama":
        logits = logits_bytes(seq * mb, s.vocab, 6) / c.tp
        gather = 2 * 2 * layer_params(s) / c.tp if shard > c.tp else 0.0  # this layer's and the prefetched one's bf16
    train_phase = {
        "activations": _act(s, c, c.checkpointing),
        "logits": logits,
        "FSDP gather buffers": gather,
        "critic activations": _act(s, c, c.checkpointing) if roles.critic and c.critic == "separate" else 0,
    }
    kv_total = kv_bytes_per_token(s) * c.rollout_seqs * rlen if roles.rollout else 0.0

    def kv_per_gpu(n):  # batch over replicas, heads over TP (replicated past kv_heads)
        return kv_total / (n // rtp) / min(rtp, s.kv_heads)

    pools = {}
    if c.placement == "colocated":
        gathered = 2 * p / rtp if roles.rollout and (shard > c.tp or rtp != c.tp) else 0.0
        rollout = {"rollout weights": gathered, "KV cache": kv_per_gpu(c.gpus) if roles.rollout else 0.0}
        persistent = {**train_state, "critic": critic, **{k: v / shard for k, v in frozen.items()}}
        pools["colocated"] = _pool(c.gpus, persistent, train_phase, rollout, capacity)
    else:
        pools["trainer"] = _pool(c.gpus, {**train_state, "critic": critic}, train_phase, {}, capacity)
        if any(frozen.values()):
            pools["reference"] = _pool(c.ref_gpus, {k: v / c.ref_gpus for k, v in frozen.items()}, {}, {}, capacity)
        if roles.rollout:
            pools["rollout"] = _pool(
                c.rollout_gpus, {"rollout weights": 2 * p / rtp}, {}, {"KV cache": kv_per_gpu(c.rollout_gpus)}, capacity
            )
    out = {
        "model": asdict(s),
        "params": p,
        "trainable_params": pt,
        "roles": asdict(roles),
        "config": asdict(c),
        "gpu": label,
        "capacity_bytes": capacity,
        "pools": pools,
        "peak_bytes": max(q["peak_bytes"] for q in pools.values()),
        "fits": all(q["fits"] for q in pools.values()),
        "fits_on": {g[0]: all(q["peak_bytes"] <= g[1] for q in pools.values()) for g in GPUS.values()},
        "notes": {
            "activations_with_checkpointing": _act(s, c, True),
            "activations_without_checkpointing": _act(s, c, False),
            "kv_bytes_per_token": kv_bytes_per_token(s),
            "kv_cache_total": kv_total,
            "train_bytes_per_param": per_param,
        },
    }
    out["suggestions"] = suggestions(s, c) if suggest and not out["fits"] else []
    return out


def _roles(c: PlanConfig) -> Roles:
    if c.algo not in ROLES:
        import difflib

        close = (
            [a for a in ROLES if sorted(a) == sorted(c.algo)]  # a transposition ("gpro") first
            or difflib.get_close_matches(c.algo, list(ROLES), n=1)
        )
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UsageError(f"--algo {c.algo!r} is unknown{hint} (valid: {', '.join(sorted(ROLES))})")
    r = ROLES[c.algo]
    ref = {"auto": r.reference, "gpu": True, "cpu": r.reference, "none": False}.get(c.reference)
    if ref is None:
        raise UsageError(f"--reference {c.reference!r} is unknown; use auto, gpu, cpu or none")
    return replace(r, reference=ref, reward_model=r.reward_model or bool(c.reward_model))


def _check(c: PlanConfig, s: ModelShape) -> None:
    rtp = c.rollout_tp or c.tp
    for name, n in [
        ("gpus", c.gpus),
        ("tp", c.tp),
        ("micro_batch", c.micro_batch),
        ("seq_len", c.seq_len),
        ("rollout_tp", rtp),
        ("ref_gpus", c.ref_gpus),
        ("rollout_gpus", c.rollout_gpus),
        ("rollout_seqs", c.rollout_seqs),
    ]:
        if n < 1:
            raise UsageError(f"{name}={n} must be ≥ 1")
    if c.lora < 0 or c.rollout_len < 0:
        raise UsageError(f"lora={c.lora} and rollout_len={c.rollout_len} must be ≥ 0")
    if s.heads % c.tp or s.heads % rtp:
        raise UsageError(f"tp={c.tp} / rollout_tp={rtp} must divide {s.name}'s {s.heads} attention heads")
    rollout_pool = c.rollout_gpus if c.placement == "split" else c.gpus
    if c.gpus % c.tp or rollout_pool % rtp:
        raise UsageError(f"tp={c.tp} / rollout_tp={rtp} must divide the pool's GPUs ({c.gpus} / {rollout_pool})")
    if (
        c.shard not in ("fsdp", "dp")
        or c.placement not in ("colocated", "split")
        or c.activations not in ("llama", "course")
        or c.critic not in ("separate", "shared")
    ):
        raise UsageError(
            "shard is fsdp|dp, placement colocated|split, activations llama|course, critic separate|shared"
        )


def _act(s, c, ckpt):
    if c.activations == "course":
        return course_activation_bytes(s.layers, s.hidden, c.seq_len, c.micro_batch, ckpt) / c.tp
    return activation_bytes(s, c.seq_len, c.micro_batch, ckpt) / c.tp


def _pool(gpus, persistent, train, rollout, capacity) -> dict:
    phases = {k: sum(v.values()) for k, v in [("persistent", persistent), ("train", train), ("rollout", rollout)]}
    peak = phases["persistent"] + max(phases["train"], phases["rollout"])
    return {
        "gpus": gpus,
        "components": {**persistent, **train, **rollout},
        "phases": phases,
        "peak_bytes": peak,
        "fits": peak <= capacity,
    }


def suggestions(s: ModelShape, c: PlanConfig) -> list[dict]:
    """What to change when the plan does not fit: each single change that fits on the same
    GPUs (cheapest first), the smallest FSDP scale-out that fits alone, and, when no single
    change fits, the shortest prefix of the cheap changes that fits (on as few GPUs as it takes)."""

    def fitting(text, **kw):
        r = plan(s, replace(c, **kw), suggest=False)
        return [{"change": text, "overrides": kw, "peak_gb": round(r["peak_bytes"] / GB, 1)}] if r["fits"] else []

    cheap = []
    if not c.checkpointing:
        cheap.append(("gradient checkpointing on", {"checkpointing": True}))
    if c.micro_batch > 1:
        cheap.append(("micro-batch 1 (more accumulation steps)", {"micro_batch": 1}))
    if _roles(c).reference and c.reference in ("auto", "gpu") and not c.lora:
        cheap.append(("reference offloaded to CPU", {"reference": "cpu"}))
    if not c.lora:  # last: it changes what is trained
        cheap.append(("LoRA rank 16 (the reference is the base with the adapter off)", {"lora": 16}))
    out = [x for text, kw in cheap for x in fitting(text, **kw)]

    def capped(extra: dict, label: str) -> list[dict]:  # fewer sequences in flight shrink the KV cache
        n = c.rollout_seqs // 2
        while ROLES[c.algo].rollout and n >= 1:
            if hit := fitting(
                ", ".join(x for x in [label, f"rollout concurrency capped at {n} sequences"] if x),
                **extra,
                rollout_seqs=n,
            ):
                return hit
            n //= 2
        return []

    out += capped({}, "")
    rtp0, split = c.rollout_tp or c.tp, c.placement == "split"
    rtps = [r for r in (rtp0, 2 * rtp0, 4 * rtp0, 8 * rtp0) if s.heads % r == 0 and r <= max(8, rtp0)]

    def total(kw):  # GPUs over all pools
        return sum(kw.get(k, getattr(c, k)) for k in (("gpus", "ref_gpus", "rollout_gpus") if split else ("gpus",)))

    def grow(kw, knob, pools):
        """The smallest size of `knob` (× a rollout TP where the pool runs the sampler) that fits `pools`."""
        sampler = knob == "rollout_gpus" or not split
        for n in [getattr(c, knob) * 2**i for i in range(11)]:
            for rtp in [r for r in (rtps if sampler else [rtp0]) if not sampler or n % r == 0]:
                trial = {**kw, knob: n, "rollout_tp": rtp}
                got = plan(s, replace(c, **trial), suggest=False)["pools"]
                if all(got[q]["fits"] for q in pools if q in got):
                    return trial
        return None

    def scale_out(extra: dict, label: str) -> list[dict]:
        kw = {**extra, "shard": "fsdp"}
        for knob, pools in (
            [("gpus", ["trainer"]), ("ref_gpus", ["reference"]), ("rollout_gpus", ["rollout"])]
            if split
            else [("gpus", ["colocated"])]
        ):
            if (kw := grow(kw, knob, pools)) is None:
                return []
        parts = [f"FSDP over {kw['gpus']} GPUs" if kw["gpus"] != c.gpus or c.shard != "fsdp" else ""]
        parts += [
            f"{pool} over {kw[k]} GPUs"
            for pool, k in (("reference", "ref_gpus"), ("rollout", "rollout_gpus"))
            if kw.get(k, getattr(c, k)) != getattr(c, k)
        ]
        parts += [f"rollout TP={kw['rollout_tp']}" if kw["rollout_tp"] != rtp0 else "", label]
        text = ", ".join(x for x in parts if x)
        return fitting(text, **kw) if text else []

    out += scale_out({}, "")
    if not any(total(x["overrides"]) == total({}) for x in out):
        combos, here = [], []  # cheap changes together: on as few GPUs as they allow,
        for k in range(2, len(cheap) + 1):  # and on these GPUs with a rollout concurrency cap
            lora = any("lora" in kw for _, kw in cheap[:k])  # LoRA already drops the reference copy
            picked = [(text, kw) for text, kw in cheap[:k] if not (lora and "reference" in kw)]
            combo = {key: v for _, kw in picked for key, v in kw.items()}
            combos += scale_out(combo, " + ".join(text for text, _ in picked))
            here = here or capped(combo, " + ".join(text for text, _ in picked))
        if combos:
            out += [min(combos, key=lambda x: total(x["overrides"]))]
        out += here
    return out
