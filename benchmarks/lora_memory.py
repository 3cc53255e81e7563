"""LoRA vs full fine-tuning with `posttrain rl`: trainable parameters and peak memory (CPU, fp32).

    python benchmarks/lora_memory.py [--steps 3] [--r 8] [--out benchmarks/results/lora_memory.json]

Each variant runs in its own process (a fresh interpreter, so one run's allocations cannot
hide the other's) on the same random HF Llama (~25M parameters, written by models/hf.write_tiny)
with the same GRPO batch; the process reports its peak resident set size (`ru_maxrss`) and the
bytes of training state it holds (gradients + AdamW moments, counted from the tensors). Peak
RSS includes the interpreter, torch and transformers (~0.5 GB), the same for both, and the
activations of the batch; `peak_rss_train_mb` is read after the last optimizer step, before
the final checkpoint (writing merged LoRA weights materialises one extra copy of them). The
children run with MALLOC_MMAP_THRESHOLD_=65536 so that RSS follows live memory (see measure()).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MODEL = dict(arch="llama", d_model=512, n_layers=8, n_heads=8, n_kv_heads=8, d_ff=1376, max_len=128)

CHILD = r"""
import json, resource, sys, torch
from posttrain.config import RLConfig, load_config
from posttrain.recipes import rl
from posttrain.framework import trainer as T
held = {}
step = T.Trainer.step
def counting_step(self, *a, **k):       # measure the optimizer's state after a real step
    out = step(self, *a, **k)
    params = [p for p in self.model.parameters() if p.requires_grad]
    held["trainable"] = sum(p.numel() for p in params)
    held["total"] = sum(p.numel() for p in self.model.parameters())
    held["optimizer_state_bytes"] = sum(t.numel() * t.element_size() for s in self.optimizer.state.values()
                                        for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
    held["grad_bytes"] = sum(p.numel() * p.element_size() for p in params)
    held["peak_rss_train_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # before the final save
    return out
T.Trainer.step = counting_step
rl.run(load_config(RLConfig, None, sys.argv[1:]))
held["peak_rss_with_save_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT " + json.dumps(held))
"""


def measure(args_list: list[str]) -> dict:
    # A fixed mmap threshold: glibc's adaptive one keeps freed multi-MB activation buffers in
    # the heap, and peak RSS then measures fragmentation (it showed LoRA *above* full fine-tuning).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, "-c", CHILD, *args_list], capture_output=True, text=True, check=True, env=env)
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--r", type=int, default=8)
    ap.add_argument("--out", default="benchmarks/results/lora_memory.json")
    args = ap.parse_args(argv)
    from posttrain.bench import write_json
    from posttrain.models.hf import write_tiny

    res = {"model": MODEL, "steps": args.steps, "lora_r": args.r}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_tiny(Path(tmp, "model"), **MODEL)
        common = [
            f"init={model_dir}",
            "overwrite=true",
            f"steps={args.steps}",
            "prompts_per_step=8",
            "samples_per_prompt=8",
            "max_new_tokens=24",
            "eval_problems=2",
            "eval_samples=1",
            "threads=1",
        ]
        for name, extra in (("full", []), ("lora", [f"lora.r={args.r}", "lora.alpha=16"])):
            res[name] = measure(common + [f"out={tmp}/{name}"] + extra)
            print(name, res[name], flush=True)
    f, lo = res["full"], res["lora"]
    res["trainable_frac"] = round(lo["trainable"] / f["trainable"], 4)
    res["training_state_saved_mb"] = round(
        (f["optimizer_state_bytes"] + f["grad_bytes"] - lo["optimizer_state_bytes"] - lo["grad_bytes"]) / 2**20, 1
    )
    res["peak_rss_train_saved_mb"] = round(f["peak_rss_train_mb"] - lo["peak_rss_train_mb"], 1)
    write_json(args.out, res)
    print(f"wrote {args.out}")
    return res


if __name__ == "__main__":
    main()
