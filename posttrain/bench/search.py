"""`posttrain bench search`: the test-time search table of preference/search.py, measured.

    posttrain bench search --init runs/sft --rm runs/rm --n 8 --beam 2 --out search.json

`main` labels steps by Monte-Carlo (reward_models/prm.mc_labels), trains the PRM from the
policy's trunk, runs the table on held-out problems at equal sample budgets and writes it as
JSON with the tokens each method generated.
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch

from posttrain import checkpoint
from posttrain.bench import write_json
from posttrain.config import OptimConfig
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.framework.trainer import Trainer
from posttrain.preference.search import beam_search, sample_table, solved
from posttrain.recipes.common import EpochIndices
from posttrain.reward_models.prm import PRM, aggregate, collate_rows, mc_labels, prm_loss_fn, step_scores
from posttrain.reward_models.reward_model import load_scorer
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask


def compare(
    policy,
    prm,
    tok,
    task,
    items,
    n: int = 8,
    beam: int = 2,
    orm=None,
    temperature: float = 1.0,
    max_len: int = 64,
    seed: int = 0,
) -> dict:
    """The table of the module docstring on `items`: accuracy and generated tokens per problem."""
    engine = Engine(policy, tok)
    prompts = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    samples = engine.generate(prompts, n, SamplingParams(temperature=temperature, max_new_tokens=max_len), seed=seed)
    bon_tokens = engine.stats["rollout/generated_tokens"] / len(items)
    steps = step_scores(prm, tok, [s.prompt_ids for s in samples], [s.response_ids for s in samples])
    orm_s = orm.score([task.prompt(it) for it in items for _ in range(n)], [s.text for s in samples]) if orm else None
    acc = sample_table(
        task,
        items,
        samples,
        n,
        orm_s,
        [aggregate(s, "min") for s in steps],
        **{"prm-last": [aggregate(s, "last") for s in steps]},
    )
    t0 = time.perf_counter()
    texts, beam_tokens = beam_search(
        policy, prm, tok, task, items, beam, max(1, n // beam), temperature, max_len, seed=seed + 1
    )
    acc[f"prm beam {beam}x{max(1, n // beam)}"] = float(np.mean([solved(task, it, t) for it, t in zip(items, texts)]))
    return {
        "accuracy": acc,
        "tokens_per_problem": {"sampling (all best@n, maj)": bon_tokens, "beam": beam_tokens / len(items)},
        "beam_s": time.perf_counter() - t0,
        "problems": len(items),
        "n": n,
    }


def train_prm(trunk, tok, rows, steps: int, batch_size: int = 32, lr: float = 3e-4, seed: int = 0):
    """A PRM on a copy of `trunk`, `steps` AdamW steps over the labelled rows (epoch order)."""
    prm = PRM(copy.deepcopy(trunk))
    trainer = Trainer(prm, OptimConfig(lr=lr, weight_decay=0.0, warmup_steps=10), steps)
    order = EpochIndices(len(rows), batch_size, seed)
    log = []
    for step in range(1, steps + 1):
        batch = collate_rows([rows[i] for i in order(step)], tok.pad_id)
        batch["loss_mask"] = batch["step_mask"]  # the loss's unit: boundaries
        m = trainer.step(batch, prm_loss_fn)
        log.append({"step": step, "loss": m["loss"], "prm/abs_err": m["prm/abs_err"]})
    return prm.eval(), log


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="posttrain bench search", description=__doc__.split("\n\n")[0])
    p.add_argument("--init", required=True, help="the policy (SFT or RL run/checkpoint); the PRM starts from its trunk")
    p.add_argument(
        "--rm",
        help="an outcome reward model (`posttrain rm` run, or RUN_A,RUN_B for an ensemble) for the orm best@n column",
    )
    p.add_argument("--n", type=int, default=8, help="samples per problem (the budget)")
    p.add_argument("--beam", type=int, default=2, help="beam width; each beam is extended with n/beam steps")
    p.add_argument("--problems", type=int, default=200, help="held-out problems")
    p.add_argument("--label-problems", type=int, default=400, help="train problems for the PRM's Monte-Carlo labels")
    p.add_argument("--responses", type=int, default=2, help="labelled responses per train problem")
    p.add_argument("--completions", type=int, default=4, help="completions per step prefix (the MC label's K)")
    p.add_argument("--prm-steps", type=int, default=300)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="search.json")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    policy, tok, path = checkpoint.load_model(a.init)
    task = ArithmeticTask(ArithmeticConfig())
    t0 = time.perf_counter()
    rows, stats = mc_labels(
        policy, tok, task, task.items(a.label_problems, "train", a.seed), a.responses, a.completions, seed=a.seed
    )
    t_label = time.perf_counter() - t0
    prm, log = train_prm(policy, tok, rows, a.prm_steps, seed=a.seed)
    t_train = time.perf_counter() - t0 - t_label
    orm = load_scorer(a.rm) if a.rm else None
    res = compare(policy, prm, tok, task, task.items(a.problems, "test", a.seed), a.n, a.beam, orm, seed=a.seed)
    out = {
        "policy": str(path),
        "rm": a.rm,
        "labels": stats,
        "label_s": t_label,
        "prm_train_s": t_train,
        "prm_log": log[:: max(1, len(log) // 20)] + log[-1:],
        **res,
    }
    write_json(a.out, out)
    print(
        f"PRM labels: {stats}  ({t_label:.0f} s), trained {a.prm_steps} steps ({t_train:.0f} s), "
        f"final |σ − label| {log[-1]['prm/abs_err']:.3f}"
    )
    print(f"{'method':28s} {'held-out acc':>12s}")
    for k, v in res["accuracy"].items():
        print(f"{k:28s} {v:12.3f}")
    print(f"tokens generated per problem: {res['tokens_per_problem']}")
