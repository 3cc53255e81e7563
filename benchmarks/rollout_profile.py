"""Where a rollout's time goes: torch.profiler over one `Engine.generate`, op time grouped by role.

    python benchmarks/rollout_profile.py [--batches 1,8,64,256] [--threads 1] [--out benchmarks/results/rollout_profile.json]

The `posttrain bench rollout` setting (micro preset, one sample per prompt, exactly 64 new
tokens, temperature 1). Each op's self CPU time goes into one group: the projections (aten::mm),
attention over the KV cache (the decode step's bmm/baddbmm/softmax), the prompt prefill's fused
attention, KV-cache writes, and every other tensor op; "python" is the profiled wall time not
inside any op (the engine's and the decode step's Python, dispatch). Shares, not absolute times,
are the point: they say which part a faster engine has to cut, and they move little under load.
The profiler adds a few microseconds to every op, so at small batches (many ops per token) the
"other_ops" and "python" shares are overstated.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from posttrain.bench import finish, op_seconds, run_header  # noqa: E402

GROUPS = {
    "linear": ("aten::mm", "aten::addmm"),
    "decode_attention": ("aten::bmm", "aten::baddbmm", "aten::_softmax"),
    "prefill_attention": ("aten::_scaled_dot_product_flash_attention_for_cpu",),
    "kv_writes": ("aten::index_copy_", "aten::_index_put_impl_"),
}


def profile_batch(B: int, new_tokens: int = 64) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from posttrain.framework.rollout import Engine, SamplingParams
    from posttrain.models.gpt_mini import ModelConfig, build_model
    from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
    from posttrain.tasks.arithmetic import ArithmeticTask

    tok, task = CharTokenizer(BASE_CHARS), ArithmeticTask()
    torch.manual_seed(0)
    model = build_model(ModelConfig(preset="micro"), tok.vocab_size).eval()
    prompts = [tok.encode(tok.chat_prompt(task.prompt(i))) for i in task.items(B, seed=0)]
    engine = Engine(model, tok, max_slots=max(B, 1))
    sp = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True)
    engine.generate(prompts, 1, sp)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        engine.generate(prompts, 1, sp)
        wall = time.perf_counter() - t0
    spent = op_seconds(prof, GROUPS, wall)
    total = sum(spent.values())
    row = {
        "batch": B,
        "tokens": B * new_tokens,
        "profiled_wall_s": wall,
        "decode_steps": engine.stats["rollout/decode_steps"],
        "seconds": spent,
        "share": {k: v / total for k, v in spent.items()},
    }
    print(f"batch {B:>4}: " + "  ".join(f"{k} {100 * v:4.1f}%" for k, v in row["share"].items()), flush=True)
    return row


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results/rollout_profile.json")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    result = run_header("rollout_profile", a.threads, preset="micro")
    result["rows"] = [profile_batch(int(b)) for b in a.batches.split(",")]
    return finish(result, a.out)


if __name__ == "__main__":
    main()
