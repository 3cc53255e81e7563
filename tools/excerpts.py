"""The lessons' ranged code excerpts ({{code:MODULE:QUALNAME:A-B}}) stay on the lines they were written for.

A range counts lines from the start of the object, so an edit above the lines (a new docstring line, a
reformat) silently moves the excerpt onto other code. The text each range showed is pinned in
posttrain/lessons/data/excerpts.json; tests/test_lessons_text.py checks every range still shows it.

    python tools/excerpts.py --check     # every ranged excerpt shows its pinned text (exit 1 if not)
    python tools/excerpts.py --remap     # after moving code: find each pinned text again, rewrite the ranges
    python tools/excerpts.py --pin       # after choosing new lines on purpose: pin what the ranges show now

--remap compares the code with whitespace, quote style and trailing commas removed, so a reformat
(`ruff format` splitting or joining lines) re-anchors by itself; an excerpt whose code really changed
is printed for a person to choose its lines again.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from posttrain.lessons import sources  # noqa: E402

TEXT_DIR = ROOT / "posttrain" / "lessons" / "text"
PINNED = ROOT / "posttrain" / "lessons" / "data" / "excerpts.json"
RANGED = re.compile(r"\{\{code:([^{}:]+:[^{}:]+):(\d+)-(\d+)\}\}")


def ranged_specs() -> list[tuple[Path, str, int, int]]:
    """(lesson file, module:qualname, A, B) for every ranged excerpt, in file order."""
    out = []
    for path in sorted(TEXT_DIR.glob("*.md")):
        for m in RANGED.finditer(path.read_text()):
            out.append((path, m[1], int(m[2]), int(m[3])))
    return out


def object_lines(obj_spec: str) -> list[str]:
    rel, first, last = sources.code_ref(obj_spec)
    return (ROOT / rel).read_text().splitlines()[first - 1 : last]


def shown(obj_spec: str, a: int, b: int) -> str:
    return "\n".join(object_lines(obj_spec)[a - 1 : b])


def key(obj_spec: str, a: int, b: int) -> str:
    return f"{obj_spec}:{a}-{b}"


def normal(text: str) -> str:
    """Code with layout removed: whitespace, quote style and the trailing commas a formatter adds."""
    text = re.sub(r"\s+", "", text).replace("'", '"')
    return re.sub(r",(?=[)\]}])", "", text)


def find(lines: list[str], want: str) -> tuple[int, int] | None:
    """The shortest 1-based line range A-B of `lines` whose normal form is `want` (None if no range is)."""
    target = normal(want)
    for a in range(len(lines)):
        for b in range(a, len(lines)):
            acc = normal("\n".join(lines[a : b + 1]))
            if acc == target:
                return a + 1, b + 1
            if not target.startswith(acc.rstrip(",")):  # a comma a later `)` would remove
                break
    return None


def check() -> list[str]:
    pinned = json.loads(PINNED.read_text()) if PINNED.exists() else {}
    problems = []
    for path, obj, a, b in ranged_specs():
        k = key(obj, a, b)
        if k not in pinned:
            problems.append(f"{path.name}: {{{{code:{k}}}}} has no pinned text: run `python tools/excerpts.py --pin`")
        elif b > len(object_lines(obj)) or normal(shown(obj, a, b)) != normal(pinned[k]):
            problems.append(
                f"{path.name}: {{{{code:{k}}}}} no longer shows its pinned lines (the code above it "
                "moved?): run `python tools/excerpts.py --remap`"
            )
    return problems


def pin() -> int:
    specs = ranged_specs()
    PINNED.write_text(
        json.dumps({key(o, a, b): shown(o, a, b) for _, o, a, b in specs}, indent=1, sort_keys=True) + "\n"
    )
    print(f"pinned {len(specs)} ranged excerpts in {PINNED.relative_to(ROOT)}")
    return 0


def remap() -> int:
    pinned = json.loads(PINNED.read_text())
    lost = 0
    for path, obj, a, b in ranged_specs():
        k = key(obj, a, b)
        if k not in pinned or (b <= len(object_lines(obj)) and normal(shown(obj, a, b)) == normal(pinned[k])):
            continue
        hit = find(object_lines(obj), pinned[k])
        if hit is None:
            lost += 1
            print(
                f"{path.name}: {{{{code:{k}}}}}: its pinned lines are gone from {obj}; choose new lines, "
                f"then --pin. They were:\n{pinned[k]}\n"
            )
            continue
        new = key(obj, *hit)
        path.write_text(path.read_text().replace(f"{{{{code:{k}}}}}", f"{{{{code:{new}}}}}"))
        pinned[new] = shown(obj, *hit)
        print(f"{path.name}: {k} -> {hit[0]}-{hit[1]}")
    keep = {key(o, a, b) for _, o, a, b in ranged_specs()}
    PINNED.write_text(json.dumps({k: v for k, v in pinned.items() if k in keep}, indent=1, sort_keys=True) + "\n")
    return 1 if lost else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true")
    mode.add_argument("--pin", action="store_true")
    mode.add_argument("--remap", action="store_true")
    args = ap.parse_args()
    if args.pin:
        return pin()
    if args.remap:
        return remap()
    problems = check()
    print("\n".join(problems) or f"{len(ranged_specs())} ranged excerpts show their pinned lines")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
