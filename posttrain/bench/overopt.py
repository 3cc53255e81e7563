"""Reward-model over-optimisation, Gao et al.'s sweep at small scale (2210.10760): true and proxy
reward against √KL, for reward models trained on more or less data and for several KL coefficients.

    posttrain bench overopt --init runs/pipeline/sft --rms runs/rm_a,runs/rm_b --part bon,rl --seeds 0,1,2
        [--kl 0,0.05] [--out benchmarks/results/overoptimization.json]

bon   Best-of-n against each RM. N samples per held-out problem are drawn once; for n = 1, 2,
      4 … N the expected true reward (verifier) and proxy (RM score) of the sample the RM ranks
      first among n drawn at random is exact from the order statistics of the N: the sample of
      proxy rank j (ascending) wins with probability C(j−1, n−1)/C(N, n). Gao's KL of best-of-n
      is log n − (n−1)/n, so √KL runs from 0 to ≈1.7 at n = 32.
rl    GRPO on each RM's score (`reward_model=`, reward_models/rlhf.py) for each KL coefficient: the
      per-step true and proxy reward against √(sequence KL) from the run's overoptimization.json
      (its report draws the same curve); reported: where the smoothed true reward peaked, and how
      far it fell by the end while the proxy kept rising.

Each seed draws its own problems and samples; the RMs are fixed (train them with `posttrain rm`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from pathlib import Path

import numpy as np
import torch

from posttrain import checkpoint
from posttrain.bench import update_json
from posttrain.config import RLConfig, load_config
from posttrain.eval import response_budget
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.logging import read_metrics
from posttrain.recipes import rl
from posttrain.reward_models.reward_model import load_scorer
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from posttrain.tasks.base import safe_reward


def best_of_n(proxy: np.ndarray, true: np.ndarray, ns: list[int]) -> list[dict]:
    """Exact E[true], E[proxy] of the RM's pick among n of the N samples of each prompt.
    proxy, true [P, N] → one row per n, averaged over prompts."""
    N = proxy.shape[1]
    order = np.argsort(proxy, axis=1, kind="stable")  # ascending ranks
    t_sorted = np.take_along_axis(true, order, 1)  # [P, N]
    p_sorted = np.take_along_axis(proxy, order, 1)
    rows = []
    for n in ns:
        w = np.array([math.comb(j, n - 1) for j in range(N)], dtype=float) / math.comb(N, n)  # rank j+1 wins
        kl = math.log(n) - (n - 1) / n
        rows.append(
            {
                "n": n,
                "kl": kl,
                "sqrt_kl": math.sqrt(kl),
                "true": float((t_sorted @ w).mean()),
                "proxy": float((p_sorted @ w).mean()),
            }
        )
    return rows


def rm_accuracy(rm_dir: str) -> float | None:
    """The RM's last held-out pairwise accuracy from its metrics.jsonl."""
    vals = [m[k] for m in read_metrics(rm_dir) for k in m if k.startswith("eval/") and "acc" in k]
    return vals[-1] if vals else None


def bon(init: str, rms: list[str], seed: int, prompts: int, N: int) -> dict:
    model, tok, _ = checkpoint.load_model(init)
    task = ArithmeticTask(ArithmeticConfig())
    items = task.items(prompts, "test", seed)
    ids = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    samples = Engine(model.eval(), tok).generate(
        ids,
        N,
        SamplingParams(temperature=1.0, max_new_tokens=response_budget(task, items)),
        seed=seed + 11,
        items=items,
    )
    true = np.array([safe_reward(task, s.item, s.text).reward >= 1.0 for s in samples], float).reshape(prompts, N)
    ns = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= N]
    out = {
        "seed": seed,
        "prompts": prompts,
        "N": N,
        "pass@1": float(true.mean()),
        "pass@N": float(true.max(1).mean()),
        "rms": {},
    }
    for rm in rms:
        scores = load_scorer(rm).score([task.prompt(s.item) for s in samples], [s.text for s in samples])
        curve = best_of_n(np.array(scores).reshape(prompts, N), true, ns)
        out["rms"][rm] = {"heldout_pair_acc": rm_accuracy(rm), "curve": curve}
        peak = max(curve, key=lambda r: r["true"])
        print(
            f"[bon] seed {seed} {rm}: true "
            + " ".join(f"n={r['n']}:{r['true']:.3f}" for r in curve)
            + f"  (peak n={peak['n']})",
            flush=True,
        )
    return out


def rl_run(init: str, rm: str, kl: float, seed: int, steps: int, runs: Path, lr: float | None = None) -> dict:
    """One RLHF run (configs/rlhf.yaml budget at 8 prompts × 8 samples, its lr 1e-4 unless `lr`)
    and its over-optimisation turn."""
    out = runs / (f"{Path(rm).name}_kl{kl}_s{seed}" + (f"_lr{lr:g}" if lr is not None else ""))
    cfg = load_config(
        RLConfig,
        "rlhf",
        [
            f"init={init}",
            f"reward_model={rm}",
            f"out={out}",
            "overwrite=true",
            f"steps={steps}",
            f"seed={seed}",
            f"eval_every={steps}",
            "threads=1",
            f"algo.kl_coef={kl}",
            "rollout.prompts_per_step=8",
            "eval.problems=50",
            *([f"optim.lr={lr}"] if lr is not None else []),
        ],
    )
    rl.run(cfg)
    data = json.loads((out / "overoptimization.json").read_text())

    ms = read_metrics(out)
    return {
        "rm": rm,
        "kl_coef": kl,
        "lr": cfg.optim.lr,
        "seed": seed,
        "steps": steps,
        "run": str(out),
        "turn": data["turn"],
        "pass@1_start": ms[0].get("eval/pass@1"),
        "pass@1_end": ms[-1].get("eval/pass@1"),
        "curve": [{k: round(v, 5) for k, v in r.items()} for r in data["rows"]],
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="posttrain bench overopt", description=__doc__.split("\n\n")[0])
    p.add_argument("--init", required=True)
    p.add_argument("--rms", required=True, help="comma-separated `posttrain rm` runs, weakest first")
    p.add_argument("--part", default="bon,rl")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--prompts", type=int, default=150)
    p.add_argument("--n", type=int, default=32, help="samples per problem for best-of-n (n = 1, 2, 4 … this)")
    p.add_argument("--kl", default="0,0.05", help="rl: KL coefficients")
    p.add_argument("--rl-rms", default="", help="rl: the RMs to optimise against (default: the first of --rms)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=None, help="rl: learning rate (default: configs/rlhf.yaml's 1e-4)")
    p.add_argument("--runs", default="runs/overopt")
    p.add_argument("--out", default="benchmarks/results/overoptimization.json")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    rms, out = a.rms.split(","), Path(a.out)

    def save(part, row, same):
        def update(res):  # seeds run in parallel processes
            res[part] = [r for r in res.get(part, []) if not same(r)] + [row]
            res.setdefault("load_average", {})[f"{part} {row['seed']}"] = [round(x, 2) for x in os.getloadavg()]
            if part == "bon":
                bons = res["bon"]
                res["bon_summary"] = {
                    rm: [
                        {
                            "n": c["n"],
                            "sqrt_kl": c["sqrt_kl"],
                            "true": statistics.fmean(r["rms"][rm]["curve"][i]["true"] for r in bons),
                            "proxy": statistics.fmean(r["rms"][rm]["curve"][i]["proxy"] for r in bons),
                        }
                        for i, c in enumerate(bons[0]["rms"][rm]["curve"])
                    ]
                    for rm in bons[0]["rms"]
                }
            return res

        update_json(out, update)

    for seed in map(int, a.seeds.split(",")):
        if "bon" in a.part:
            save("bon", bon(a.init, rms, seed, a.prompts, a.n), lambda r, s=seed: r["seed"] == s)
        if "rl" in a.part:
            for rm in a.rl_rms.split(",") if a.rl_rms else rms[:1]:
                for kl in map(float, a.kl.split(",")):
                    row = rl_run(a.init, rm, kl, seed, a.steps, Path(a.runs), a.lr)
                    save(
                        "rl",
                        row,
                        lambda r, k=(rm, kl, row["lr"], seed): (
                            (r["rm"], r["kl_coef"], r.get("lr", 1e-4), r["seed"]) == k
                        ),
                    )
                    print(f"[rl] {rm} kl {kl} seed {seed}: {row['turn']}", flush=True)


if __name__ == "__main__":
    main()
