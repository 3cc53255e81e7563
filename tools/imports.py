"""The import graph of posttrain, checked against the layering of docs/architecture.md §2.

    python tools/imports.py              the counts, every circle and every upward import
    python tools/imports.py --verbose    also every import inside a function, with or without a reason
    python tools/imports.py --check      exit 1 on a circle, an unmarked or surplus upward import, an unranked room
    python tools/imports.py --strict     exit 1 also on a function-level import without a reason (CI, pre-commit)

The graph is every import of a posttrain module that a reader sees: at module level, inside functions
and in the script entry of a file (`if __name__ == ...`) alike; an import that runs later is still an
arrow. Only imports under `if TYPE_CHECKING:` are left out: they name types and never run. Three rules,
about what a reader can trust when they open a file:

1. **No circles.** No set of modules imports each other in a loop, whatever the level of the imports,
   so the graph says which layer sits below which.
2. **Arrows point down.** Every top-level room of the package has a rank (RANKS below); a module
   imports only rooms of the same or a lower rank. `models/` never imports `framework/`, `framework/`
   never imports `recipes/`. An upward import is allowed only where its line says why,
   `# upward: why`, and at most MAX_UPWARD in the package: rare, and each one named.
3. **The graph is at the top of the file.** An import of a posttrain module inside a function hides an
   arrow. It is allowed where the arrow leads to an optional dependency (the imported module needs,
   directly or through its own imports, a package outside the core dependencies: plotly for the
   lessons, fastapi for serve, ray, transformers), where it sits in an entry point that must start fast
   (`posttrain/__init__.py`, `cli.py`: a usage error prints before torch loads), or where its line says
   why: `# upward: why` (rule 2) or `# entry: why` (the importing module stays torch-free until a
   function is called: `import posttrain.api`, `posttrain serve -h`, `posttrain memory`, the CLI's
   config help). `--strict` fails on any other.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "posttrain"

# Rank of each top-level room (a package or a module directly under posttrain/): a module may
# import rooms of its own rank or lower. Lower = closer to torch.
RANKS = {
    "posttrain": 0,
    "errors": 0,
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
    "checkpoint_shards": 2,
    "sizing": 3,
    "framework": 4,
    "eval": 5,
    "preference": 5,
    "reward_models": 5,
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
    "demo": 8,
    "cli": 9,
    "__main__": 9,
}
ENTRY_POINTS = {"posttrain", "posttrain.cli"}  # lazy on purpose: `posttrain --help` without torch
REASON = re.compile(r"#\s*(upward|entry):\s*\S")  # a reason on a function-level import's line
UPWARD = re.compile(r"#\s*upward:\s*\S")  # an upward import that says why
MAX_UPWARD = 7  # upward imports stay rare: each is a room that knows a room built on top of it
CORE = {"torch", "numpy", "yaml", "safetensors", "rich", "posttrain"}  # pyproject's dependencies


@dataclass
class Module:
    name: str
    path: Path
    top: list[tuple[str, int]] = field(default_factory=list)  # (imported module, line) at module level
    inner: list[tuple[str, int]] = field(default_factory=list)  # inside a function
    script: list[tuple[str, int]] = field(default_factory=list)  # in the file's script entry
    reasoned: set[int] = field(default_factory=set)  # lines of imports that carry a reason
    marked_upward: set[int] = field(default_factory=set)  # lines of imports that say `# upward: why`
    third_party: set[str] = field(default_factory=set)  # non-core packages imported at module level

    def edges(self) -> list[tuple[str, int]]:
        """Every arrow a reader sees: module level, inside functions, the script entry."""
        return self.top + self.inner + self.script


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


def _visit(mod: Module, node: ast.AST, where: str, names: set[str], root: Path, lines: list[str]) -> None:
    """Record the imports under `node` into `mod` by where they run: "top" (module level), "inner"
    (inside a function) or "script" (the file's script entry)."""
    for child in ast.iter_child_nodes(node):
        guard = _guard(child) if isinstance(child, ast.If) and where == "top" else None
        if guard == "types":
            continue  # names types only: never runs
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            said = lines[child.lineno - 1 : child.end_lineno or child.lineno]
            for t in dict.fromkeys(targets(child, names, mod.name, root)):  # once per statement
                top = t.split(".")[0]
                if top == "posttrain":
                    getattr(mod, where).append((t, child.lineno))
                    if any(REASON.search(x) for x in said):
                        mod.reasoned.add(child.lineno)
                    if any(UPWARD.search(x) for x in said):
                        mod.marked_upward.add(child.lineno)
                elif where == "top" and top not in CORE and top not in sys.stdlib_module_names:
                    mod.third_party.add(top)
        inner = where
        if guard == "script":
            inner = "script"
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner = "inner"
        _visit(mod, child, inner, names, root, lines)


def scan(root: Path = ROOT) -> dict[str, Module]:
    paths = sorted(root.rglob("*.py"))
    names = {module_name(p, root) for p in paths}
    mods = {}
    for path in paths:
        mod = Module(module_name(path, root), path)
        text = path.read_text()
        _visit(mod, ast.parse(text), "top", names, root, text.splitlines())
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


def circles(mods: dict[str, Module]) -> list[list[str]]:
    """Every set of two or more modules that import each other in a loop: the strongly connected
    components of the whole graph (Tarjan's algorithm, with an explicit stack)."""
    graph = {n: sorted({t for t, _ in m.edges() if t in mods and t != n}) for n, m in mods.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on.add(v)
            for k in range(i, len(graph[v])):
                w = graph[v][k]
                if w not in index:
                    work += [(v, k + 1), (w, 0)]
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[v])
    return sorted(found)


def check(root: Path = ROOT) -> dict:
    """{'circles', 'upward' (unmarked), 'upward_marked', 'unranked', 'inner' (unjustified), 'inner_allowed',
    'inner_reasoned': lists of lines; 'counts'}."""
    mods = scan(root)
    optional = optional_modules(mods)
    kinds = ("circles", "upward", "upward_marked", "unranked", "inner", "inner_allowed", "inner_reasoned")
    out: dict = {k: [] for k in kinds}
    for n, m in mods.items():
        rel = m.path.relative_to(root.parent)
        if room(n) not in RANKS:
            out["unranked"].append(f"{rel}: room {room(n)!r} has no rank in tools/imports.py")
            continue
        for t, line in m.edges():
            if t in mods and RANKS.get(room(t), 99) > RANKS[room(n)]:
                out["upward_marked" if line in m.marked_upward else "upward"].append(
                    f"{rel}:{line}: {n} → {t} ({room(n)} rank {RANKS[room(n)]} imports {room(t)} "
                    f"rank {RANKS.get(room(t), '?')})"
                )
        for t, line in m.inner:
            where = f"{rel}:{line}: {n} → {t}"
            if t in optional or n in ENTRY_POINTS:
                out["inner_allowed"].append(where)
            else:
                out["inner_reasoned" if line in m.reasoned else "inner"].append(where)
    for comp in circles(mods):
        inside = set(comp)
        ties = [
            f"{mods[a].path.relative_to(root.parent)}:{line} → {b}"
            for a in comp
            for b, line in mods[a].edges()
            if b in inside and b != a
        ]
        out["circles"].append(f"{len(comp)} modules: " + "; ".join(ties))
    out["counts"] = {
        "modules": len(mods),
        "circles": len(out["circles"]),
        "upward_unmarked": len(out["upward"]),
        "upward_marked": len(out["upward_marked"]),
        "function_level_own": len(out["inner"]) + len(out["inner_allowed"]) + len(out["inner_reasoned"]),
        "function_level_unjustified": len(out["inner"]),
        "function_level_optional_or_entry": len(out["inner_allowed"]),
        "function_level_with_reason": len(out["inner_reasoned"]),
    }
    return out


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    argv = sys.argv[1:] if argv is None else argv
    res = check(root)
    always = ("unranked", "circles", "upward", "upward_marked")
    shown = (*always, "inner", "inner_allowed", "inner_reasoned") if "--verbose" in argv else always
    label = {"inner_allowed": "allowed", "inner_reasoned": "reason", "upward_marked": "upward, says why"}
    for kind in shown:
        for line in res[kind]:
            print(f"{label.get(kind, kind)}: {line}")
    print(" ".join(f"{k}={v}" for k, v in res["counts"].items()))
    surplus = len(res["upward_marked"]) > MAX_UPWARD
    if surplus:
        print(f"{len(res['upward_marked'])} upward imports, at most {MAX_UPWARD}: move the code down instead")
    bad = res["unranked"] or res["circles"] or res["upward"] or surplus or ("--strict" in argv and res["inner"])
    return 1 if ("--check" in argv or "--strict" in argv) and bad else 0


if __name__ == "__main__":
    sys.exit(main())
