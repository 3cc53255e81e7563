"""The two rollout backends side by side (issue 32): tokens/s on the same weights, and an RL step's split.

    python benchmarks/rollout_backends.py [--init CKPT] [--rows 8,64,256] [--threads 1] [--steps 3]
        [--out benchmarks/results/rollout_backends.json]

Runs where vLLM imports (the vLLM virtualenv: README, "Rollout through vLLM"). Part 1: one gpt_mini
(micro preset, seeded; or --init) sampled by the built-in engine and by vLLM (its HF export), 8
samples per prompt, exactly 64 new tokens each (ignore_eos), temperature 1, at 8, 64 and 256 rows
(1, 8, 32 prompts); the best of 3 timed calls after one warm-up. The built-in engine gets as many
decode slots as rows, vLLM `max_num_seqs` 256. Part 2: `--steps` GRPO steps of the default
config on the same checkpoint with each backend (`rollout.backend=posttrain|vllm`, 16 prompts × 8
samples), the mean seconds per step of each role from metrics.jsonl (`time/*_s`), step 1 left
out (warm-up). vLLM's step has one more role: the off-policy correction (`time/proximal_s`), on
by default for it. CPU only here: on a GPU both engines change, vLLM far more.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from posttrain import checkpoint  # noqa: E402
from posttrain.bench import best_of, finish, run_header  # noqa: E402
from posttrain.config import RLConfig, SamplerConfig, load_config  # noqa: E402
from posttrain.framework.backends import make_engine  # noqa: E402
from posttrain.framework.rollout import SamplingParams  # noqa: E402
from posttrain.models.gpt_mini import GPTMini, ModelConfig  # noqa: E402
from posttrain.models.tokenizer import CharTokenizer  # noqa: E402
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask  # noqa: E402

N, NEW = 8, 64  # samples per prompt, new tokens per sample


def policy(init: str | None):
    if init:
        model, tok, _ = checkpoint.load_model(init)
        return model.eval(), tok
    tok = CharTokenizer()
    torch.manual_seed(0)
    return GPTMini(ModelConfig(preset="micro").resolved(tok.vocab_size)).eval(), tok


def throughput(model, tok, rows: list[int]) -> dict:
    task = ArithmeticTask(ArithmeticConfig())
    sp = SamplingParams(temperature=1.0, max_new_tokens=NEW, ignore_eos=True)
    vllm = make_engine(model, tok, SamplerConfig(backend="vllm"), max_slots=max(rows))
    out = {}
    for r in rows:
        prompts = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in task.items(r // N, "train", 0)]
        built_in = make_engine(model, tok, max_slots=r)
        row = {}
        for name, engine in (("posttrain", built_in), ("vllm", vllm)):
            secs = best_of(lambda e=engine, p=prompts: e.generate(p, N, sp, seed=0), repeats=3, warmup=True)
            row[f"{name}_tokens_per_s"] = round(r * NEW / secs, 1)
        row["vllm_over_posttrain"] = round(row["vllm_tokens_per_s"] / row["posttrain_tokens_per_s"], 3)
        out[str(r)] = row
        print(f"rows {r}: {row}", flush=True)
    vllm.close()
    return out


def step_split(init: str, steps: int, threads: int) -> dict:
    from posttrain.recipes import rl

    out = {}
    for backend in ("posttrain", "vllm"):
        with tempfile.TemporaryDirectory() as d:
            args = [
                f"init={init}",
                f"out={d}/rl",
                f"steps={steps}",
                f"threads={threads}",
                "eval_every=1000",
                "eval.problems=8",
                "eval.samples=1",
                "rollout.prompts_per_step=16",
                f"rollout.backend={backend}",
            ]
            t0 = time.perf_counter()
            rl.run(load_config(RLConfig, "grpo_arith", args))
            wall = time.perf_counter() - t0
            rows = [json.loads(x) for x in open(Path(d, "rl", "metrics.jsonl"))]
            rows = [x for x in rows if "time/train_s" in x][1:]  # step 1: warm-up
        keys = sorted({k for x in rows for k in x if k.startswith("time/")})
        out[backend] = {k: round(sum(x.get(k, 0.0) for x in rows) / len(rows), 4) for k in keys}
        out[backend]["run_wall_s"] = round(wall, 1)
        print(f"{backend}: {out[backend]}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", default="", help="a gpt_mini checkpoint (default: a seeded micro model)")
    ap.add_argument("--rows", default="8,64,256")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3, help="GRPO steps per backend in part 2 (0 = skip)")
    ap.add_argument("--out", default="benchmarks/results/rollout_backends.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, tok = policy(a.init or None)
    import vllm

    result = run_header("rollout_backends", a.threads, vllm=vllm.__version__, init=a.init or "micro, seed 0")
    result["params"] = model.num_params()
    result["tokens_per_s"] = throughput(model, tok, [int(x) for x in a.rows.split(",")])
    if a.steps > 0:
        with tempfile.TemporaryDirectory() as d:
            init = a.init or str(checkpoint.save(Path(d, "init"), 0, model, tok))
            result["rl_step_s"] = step_split(init, a.steps, a.threads)
    finish(result, a.out)


if __name__ == "__main__":
    main()
