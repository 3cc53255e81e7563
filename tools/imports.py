"""The import graph of posttrain, checked against the layering of docs/architecture.md.

    python tools/imports.py              the counts, and every upward import
    python tools/imports.py --verbose    also every import inside a function, with or without a reason
    python tools/imports.py --check      exit 1 on an upward import or an unranked room (CI, pre-commit)
    python tools/imports.py --strict     exit 1 also on a function-level import without a reason

Two rules, both about what a reader can trust when they open a file:

1. **Arrows point down.** Every top-level room of the package has a rank (RANKS below); a module
   imports, at module level, only rooms of the same or a lower rank. `models/` never imports
   `framework/`, `framework/` never imports `recipes/`. An upward import is a room that knows
   about the rooms built on top of it.
2. **The import graph is at the top of the file.** An `import` inside a function hides an edge of
   the graph; it is allowed only where the edge leads to an optional dependency (the imported
   posttrain module needs, directly or through its own imports, a package outside the core
   dependencies: plotly for the lessons, fastapi for serve, ray, transformers) or sits in an entry
   point that must start fast (`posttrain/__init__.py`, `cli.py`: a usage error prints before
   torch loads).

   Three other reasons are written on the import line itself, as a comment the check reads:
   `# cycle: posttrain.x` (posttrain.x imports this module back at module level, directly or
   through its own imports, so the edge at module level would be a circular import),
   `# upward: posttrain.x` (at module level the edge would point up the layering of rule 1) and
   `# entry: why` (the importing module is itself an entry point that stays torch-free until a
   function is called: `import posttrain.api`, `posttrain serve -h`, `posttrain memory`, the CLI's
   config help). Such an import counts as justified; any other function-level import does not,
   and `--strict` fails on it.

Imports under `if TYPE_CHECKING:` are types only and never run; those under
`if __name__ == "__main__":` run only when a file is executed as a script (every algorithm is
runnable alone), so neither counts as a module-level edge.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "posttrain"

# Rank of each top-level room (a package or a module directly under posttrain/): a module may
# import rooms of its own rank or lower at module level. Lower = closer to torch.
RANKS = {
    "posttrain": 0,
    "chat": 0,
    "progress": 0,
    "runtime": 0,
    "validate": 0,
    "logging": 0,
    "postmortem": 0,
    "algorithms": 1,
    "models": 1,
    "tasks": 1,
    "precision": 1,
    "config": 2,
    "config_load": 2,
    "config_help": 2,
    "checkpoint": 2,
    "sizing": 3,
    "framework": 4,
    "eval": 5,
    "preference": 5,
    "distributed": 5,
    "serve": 5,
    "data": 5,
    "envs": 6,
    "recipes": 7,
    "report": 7,
    "report_plots": 7,
    "report_samples": 7,
    "bench": 8,
    "lessons": 8,
    "api": 8,
    "cli": 9,
}
ENTRY_POINTS = {"posttrain", "posttrain.cli"}  # lazy on purpose: `posttrain --help` without torch
REASON = re.compile(r"#\s*(cycle|upward|entry):\s*\S")  # a reason on a function-level import's line
CORE = {"torch", "numpy", "yaml", "safetensors", "rich", "posttrain"}  # pyproject's dependencies


@dataclass
class Module:
    name: str
    path: Path
    top: list[tuple[str, int]] = field(default_factory=list)  # (imported module, line) at module level
    inner: list[tuple[str, int]] = field(default_factory=list)  # inside a function
    reasoned: set[int] = field(default_factory=set)  # lines of function-level imports that carry a reason
    third_party: set[str] = field(default_factory=set)  # non-core packages imported at module level


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "posttrain"


def _guard(node: ast.If) -> str | None:
    """'types' for `if TYPE_CHECKING:`, 'script' for `if __name__ == "__main__":`."""
    test = node.test
    if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
        return "types"
    if isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING":
        return "types"
    if (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    ):
        return "script"
    return None


def targets(node: ast.Import | ast.ImportFrom, names: set[str], here: str, root: Path = ROOT) -> list[str]:
    """The modules an import statement loads: `from posttrain.x import y` loads posttrain.x.y
    when y is a module, else posttrain.x."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:  # relative: from . import x
        pkg = here.split(".")[: len(here.split(".")) - node.level + (here in names and _is_pkg(here, root))]
        base = ".".join(pkg + ([base] if base else []))
    out = []
    for a in node.names:
        full = f"{base}.{a.name}"
        out.append(full if full in names else base)
    return out


def _is_pkg(name: str, root: Path = ROOT) -> bool:
    return (root.parent / name.replace(".", "/") / "__init__.py").exists()


def _visit(mod: Module, node: ast.AST, in_function: bool, names: set[str], root: Path, lines: list[str]) -> None:
    """Record the imports under `node` into `mod`: module level or inside a function."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and not in_function and _guard(child):
            continue  # types only, or the script's entry
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            for t in dict.fromkeys(targets(child, names, mod.name, root)):  # once per statement
                top = t.split(".")[0]
                if top == "posttrain":
                    (mod.inner if in_function else mod.top).append((t, child.lineno))
                    end = child.end_lineno or child.lineno
                    if in_function and any(REASON.search(x) for x in lines[child.lineno - 1 : end]):
                        mod.reasoned.add(child.lineno)
                elif not in_function and top not in CORE and top not in sys.stdlib_module_names:
                    mod.third_party.add(top)
        inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        _visit(mod, child, inner, names, root, lines)


def scan(root: Path = ROOT) -> dict[str, Module]:
    paths = sorted(root.rglob("*.py"))
    names = {module_name(p, root) for p in paths}
    mods = {}
    for path in paths:
        mod = Module(module_name(path, root), path)
        text = path.read_text()
        _visit(mod, ast.parse(text), False, names, root, text.splitlines())
        mods[mod.name] = mod
    return mods


def optional_modules(mods: dict[str, Module]) -> set[str]:
    """posttrain modules that need a non-core package on import, directly or through their imports."""
    optional = {n for n, m in mods.items() if m.third_party}
    changed = True
    while changed:
        changed = False
        for n, m in mods.items():
            if n not in optional and any(t in optional for t, _ in m.top):
                optional.add(n)
                changed = True
    return optional


def check(root: Path = ROOT) -> dict:
    """{'upward': [...], 'unranked': [...], 'inner': [...], 'inner_allowed': [...], 'inner_reasoned': [...],
    counts}."""
    mods = scan(root)
    optional = optional_modules(mods)
    out: dict = {"upward": [], "unranked": [], "inner": [], "inner_allowed": [], "inner_reasoned": []}
    for n, m in mods.items():
        if room(n) not in RANKS:
            out["unranked"].append(
                f"{m.path.relative_to(root.parent)}: room {room(n)!r} has no rank in tools/imports.py"
            )
            continue
        for t, line in m.top:
            if t in mods and RANKS.get(room(t), 99) > RANKS[room(n)]:
                out["upward"].append(
                    f"{m.path.relative_to(root.parent)}:{line}: {n} → {t} "
                    f"({room(n)} rank {RANKS[room(n)]} imports {room(t)} rank {RANKS.get(room(t), '?')})"
                )
        for t, line in m.inner:
            where = f"{m.path.relative_to(root.parent)}:{line}: {n} → {t}"
            if t in optional or n in ENTRY_POINTS:
                out["inner_allowed"].append(where)
            else:
                out["inner_reasoned" if line in m.reasoned else "inner"].append(where)
    out["counts"] = {
        "modules": len(mods),
        "module_level_upward": len(out["upward"]),
        "function_level_own": len(out["inner"]) + len(out["inner_allowed"]) + len(out["inner_reasoned"]),
        "function_level_unjustified": len(out["inner"]),
        "function_level_optional_or_entry": len(out["inner_allowed"]),
        "function_level_with_reason": len(out["inner_reasoned"]),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    res = check()
    verbose = ("inner", "inner_allowed", "inner_reasoned")
    shown = ("unranked", "upward", *verbose) if "--verbose" in argv else ("unranked", "upward")
    label = {"inner_allowed": "allowed", "inner_reasoned": "reason"}
    for kind in shown:
        for line in res[kind]:
            print(f"{label.get(kind, kind)}: {line}")
    print(" ".join(f"{k}={v}" for k, v in res["counts"].items()))
    bad = res["unranked"] or res["upward"] or ("--strict" in argv and res["inner"])
    return 1 if ("--check" in argv or "--strict" in argv) and bad else 0


if __name__ == "__main__":
    sys.exit(main())
