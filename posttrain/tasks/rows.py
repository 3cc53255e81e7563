"""Reading a dataset's rows: JSONL, JSON, CSV, Parquet, a `datasets` save_to_disk folder, or a
Hugging Face Hub dataset id (tasks/hub_data.py).

    rows = read_rows("data/train.jsonl")            # [(where, row dict), ...]
    rows = read_rows("openai/gsm8k", subset="main") # a hub id that is not a local path

`where` is "FILE:LINE" (or "FILE row N"), so every later error can name the row. Parquet needs
pyarrow and a saved `datasets` folder needs `datasets` (both in the `data` extra); each is
imported only for its format. An unknown format, a missing file, an unreadable row: one line
naming the file and the fix (UsageError), before any training.
"""

from __future__ import annotations

import csv
import json
import string
from pathlib import Path

from posttrain.errors import UsageError
from posttrain.tasks.hub_data import FILE_SUFFIXES as FORMATS
from posttrain.tasks.hub_data import is_hub_dataset, read_hub


def read_rows(
    path: str, key: str = "task.train", split: str = "train", subset: str = "", limit: int = 0
) -> list[tuple[str, dict]]:
    """Every row of the file, folder or hub dataset at `path` as (where, dict). `key` names the
    config key in errors; `split` picks the split of a saved DatasetDict folder or a hub dataset,
    `subset` a hub dataset's configuration; `limit` > 0 keeps the first rows only."""
    if is_hub_dataset(path):
        rows = read_hub(path, key, subset, split, limit)
        if not rows:
            raise UsageError(f"{key}={path!r} ({split}) holds no rows")
        return rows
    rows = _read_local(path, key, split)
    return rows[:limit] if limit else rows


def _read_local(path: str, key: str, split: str) -> list[tuple[str, dict]]:
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
            f"{', '.join(FORMATS)}, a `datasets` save_to_disk folder or a hub id (org/name)"
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


def rename_columns(rows: list[tuple[str, dict]], columns: dict) -> list[tuple[str, dict]]:
    """`task.columns` applied: each {name: column} adds `name` holding that column's value (the
    column itself stays, for reward functions). A column a row lacks is one UsageError naming the
    row, the key and the columns it has."""
    if not columns:
        return rows
    for where, row in rows:
        for name, col in columns.items():
            if col not in row:
                raise UsageError(
                    f"{where}: task.columns.{name}={col!r}, but the row has no {col!r} column "
                    f"(columns: {', '.join(map(str, row))})"
                )
            row[name] = row[col]
    return rows


def render_template(template: str, row: dict, where: str) -> str:
    """`task.prompt_template` formatted with the row's columns ("{question} Let's think…"); a field
    the row lacks, or a template str.format cannot read, is one UsageError naming the row."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise UsageError(f"task.prompt_template={template!r}: {e}; write literal braces as {{{{ }}}}") from None
    missing = [f for f in fields if f.split(".")[0].split("[")[0] not in row]
    if missing:
        raise UsageError(
            f"{where}: task.prompt_template names {{{missing[0]}}}, not a column of the row "
            f"(columns: {', '.join(map(str, row))})"
        )
    try:
        return template.format_map(row)
    except (KeyError, IndexError, AttributeError, ValueError) as e:
        raise UsageError(
            f"{where}: task.prompt_template={template!r} cannot be filled ({type(e).__name__}: {e})"
        ) from None
