"""Rows of a dataset on the Hugging Face Hub, named by its id (`task.name=dataset`).

    task.train=openai/gsm8k task.subset=main                 # split train; task.test=… reads task.test_split (test)
    task.train=openai/gsm8k:main:train                       # the same in one value: ID[:SUBSET[:SPLIT]]
    task.train=openai/gsm8k@<commit>:main                    # a pinned revision (a branch, tag or commit)

Read by `datasets` (the `data` extra) as `load_dataset(id, subset, split=…, revision=…)` reads it:
`load_dataset_builder` resolves the id (the hub's commit, or offline the copy `datasets` cached
under HF_HOME/datasets the last time it was read online), `download_and_prepare` fetches and
converts what is missing, `as_dataset` gives the split. HF_HOME, HF_TOKEN, HF_HUB_OFFLINE and
HF_DATASETS_OFFLINE act as they do for `load_dataset`. The builder's hash is the hub commit the
rows came from: it is kept in `RECORDS` and written to RUN_DIR/sources.json (recipes/common.py).

A name is a hub dataset when it is not a local path, has a hub id's form (org/name) and no file
suffix of tasks/rows.py's formats. A subset, a split or an id that does not resolve is one
UsageError naming the key, what was tried and the subsets or splits there are, before any model
is loaded (the task's rows load before the model in every stage).
"""

from __future__ import annotations

from pathlib import Path

from posttrain.errors import UsageError
from posttrain.models import hub

FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
RECORDS: dict[tuple[str, str], dict] = {}  # (config key, value) -> what sources.json records


def parse_spec(spec: str) -> tuple[str, str | None, str, str] | None:
    """(repo_id, revision, subset, split) of `ID[@REV][:SUBSET[:SPLIT]]`, "" where not given; None
    when `spec` is a local path or not a hub id."""
    if not spec or Path(spec).exists() or Path(spec.split(":", 1)[0]).suffix in FILE_SUFFIXES:
        return None
    name, subset, split = (spec.split(":") + ["", ""])[:3] if spec.count(":") <= 2 else (spec, "", "")
    ref = hub.parse_id(name)
    return None if ref is None else (ref[0], ref[1], subset, split)


def is_hub_dataset(spec: str) -> bool:
    return parse_spec(spec) is not None


def read_hub(spec: str, key: str, subset: str = "", split: str = "train", limit: int = 0) -> list[tuple[str, dict]]:
    """Every row of the split (the first `limit` when > 0) as (where, dict), `where` naming the id,
    subset, split and row for later errors. `subset` and `split` are the config's, which a subset or
    split written in `spec` overrides."""
    parsed = parse_spec(spec)
    if parsed is None:
        raise UsageError(f"{key}={spec!r} is not a Hugging Face dataset id (org/name[:subset[:split]])")
    repo, revision, own_subset, own_split = parsed
    subset, split = own_subset or subset, own_split or split
    tried = f"{repo}@{revision or 'main'}" + (f" subset {subset!r}" if subset else "")
    try:
        import datasets
    except ImportError:
        raise UsageError(
            f"{key}={spec!r}: no local file of that name, and reading {repo} from the Hugging Face Hub needs "
            "`datasets`: pip install 'posttrain[data]'"
        ) from None
    datasets.disable_progress_bars()  # one line per stage, not a bar per split
    try:
        builder = datasets.load_dataset_builder(repo, subset or None, revision=revision)
    except ValueError as e:  # a subset missing or not given: datasets names the ones there are
        raise UsageError(
            f"{key}={spec!r}: {repo} has no subset {subset!r}: {_first_line(e)}; set task.subset"
        ) from None
    except Exception as e:  # not found, gated, offline without a cached copy, unreachable
        raise hub.hub_failure(key, spec, tried, e, "dataset") from None
    _check_revision(key, spec, revision, builder.hash)
    known = builder.info.splits
    if known and split not in known:
        raise _no_split(key, spec, tried, split, list(known))
    try:
        builder.download_and_prepare()
        ds = builder.as_dataset(split=split)
    except ValueError as e:  # "Unknown split": splits were not known before the data was read
        if "split" in str(e).lower():
            raise _no_split(key, spec, tried, split, list(builder.info.splits or {})) from None
        raise
    if limit:
        ds = ds.select(range(min(limit, len(ds))))
    where = f"{repo}[{subset + '/' if subset else ''}{split}]"
    RECORDS[(key, spec)] = {
        "hub_id": repo,
        "subset": subset or builder.config.name,
        "split": split,
        "revision": builder.hash,
        "requested_revision": revision or "main",
        "rows": len(ds),
    }
    return [(f"{where} row {i}", dict(r)) for i, r in enumerate(ds)]


def _check_revision(key: str, spec: str, asked: str | None, got: str | None) -> None:
    """Offline, `datasets` reads its latest cached copy whatever revision is asked: a pinned commit
    that is not that copy is refused rather than read silently."""
    if asked and got and len(asked) == 40 and asked != got:
        raise UsageError(
            f"{key}={spec!r}: the copy `datasets` holds is revision {got}, not {asked} ({hub.offline_setting()}); "
            "read the pinned revision online once, or drop @revision"
        )


def _no_split(key: str, spec: str, tried: str, split: str, splits: list[str]) -> UsageError:
    fix = "task.split" if key == "task.train" else "task.test_split"
    return UsageError(
        f"{key}={spec!r}: {tried} has splits {', '.join(splits) or '(none)'}, not {split!r}; set {fix} "
        "(or write ID:SUBSET:SPLIT)"
    )


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
