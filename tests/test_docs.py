"""docs/ stays true to the code: every file it names exists, and every `docs/architecture.md §N`
that a source docstring cites is a section of that page."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["docs/architecture.md", "docs/extending.md", "CONTRIBUTING.md"]
PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.(?:py|md|yaml)|(?:examples|benchmarks|configs|tools)/[\w/-]*)")
NOT_FILES = {"config.yaml", "FILE.py"}   # a run directory's file; the placeholder of `task.name=FILE.py:Class`


FILES = [p.relative_to(ROOT).as_posix() for d in ("posttrain", "tests", "examples", "docs", "tools", "configs",
                                                 "benchmarks") for p in (ROOT / d).rglob("*")] + \
    [p.name for p in ROOT.iterdir()]


def _exists(name: str) -> bool:
    """A path from the repository's root, or the end of one (`weight_sync/local.py`, `core.py`
    next to the room the sentence is about)."""
    name = name.rstrip("/")
    return any(f == name or f.endswith("/" + name) for f in FILES)


def test_every_file_the_docs_name_exists():
    missing = []
    for doc in DOCS:
        text = (ROOT / doc).read_text().split("| the course's companion code")[0]   # the course's files: not ours
        for m in PATH.finditer(text):
            name = m.group(1)
            if name in NOT_FILES:
                continue
            if not _exists(name):
                missing.append(f"{doc}: {name}")
    assert missing == []


def test_section_citations_in_the_source_exist():
    sections = {m.group(1) for m in re.finditer(r"^## (\d+)\. ", (ROOT / "docs/architecture.md").read_text(), re.M)}
    cited = set()
    for path in (ROOT / "posttrain").rglob("*.py"):
        for m in re.finditer(r"docs/architecture\.md §(\d+)", path.read_text()):
            cited.add((str(path.relative_to(ROOT)), m.group(1)))
    assert len(cited) >= 15
    assert [c for c in cited if c[1] not in sections] == []
