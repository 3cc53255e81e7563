"""The import graph (tools/imports.py): arrows point down, and the tool sees an arrow that does not."""

import importlib.util
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "imports.py"
spec = importlib.util.spec_from_file_location("imports_tool", TOOL)
imports = sys.modules["imports_tool"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
spec.loader.exec_module(imports)


def test_no_module_level_upward_import_and_every_room_ranked():
    res = imports.check()
    assert res["unranked"] == [] and res["upward"] == [], res["unranked"] + res["upward"]


def test_every_function_level_import_of_posttrain_is_optional_an_entry_or_says_why():
    res = imports.check()
    assert res["inner"] == [], res["inner"]
    assert imports.main(["--strict"]) == 0


def test_the_tool_finds_an_upward_import_and_skips_types_and_functions(tmp_path):
    pkg = tmp_path / "posttrain"
    for room in ("models", "framework"):
        (pkg / room).mkdir(parents=True)
        (pkg / room / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "framework" / "sync.py").write_text("X = 1\n")
    (pkg / "models" / "lora.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from posttrain.framework.sync import X\n"  # upward, at module level: line 2
        "if TYPE_CHECKING:\n    from posttrain.framework import sync\n"
        "def f():\n    from posttrain.framework import sync\n    return sync\n"
    )
    res = imports.check(pkg)
    assert res["upward"] == [
        "posttrain/models/lora.py:2: posttrain.models.lora → posttrain.framework.sync "
        "(models rank 1 imports framework rank 4)"
    ]
    assert res["counts"]["function_level_own"] == 1 and res["inner"] == [
        "posttrain/models/lora.py:6: posttrain.models.lora → posttrain.framework.sync"
    ]


def test_a_reason_on_the_import_line_justifies_a_function_level_import(tmp_path):
    pkg = tmp_path / "posttrain"
    (pkg / "models").mkdir(parents=True)
    for f in ("__init__.py", "models/__init__.py", "models/a.py"):
        (pkg / f).write_text("")
    (pkg / "models" / "b.py").write_text(
        "def f():\n    from posttrain.models import a  # cycle: posttrain.models.a\n    return a\n"
        "def g():\n    from posttrain.models import (  # entry: no torch until called\n        a,\n    )\n    return a\n"
        "def h():\n    from posttrain.models import a  # a comment that names no reason\n    return a\n"
    )
    res = imports.check(pkg)
    assert res["inner_reasoned"] == [
        "posttrain/models/b.py:2: posttrain.models.b → posttrain.models.a",
        "posttrain/models/b.py:5: posttrain.models.b → posttrain.models.a",
    ]
    assert res["inner"] == ["posttrain/models/b.py:10: posttrain.models.b → posttrain.models.a"]
    assert res["counts"]["function_level_unjustified"] == 1 and res["counts"]["function_level_with_reason"] == 2
