"""Reading a dataset's rows from disk: JSONL, JSON, CSV, Parquet, or a `datasets` save_to_disk folder.

    rows = read_rows("data/train.jsonl")            # [(where, row dict), ...]

`where` is "FILE:LINE" (or "FILE row N"), so every later error can name the row. Parquet needs
pyarrow and a saved `datasets` folder needs `datasets` (both in the `data` extra); each is
imported only for its format. An unknown format, a missing file, an unreadable row: one line
naming the file and the fix (UsageError), before any training.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from posttrain.errors import UsageError

FORMATS = (".jsonl", ".json", ".csv", ".parquet")


def read_rows(path: str, key: str = "task.train", split: str = "train") -> list[tuple[str, dict]]:
    """Every row of the file or folder at `path` as (where, dict). `key` names the config key in
    errors; `split` picks the split of a saved DatasetDict folder."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{key}={path!r}: no such file or directory")
    if p.is_dir():
        rows = _saved_dataset(p, key, split)
    elif p.suffix == ".jsonl":
        rows = _jsonl(p)
    elif p.suffix == ".json":
        rows = _json(p)
    elif p.suffix == ".csv":
        with open(p, newline="", encoding="utf-8") as f:
            rows = [(f"{p}:{i + 2}", dict(r)) for i, r in enumerate(csv.DictReader(f))]  # line 1 is the header
    elif p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise UsageError(f"{key}={path!r}: reading Parquet needs pyarrow: pip install 'posttrain[data]'") from None
        rows = [(f"{p} row {i}", r) for i, r in enumerate(pq.read_table(p).to_pylist())]
    else:
        raise UsageError(
            f"{key}={path!r}: unknown format {p.suffix or '(no extension)'!r}; use one of "
            f"{', '.join(FORMATS)} or a `datasets` save_to_disk folder"
        )
    if not rows:
        raise UsageError(f"{key}={path!r} holds no rows")
    return rows


def _jsonl(p: Path) -> list[tuple[str, dict]]:
    rows = []
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UsageError(f"{p}:{n}: not valid JSON ({e.msg}); fix or remove the line") from None
            if not isinstance(row, dict):
                raise UsageError(f"{p}:{n}: a row must be a JSON object, got {type(row).__name__}")
            rows.append((f"{p}:{n}", row))
    return rows


def _json(p: Path) -> list[tuple[str, dict]]:
    text = p.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return _jsonl(p)  # JSON lines under a .json name, as `datasets` writes them
    if isinstance(data, dict) and len(data) == 1 and isinstance(next(iter(data.values())), list):
        data = next(iter(data.values()))  # {"data": [...]} / {"train": [...]}
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise UsageError(f"{p}: a JSON dataset is a list of row objects (or JSON lines)")
    return [(f"{p} row {i}", r) for i, r in enumerate(data)]


def _saved_dataset(p: Path, key: str, split: str) -> list[tuple[str, dict]]:
    if not ((p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists()):
        raise UsageError(
            f"{key}={str(p)!r} is a folder but not a `datasets` save_to_disk folder "
            "(no dataset_info.json or dataset_dict.json); give a file or such a folder"
        )
    try:
        from datasets import load_from_disk
    except ImportError:
        raise UsageError(
            f"{key}={str(p)!r}: reading a saved dataset needs `datasets`: pip install 'posttrain[data]'"
        ) from None
    ds = load_from_disk(str(p))
    if hasattr(ds, "keys"):  # a DatasetDict: the split this key reads
        if split not in ds:
            raise UsageError(
                f"{key}={str(p)!r} has splits {', '.join(ds.keys())}, not {split!r}; "
                f"save the split alone or name its folder"
            )
        ds, where = ds[split], f"{p}[{split}]"
    else:
        where = str(p)
    return [(f"{where} row {i}", dict(r)) for i, r in enumerate(ds)]
