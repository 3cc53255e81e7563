"""Hugging Face Hub ids where a user names a model: `org/name` or `org/name@revision`.

    resolve_model("Qwen/Qwen2.5-0.5B-Instruct")      # -> Resolved(local_dir=…/snapshots/<hash>, revision=<hash>)
    resolve_model("Qwen/Qwen2.5-0.5B-Instruct@main") # a branch, a tag or a commit hash
    resolve_model("runs/sft")                        # a local path that exists wins: revision None

The one place a model name becomes a directory: `init=`, `reward_model=`, `teacher=`, the judge's
`task.judge.model`, `posttrain eval`, `serve`, `export` and `memory`'s `init=` all reach it through
`checkpoint.resolve` or `models/hf.load_hf`. A hub id is fetched by huggingface_hub's
`snapshot_download` into its cache, as `from_pretrained` fetches it: `HF_HOME` (or
`HF_HUB_CACHE`) says where, `HF_TOKEN` authenticates a gated or private repository, and
`HF_HUB_OFFLINE=1` reads the cache only. What is fetched: the repository's top-level files a
transformers causal LM loads (`MODEL_FILES`: config, generation config, tokenizer files, chat
template, safetensors weights); not sub-folders (Llama's `original/`), not the `consolidated`
weights Mistral ships beside the transformers shards, not `.bin`/`.pth`/`.gguf` copies.

A name resolves locally when the path exists, else on the hub when it has the form org/name
(one slash, the hub's characters; a bare name such as `gpt2` is a local path only). A name that
resolves nowhere is one UsageError naming the key, the local path tried, the hub id and revision
tried, why the hub refused, and HF_HUB_OFFLINE. A resolution is memoised for the process, so the
startup check (recipes/common.record_sources) and the load that follows see one commit, and the
run records it (`RUN_DIR/sources.json`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from posttrain.errors import UsageError

_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9_][\w.-]*)(?:@(?P<rev>[\w.][\w./-]*))?$")
MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]  # top level only
SKIP_FILES = ["*/*", "consolidated*"]


@dataclass(frozen=True)
class Resolved:
    """Where a named model is on this machine, and which commit of the hub it is (None: a local path)."""

    name: str  # as the user wrote it
    local_dir: Path
    repo_id: str | None = None
    revision: str | None = None  # the commit hash of the snapshot
    requested: str | None = None  # the revision asked for (None = main)

    def record(self) -> dict:
        """What RUN_DIR/sources.json keeps: enough to fetch the same files again (`org/name@<hash>`)."""
        return {
            "hub_id": self.repo_id,
            "revision": self.revision,
            "requested_revision": self.requested or "main",
            "pinned": f"{self.repo_id}@{self.revision}",
            "path": str(self.local_dir),
        }


def parse_id(name: str) -> tuple[str, str | None] | None:
    """(repo_id, revision or None) when `name` has a hub id's form org/name[@revision], else None.
    The hub refuses "--" and ".." in ids, so such a name is a path."""
    m = _HUB_ID.match(str(name))
    if m is None or "--" in m["repo"] or ".." in m["repo"]:
        return None
    return m["repo"], m["rev"]


def is_hub_name(name: str) -> bool:
    """Would `name` be looked up on the hub: no local path of that name, and a hub id's form."""
    return bool(name) and not Path(name).exists() and parse_id(name) is not None


def offline_setting() -> str:
    """HF_HUB_OFFLINE as the user set it, for the one-line errors."""
    value = os.environ.get("HF_HUB_OFFLINE")
    return f"HF_HUB_OFFLINE={value}" if value is not None else "HF_HUB_OFFLINE unset"


def hub_failure(key: str, name: str, tried: str, error: Exception, what: str = "model") -> UsageError:
    """One line: the local path and the hub id tried, why the hub refused, HF_HUB_OFFLINE, the fix."""
    kind = type(error).__name__
    text = str(error).strip().splitlines()[0].split(". ")[0][:160] if str(error).strip() else ""
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    local = "a local directory" if what == "model" else "a local file"
    unreachable = any(w in kind + text for w in ("Connect", "Timeout", "Name or service", "Couldn't reach"))
    if "Gated" in kind or "401" in text or "403" in text:
        fix = "set HF_TOKEN to a token with access to it (and accept its licence on the hub)"
    elif offline or "LocalEntryNotFound" in kind and not unreachable:
        where = hub_cache() if what == "model" else "HF_HOME/datasets, where `datasets` keeps what it read"
        fix = f"it is not in the cache ({where}): fetch it once online (unset HF_HUB_OFFLINE) or give {local}"
    elif unreachable:
        fix = f"the hub is unreachable and it is not in the cache: fetch it where the hub is reachable, or give {local}"
    elif "RevisionNotFound" in kind:
        fix = "check the revision after @ (a branch, a tag or a commit hash)"
    else:
        fix = "check the id (org/name[@revision]); a private or gated repository needs HF_TOKEN"
    return UsageError(
        f"{key}={name!r}: no local path {str(Path(name).absolute())!r}, and the Hugging Face Hub "
        f"{what} {tried} failed ({kind}{': ' + text if text else ''}; {offline_setting()}); {fix}"
    )


def hub_cache() -> str:
    """The hub cache directory huggingface_hub uses (HF_HUB_CACHE, else HF_HOME/hub)."""
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except ImportError:
        return os.path.join(os.environ.get("HF_HOME", "~/.cache/huggingface"), "hub")


_MODELS: dict[str, Resolved] = {}


def resolve_model(name: str | Path, key: str = "model") -> Resolved:
    """The local directory of a model named by a path or a hub id (see the module docstring), and
    the hub commit it came from. A local path is returned as given, existing or not: the caller's
    own checks name what is missing there."""
    name = str(name)
    if not is_hub_name(name):
        return Resolved(name, Path(name))
    if name in _MODELS:
        return _MODELS[name]
    repo_id, revision = parse_id(name)  # type: ignore[misc]  (is_hub_name: a hub id's form)
    tried = f"{repo_id}@{revision or 'main'}"
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UsageError(
            f"{key}={name!r}: no local path of that name, and fetching {tried} from the Hugging Face Hub "
            "needs huggingface_hub: pip install 'posttrain[hf]'"
        ) from None
    try:
        local = Path(
            snapshot_download(repo_id, revision=revision, allow_patterns=MODEL_FILES, ignore_patterns=SKIP_FILES)
        )
    except Exception as e:  # the client's HTTP, offline-cache, validation and network errors: one fact for the user
        raise hub_failure(key, name, tried, e) from None
    if not (local / "config.json").exists():
        raise UsageError(
            f"{key}={name!r}: {tried} ({local}) has no config.json at its top level: not a transformers model "
            "repository; give a causal LM's id or a local directory"
        )
    _MODELS[name] = resolved = Resolved(name, local, repo_id, local.name, revision)
    return resolved
