"""The floor of one RL step: the least time the hardware allows for the work the step did.

    step_floor(params, metrics, weight_bytes=2, kv_bytes=12288, peak_tflops=800, peak_gbs=3000)

Work, from a step's own metrics (N = every parameter of the model, counted; a tied embedding once):
  FLOP    train      6·N per trained token (forward 2, backward 4): `train/tokens` × `train/optimizer_steps`
          reference  2·N per token it scores: the batch's prompt + response tokens (when the step ran one)
          prefill    2·N per prompt token computed (`rollout/prefill_tokens`: a group's prompt once)
          decode     2·N per generated token (`rollout/generated_tokens`)
  bytes   decoding is bound by memory: each decode step reads every weight in the compute dtype
          (`rollout/decode_steps` × N × `weight_bytes`) and the KV cache it attends over
          (`rollout/kv_positions`, Σ over decode steps of the cached positions, × `kv_bytes` a position)
Floor seconds = FLOP ÷ the peak FLOP rate + bytes ÷ the peak bandwidth (issue 33's sum: the decode's
reads on top of all the compute), per role too: rollout (prefill + decode FLOP and the bytes),
reference, train. The fraction reached = floor ÷ measured seconds (1 = at the hardware's limit).
Attention's own FLOPs (the T×T products) are left out, so fractions slightly understate the work.
`peaks` picks the rates (`posttrain bench step`'s docstring: H100 defaults on CUDA, measured on CPU).
"""

from __future__ import annotations

import torch

from posttrain.bench import copy_bandwidth_gbs, matmul_peak_gflops

H100_TFLOPS, H100_GBS = 800.0, 3000.0  # what a large bf16 matmul and a stream of reads reach on one H100


def step_floor(
    params: int,
    metrics: dict,
    weight_bytes: int,
    kv_bytes: int,
    peak_tflops: float,
    peak_gbs: float,
) -> dict:
    """The floor of the step whose metrics are `metrics` (one step's, or a mean over steps); see
    the module docstring. Returns {"tokens", "flop", "bytes", "floor_s", "fraction"}."""
    m = metrics
    batch_tokens = m["rollout/prompt_tokens"] + m["rollout/generated_tokens"]
    tokens = {
        "prefill": m["rollout/prefill_tokens"],
        "generated": m["rollout/generated_tokens"],
        "decode_steps": m["rollout/decode_steps"],
        "kv_positions": m["rollout/kv_positions"],
        "reference": batch_tokens if "time/reference_s" in m else 0,
        "trained": m["train/tokens"] * m.get("train/optimizer_steps", 1.0),
    }
    flop = {
        "train": 6 * params * tokens["trained"],
        "reference": 2 * params * tokens["reference"],
        "prefill": 2 * params * tokens["prefill"],
        "decode": 2 * params * tokens["generated"],
    }
    flop["total"] = sum(flop.values())
    nbytes = {
        "decode_weights": tokens["decode_steps"] * params * weight_bytes,
        "decode_kv": tokens["kv_positions"] * kv_bytes,
    }
    nbytes["total"] = nbytes["decode_weights"] + nbytes["decode_kv"]
    per_flop, per_byte = 1 / (peak_tflops * 1e12), 1 / (peak_gbs * 1e9)
    floor = {
        "flop": flop["total"] * per_flop,
        "bytes": nbytes["total"] * per_byte,
        "rollout": (flop["prefill"] + flop["decode"]) * per_flop + nbytes["total"] * per_byte,
        "reference": flop["reference"] * per_flop,
        "train": flop["train"] * per_flop,
    }
    floor["step"] = floor["flop"] + floor["bytes"]
    measured = {
        "step": m["time/step_s"],
        "flop": m["time/step_s"],
        "bytes": m["time/step_s"],
        "rollout": m["time/rollout_s"],
        "reference": m.get("time/reference_s", 0.0),
        "train": m["time/train_s"],
    }
    fraction = {k: floor[k] / measured[k] if measured[k] > 0 else None for k in measured}
    return {"tokens": tokens, "flop": flop, "bytes": nbytes, "floor_s": floor, "fraction": fraction}


def peaks(device: str, threads: int, tflops: float | None, gbs: float | None) -> dict:
    """The peaks the floor is taken at (see the module docstring) and the rates measured here."""
    cuda = device.startswith("cuda")
    measured = {
        "matmul_tflops": matmul_peak_gflops(
            threads, n=8192 if cuda else 1024, dtype=torch.bfloat16 if cuda else torch.float32, device=device
        )
        / 1e3,
        "copy_gbs": copy_bandwidth_gbs(1024 if cuda else 128, device=device),
    }
    if tflops is not None or gbs is not None:
        source = "given"
    else:
        source = "default" if cuda else "measured"
    default_t, default_g = (H100_TFLOPS, H100_GBS) if cuda else (measured["matmul_tflops"], measured["copy_gbs"])
    return {
        "tflops": tflops if tflops is not None else default_t,
        "gbs": gbs if gbs is not None else default_g,
        "source": source,
        "measured": measured,
    }
