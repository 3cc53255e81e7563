"""Where a lesson points into posttrain's code: `module:qualname` → file and line range, read from
the live source with inspect (so links stay true when the code moves), and the source view's file
names.

A source view mirrors the repository's own path: posttrain/algorithms/__init__.py is shown at
source/posttrain/algorithms/__init__.py.html. No encoding of `/` into the name, so no file name
(dunders included) can collide with another one.
"""

from __future__ import annotations

import importlib
import inspect
import re
from functools import cache
from pathlib import Path

from posttrain.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]  # the directory holding the posttrain package
CODE_DIRECTIVE = re.compile(r"\{\{code:([^{}]+)\}\}")


@cache
def code_ref(spec: str) -> tuple[str, int, int]:
    """'posttrain.algorithms.grpo:advantages' → ('posttrain/algorithms/grpo.py', first, last line).
    An empty qualname means the whole module."""
    module, _, qual = spec.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in qual.split(".") if qual else []:
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise UsageError(f"code reference {spec!r} does not resolve ({type(e).__name__}: {e})") from None
    obj = inspect.unwrap(obj)  # decorated functions (torch.no_grad) → the real one
    try:
        path = Path(inspect.getsourcefile(obj)).resolve()
        if qual:
            lines, first = inspect.getsourcelines(obj)
            last = first + len(lines) - 1
        else:
            first, last = 1, len(path.read_text().splitlines())
    except TypeError:  # a constant, a builtin: nothing to point at
        raise UsageError(
            f"code reference {spec!r} names a {type(obj).__name__}, not a function, class or module"
        ) from None
    return path.relative_to(ROOT).as_posix(), first, last


def excerpt_ref(spec: str) -> tuple[str, int, int]:
    """'MODULE:QUALNAME' or 'MODULE:QUALNAME:A-B' (lines A..B of the object, 1-based) → file, first, last."""
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not parts[1]:
        raise UsageError(f"code excerpt {spec!r}: write MODULE:QUALNAME or MODULE:QUALNAME:A-B")
    rel, first, last = code_ref(":".join(parts[:2]))
    if len(parts) == 3:
        m = re.fullmatch(r"(\d+)-(\d+)", parts[2])
        n = last - first + 1
        if not m or not 1 <= int(m[1]) <= int(m[2]) <= n:
            raise UsageError(
                f"code excerpt {spec!r}: the range must be A-B with 1 <= A <= B <= {n} (the object's length in lines)"
            )
        first, last = first + int(m[1]) - 1, first + int(m[2]) - 1
    return rel, first, last


def source_name(relpath: str) -> str:
    """The source view of a repository file, relative to source/."""
    return relpath + ".html"


def depth_prefix(relpath: str) -> str:
    """The relative prefix from source/<relpath>.html back to the site's root."""
    return "../" * (1 + relpath.count("/"))


def text_specs(text: str) -> set[str]:
    """The objects a lesson text excerpts ({{code:...}}), as module:qualname."""
    return {":".join(m.split(":")[:2]) for m in CODE_DIRECTIVE.findall(text)}
