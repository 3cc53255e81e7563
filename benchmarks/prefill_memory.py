"""Prefill by a token budget (`rollout.prefill_chunk`, issue 33) on the CPU: the rollout's peak memory
and time with long prompts, one budget per subprocess, side by side in one run.

    python benchmarks/prefill_memory.py [--layers 2] [--prompts 64] [--prompt-len 512]
                                        [--chunks 0,16384,4096] [--threads 1] [--out benchmarks/results/prefill_memory.json]

A randomly initialised model of Qwen2.5-0.5B's widths (hidden 896, 14 heads, 2 KV heads, MLP 4864,
vocabulary 151,936; `--layers` of its 24 blocks: a prefill's transient peak is one layer's
intermediates, so the depth adds weights, not peak) is written once (bench/hf_shapes.write_shape);
each budget then runs in a fresh process: load it, `Engine.generate` of `--prompts` prompts of
`--prompt-len` tokens, one sample of one new token each (the prefill is the whole work), with
`engine.prefill_chunk` = the budget (0 = no budget: all 64 prompts in one forward, the engine before
the budget). Measured: the process's peak resident set above its RSS once the model is loaded
(VmHWM reset just before generate: runtime.peak_memory_bytes), the wall and CPU seconds, the prefill
forwards, and a digest of the sampled tokens (equal across budgets: the same samples).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(a) -> dict:
    import random

    import torch

    from posttrain import runtime
    from posttrain.bench import peak_memory, reset_peak_memory
    from posttrain.framework.decode_loop import DecodeLoop
    from posttrain.framework.rollout import Engine, SamplingParams
    from posttrain.models.hf import load_hf

    torch.set_num_threads(a.threads)
    model, tok = load_hf(a.model, "cpu")
    engine = Engine(model, tok, max_slots=a.prompts)
    engine.prefill_chunk = a.chunk or 10**12  # 0: no budget, every prompt of the ring in one forward
    rng = random.Random(0)
    prompts = [[rng.randrange(2, model.config.vocab_size) for _ in range(a.prompt_len)] for _ in range(a.prompts)]
    forwards = []
    last = DecodeLoop._last_logits
    DecodeLoop._last_logits = lambda s, ids, n: forwards.append(list(ids.shape)) or last(s, ids, n)  # type: ignore[method-assign]
    rss0 = runtime.peak_memory_bytes("cpu")
    reset_peak_memory("cpu")
    t0, c0 = time.perf_counter(), time.process_time()
    samples = engine.generate(prompts, 1, SamplingParams(max_new_tokens=1, ignore_eos=True), seed=0)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = peak_memory("cpu")["peak_rss_gib"]
    return {
        "prefill_chunk": a.chunk,
        "forwards": forwards,
        "peak_rss_gib": peak,
        "rss_before_gib": rss0 / 2**30,
        "peak_added_gib": peak - rss0 / 2**30,
        "wall_s": wall,
        "cpu_s": cpu,
        "samples_digest": hash(tuple(s.response_ids[0] for s in samples)),
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--chunks", default="0,16384,4096")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/prefill_memory.json"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--chunk", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a)))
        return {}
    from dataclasses import replace

    from posttrain.bench import finish, run_header
    from posttrain.bench.hf_shapes import SHAPES, write_shape

    shape = SHAPES["qwen2.5-0.5b"]
    shape = replace(shape, dims=replace(shape.dims, name=f"qwen2.5-0.5b-{a.layers}-layers", layers=a.layers))
    res = run_header("prefill_memory", a.threads, model=shape.dims.name, prompts=a.prompts, prompt_len=a.prompt_len)
    res["rows"] = []
    with tempfile.TemporaryDirectory(prefix="prefill-") as tmp:
        model = write_shape(Path(tmp, "m"), shape)
        for chunk in [int(c) for c in a.chunks.split(",")]:
            cmd = [sys.executable, __file__, "--child", "--model", str(model), "--chunk", str(chunk)]
            cmd += ["--prompts", str(a.prompts), "--prompt-len", str(a.prompt_len), "--threads", str(a.threads)]
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(a.threads)}
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            res["rows"].append(row)
            print(
                f"prefill_chunk={chunk or 'none'}: {len(row['forwards'])} forwards, peak +{row['peak_added_gib']:.2f} GiB, "
                f"{row['wall_s']:.1f} s",
                flush=True,
            )
    return finish(res, a.out)


if __name__ == "__main__":
    main()
