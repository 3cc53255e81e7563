"""How often a judge model agrees with the built-in task's verifier (tasks/judge.py).

    python benchmarks/judge_agreement.py --policy runs/cache/sft_cot/sft [--out benchmarks/results/judge_agreement.json]

The judge is a gpt_mini checkpoint trained for it (nothing bigger runs on 2 CPU cores):
  1. the policy (the default SFT(CoT) checkpoint) samples responses to TRAIN problems at temperature 1;
  2. each becomes a judge row: the frozen template (examples/judge/arith_judge.txt) filled with the
     question and the response; the target is the judge's own worked sum, then "score: 1" when the
     verifier accepts the response and "score: 0" otherwise (reference-free: the judge must redo the sum);
  3. SFT of the policy checkpoint on those rows (posttrain.sft, task.name=dataset) is the judge.
Agreement is then measured on HELD-OUT problems the judge never saw: fresh policy samples, each
scored by the verifier and by the judge through `JudgeTask` (the same code as `task.judge.model=`
in RL: pointwise, greedy, the reply parsed by parse_score). Reported: agreement, the confusion
counts, precision/recall of "correct", judge errors, and the base rate (always saying the majority).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))                  # this checkout's posttrain, not an installed one
TEMPLATE = ROOT / "examples/judge/arith_judge.txt"


def policy_samples(policy: str, items, n: int, seed: int):
    """`n` responses per item from the policy at temperature 1: [(item, response text)]."""
    from posttrain import checkpoint
    from posttrain.framework.rollout import Engine, SamplingParams
    model, tok, _ = checkpoint.load_model(policy)
    model.eval()
    engine = Engine(model, tok)
    prompts = [tok.encode(tok.chat_prompt(it.question)) for it in items]
    with torch.no_grad():
        out = engine.generate(prompts, n, SamplingParams(temperature=1.0, max_new_tokens=64), seed=seed)
    return [(items[s.group], tok.decode(s.response_ids)) for s in out]


def judge_rows(pairs, template: str):
    from posttrain.tasks.arithmetic import verify
    from posttrain.tasks.judge import render
    rows = []
    for item, text in pairs:
        response = text.split("#", 1)[0]
        label = int(verify(response, item.answer))
        rows.append({"prompt": render(template, question=item.question, response=response),
                     "completion": f"{item.target(True)} score: {label}", "answer": label})
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", required=True, help="the SFT(CoT) checkpoint whose responses are judged")
    p.add_argument("--work", default="runs/judge_agreement")
    p.add_argument("--train-problems", type=int, default=1500)
    p.add_argument("--heldout-problems", type=int, default=300)
    p.add_argument("--samples", type=int, default=2, help="policy responses per problem")
    p.add_argument("--sft-steps", type=int, default=300)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/judge_agreement.json"))
    args = p.parse_args(argv)
    import posttrain
    from posttrain.tasks.arithmetic import ArithmeticTask, verify
    from posttrain.tasks.base import JudgeConfig
    from posttrain.tasks.judge import JudgeTask
    torch.set_num_threads(args.threads)
    work, template = Path(args.work), TEMPLATE.read_text()
    work.mkdir(parents=True, exist_ok=True)
    task, t0, load = ArithmeticTask(), time.time(), os.getloadavg()
    rows = judge_rows(policy_samples(args.policy, task.items(args.train_problems, "train", 7), args.samples, 7),
                      template)
    (work / "judge_rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    judge = posttrain.sft(init=args.policy, task={"name": "dataset", "train": str(work / "judge_rows.jsonl"),
                                                  "test_frac": 0.05},
                          steps=args.sft_steps, batch_size=32, eval_every=100, eval_problems=100, out=str(work / "judge"),
                          overwrite=True, threads=args.threads, tensorboard=False)
    t_train = time.time() - t0
    heldout = policy_samples(args.policy, task.items(args.heldout_problems, "test", 11), args.samples, 11)
    jt = JudgeTask(task, JudgeConfig(model=str(judge.path), template=str(TEMPLATE), scale=1.0, max_tokens=64))
    from posttrain.models.tokenizer import CharTokenizer
    jt.check(CharTokenizer())
    jt.start(work, False, args.samples)
    res = jt.reward_batch([it for it, _ in heldout], [t for _, t in heldout], step=0)
    truth = [verify(t.split("#", 1)[0], it.answer) >= 1 for it, t in heldout]
    said = [r.reward >= 0.5 for r in res]
    ok = [r.error is None for r in res]
    tp = sum(t and s and o for t, s, o in zip(truth, said, ok))
    tn = sum((not t) and (not s) and o for t, s, o in zip(truth, said, ok))
    fp = sum((not t) and s and o for t, s, o in zip(truth, said, ok))
    fn = sum(t and (not s) and o for t, s, o in zip(truth, said, ok))
    errors, n = sum(not o for o in ok), len(res)
    out = {"judge": {"what": "gpt_mini (nano) SFT(CoT) checkpoint fine-tuned on verifier-labelled policy samples "
                             "of train problems: the judge redoes the sum, then writes score: 1 or 0",
                     "checkpoint": str(judge.path), "template": str(TEMPLATE.relative_to(ROOT)),
                     "train_rows": len(rows), "train_positive_frac": sum(r["answer"] for r in rows) / len(rows),
                     "sft_steps": args.sft_steps},
           "heldout": {"problems": args.heldout_problems, "responses": n,
                       "verifier_correct_frac": sum(truth) / n,
                       "agreement": (tp + tn) / n,                 # judge errors count as disagreement
                       "agreement_scored": (tp + tn) / max(n - errors, 1),
                       "majority_baseline": max(sum(truth), n - sum(truth)) / n,
                       "tp": tp, "tn": tn, "fp": fp, "fn": fn, "judge_errors": errors,
                       "precision_correct": tp / max(tp + fp, 1), "recall_correct": tp / max(tp + fn, 1)},
           "machine": {"threads": args.threads, "loadavg_start": load, "loadavg_end": os.getloadavg(),
                       "seconds_data_and_sft": round(t_train, 1), "seconds_total": round(time.time() - t0, 1)},
           "command": "python benchmarks/judge_agreement.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["heldout"], indent=1))
    return out


if __name__ == "__main__":
    main()
