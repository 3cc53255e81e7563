"""Math word problems with numeric answers, generated here (GSM8K-like templates, no download).

    python examples/math_word/make_data.py --out data/math_word     # train.jsonl (20,000) + test.jsonl (500)
    python examples/math_word/make_data.py --chat --out data/math_chat   # prompts as chat messages (TRL's
                                                                         # conversational rows; trl.rewards wants them)

Each row is what TRL and posttrain read: `prompt` (a string), `answer` (the number), `solution`
(the answer as LaTeX, `$42$`, the column TRL's accuracy_reward reads), `completion` (a worked
solution, for SFT) and `steps` (how many operations the problem needs). Problems take one to
three steps of + − ×; a problem's text decides its split (a stable hash), so no test problem is
ever trained on.
"""

from __future__ import annotations

import argparse
import json
import random
import zlib
from pathlib import Path

NAMES = ["ana", "ben", "cleo", "dev", "eli", "fay", "gus", "ivy", "jon", "kai", "lea", "max", "nia", "omar", "pia"]
ITEMS = ["apples", "books", "coins", "pens", "shells", "stamps", "cards", "eggs", "nuts", "beads"]


def problem(rng: random.Random) -> dict:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    kind = rng.choice(["add", "sub", "mul", "add_sub", "mul_add", "add_add"])
    if kind == "add":
        a, b = rng.randint(2, 60), rng.randint(2, 40)
        text = f"{name} has {a} {item} and gets {b} more. how many {item} does {name} have now?"
        work, answer = [f"{a}+{b}={a + b}"], a + b
    elif kind == "sub":
        a = rng.randint(10, 90)
        b = rng.randint(2, a - 1)
        text = f"{name} had {a} {item} and gave away {b}. how many {item} are left?"
        work, answer = [f"{a}-{b}={a - b}"], a - b
    elif kind == "mul":
        a, b = rng.randint(2, 9), rng.randint(2, 12)
        text = f"{name} buys {a} bags with {b} {item} in each bag. how many {item} is that?"
        work, answer = [f"{a}*{b}={a * b}"], a * b
    elif kind == "add_sub":
        a, b = rng.randint(5, 50), rng.randint(2, 30)
        c = rng.randint(1, a + b - 1)
        text = f"{name} has {a} {item}, finds {b} more, then gives {c} to a friend. how many {item} are left?"
        work, answer = [f"{a}+{b}={a + b}", f"{a + b}-{c}={a + b - c}"], a + b - c
    elif kind == "mul_add":
        a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 30)
        text = f"{name} fills {a} boxes with {b} {item} each and has {c} loose {item}. how many {item} in all?"
        work, answer = [f"{a}*{b}={a * b}", f"{a * b}+{c}={a * b + c}"], a * b + c
    else:
        a, b, c = rng.randint(2, 40), rng.randint(2, 40), rng.randint(2, 40)
        text = f"{name} picks {a} {item} on monday, {b} on tuesday and {c} on wednesday. how many {item} in total?"
        work, answer = [f"{a}+{b}={a + b}", f"{a + b}+{c}={a + b + c}"], a + b + c
    completion = "; ".join(work) + f". the answer is ${answer}$."
    return {"prompt": text, "answer": answer, "solution": f"${answer}$", "completion": completion,
            "steps": len(work)}


def held_out(text: str) -> bool:
    return zlib.crc32(text.encode()) % 10 == 0                       # 10% of all problem texts


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="data/math_word")
    p.add_argument("--train", type=int, default=20000)
    p.add_argument("--test", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chat", action="store_true", help="write each prompt as [{role: user, content: ...}]")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    rows = {"train": [], "test": []}
    seen = set()
    while len(rows["train"]) < args.train or len(rows["test"]) < args.test:
        row = problem(rng)
        if row["prompt"] in seen:
            continue
        seen.add(row["prompt"])
        split = "test" if held_out(row["prompt"]) else "train"
        if len(rows[split]) < getattr(args, split):
            rows[split].append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split, data in rows.items():
        if args.chat:
            data = [{**r, "prompt": [{"role": "user", "content": r["prompt"]}]} for r in data]
        (out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    print(f"wrote {len(rows['train'])} train and {len(rows['test'])} test problems to {out}/")


if __name__ == "__main__":
    main()
