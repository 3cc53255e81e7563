"""Where a GRPO trainer step's time goes: torch.profiler over one `Trainer.step`, op time grouped.

    python benchmarks/train_profile.py [--threads 2] [--compile] [--packing] [--out benchmarks/results/train_profile.json]

The RL stage's shape (benchmarks/ab_refs.py `rl_batch`: nano, 128 rows, the task's prompts plus
responses of 8-54 tokens, GRPO with kl 0.01, the trainer's micro-batches). Each op's self CPU
time goes into one group: the projections' matmuls forward and backward (aten::mm), the fused
attention forward and backward, the optimizer, and every other op (RMSNorm, rotary, SwiGLU,
residuals, the log-softmax, their backward); "python" is the profiled wall time not inside any op.
The step's real-token rate, 6·N·real tokens per second, is given against the matmul peak measured
in the same run, and so is the matmuls' own rate.

--compile also times the step with the policy under `torch.compile(dynamic=True)`: the compile
time (the first steps) and the step time after it, over the same micro-batch shapes.

--packing: the trainer packs its micro-batches (optim.packing, framework/packing.py).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GROUPS = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm"),
    "attention": (
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    ),
    "optimizer": (
        "aten::_foreach_mul_",
        "aten::_foreach_add_",
        "aten::_foreach_addcmul_",
        "aten::_foreach_lerp_",
        "aten::_foreach_addcdiv_",
        "aten::_foreach_sqrt",
        "aten::_foreach_div_",
        "aten::_foreach_norm",  # gradient clipping
    ),
}


def _ab_refs():
    """benchmarks/ab_refs.py, loaded by path (this folder is not put on sys.path)."""
    from posttrain.bench import load_script

    return load_script(Path(__file__).resolve().parent / "ab_refs.py", "posttrain_bench_ab_refs")


def setup(compiled: bool = False, packing: bool = False):
    rl_batch = _ab_refs().rl_batch
    from posttrain import algorithms
    from posttrain.config import OptimConfig
    from posttrain.framework.batch import RolloutBatch
    from posttrain.framework.trainer import Trainer, policy_loss_fn
    from posttrain.models.gpt_mini import ModelConfig, build_model
    from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer

    tok = CharTokenizer(BASE_CHARS)
    batch = RolloutBatch(**rl_batch(tok))
    torch.manual_seed(0)
    model = build_model(ModelConfig(preset="nano"), tok.vocab_size)
    params = model.num_params()
    if compiled:
        model = torch.compile(model, dynamic=True)
    algo = algorithms.get("grpo")
    loss_fn = policy_loss_fn(algo, algo.Config(kl_coef=0.01), 1.0)
    trainer = Trainer(model, OptimConfig(lr=0.0, packing=packing), 10)  # lr 0: every step the same
    real = float(batch.attention_mask.sum())
    return (lambda: trainer.step(copy.copy(batch), loss_fn)), params, real


def main(argv=None) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from posttrain.bench import best_of, finish, matmul_peak_gflops, op_seconds, run_header

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--packing", action="store_true")
    ap.add_argument("--out", default="benchmarks/results/train_profile.json")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    result = run_header("train_profile", a.threads, preset="nano", packing=a.packing)
    result["matmul_peak_gflops"] = matmul_peak_gflops(a.threads)
    step, params, real = setup(packing=a.packing)
    m = step()  # warm-up
    wall = best_of(step, a.repeats)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        step()
        prof_wall = time.perf_counter() - t0
    spent = op_seconds(prof, GROUPS, prof_wall)
    total = sum(spent.values())
    peak = result["matmul_peak_gflops"] * 1e9
    flops = 6 * params * real
    result.update(
        params=params,
        real_tokens=real,
        computed_tokens=m["train/padded_tokens"],
        micro_batches=m["train/micro_batches"],
        step_s=wall,
        real_token_peak_frac=flops / wall / peak,
        share={k: v / total for k, v in spent.items()},
        matmul_peak_frac_inside=6 * params * m["train/padded_tokens"] / (spent["matmul"] / total * wall) / peak,
    )
    print(
        f"GRPO step, {real:.0f} real tokens ({m['train/padded_tokens']:.0f} computed): {wall * 1000:.0f} ms, "
        f"real tokens at {result['real_token_peak_frac']:.0%} of the matmul peak "
        f"({result['matmul_peak_gflops']:.0f} GFLOP/s); the matmuls alone run at "
        f"{result['matmul_peak_frac_inside']:.0%}",
        flush=True,
    )
    print("  " + "  ".join(f"{k} {100 * v:4.1f}%" for k, v in result["share"].items()), flush=True)
    if a.compile:
        cstep, _, _ = setup(compiled=True, packing=a.packing)
        t0 = time.perf_counter()
        cstep()
        cstep()
        compile_s = time.perf_counter() - t0
        cwall = best_of(cstep, a.repeats)
        result["compiled"] = {"first_two_steps_s": compile_s, "step_s": cwall, "speedup": wall / cwall}
        result["compiled"]["break_even_steps"] = compile_s / max(wall - cwall, 1e-9)
        print(
            f"torch.compile: {compile_s:.1f} s for the first two steps, then {cwall * 1000:.0f} ms "
            f"({wall / cwall:.2f}x); it pays after ~{result['compiled']['break_even_steps']:.0f} steps",
            flush=True,
        )
    return finish(result, a.out)


if __name__ == "__main__":
    main()
