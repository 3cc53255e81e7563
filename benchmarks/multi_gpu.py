"""Issue 42's measurement on a machine with several GPUs, in one call: 1 → N ranks, each sampling and training.

    PYTHONPATH=$PWD python benchmarks/multi_gpu.py --out $OUT                  # every GPU of the machine
    PYTHONPATH=$PWD python benchmarks/multi_gpu.py --tiny --device cpu --out /tmp/mg   # a check: 1 and 2 gloo ranks

For each shape (qwen2.5-0.5b and qwen2.5-1.5b: Qwen2ForCausalLM of the published config, random init,
benchmarks' tokenizer: posttrain/bench/hf_shapes.py) and each rank count (1, 2, 4, 8 up to the GPUs seen),
`torchrun --standalone --nproc-per-node N` runs this file as every rank: GRPO through `posttrain.api.rl`, the
same rows and reward as `posttrain bench step` (bench/step.py: `prompt_rows`, `vowel_spread`), with
`--prompts-per-rank` prompt groups per rank (weak scaling: the step's batch grows with N, each card's share
stays), the policy FSDP2-sharded (`--shard`). Each run's metrics.jsonl gives the step time and its split by
role (the slowest rank's timers), and each rank writes its own peak memory. DIR/multi_gpu.json, rewritten
after every run: per shape and N the timed mean of the steps after the first, samples/s, scaling efficiency
(samples/s at N ÷ (N × samples/s at 1); the goal is ≥ 0.85 at N = 8), the peak of every card and the run's
predicted peak per rank (RUN_DIR/memory.json). A run that fails or outlasts `--timeout` loses that point only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SHAPES = ("qwen2.5-0.5b", "qwen2.5-1.5b")
KEYS = ("time/step_s", "time/rollout_s", "time/reward_s", "time/reference_s", "time/train_s", "time/sync_s")


def rank_main(a) -> None:
    """One rank of a run (under torchrun): GRPO on the benchmark's rows; then this rank's peak memory."""
    import torch
    from transformers import AutoTokenizer

    from posttrain import api, runtime
    from posttrain.bench.step import prompt_rows, vowel_spread
    from posttrain.models.hf_tokenizer import HFTokenizer

    ranks = int(os.environ["WORLD_SIZE"])
    tok = HFTokenizer(AutoTokenizer.from_pretrained(a.init, local_files_only=True))
    prompts = a.prompts_per_rank * ranks
    rows = prompt_rows(tok, prompts * a.steps + 8, a.prompt_len, 0)
    api.rl(
        dataset=rows[8:],
        test_dataset=rows[:8],
        reward_funcs=[vowel_spread],
        init=a.init,
        out=a.run_dir,
        steps=a.steps,
        device=a.device,
        threads=a.threads,
        eval_every=0,
        log_every=1,
        tensorboard=False,
        overwrite=True,
        **{
            "eval.problems": 0,
            "eval.save_samples": 0,
            "rollout.prompts_per_step": prompts,
            "rollout.samples_per_prompt": a.samples,
            "rollout.max_new_tokens": a.new_tokens,
            "scale.trainer_shard": a.shard,
        },
    )
    device = f"cuda:{os.environ['LOCAL_RANK']}" if a.device != "cpu" and torch.cuda.is_available() else "cpu"
    peak = runtime.peak_memory_bytes(device) / 2**30
    Path(a.run_dir, f"peak_rank{os.environ['RANK']}.json").write_text(json.dumps({"device": device, "peak_gib": peak}))


def one_run(a, init: Path, ranks: int, out: Path) -> dict:
    """`ranks` ranks through torchrun; the timed mean of its steps, throughput and every card's peak."""
    run_dir = out / f"run_{init.name}_{ranks}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", __file__]
    cmd += ["--rank", "--init", str(init), "--run-dir", str(run_dir), "--device", a.device, "--shard", a.shard]
    cmd += [f"--{k.replace('_', '-')}={getattr(a, k)}" for k in ("steps", "prompts_per_rank", "samples")]
    cmd += [f"--{k.replace('_', '-')}={getattr(a, k)}" for k in ("new_tokens", "prompt_len", "threads")]
    t0 = time.perf_counter()
    log = out / f"{init.name}_{ranks}.log"
    try:
        with open(log, "w") as f:
            code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=a.timeout).returncode
    except subprocess.TimeoutExpired:
        return {"ranks": ranks, "error": f"timeout after {a.timeout} s", "log": str(log)}
    if code != 0:
        return {"ranks": ranks, "error": f"exit {code}", "log": str(log)}
    rows = [json.loads(x) for x in open(run_dir / "metrics.jsonl")]
    steps = [m for m in rows if m.get("step", 0) >= 1 and "time/step_s" in m]
    timed = steps[1:] or steps  # the first step compiles, captures graphs, warms the allocator
    mean = {k: sum(m.get(k, 0.0) for m in timed) / len(timed) for k in (*KEYS, "rollout/samples", "train/tokens")}
    peaks = [json.loads(p.read_text()) for p in sorted(run_dir.glob("peak_rank*.json"))]
    memory = json.loads((run_dir / "memory.json").read_text())
    return {
        "ranks": ranks,
        "wall_s": time.perf_counter() - t0,
        "timed_steps": [m["step"] for m in timed],
        "timed": mean,
        "samples_per_s": mean["rollout/samples"] / mean["time/step_s"],
        "train_tokens_per_s": mean["train/tokens"] / mean["time/train_s"],
        "peak_gib_per_card": [p["peak_gib"] for p in peaks],
        "predicted_peak_gib_per_rank": memory["peak_gib"],
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="benchmarks/results/multi_gpu")
    p.add_argument("--tiny", action="store_true", help="tiny-qwen2, small batch, 1 and 2 ranks: the script's check")
    p.add_argument("--device", default="auto")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--ranks", default="", help="comma list; default 1, 2, 4, 8 up to the GPUs seen (tiny: 1,2)")
    p.add_argument("--shard", default="fsdp", choices=["fsdp", "replicate"])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts-per-rank", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--timeout", type=int, default=900, help="seconds a run may take")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)  # this file as one of torchrun's ranks
    p.add_argument("--init", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.rank:
        rank_main(a)
        return {}
    import torch

    from posttrain.bench.hf_shapes import write_shape

    if a.tiny:
        a.shapes, a.steps, a.prompts_per_rank, a.samples, a.new_tokens, a.prompt_len = "tiny-qwen2", 3, 2, 4, 12, 8
        a.threads = 1
    gpus = torch.cuda.device_count() if a.device != "cpu" else 0
    ranks = [int(x) for x in a.ranks.split(",")] if a.ranks else [n for n in (1, 2, 4, 8) if n <= max(gpus, 2)]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"gpus": gpus, "device": a.device, "shard": a.shard, "args": vars(a), "load": os.getloadavg()}
    for shape in a.shapes.split(","):
        init = write_shape(out / shape, shape)
        runs = []
        for n in ranks:
            runs.append(one_run(a, init, n, out))
            base = next((r for r in runs if r["ranks"] == 1 and "error" not in r), None)
            for r in runs:
                if base is not None and "error" not in r:
                    r["scaling_efficiency"] = r["samples_per_s"] / (r["ranks"] * base["samples_per_s"])
            result[shape] = runs
            (out / "multi_gpu.json").write_text(json.dumps(result, indent=1))
            print(json.dumps({k: v for k, v in runs[-1].items() if k not in ("timed",)}), flush=True)
    at8 = {
        s: r["scaling_efficiency"]
        for s in a.shapes.split(",")
        for r in result[s]
        if r["ranks"] == 8 and "scaling_efficiency" in r
    }
    result["acceptance"] = {
        "efficiency_at_8": at8,
        "goal": "scaling_efficiency >= 0.85 at 8 ranks",
        "met": {s: e >= 0.85 for s, e in at8.items()},
    }
    (out / "multi_gpu.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
