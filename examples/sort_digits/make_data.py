"""Sort a list of digits, as chat rows with a system turn (generated here, no download).

    python examples/sort_digits/make_data.py --out data/sort_digits   # train.jsonl (20,000) + test.jsonl (500)

Each row: `prompt` as chat messages, a system turn saying which order (smallest first or largest
first) and a user turn with 3 to 8 digits (`"8 1 4 1"`); `completion`, the sorted digits for SFT
(`"1 1 4 8"`); `answer`, the same text, which the exact-match reward in rewards.py compares word
for word; `n`, how many digits. A row's messages decide its split (a stable hash), so no held-out
list is ever trained on in either order.
"""

from __future__ import annotations

import argparse
import json
import random
import zlib
from pathlib import Path

ORDERS = {"up": "sort the digits from smallest to largest.", "down": "sort the digits from largest to smallest."}


def problem(rng: random.Random) -> dict:
    order = rng.choice(sorted(ORDERS))
    digits = [rng.randrange(10) for _ in range(rng.randint(3, 8))]
    answer = " ".join(map(str, sorted(digits, reverse=order == "down")))
    prompt = [{"role": "system", "content": ORDERS[order]}, {"role": "user", "content": " ".join(map(str, digits))}]
    return {"prompt": prompt, "completion": answer, "answer": answer, "order": order, "n": len(digits)}


def held_out(row: dict) -> bool:
    return zlib.crc32(json.dumps(row["prompt"]).encode()) % 10 == 0  # 10% of all prompts


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="data/sort_digits")
    p.add_argument("--train", type=int, default=20000)
    p.add_argument("--test", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    rows: dict = {"train": [], "test": []}
    seen = set()
    while len(rows["train"]) < args.train or len(rows["test"]) < args.test:
        row = problem(rng)
        key = json.dumps(row["prompt"])
        if key in seen:
            continue
        seen.add(key)
        split = "test" if held_out(row) else "train"
        if len(rows[split]) < getattr(args, split):
            rows[split].append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split, data in rows.items():
        (out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    print(f"wrote {len(rows['train'])} train and {len(rows['test'])} test rows to {out}/")


if __name__ == "__main__":
    main()
