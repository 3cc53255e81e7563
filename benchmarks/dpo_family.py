"""Every preference loss from the same SFT checkpoint and the same verifier-labelled pairs:
held-out pass@1 / pass@8 / greedy before and after, and the chosen / rejected log-probs
(likelihood displacement). Writes JSON and prints one table.

    python benchmarks/dpo_family.py --init runs/pipeline/sft --out benchmarks/results/dpo_family.json

Each run is `posttrain dpo` with the overrides below; the pairs are sampled once (the first
run) and reused by the rest (`pairs=` the first run's pairs.jsonl), so the losses differ only
in the loss.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from posttrain.config import load_config
from posttrain.recipes import dpo

RUNS = {  # name -> overrides
    "dpo lr 1e-5": ["loss_type=dpo", "optim.lr=1e-5"],
    "dpo lr 3e-6": ["loss_type=dpo", "optim.lr=3e-6"],
    "dpo_nll lr 1e-5": ["loss_type=dpo_nll", "optim.lr=1e-5"],
    "cdpo lr 3e-6": ["loss_type=cdpo", "optim.lr=3e-6"],
    "ipo lr 3e-6": ["loss_type=ipo", "optim.lr=3e-6"],
    "kto lr 3e-6": ["loss_type=kto", "optim.lr=3e-6"],
    "simpo lr 3e-6": ["loss_type=simpo", "beta=2.5", "optim.lr=3e-6"],
    "orpo lr 1e-5": ["loss_type=orpo", "optim.lr=1e-5"],
}


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--init", required=True, help="SFT run directory or checkpoint")
    p.add_argument("--out", default="benchmarks/results/dpo_family.json")
    p.add_argument("--runs", default="runs/dpo_family", help="parent of the run directories")
    p.add_argument("--steps", type=int, default=100)
    args = p.parse_args(argv)
    rows, pairs = [], ""
    for name, overrides in RUNS.items():
        out = Path(args.runs, name.replace(" ", "_"))
        cfg = load_config(
            dpo.DPOConfig,
            None,
            [
                f"init={args.init}",
                f"out={out}",
                "overwrite=true",
                f"steps={args.steps}",
                f"eval_every={args.steps // 2}",
                *([f"pairs={pairs}"] if pairs else []),
                *overrides,
            ],
        )
        t0 = time.time()
        dpo.run(cfg)
        pairs = pairs or str(out / "pairs.jsonl")
        evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        evals = [m for m in evals if "eval/pass@1" in m]
        train = [
            json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "logps/chosen" in line
        ]
        first_train, last_train = train[0], train[-1]
        rows.append(
            {
                "run": name,
                "overrides": overrides,
                "wall_s": round(time.time() - t0, 1),
                "start": {k: evals[0][k] for k in ("eval/greedy_acc", "eval/pass@1", "eval/pass@8")},
                "evals": [{k: m[k] for k in ("step", "eval/greedy_acc", "eval/pass@1", "eval/pass@8")} for m in evals],
                "first_logps_chosen": first_train["logps/chosen"],  # the first batch's: where displacement starts
                "final_logps_chosen": last_train["logps/chosen"],
                "final_logps_rejected": last_train["logps/rejected"],
            }
        )
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))
    print(f"{'run':18} {'pass@1 start':>12} {'mid':>6} {'end':>6} {'pass@8 end':>10} {'logp(w)':>8} {'logp(l)':>8}")
    for r in rows:
        e = r["evals"]
        print(
            f"{r['run']:18} {e[0]['eval/pass@1']:12.3f} {e[1]['eval/pass@1']:6.3f} {e[-1]['eval/pass@1']:6.3f} "
            f"{e[-1]['eval/pass@8']:10.3f} {r['final_logps_chosen']:8.2f} {r['final_logps_rejected']:8.2f}"
        )


if __name__ == "__main__":
    main()
