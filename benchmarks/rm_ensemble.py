"""Held-out pairwise accuracy of reward models alone and as an ensemble (the mean score).

    python benchmarks/rm_ensemble.py --pairs runs/rm_a/eval_pairs.jsonl runs/rm_a runs/rm_b \
        [--out benchmarks/results/rm_ensemble.json]

Every RM scores the same held-out pairs (a `posttrain rm` run's eval_pairs.jsonl, or any
pairs file in TRL's format). The ensemble is what `reward_model=RUN_A,RUN_B` (RLHF) and
`posttrain eval --rm RUN_A,RUN_B` (best@n) use.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from posttrain.preference.data import load_jsonl  # noqa: E402
from posttrain.reward_models.reward_model import EnsembleScorer, RewardModelScorer  # noqa: E402


def accuracy(chosen: list[float], rejected: list[float]) -> float:
    """Share of pairs whose chosen response scores strictly higher (a tie counts as wrong)."""
    return sum(c > r for c, r in zip(chosen, rejected)) / len(chosen)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", required=True, help="held-out pairs (JSONL: prompt, chosen, rejected)")
    p.add_argument("runs", nargs="+", help="`posttrain rm` runs (two or more for an ensemble)")
    p.add_argument("--out", default="benchmarks/results/rm_ensemble.json")
    args = p.parse_args(argv)
    pairs, _ = load_jsonl(args.pairs)
    prompts = [x.prompt for x in pairs]
    members = [RewardModelScorer.from_checkpoint(r) for r in args.runs]
    scores = {}
    for run, m in zip(args.runs, members):
        scores[run] = (m.score(prompts, [x.chosen for x in pairs]), m.score(prompts, [x.rejected for x in pairs]))
    ens = EnsembleScorer(members)
    # the ensemble's score is the members' mean: computed from their scores, and checked once
    mean = [[sum(col) / len(col) for col in zip(*(s[i] for s in scores.values()))] for i in (0, 1)]
    assert abs(ens.score(prompts[:1], [pairs[0].chosen])[0] - mean[0][0]) < 1e-5
    rep = {
        "pairs_file": args.pairs,
        "pairs": len(pairs),
        "members": {run: accuracy(*s) for run, s in scores.items()},
        "ensemble": accuracy(*mean),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rep, indent=2))
    for run, acc in rep["members"].items():
        print(f"{run:40s} {acc:.3f}")
    print(f"{'ensemble (mean score)':40s} {rep['ensemble']:.3f}   ({len(pairs)} held-out pairs)")
    return rep


if __name__ == "__main__":
    main()
