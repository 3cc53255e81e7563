"""docs/ stays true to the code: every file it names exists, every `docs/architecture.md §N` or
`docs/algorithms.md §N` that a source docstring cites is a section of that page, and every default
docs/algorithms.md states is the one its config class holds."""

import dataclasses
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["docs/architecture.md", "docs/extending.md", "CONTRIBUTING.md"]
PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.(?:py|md|yaml)|(?:examples|benchmarks|configs|tools)/[\w/-]*)")
NOT_FILES = {"config.yaml", "FILE.py"}  # a run directory's file; the placeholder of `task.name=FILE.py:Class`


FILES = [
    p.relative_to(ROOT).as_posix()
    for d in ("posttrain", "tests", "examples", "docs", "tools", "configs", "benchmarks")
    for p in (ROOT / d).rglob("*")
] + [p.name for p in ROOT.iterdir()]


def _exists(name: str) -> bool:
    """A path from the repository's root, or the end of one (`weight_sync/local.py`, `core.py`
    next to the room the sentence is about)."""
    name = name.rstrip("/")
    return any(f == name or f.endswith("/" + name) for f in FILES)


def test_every_file_the_docs_name_exists():
    missing = []
    for doc in DOCS:
        text = (ROOT / doc).read_text().split("| the course's companion code")[0]  # the course's files: not ours
        for m in PATH.finditer(text):
            name = m.group(1)
            if name in NOT_FILES:
                continue
            if not _exists(name):
                missing.append(f"{doc}: {name}")
    assert missing == []


def _sections(doc: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^## (\d+)\. ", (ROOT / doc).read_text(), re.M)}


def test_section_citations_in_the_source_exist():
    pages = {name: _sections(f"docs/{name}.md") for name in ("architecture", "algorithms")}
    cited = set()
    for path in (ROOT / "posttrain").rglob("*.py"):
        for m in re.finditer(r"docs/(architecture|algorithms)\.md §(\d+)", path.read_text()):
            cited.add((str(path.relative_to(ROOT)), m.group(1), m.group(2)))
    assert len([c for c in cited if c[1] == "architecture"]) >= 15
    assert len([c for c in cited if c[1] == "algorithms"]) >= 20  # every algorithm file cites its section
    assert [c for c in cited if c[2] not in pages[c[1]]] == []


def test_no_source_cites_a_design_file_outside_the_repository():
    outside = re.compile(r"ALGORITHMS\.md|DESIGN\.md|STYLE\.md")
    cites = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in (ROOT / "posttrain").rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if outside.search(line)
    ]
    assert cites == []


def test_the_algorithms_page_names_only_files_that_exist():
    """docs/algorithms.md also names TRL's and verl's files; those of this repository must exist."""
    ours = re.compile(r"(?<![\w./-])((?:posttrain|tests|benchmarks|configs|examples)/[\w/.-]*\w)")
    names = ours.findall((ROOT / "docs/algorithms.md").read_text())
    assert len(names) >= 30
    assert [n for n in names if not (ROOT / n).exists()] == []


def _same(text: str, value) -> bool:
    if value is None or isinstance(value, bool):
        return text == str(value)
    if isinstance(value, (int, float)):
        return float(text) == value
    return text == value


def test_the_defaults_on_the_algorithms_page_are_the_code_s():
    """Each `**Defaults** (`module.Class`): `key=value`, ...` line holds the values of a fresh Class()."""
    lines = re.findall(r"^\*\*Defaults\*\* \(`([\w.]+)`\): (.+)$", (ROOT / "docs/algorithms.md").read_text(), re.M)
    assert len(lines) >= 16  # the 12 RL algorithms, the correction, DPO, RM, distillation
    wrong = []
    for path, pairs in lines:
        module, cls = path.rsplit(".", 1)
        cfg = getattr(importlib.import_module(module), cls)()
        fields = {f.name for f in dataclasses.fields(cfg)}
        for key, text in re.findall(r"`(\w+)=([^`]*)`", pairs):
            if key not in fields or not _same(text, getattr(cfg, key)):
                wrong.append(f"{path}.{key}: page {text}, code {getattr(cfg, key, '(no such key)')}")
    assert wrong == []


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#{1,6} (.+)$", path.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_the_readme_and_the_user_pages_link_to_what_exists():
    """The README sends a newcomer on to docs/running.md and docs/results.md: every relative link
    (file and #heading) and every benchmark script or JSON they name must be there."""
    broken = []
    for doc in ("README.md", "docs/running.md", "docs/results.md"):
        text = (ROOT / doc).read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"\w+://", target):
                continue
            file, _, anchor = target.partition("#")
            path = (ROOT / doc).parent / file if file else ROOT / doc
            if not path.exists() or (anchor and anchor not in _anchors(path)):
                broken.append(f"{doc}: {target}")
        for name in re.findall(r"benchmarks/[\w/.-]+\.(?:py|json)", text):
            if not (ROOT / name).exists():
                broken.append(f"{doc}: {name}")
    assert broken == []
