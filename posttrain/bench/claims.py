"""The algorithm lessons' claims, reproduced at small scale on the built-in task.

    posttrain bench claims --init runs/pipeline/sft [--steps 100] [--only degenerate,length,clip,group]
        [--out benchmarks/results/claims.json]

1. degenerate  A group of K samples of a prompt that the policy solves with probability p is
               degenerate (all right or all wrong, zero GRPO advantage) with probability
               p^K + (1−p)^K. We estimate each prompt's p from 32 samples, predict the
               degenerate fraction for K = 2, 4, 8, 16, and compare with the fraction observed
               on fresh, independent groups — next to the naive prediction from the mean p.
2. length      GRPO's seq-mean-token-mean divides each response's loss by its own length, so a
               long wrong answer is pushed down less per token than a short one; Dr. GRPO's
               constant normaliser does not. Claim: wrong answers grow longer under GRPO.
3. clip        DAPO's clip-higher (ε_high 0.28 vs 0.2) lets low-probability tokens grow, so
               entropy stays higher. The clip only acts on reused samples: both runs take 4
               optimizer steps per batch (minibatches=4).
4. group       Group size 2 vs 8 at the same samples per step (64×2 vs 16×8).
5. length_budget  claim 2 where the budget does not cap wrong answers: rollout.max_new_tokens =
               --max-new (128, over twice the longest correct trace), one run per algorithm and
               seed (--seeds). Wrong answers are longer partly because harder sums (more terms)
               stay wrong, a composition effect both algorithms share; `excess_length` removes
               it: each wrong answer's length minus the length of ITS problem's correct trace,
               on held-out problems, before and after training.

Each claim is reported, not asserted: the numbers go to JSON and docs/results.md says whether the
claim held here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import numpy as np
import torch

from posttrain import checkpoint
from posttrain.bench import update_json
from posttrain.bench.algorithms import one_run
from posttrain.eval import response_budget
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.recipes.warm_start import default_init
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from posttrain.tasks.base import safe_reward

CLAIMS = ("degenerate", "length", "clip", "group", "length_budget")


def correct_matrix(engine, tok, task, items, n: int, seed: int, max_new: int) -> np.ndarray:
    """Whether each of n samples of each item is correct [P, n]."""
    prompts = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    samples = engine.generate(
        prompts, n, SamplingParams(temperature=1.0, max_new_tokens=max_new), seed=seed, items=items
    )
    return np.array([safe_reward(task, s.item, s.text).reward >= 1.0 for s in samples]).reshape(len(items), n)


def degenerate(init: str, prompts: int = 300, seed: int = 0) -> dict:
    model, tok, _ = checkpoint.load_model(init)
    task = ArithmeticTask(ArithmeticConfig())
    items = task.items(prompts, "train", seed)
    engine = Engine(model.eval(), tok, max_slots=256)
    max_new = response_budget(task, items)
    p = correct_matrix(engine, tok, task, items, 32, seed, max_new).mean(axis=1)  # estimate set A [P]
    fresh = correct_matrix(engine, tok, task, items, 32, seed + 1, max_new)  # independent set B [P, 32]
    rows = []
    for k in (2, 4, 8, 16):
        ok = fresh.reshape(len(items), 32 // k, k)  # 32/K groups of K per prompt
        observed = float(np.mean(ok.all(axis=2) | (~ok).all(axis=2)))
        rows.append(
            {
                "K": k,
                "observed": round(observed, 4),
                "predicted_per_prompt": round(float(np.mean(p**k + (1 - p) ** k)), 4),
                "predicted_mean_p": round(float(p.mean() ** k + (1 - p.mean()) ** k), 4),
            }
        )
    return {
        "prompts": prompts,
        "mean_p": round(float(p.mean()), 4),
        "mean_p_fresh": round(float(fresh.mean()), 4),
        "rows": rows,
    }


def excess_length(ckpt: str, seed: int, max_new: int, prompts: int = 150, n: int = 8) -> dict:
    """Held-out wrong answers: mean length, and mean length minus the correct trace of the same
    problem (tokens), sampled at temperature 1 with `max_new` tokens; and how many ran to the cap."""
    model, tok, _ = checkpoint.load_model(ckpt)
    task = ArithmeticTask(ArithmeticConfig())
    items = task.items(prompts, "test", seed)
    prompts_ids = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    samples = Engine(model.eval(), tok).generate(
        prompts_ids, n, SamplingParams(temperature=1.0, max_new_tokens=max_new), seed=seed + 7, items=items
    )
    gold = {id(it): len(tok.encode(tok.chat_response(it.target(True)))) for it in items}
    wrong = [s for s in samples if safe_reward(task, s.item, s.text).reward < 1.0]
    mean = lambda xs: round(statistics.fmean(xs), 3) if xs else None
    return {
        "wrong_frac": round(len(wrong) / len(samples), 4),
        "wrong_len": mean([len(s.response_ids) for s in wrong]),
        "wrong_excess": mean([len(s.response_ids) - gold[id(s.item)] for s in wrong]),
        "correct_len": mean([len(s.response_ids) for s in samples if s not in wrong]),
        "truncated_frac": round(sum(s.finish_reason == "length" for s in samples) / len(samples), 4),
    }


def _summary(row: dict, first: int = 10) -> dict:
    c = row.pop("curves")
    head = lambda k: statistics.fmean(x for x in c[k][:first] if x == x)
    tail = lambda k: statistics.fmean(x for x in c[k][-first:] if x == x)
    return {
        **row,
        **{f"{k}_first{first}": round(head(k), 4) for k in c},
        **{f"{k}_last{first}": round(tail(k), 4) for k in c},
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="posttrain bench claims")
    p.add_argument("--init", default="", help="SFT run directory or checkpoint (default: the cached SFT(CoT))")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=",".join(CLAIMS))
    p.add_argument("--threads", type=int, default=0, help="torch threads per run (0 = torch's default)")
    p.add_argument("--seeds", default="0", help="length_budget: comma-separated seeds")
    p.add_argument("--algorithms", default="grpo,dr_grpo", help="length_budget: the algorithms compared")
    p.add_argument("--max-new", type=int, default=128, help="length_budget: rollout.max_new_tokens")
    p.add_argument("--prompts", type=int, default=16, help="length_budget: prompts per step (× 8 samples)")
    p.add_argument("--runs", default="runs/claims")
    p.add_argument("--out", default="benchmarks/results/claims.json")
    args = p.parse_args(argv)
    init, runs, out = args.init or default_init(), Path(args.runs), Path(args.out)
    res = json.loads(out.read_text()) if out.exists() else {}
    run = lambda name, tag, overrides=(), algo=None: (
        _summary(one_run(name, init, args.steps, args.seed, runs / tag, [*overrides, f"threads={args.threads}"], algo))
        | {"run": tag}
    )
    for claim in args.only.split(","):
        torch.manual_seed(args.seed)
        if args.threads:
            torch.set_num_threads(args.threads)
        if claim == "degenerate":
            res[claim] = degenerate(init, seed=args.seed)
        elif claim == "length":
            res[claim] = [run("grpo", "length_grpo"), run("dr_grpo", "length_dr_grpo")]
        elif claim == "clip":
            res[claim] = [run("grpo", f"clip_{h}", ["optim.minibatches=4"], {"eps_high": h}) for h in (0.2, 0.28)]
        elif claim == "group":
            res[claim] = [
                run("grpo", "group_2", ["rollout.prompts_per_step=64", "rollout.samples_per_prompt=2"]),
                run("grpo", "group_8", ["rollout.prompts_per_step=16", "rollout.samples_per_prompt=8"]),
            ]
        elif claim == "length_budget":
            for name in args.algorithms.split(","):
                for seed in map(int, args.seeds.split(",")):
                    tag = f"length{args.max_new}_{name}_s{seed}"
                    over = [
                        f"rollout.max_new_tokens={args.max_new}",
                        f"rollout.prompts_per_step={args.prompts}",
                        "eval.problems=100",
                    ]
                    row = _summary(
                        one_run(name, init, args.steps, seed, runs / tag, [*over, f"threads={args.threads}"])
                    )
                    row |= {
                        "run": tag,
                        "max_new_tokens": args.max_new,
                        "prompts_per_step": args.prompts,
                        "excess_start": excess_length(init, seed, args.max_new),
                        "excess_end": excess_length(str(runs / tag), seed, args.max_new),
                        "load_average": [round(x, 2) for x in os.getloadavg()],
                    }

                    def update(res, row=row, tag=tag, claim=claim):  # seeds run in parallel processes
                        res[claim] = [r for r in res.get(claim, []) if r["run"] != tag] + [row]
                        return res

                    res = update_json(out, update)
            continue
        else:
            raise SystemExit(f"--only: unknown claim {claim!r}; choose from {', '.join(CLAIMS)}")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1))
        print(claim, json.dumps(res[claim], indent=1))


if __name__ == "__main__":
    main()
