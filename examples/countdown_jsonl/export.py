"""The built-in countdown task written out as JSONL: the generic path's control experiment.

    python examples/countdown_jsonl/export.py --out data/countdown      # train.jsonl + test.jsonl

Rows: `prompt` ("16 from 3,5,2"), `answer` (the target), `numbers`, `completion` (the CoT
demonstration). Trained with examples/countdown_jsonl/rewards.py (TinyZero's score: correct +
0.1·format), a run on these rows must learn like `configs/grpo_countdown.yaml` on the built-in task.
"""

import argparse
import json
from pathlib import Path

from posttrain.tasks.countdown import CountdownConfig, CountdownTask


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="data/countdown")
    p.add_argument("--train", type=int, default=20000)
    p.add_argument("--test", type=int, default=500)
    p.add_argument("--min-numbers", type=int, default=2)
    p.add_argument("--max-numbers", type=int, default=3)
    args = p.parse_args(argv)
    task = CountdownTask(CountdownConfig(min_numbers=args.min_numbers, max_numbers=args.max_numbers))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", args.train), ("test", args.test)):
        rows = [{"prompt": it.question, "answer": it.goal, "numbers": list(it.numbers), "completion": it.target(True)}
                for it in task.items(n, split, 0)]
        (out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {args.train} train and {args.test} test rows to {out}/")


if __name__ == "__main__":
    main()
