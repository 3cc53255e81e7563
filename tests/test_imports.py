"""The import graph (tools/imports.py): no circles, arrows point down, and the tool sees every arrow a
reader sees (module level, inside functions, the script entry), so a test of it fails on each kind."""

import importlib.util
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "imports.py"
spec = importlib.util.spec_from_file_location("imports_tool", TOOL)
imports = sys.modules["imports_tool"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
spec.loader.exec_module(imports)


def test_the_package_has_no_circle_no_unmarked_upward_import_and_every_room_ranked():
    res = imports.check()
    assert res["circles"] == [], res["circles"]
    assert res["unranked"] == [] and res["upward"] == [], res["unranked"] + res["upward"]
    assert len(res["upward_marked"]) <= imports.MAX_UPWARD, res["upward_marked"]


def test_every_function_level_import_of_posttrain_is_optional_an_entry_or_says_why():
    res = imports.check()
    assert res["inner"] == [], res["inner"]
    assert imports.main(["--strict"]) == 0


def _package(tmp_path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "posttrain"
    for rel, text in {"__init__.py": "", **files}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return pkg


def test_the_tool_finds_upward_imports_at_every_level_and_skips_types(tmp_path):
    pkg = _package(
        tmp_path,
        {
            "models/__init__.py": "",
            "framework/__init__.py": "",
            "framework/sync.py": "X = 1\n",
            "models/lora.py": "from typing import TYPE_CHECKING\n"
            "from posttrain.framework.sync import X\n"  # upward, at module level: line 2
            "if TYPE_CHECKING:\n    from posttrain.framework import sync\n"  # types: no arrow
            "def f():\n    from posttrain.framework import sync\n    return sync\n"  # upward, in a function: 6
            "if __name__ == '__main__':\n    from posttrain.framework import sync\n",  # upward, the script: 9
        },
    )
    res = imports.check(pkg)
    arrow = "posttrain.models.lora → posttrain.framework.sync (models rank 1 imports framework rank 4)"
    assert res["upward"] == [f"posttrain/models/lora.py:{n}: {arrow}" for n in (2, 6, 9)]
    assert res["counts"]["function_level_own"] == 1 and res["inner"] == [
        "posttrain/models/lora.py:6: posttrain.models.lora → posttrain.framework.sync"
    ]


def test_an_upward_import_that_says_why_is_counted_apart_and_capped(tmp_path, monkeypatch):
    pkg = _package(
        tmp_path,
        {
            "models/__init__.py": "",
            "framework/__init__.py": "",
            "framework/sync.py": "X = 1\n",
            "models/lora.py": "def f():\n    from posttrain.framework import sync  # upward: a reason\n    return sync\n",
        },
    )
    res = imports.check(pkg)
    assert res["upward"] == [] and res["inner"] == []
    assert res["upward_marked"] == [
        "posttrain/models/lora.py:2: posttrain.models.lora → posttrain.framework.sync "
        "(models rank 1 imports framework rank 4)"
    ]
    assert imports.main(["--check"], pkg) == 0
    monkeypatch.setattr(imports, "MAX_UPWARD", 0)
    assert imports.main(["--check"], pkg) == 1


def test_the_tool_finds_a_circle_through_a_function_level_import(tmp_path):
    pkg = _package(
        tmp_path,
        {
            "models/__init__.py": "",
            "models/a.py": "from posttrain.models import b\n",
            "models/b.py": "def f():\n    from posttrain.models import c  # entry: lazy\n    return c\n",
            "models/c.py": "import posttrain.models.a\n",
            "models/d.py": "from posttrain.models import a\n",  # imports the circle, is not in it
        },
    )
    res = imports.check(pkg)
    assert res["counts"]["circles"] == 1
    assert res["circles"] == [
        "3 modules: posttrain/models/a.py:1 → posttrain.models.b; posttrain/models/b.py:2 → posttrain.models.c; "
        "posttrain/models/c.py:1 → posttrain.models.a"
    ]
    assert imports.circles(imports.scan(pkg)) == [["posttrain.models.a", "posttrain.models.b", "posttrain.models.c"]]


def test_a_reason_on_the_import_line_justifies_a_function_level_import(tmp_path):
    pkg = _package(
        tmp_path,
        {
            "models/__init__.py": "",
            "models/a.py": "",
            "models/b.py": "def f():\n    from posttrain.models import a  # entry: no torch until called\n    return a\n"
            "def g():\n    from posttrain.models import (  # entry: no torch until called\n        a,\n    )\n    return a\n"
            "def h():\n    from posttrain.models import a  # cycle: no longer a reason\n    return a\n",
        },
    )
    res = imports.check(pkg)
    assert res["inner_reasoned"] == [
        "posttrain/models/b.py:2: posttrain.models.b → posttrain.models.a",
        "posttrain/models/b.py:5: posttrain.models.b → posttrain.models.a",
    ]
    assert res["inner"] == ["posttrain/models/b.py:10: posttrain.models.b → posttrain.models.a"]
    assert res["counts"]["function_level_unjustified"] == 1 and res["counts"]["function_level_with_reason"] == 2
