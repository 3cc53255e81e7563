"""Facts of lessons 20–22 that hold the text to the hardware, merged into facts_b.FACTS: the
H100's reported capacity against the planner's budget, peak against sustained FLOP/s, when
speculative verification stops being free, what attention scores cost without SDPA, and the
numbers measured on one H100 by this project (lessons/data/h100_run.json).

h100_run.json is a copy of the few numbers the lessons quote from ../shared/gpu/h100_scale.json
(posttrain main at 7de35f4, `python scale.py`): the lessons must not read outside the repository.
Every page that quotes one labels it "measured on one H100 (this project's run)".
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from pathlib import Path

from posttrain.lessons import runs, units
from posttrain.lessons.facts_b_data import kpi
from posttrain.lessons.facts_b_sys import HBM_BYTES_PER_S, kv_total
from posttrain.lessons.widgets_systems import SPEC_GAMMA
from posttrain.sizing import memory, shapes, throughput

H100_RUN = Path(__file__).resolve().parent / "data" / "h100_run.json"
PEAK_BF16 = 989e12  # H100 SXM, dense bf16 tensor-core peak (NVIDIA's datasheet: 1,979 with sparsity)
GEMM_FLOPS = 800e12  # what a large bf16 matmul reaches: the course's "sustained" rate, our 6P ceiling
LLAMA3_TFLOPS, LLAMA3_MFU = (380, 430), (38, 43)  # Llama 3 405B, bf16 on H100 (arXiv 2407.21783, Table 4)
REALISTIC_FLOPS = 400e12  # about Llama 3's sustained rate per GPU: 40% of peak


@functools.cache
def h100_run() -> dict:
    """The numbers measured on one H100 by this project (data/h100_run.json)."""
    return json.loads(H100_RUN.read_text())


def _decode_row(batch: int = 256) -> dict:
    return next(r for r in h100_run()["rollout"] if r["batch"] == batch)


def h100_decode_ms() -> float:
    """Measured: wall time of one decode step of the engine at 256 rows (rollout time / steps)."""
    r = _decode_row()
    return r["engine_s"] / r["new_tokens"] * 1e3


def h100_decode_floor_ms() -> float:
    """The bandwidth floor of the same step (lesson 20's formula): bf16 weights of the measured
    model plus the KV cache at the mean context (prompt + half the answer), at 3.35 TB/s."""
    r, m = _decode_row(), h100_run()["model"]
    kv = (
        r["batch"] * (r["prompt_len"] + r["new_tokens"] / 2) * shapes.kv_bytes_per_token(shapes.PRESETS["qwen2.5-0.5b"])
    )
    return (2 * m["params"] + kv) / HBM_BYTES_PER_S * 1e3


def h100_train_tflops() -> float:
    """The trainer's measured rate by the 6P rule: 6 · params · tokens it ran over / train time."""
    g = h100_run()["grpo"]
    return 6 * h100_run()["model"]["params"] * g["train_tokens"] / _t("train") / 1e12


def decode_step_ms(seqs: int) -> float:
    """Lesson 20's bandwidth-bound step for the course's 7B (GQA) at 2,048 tokens: (W + KV)/BW."""
    return (2 * 7e9 + kv_total(32, 4096, 8, seqs, 2048)) / HBM_BYTES_PER_S * 1e3


def spec_gain(temperature: float) -> float:
    """The scheduler widget's modelled rollout time without speculative decoding over with it (at
    the default T = 1 both engine runs are the widget's own, already cached for the page)."""
    ms = [
        float(kpi("scheduler", "modelled rollout time, 7B on one H100", spec=s, temperature=temperature).split()[0])
        for s in (False, True)
    ]
    return ms[0] / ms[1]


def scores_bytes(eager: bool, seq_len: int = 8192, batch: int = 4, layers: int = 32, heads: int = 32) -> float:
    """Attention-score memory saved for backward, all layers. The course's 2L term: n·L·B·2L·2 B.
    Eager attention, as Korthikanti et al. 2022 (arXiv 2205.05198, Eq. 1) count it: 5·a·L²·B bytes
    per layer (bf16 QKᵀ 2, its softmax 2, the 1-byte dropout mask). SDPA/FlashAttention keeps none."""
    per_layer = 5 * heads * seq_len**2 * batch if eager else seq_len * batch * 2 * seq_len * 2
    return layers * per_layer


def act_growth(course: bool) -> float:
    """Activations at 16k tokens over 8k for the course's 7B, B = 4: its formula, or the
    planner's SDPA count (shapes.activation_bytes), which is linear in L."""
    if course:
        return shapes.course_activation_bytes(32, 4096, 16384, 4) / shapes.course_activation_bytes(32, 4096, 8192, 4)
    s = shapes.resolve_model("7b")
    return shapes.activation_bytes(s, 16384, 4) / shapes.activation_bytes(s, 8192, 4)


def _gib(x: float) -> str:
    return f"{x:.1f} GiB"


def _grpo(key: str) -> float:
    return h100_run()["grpo"][key]


def _t(role: str) -> float:
    """A role's measured seconds in the H100 GRPO step (the controller's time/<role>_s timer)."""
    return h100_run()["grpo"]["timers"][f"time/{role}_s"]


REPORTED_BYTES = units.H100_REPORTED_MIB * 2**20

FACTS: dict[str, Callable[[], object]] = {
    # 20 · the card's capacity, and a decode step measured
    "rl20_h100_reported_gib": lambda: _gib(units.H100_REPORTED_GIB),
    "rl20_h100_margin_gib": lambda: _gib(units.H100_REPORTED_GIB - units.H100_GIB),
    "rl20_70b_h100s_reported": lambda: math.ceil(kv_total(80, 8192, 8, 256, 8192) / REPORTED_BYTES),
    "rl20_h100_decode_tok_s": lambda: f"{_decode_row()['engine_tok_s']:,.0f}",
    "rl20_h100_decode_ms": lambda: round(h100_decode_ms(), 1),
    "rl20_h100_decode_floor_ms": lambda: round(h100_decode_floor_ms(), 2),
    "rl20_h100_decode_over_floor": lambda: round(h100_decode_ms() / h100_decode_floor_ms()),
    "rl20_h100_mismatch": lambda: round(_grpo("mismatch_logprob_abs"), 4),
    # 21 · a decode step at 8 and 64 sequences; speculative decoding's gain and where it ends
    "rl21_decode_8_ms": lambda: round(decode_step_ms(8), 1),
    "rl21_decode_64_ms": lambda: round(decode_step_ms(64), 1),
    "rl21_decode_64_over_8": lambda: round(decode_step_ms(64) / decode_step_ms(8), 1),
    "rl21_spec_alpha_t0": lambda: runs.recorded()["spec acceptance"]["0.0"],
    "rl21_spec_alpha_t1": lambda: runs.recorded()["spec acceptance"]["1.0"],
    "rl21_spec_gain_t1": lambda: round(spec_gain(1.0), 2),
    "rl21_ridge_tokens": lambda: round(PEAK_BF16 / HBM_BYTES_PER_S),
    "rl21_ridge_seqs_spec": lambda: round(PEAK_BF16 / HBM_BYTES_PER_S / (SPEC_GAMMA + 1)),
    "rl21_spec_gamma": lambda: SPEC_GAMMA,
    # 22 · capacity, sustained FLOP/s, attention scores, and one H100 measured
    "rl22_h100_reported_gib": lambda: _gib(units.H100_REPORTED_GIB),
    "rl22_h100_margin_gib": lambda: _gib(units.H100_REPORTED_GIB - units.H100_GIB),
    "rl22_mfu_at_800": lambda: f"{GEMM_FLOPS / PEAK_BF16:.0%}",
    "rl22_llama3_tflops": lambda: f"{LLAMA3_TFLOPS[0]}–{LLAMA3_TFLOPS[1]}",
    "rl22_llama3_mfu": lambda: f"{LLAMA3_MFU[0]}–{LLAMA3_MFU[1]}%",
    "rl22_4gpu_at_400": lambda: f"{4 * throughput.train_tokens_per_s(7e9, REALISTIC_FLOPS):,.0f}",
    "rl22_train_1m_4gpu_400_s": lambda: round(
        throughput.train_time_s(1e6, 7e9, gpus=4, flops_per_s=REALISTIC_FLOPS), 1
    ),
    "rl22_scores_course": lambda: units.size(scores_bytes(eager=False)),
    "rl22_scores_eager": lambda: units.size(scores_bytes(eager=True), 2),
    "rl22_scores_ratio": lambda: round(scores_bytes(eager=True) / scores_bytes(eager=False)),
    "rl22_act_double_course": lambda: round(act_growth(course=True), 2),
    "rl22_act_double_sdpa": lambda: round(act_growth(course=False), 2),
    "rl22_envelope_b1_nockpt": lambda: units.size(memory.envelope(7, batch=1, checkpointing=False)["train_gb"] * 1e9),
    "rl22_h100_train_tflops": lambda: round(h100_train_tflops()),
    "rl22_h100_mfu": lambda: f"{h100_train_tflops() * 1e12 / PEAK_BF16:.1%}",
    "rl22_h100_peak_alloc": lambda: _gib(_grpo("peak_alloc_gib")),
    "rl22_h100_peak_reserved": lambda: _gib(_grpo("peak_reserved_gib")),
    "rl22_h100_reserved_gap": lambda: _gib(_grpo("peak_reserved_gib") - _grpo("peak_alloc_gib")),
    "rl22_h100_gen_tok_s": lambda: f"{_grpo('generated_tokens') / _t('rollout'):,.0f}",
    "rl22_h100_train_tok_s": lambda: f"{_grpo('train_tokens') / _t('train'):,.0f}",
    "rl22_h100_rollout_s": lambda: round(_t("rollout"), 2),
    "rl22_h100_trainer_side_s": lambda: round(_t("reference") + _t("train"), 2),
}
