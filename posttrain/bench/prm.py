"""PRM vs ORM at equal budget, with a PRM trained until its step labels are predictive.

    posttrain bench prm --init runs/pipeline/sft --rm runs/rm --seeds 0,1,2 [--out benchmarks/results/prm.json]

`posttrain bench search` (bench/search.py) trains its PRM on 400 problems × 2 responses
with K = 4 completions per step prefix for 300 steps, and its PRM best-of-8 fell below pass@1.
This driver measures first whether the PRM predicts its labels, then compares:

1. Labels: Monte-Carlo (reward_models/prm.mc_labels) on `--label-problems` train problems and,
   the same way, on `--eval-problems` held-out TEST problems (never trained on).
2. Step-level accuracy on the held-out labels, at every `--check-every` PRM steps: at each
   non-final boundary, does σ(PRM) ≥ ½ agree with the Monte-Carlo label ≥ ½ (how a step is
   judged "good"), beside the rate of the majority class (what a constant guess scores), the
   mean |σ − label| and, at the final boundary, the accuracy against the verifier's 0/1.
   Training continues to `--prm-steps` and keeps the checkpoint with the best step accuracy.
3. The table at one sample budget (search.compare): pass@1, maj@N, ORM best@N, PRM best@N
   (min over steps), PRM-last best@N and PRM step beam search, with generated tokens per problem.

4. `--ranking`: why best@N can fall below pass@1 with a predictive PRM. On the comparison's own
   samples: the chance a correct sample outscores a wrong one of the SAME problem (within AUC,
   what best@N needs) and of ANY problem (across AUC, what step accuracy rewards), and how the
   score follows the number of steps (the problem's length, hence its difficulty).

Each seed draws its own label problems, completions, held-out problems and samples.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from posttrain import checkpoint
from posttrain.bench import update_json
from posttrain.bench.search import compare
from posttrain.config import OptimConfig
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.framework.trainer import Trainer
from posttrain.preference.search import sample_table, solved
from posttrain.recipes.common import EpochIndices
from posttrain.reward_models.prm import PRM, aggregate, boundaries, collate_rows, mc_labels, prm_loss_fn, step_scores
from posttrain.reward_models.reward_model import load_scorer
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask


@torch.no_grad()
def step_accuracy(prm, tok, rows: list[dict]) -> dict:
    """How well σ(PRM) at each boundary predicts its Monte-Carlo label (module doc, point 2)."""
    prm.eval()
    mid_hit, mid_pos, final_hit, err, n_mid = 0, 0, 0, 0.0, 0
    for a in range(0, len(rows), 64):
        b = collate_rows(rows[a : a + 64], tok.pad_id)
        p = torch.sigmoid(prm(b["input_ids"]))  # [b, T]
        for i, r in enumerate(rows[a : a + 64]):
            P = len(r["prompt_ids"])
            probs = [float(p[i, P + pos]) for pos in r["positions"]]
            for q, y in zip(probs[:-1], r["labels"][:-1]):
                mid_hit += (q >= 0.5) == (y >= 0.5)
                mid_pos += y >= 0.5
                err += abs(q - y)
                n_mid += 1
            final_hit += (probs[-1] >= 0.5) == (r["labels"][-1] >= 0.5)
    return {
        "step_acc": mid_hit / max(n_mid, 1),
        "step_majority": max(mid_pos, n_mid - mid_pos) / max(n_mid, 1),
        "step_abs_err": err / max(n_mid, 1),
        "final_acc": final_hit / max(len(rows), 1),
        "steps_scored": n_mid,
    }


def train_until_predictive(
    policy, tok, rows, heldout, steps: int, every: int, seed: int, batch_size: int = 32, lr: float = 3e-4
) -> tuple:
    """search.train_prm's recipe (a PRM on a copy of the policy's trunk, AdamW, epoch order), with
    the held-out step accuracy every `every` steps; returns the best PRM, its numbers, the curve."""
    prm = PRM(copy.deepcopy(policy))
    trainer = Trainer(prm, OptimConfig(lr=lr, weight_decay=0.0, warmup_steps=10), steps)
    order = EpochIndices(len(rows), batch_size, seed)
    curve, best = [step_accuracy(prm, tok, heldout) | {"prm_steps": 0}], None
    for step in range(1, steps + 1):
        batch = collate_rows([rows[i] for i in order(step)], tok.pad_id)
        batch["loss_mask"] = batch["step_mask"]  # the loss's unit: boundaries
        m = trainer.step(batch, prm_loss_fn)
        if step % every == 0 or step == steps:
            acc = step_accuracy(prm, tok, heldout) | {"prm_steps": step, "train_abs_err": m["prm/abs_err"]}
            curve.append(acc)
            print(
                f"[prm] {step} steps: held-out step acc {acc['step_acc']:.3f} (majority {acc['step_majority']:.3f}, "
                f"|σ − label| {acc['step_abs_err']:.3f}), final-step acc {acc['final_acc']:.3f}",
                flush=True,
            )
            if best is None or acc["step_acc"] > best[1]["step_acc"]:
                best = (copy.deepcopy(prm), acc)
    return best[0].eval(), best[1], curve


def one_seed(a, seed: int) -> dict:
    """Labels, PRM training and the comparison for one seed. The trained PRM is kept in
    `--runs`/prm_s{seed}.pt; `--reuse` reloads it (and its numbers) to rerun only the comparison."""
    torch.manual_seed(seed)
    policy, tok, path = checkpoint.load_model(a.init)
    task = ArithmeticTask(ArithmeticConfig())
    saved = Path(a.runs, f"prm_s{seed}.pt")
    if a.reuse and saved.exists():
        state = torch.load(saved, weights_only=False)
        prm = PRM(copy.deepcopy(policy))
        prm.load_state_dict(state.pop("prm"))
        prm.eval()
    else:
        t0 = time.perf_counter()
        rows, stats = mc_labels(
            policy, tok, task, task.items(a.label_problems, "train", seed), a.responses, a.completions, seed=seed
        )
        held, held_stats = mc_labels(
            policy,
            tok,
            task,
            task.items(a.eval_problems, "test", seed + 100),
            a.responses,
            a.completions,
            seed=seed + 100,
        )
        t_label = time.perf_counter() - t0
        prm, best, curve = train_until_predictive(policy, tok, rows, held, a.prm_steps, a.check_every, seed)
        state = {
            "labels": stats,
            "heldout_labels": held_stats,
            "label_s": round(t_label, 1),
            "prm_best": best,
            "prm_curve": curve,
        }
        saved.parent.mkdir(parents=True, exist_ok=True)
        torch.save({**state, "prm": prm.state_dict()}, saved)
    orm = load_scorer(a.rm) if a.rm else None
    res = compare(policy, prm, tok, task, task.items(a.problems, "test", seed), a.n, a.beam, orm, seed=seed)
    return {
        "seed": seed,
        "policy": str(path),
        "rm": a.rm,
        **state,
        **res,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def orm_column(a, seed: int) -> dict:
    """ORM best@N alone, on the very samples compare() drew for this seed (the engine's sampling is
    keyed by (seed, prompt, sample), so the same call draws them again): for a PRM run started
    before its outcome RM had finished training."""
    policy, tok, _ = checkpoint.load_model(a.init)
    task = ArithmeticTask(ArithmeticConfig())
    items = task.items(a.problems, "test", seed)
    prompts = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    samples = Engine(policy, tok).generate(prompts, a.n, SamplingParams(temperature=1.0, max_new_tokens=64), seed=seed)
    scores = load_scorer(a.rm).score([task.prompt(it) for it in items for _ in range(a.n)], [s.text for s in samples])
    return sample_table(task, items, samples, a.n, scores)


def auc(scores: np.ndarray, right: np.ndarray) -> dict:
    """P(score of a correct sample > score of a wrong one), ties ½: within each problem (pairs
    of one row, averaged over all such pairs) and across problems. scores, right [P, n]."""

    def pairs(c: np.ndarray, w: np.ndarray) -> tuple[float, int]:
        d = c[:, None] - w[None, :]  # [|c|, |w|]
        return float((d > 0).sum() + 0.5 * (d == 0).sum()), d.size

    within = [pairs(s[r == 1], s[r == 0]) for s, r in zip(scores, right)]
    hits, n = sum(h for h, _ in within), sum(k for _, k in within)
    across, m = pairs(scores[right == 1], scores[right == 0])
    return {"within_auc": hits / n if n else None, "across_auc": across / m if m else None, "within_pairs": n}


def ranking(a, seed: int) -> dict:
    """Point 4 of the module doc on the samples compare() draws for this seed (keyed sampling)."""
    policy, tok, _ = checkpoint.load_model(a.init)
    prm = PRM(copy.deepcopy(policy))
    prm.load_state_dict(torch.load(Path(a.runs, f"prm_s{seed}.pt"), weights_only=False)["prm"])
    task = ArithmeticTask(ArithmeticConfig())
    items = task.items(a.problems, "test", seed)
    prompts = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    samples = Engine(policy, tok).generate(prompts, a.n, SamplingParams(temperature=1.0, max_new_tokens=64), seed=seed)
    steps = step_scores(prm.eval(), tok, [s.prompt_ids for s in samples], [s.response_ids for s in samples])
    right = np.array([solved(task, items[i // a.n], s.text) for i, s in enumerate(samples)]).reshape(-1, a.n)
    n_steps = np.array([len(boundaries(tok, s.response_ids)) for s in samples], float)  # [P·n]
    out = {
        "pass@1": float(right.mean()),
        "steps_correct": float(n_steps[right.ravel() == 1].mean()),
        "steps_wrong": float(n_steps[right.ravel() == 0].mean()),
    }
    for how in ("min", "last"):
        sc = np.array([aggregate(x, how) for x in steps])  # [P·n]
        out[how] = auc(sc.reshape(-1, a.n), right) | {"corr_with_steps": float(np.corrcoef(sc, n_steps)[0, 1])}
    return out


def _summarize(res: dict) -> dict:
    """Mean and std over seeds of every accuracy column all seeds have."""
    accs = [r["accuracy"] for r in res["runs"]]
    res["summary"] = {
        k: {
            "mean": statistics.fmean(x[k] for x in accs),
            "std": statistics.stdev([x[k] for x in accs]) if len(accs) > 1 else 0.0,
        }
        for k in accs[0]
        if all(k in x for x in accs)
    }
    return res


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="posttrain bench prm", description=__doc__.split("\n\n")[0])
    p.add_argument("--init", required=True, help="the policy (SFT run/checkpoint); the PRM starts from its trunk")
    p.add_argument("--rm", default="", help="outcome RM (`posttrain rm` run, or RUN_A,RUN_B) for ORM best@N")
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--beam", type=int, default=2)
    p.add_argument("--problems", type=int, default=200, help="held-out problems of the comparison")
    p.add_argument("--label-problems", type=int, default=800)
    p.add_argument("--eval-problems", type=int, default=100, help="held-out problems labelled for step accuracy")
    p.add_argument("--responses", type=int, default=2)
    p.add_argument("--completions", type=int, default=8, help="K completions per step prefix")
    p.add_argument("--prm-steps", type=int, default=600)
    p.add_argument("--check-every", type=int, default=100)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--runs", default="runs/prm", help="where each seed's trained PRM is kept")
    p.add_argument("--reuse", action="store_true", help="reload a seed's trained PRM instead of labelling and training")
    p.add_argument(
        "--orm-only", action="store_true", help="add ORM best@N (--rm) to the seeds' rows in --out, nothing else"
    )
    p.add_argument(
        "--ranking", action="store_true", help="add within/across-problem AUC of the seeds' saved PRMs to --out"
    )
    p.add_argument("--out", default="benchmarks/results/prm.json")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    for seed in map(int, a.seeds.split(",")):
        if a.ranking:  # point 4, into the seed's row
            rank = ranking(a, seed)

            def put(res, rank=rank, seed=seed):
                row = next(r for r in res["runs"] if r["seed"] == seed)
                if abs(row["accuracy"]["pass@1"] - rank["pass@1"]) > 1e-9:
                    raise SystemExit(f"seed {seed}: the samples differ from the PRM run's; rerun with --reuse")
                row["ranking"] = rank
                return res

            update_json(a.out, put)
            print(f"[prm] seed {seed} ranking: {json.dumps(rank)}", flush=True)
            continue
        if a.orm_only:  # add the ORM column to a seed's row
            table = orm_column(a, seed)

            def add(res, table=table, seed=seed):
                row = next(r for r in res["runs"] if r["seed"] == seed)
                if abs(row["accuracy"]["pass@1"] - table["pass@1"]) > 1e-9:
                    raise SystemExit(
                        f"seed {seed}: the samples differ from the PRM run's (pass@1 "
                        f"{table['pass@1']} vs {row['accuracy']['pass@1']}); rerun with --reuse --rm"
                    )
                row["accuracy"][f"orm best@{a.n}"], row["rm"] = table[f"orm best@{a.n}"], a.rm
                return _summarize(res)

            update_json(a.out, add)
            continue
        row = one_seed(a, seed)

        def update(res, row=row, seed=seed):  # seeds run in parallel processes
            res["runs"] = [r for r in res.get("runs", []) if r["seed"] != seed] + [row]
            res["command"] = "posttrain bench prm " + " ".join(argv if argv is not None else sys.argv[1:])
            return _summarize(res)

        update_json(a.out, update)
        print(json.dumps(row["accuracy"], indent=1), row["tokens_per_problem"], flush=True)


if __name__ == "__main__":
    main()
