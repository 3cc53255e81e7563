"""Does RL teach gpt_mini to search? Held-out answer accuracy and search rate before → after RL on
the search-tool environment (tasks/search.py), from a warm-up made by the task's own demonstrations.

    python benchmarks/search_env.py [--seeds 0,1,2] [--rl-steps 30] [--out benchmarks/results/search_env.json]

1. pretrain a fresh gpt_mini (nano) on the task's corpus: `question=demonstration` lines of TRAIN
   entities, 30% of which search (`⟦name⟧⟨document⟩answer`) and 70% answer from memory;
2. SFT on the same demonstrations (the search results masked out of the loss);
3. GRPO from that checkpoint, one run per seed, evaluated at step 0 and at the end on questions
   about HELD-OUT entities, whose facts are in no training text: only a search can answer them.
Recorded per seed: greedy accuracy and search rate, sampled pass@1 and search rate, the accuracy of
sampled answers with and without a search, before and after; plus the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's posttrain, not an installed one

KEYS = (
    "eval/greedy_acc",
    "eval/greedy_tool_call_rate",
    "eval/pass@1",
    "eval/tool_call_rate",
    "eval/acc_with_tool",
    "eval/acc_without_tool",
)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default="runs/search_env")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--pretrain-steps", type=int, default=600)
    p.add_argument("--sft-steps", type=int, default=800)
    p.add_argument("--rl-steps", type=int, default=30)
    p.add_argument("--reward", default="answer", help="answer | tool_n1")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/search_env.json"))
    args = p.parse_args(argv)
    import posttrain

    work, t0, load = Path(args.work), time.time(), os.getloadavg()
    task = {"name": "search"}
    common = dict(threads=args.threads, tensorboard=False, overwrite=True)
    from posttrain import checkpoint

    if not checkpoint.latest(work / "pt"):
        posttrain.pretrain(task=task, steps=args.pretrain_steps, corpus_chars=200_000, out=str(work / "pt"), **common)
    if not checkpoint.latest(work / "sft"):
        posttrain.sft(
            task=task,
            init=str(work / "pt"),
            steps=args.sft_steps,
            batch_size=32,
            eval_every=100,
            eval_problems=100,
            out=str(work / "sft"),
            **common,
        )
    t_warm = time.time() - t0
    runs = {}
    for seed in map(int, args.seeds.split(",")):
        run = posttrain.rl(
            task={**task, "reward": args.reward},
            init=str(work / "sft"),
            seed=seed,
            steps=args.rl_steps,
            eval_every=args.rl_steps,
            out=str(work / f"rl_{args.reward}_{seed}"),
            rollout={"prompts_per_step": 8, "samples_per_prompt": 8, "max_new_tokens": 48},
            algo={"name": "grpo", "kl_coef": 0.0},
            optim={"lr": 1e-4},
            eval={"problems": 100, "samples": 4},
            **common,
        )
        evals = [m for m in run.metrics if "eval/greedy_acc" in m]
        steps = [m for m in run.metrics if "reward/mean" in m]
        runs[seed] = {
            "before": {k: evals[0].get(k) for k in KEYS},
            "after": {k: evals[-1].get(k) for k in KEYS},
            "reward_first_steps": sum(m["reward/mean"] for m in steps[:5]) / len(steps[:5]),
            "reward_last_steps": sum(m["reward/mean"] for m in steps[-5:]) / len(steps[-5:]),
            "train_search_rate_first": steps[0].get("agent/tool_call_rate"),
            "train_search_rate_last": steps[-1].get("agent/tool_call_rate"),
        }
        print(seed, json.dumps(runs[seed]), flush=True)

    def mean(when, k):
        vals = [r[when][k] for r in runs.values() if r[when][k] is not None]
        return sum(vals) / len(vals) if vals else None

    out = {
        "task": "search (tasks/search.py): 3000 made-up entities, 20% held out; BM25 top-1; reward " + args.reward,
        "warmup": {"pretrain_steps": args.pretrain_steps, "sft_steps": args.sft_steps, "demo_search_frac": 0.3},
        "rl": {
            "algorithm": "grpo",
            "steps": args.rl_steps,
            "prompts_per_step": 8,
            "samples_per_prompt": 8,
            "lr": 1e-4,
            "kl_coef": 0.0,
            "eval": "100 held-out questions, greedy + 4 samples",
        },
        "seeds": runs,
        "mean": {w: {k: mean(w, k) for k in KEYS} for w in ("before", "after")},
        "machine": {
            "threads": args.threads,
            "loadavg_start": load,
            "loadavg_end": os.getloadavg(),
            "seconds_warmup": round(t_warm, 1),
            "seconds_total": round(time.time() - t0, 1),
        },
        "command": "python benchmarks/search_env.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["mean"], indent=1))
    return out


if __name__ == "__main__":
    main()
