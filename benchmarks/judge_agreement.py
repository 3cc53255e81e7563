"""How often a judge model agrees with the built-in task's verifier (reward_models/judge.py), pointwise and pairwise.

    python benchmarks/judge_agreement.py --policy runs/cache/sft_cot/sft --mode pointwise
    python benchmarks/judge_agreement.py --policy runs/cache/sft_cot/sft --mode pairwise

The judge is a gpt_mini checkpoint trained for it (nothing bigger runs on 2 CPU cores):
  1. the policy (the default SFT(CoT) checkpoint) samples responses to TRAIN problems at temperature 1;
  2. each becomes a judge row through the frozen template of the mode (examples/judge/): pointwise, the
     question and one response, target "score: 1" or "score: 0" by the verifier; pairwise, the question
     and two responses in random order, target "[[a]]", "[[b]]" (the verifier-correct one) or "[[c]]"
     (both right or both wrong; ties thinned to one per two decisive pairs). Either target starts with
     the judge's own worked sum: the judge is reference-free and must redo the sum;
  3. SFT of the policy checkpoint on those rows (posttrain.sft, task.name=dataset) is the judge.
Agreement is measured on HELD-OUT problems: fresh policy samples scored by the verifier and by the
judge through `JudgeTask` (the code `task.judge.model=` runs in RL: greedy, replies parsed by
parse_score / parse_choice, order coin-flipped). Pointwise: agreement, confusion counts, the majority
baseline. Pairwise: how often the verifier-correct response wins a discordant pair, and position
consistency: each discordant pair asked in both orders, the share whose two verdicts name the same winner.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's posttrain, not an installed one
TEMPLATES = {"pointwise": ROOT / "examples/judge/arith_judge.txt", "pairwise": ROOT / "examples/judge/arith_pair.txt"}


def policy_samples(policy: str, items, n: int, seed: int):
    """`n` responses per item from the policy at temperature 1: [(item, response text without end-of-turn)]."""
    from posttrain import checkpoint
    from posttrain.framework.rollout import Engine, SamplingParams

    model, tok, _ = checkpoint.load_model(policy)
    model.eval()
    with torch.no_grad():
        out = Engine(model, tok).generate(
            [tok.encode(tok.chat_prompt(it.question)) for it in items],
            n,
            SamplingParams(temperature=1.0, max_new_tokens=64),
            seed=seed,
        )
    return [(items[s.group], tok.decode(s.response_ids).split("#", 1)[0]) for s in out]


def judge_rows(pairs, template: str, mode: str, n: int):
    """SFT rows for the judge: pointwise one per response; pairwise one per neighbour pair of a problem's
    `n` responses, shown in a random order."""
    from posttrain.reward_models.judge import render
    from posttrain.tasks.arithmetic import verify

    if mode == "pointwise":
        return [
            {
                "prompt": render(template, question=it.question, response=t),
                "completion": f"{it.target(True)} score: {int(verify(t, it.answer))}",
                "answer": int(verify(t, it.answer)),
            }
            for it, t in pairs
        ]
    rng, rows, ties = random.Random(0), [], []
    for g in range(0, len(pairs), n):
        group = pairs[g : g + n]
        for k in range(n):
            (it, a), (_, b) = group[k], group[(k + 1) % n]
            if rng.random() < 0.5:
                a, b = b, a
            ra, rb = verify(a, it.answer), verify(b, it.answer)
            verdict = "c" if ra == rb else "a" if ra > rb else "b"
            (ties if verdict == "c" else rows).append(
                {
                    "prompt": render(template, question=it.question, response_a=a, response_b=b),
                    "completion": f"{it.target(True)} [[{verdict}]]",
                    "answer": verdict,
                }
            )
    # ties (both right or both wrong) are most pairs of a 60%-accurate policy; a judge trained on them
    # as they come says "tie" to everything. Keep one tie per two decisive pairs.
    return rows + rng.sample(ties, min(len(ties), len(rows) // 2))


def pointwise_stats(task, heldout, verify) -> dict:
    res = task.reward_batch([it for it, _ in heldout], [t for _, t in heldout], step=0)
    truth = [verify(t, it.answer) >= 1 for it, t in heldout]
    said = [r.reward >= 0.5 for r in res]
    ok = [r.error is None for r in res]
    count = {
        k: sum(o and (t, s) == want for t, s, o in zip(truth, said, ok))
        for k, want in (("tp", (True, True)), ("tn", (False, False)), ("fp", (False, True)), ("fn", (True, False)))
    }
    n, errors = len(res), sum(not o for o in ok)
    return {
        "responses": n,
        "verifier_correct_frac": sum(truth) / n,
        "agreement": (count["tp"] + count["tn"]) / n,  # a judge error counts as disagreement
        "majority_baseline": max(sum(truth), n - sum(truth)) / n,
        **count,
        "judge_errors": errors,
        "precision_correct": count["tp"] / max(count["tp"] + count["fp"], 1),
        "recall_correct": count["tp"] / max(count["tp"] + count["fn"], 1),
    }


def pairwise_stats(task, heldout, verify) -> dict:
    from posttrain.reward_models.judge import comparisons, parse_choice, render

    items, texts = [it for it, _ in heldout], [t for _, t in heldout]
    task.reward_batch(items, texts, step=0)
    logged = dict(task.logged)
    right = [verify(t, it.answer) for it, t in heldout]
    comps = comparisons(items, texts, task.cfg, 0, lambda it: it.question)
    discordant = [(i, j) for i, j, _ in comps if right[i] != right[j]]
    prompts = [
        render(task.template, response_a=texts[x], response_b=texts[y], **task._fields(items[i]))
        for i, j in discordant
        for x, y in ((i, j), (j, i))
    ]
    replies = task.backend.complete(prompts, 0)
    winners = []
    for k in range(0, len(replies), 2):
        i, j = discordant[k // 2]
        pair = []
        for reply, first in ((replies[k], i), (replies[k + 1], j)):
            try:
                c = parse_choice(reply) if isinstance(reply, str) else None
            except ValueError:
                c = None
            pair.append(None if c is None else "tie" if c == "tie" else first if c == "A" else (i + j - first))
        winners.append(pair)
    both = [w for w in winners if None not in w]
    return {
        "comparisons": int(logged["judge_calls"]),
        "judge_errors": int(logged["judge_errors"]),
        "agreement_discordant": logged.get("judge_agreement"),  # the verifier-correct response won (tie = ½)
        "first_frac": logged.get("judge_first_frac"),
        "discordant_pairs": len(discordant),
        "position_consistency": sum(a == b for a, b in both) / max(len(both), 1),
        "both_orders_parsed": len(both),
    }


def rl_with_judge(args, work: Path, template: Path) -> dict:
    """GRPO from the policy, rewarded by the judge alone (task.judge.*): the verifier's held-out pass@1
    before and after, and how often the judge agreed with the verifier on the training samples."""
    import posttrain

    judge = {
        "model": str(work / "judge"),
        "template": str(template),
        "mode": args.mode,
        "scale": 1.0,
        "max_tokens": 64,
        "pairs": 1,
    }
    run = posttrain.rl(
        init=args.policy,
        task={"name": "arithmetic", "judge": judge},
        steps=args.rl_steps,
        eval_every=args.rl_steps,
        out=str(work / "rl"),
        overwrite=True,
        threads=args.threads,
        tensorboard=False,
        rollout={"prompts_per_step": 16, "samples_per_prompt": 8},
        eval={"problems": 200, "samples": 4},
    )
    steps = [m for m in run.metrics if m["step"] > 0]
    evals = [m for m in run.metrics if "eval/pass@1" in m]
    mean = lambda k: sum(m[k] for m in steps if k in m) / max(sum(k in m for m in steps), 1)  # noqa: E731
    return {
        "steps": args.rl_steps,
        "prompts_per_step": 16,
        "samples_per_prompt": 8,
        "verifier_pass@1": [evals[0]["eval/pass@1"], evals[-1]["eval/pass@1"]],
        "verifier_greedy_acc": [evals[0]["eval/greedy_acc"], evals[-1]["eval/greedy_acc"]],
        "reward_judge_first_last5": [
            sum(m["reward/judge"] for m in steps[:5]) / 5,
            sum(m["reward/judge"] for m in steps[-5:]) / 5,
        ],
        "reward_verifier_first_last5": [
            sum(m["reward/verifier"] for m in steps[:5]) / 5,
            sum(m["reward/verifier"] for m in steps[-5:]) / 5,
        ],
        "judge_agreement_mean": mean("reward/judge_agreement"),
        "judge_errors_total": sum(m["reward/judge_errors"] for m in steps),
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", required=True, help="the SFT(CoT) checkpoint whose responses are judged")
    p.add_argument("--mode", default="pointwise", choices=("pointwise", "pairwise"))
    p.add_argument("--work", default="runs/judge_agreement")
    p.add_argument("--train-problems", type=int, default=1500)
    p.add_argument("--heldout-problems", type=int, default=300)
    p.add_argument("--samples", type=int, default=2, help="policy responses per problem")
    p.add_argument("--sft-steps", type=int, default=300)
    p.add_argument("--reuse", action="store_true", help="measure an already trained judge in WORK/MODE/judge")
    p.add_argument("--rl-steps", type=int, default=0, help="then GRPO from the policy with this judge as the reward")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/judge_agreement.json"))
    args = p.parse_args(argv)
    import posttrain
    from posttrain import checkpoint
    from posttrain.models.tokenizer import CharTokenizer
    from posttrain.reward_models.judge import JudgeTask
    from posttrain.tasks.arithmetic import ArithmeticTask, verify
    from posttrain.tasks.base import JudgeConfig

    torch.set_num_threads(args.threads)
    work, path = Path(args.work) / args.mode, TEMPLATES[args.mode]
    work.mkdir(parents=True, exist_ok=True)
    task, t0, load = ArithmeticTask(), time.time(), os.getloadavg()
    rows_file = work / "judge_rows.jsonl"
    if not (args.reuse and checkpoint.latest(work / "judge")):
        rows = judge_rows(
            policy_samples(args.policy, task.items(args.train_problems, "train", 7), args.samples, 7),
            path.read_text(),
            args.mode,
            args.samples,
        )
        rows_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
        posttrain.sft(
            init=args.policy,
            task={"name": "dataset", "train": str(rows_file), "test_frac": 0.05},
            steps=args.sft_steps,
            batch_size=32,
            eval_every=100,
            eval_problems=100,
            out=str(work / "judge"),
            overwrite=True,
            threads=args.threads,
            tensorboard=False,
        )
    n_rows = sum(1 for _ in rows_file.open())
    t_train = time.time() - t0
    heldout = policy_samples(args.policy, task.items(args.heldout_problems, "test", 11), args.samples, 11)
    jt = JudgeTask(
        task,
        JudgeConfig(model=str(work / "judge"), template=str(path), mode=args.mode, scale=1.0, max_tokens=64, pairs=1),
    )
    jt.check(CharTokenizer())
    jt.start(work, False, args.samples)
    stats = (pointwise_stats if args.mode == "pointwise" else pairwise_stats)(jt, heldout, verify)
    result = {
        "judge": "gpt_mini (nano) SFT(CoT) checkpoint fine-tuned on verifier-labelled policy samples of train "
        "problems; it redoes the sum, then gives its verdict",
        "template": str(path.relative_to(ROOT)),
        "train_rows": n_rows,
        "sft_steps": args.sft_steps,
        "heldout_problems": args.heldout_problems,
        "responses_per_problem": args.samples,
        **stats,
        "machine": {
            "threads": args.threads,
            "loadavg_start": load,
            "loadavg_end": os.getloadavg(),
            "seconds_data_and_sft": round(t_train, 1),
            "seconds_total": round(time.time() - t0, 1),
        },
        "command": "python benchmarks/judge_agreement.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    if args.rl_steps:
        result["rl_with_judge"] = rl_with_judge(args, work, path)
    out = Path(args.out)
    merged = json.loads(out.read_text()) if out.exists() else {}
    merged[args.mode] = result
    out.write_text(json.dumps(merged, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
