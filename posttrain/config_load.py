"""Loading a config: a YAML file, a dict and dotted `key=value` overrides into a stage's dataclass.

    cfg = load_config(SFTConfig, "configs/sft_cot.yaml", ["steps=200", "model.preset=micro"])

The stages' dataclasses are in config.py, which re-exports these functions; this file knows
none of them. Every key and type is checked on the way in: an unknown key fails with the
closest valid name, a wrong type names the key and the type it expects (both `UsageError`, one
line and exit 2 from the CLI). A stage class may carry `renamed = (moved, foreign)`, two dicts
of old flat names (accepted with a note) and other libraries' names (refused with ours).
`save_config` writes the resolved config that a run directory keeps as `config.yaml`.
"""

from __future__ import annotations

import dataclasses
import difflib
import keyword
import sys
import types
import typing
from pathlib import Path

import yaml

from posttrain import algorithms
from posttrain.algorithms.base import AlgoConfig
from posttrain.errors import UsageError
from posttrain.tasks import config_class
from posttrain.tasks.base import TaskConfig
from posttrain.validate import validate

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def _resolve_path(path: str | None) -> Path | None:
    if path is None:
        return None
    p = Path(path)
    if p.exists():
        return p
    for cand in (CONFIG_DIR / path, CONFIG_DIR / f"{path}.yaml"):
        if cand.exists():
            return cand
    names = sorted(x.stem for x in CONFIG_DIR.glob("*.yaml")) if CONFIG_DIR.exists() else []
    raise UsageError(f"config file {path!r} not found; give a YAML path or a preset name ({', '.join(names)})")


def load_config(cls, path: str | None = None, overrides: typing.Sequence[str] = (), data: dict | None = None):
    """Build `cls` from an optional YAML file, then `data` (a nested dict: the Python API's keyword
    arguments), then `key=value` overrides (dotted for nesting)."""
    merged: dict = {}
    p = _resolve_path(path)
    if p is not None:
        try:
            merged = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise UsageError(f"config file {p} is not valid YAML: {str(e).splitlines()[0]}") from None
        except UnicodeDecodeError as e:
            line = p.read_bytes()[: e.start].count(b"\n") + 1
            raise UsageError(
                f"config file {p}:{line}: byte 0x{e.object[e.start]:02x} is not UTF-8; save the file as UTF-8"
            ) from None
        if not isinstance(merged, dict):
            raise UsageError(f"config file {p} must hold a mapping of keys to values")
    data = _deep_merge(merged, data or {})
    for item in overrides:
        if "=" not in item:
            raise UsageError(f"override {item!r} must look like key=value (e.g. steps=100)")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UsageError(f"override {key!r}: {part!r} is not a section")
        node[parts[-1]] = value
    return validate(build(cls, data))  # values: posttrain/validate.py


def _deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def build(cls, data: dict, prefix: str = "", base=None):
    """Turn a nested dict into the dataclass `cls` (on top of `base`, default `cls()`),
    validating every key and type. Nested sections keep the stage's own defaults."""
    obj = base if base is not None else cls()
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    data = _renamed(cls, data, prefix, hints)
    kwargs = {}
    for key, value in data.items():
        if keyword.iskeyword(key):  # `async: true` in YAML is the field async_
            key += "_"
        if key not in hints:
            raise UsageError(
                f"unknown config key '{prefix}{key}' for {cls.__name__}{_suggest(obj, key, names, prefix)}"
            )
        if dataclasses.is_dataclass(hints[key]) and isinstance(value, dict):
            sub, current = _section(hints[key], value, getattr(obj, key))
            kwargs[key] = build(sub, value, f"{prefix}{key}.", current)
        else:
            kwargs[key] = _coerce(hints[key], value, f"{prefix}{key}")
    return dataclasses.replace(obj, **kwargs)


_NOTED: set[str] = set()


def _renamed(cls, data: dict, prefix: str, hints) -> dict:
    """Old flat names moved into their sections (a one-line note, once); TRL's names refused with
    posttrain's name for the same thing."""
    moved, foreign = getattr(cls, "renamed", ({}, {}))
    out = dict(data)
    for key in [k for k in data if k not in hints and (k + "_" not in hints or not keyword.iskeyword(k))]:
        if key in moved:
            *path, leaf = moved[key].split(".")
            node = out
            for part in path:
                node[part] = node = dict(node.get(part) or {})
            if leaf in node and node[leaf] != data[key]:
                raise UsageError(
                    f"config keys '{prefix}{key}' and '{prefix}{moved[key]}' are the same key with two "
                    f"values; keep '{prefix}{moved[key]}'"
                )
            node[leaf] = out.pop(key)
            if key not in _NOTED:
                _NOTED.add(key)
                print(
                    f"note: config key '{prefix}{key}' is now '{prefix}{moved[key]}' (the old name works until "
                    "posttrain 0.3)",
                    file=sys.stderr,
                )
        elif key in foreign:
            raise UsageError(
                f"unknown config key '{prefix}{key}' for {cls.__name__}: that is TRL's name; "
                f"posttrain's is '{prefix}{foreign[key]}'"
            )
    return out


def _section(tp, value: dict, current):
    """The dataclass of a nested section and its base. A `task:` section is the config of the task
    its `name` picks (tasks/__init__.py), an `algo:` section the Config of the algorithm its `name`
    picks (algorithms/__init__.py); switching the name starts from that one's defaults."""
    if isinstance(tp, type) and issubclass(tp, AlgoConfig):
        cls = algorithms.get(value.get("name", current.name)).Config
        return cls, current if type(current) is cls else None
    if not (isinstance(tp, type) and issubclass(tp, TaskConfig)):
        return tp, current

    name = value.get("name", current.name)
    cls = config_class(name)
    if tp is not TaskConfig and cls is not tp:  # a stage typed to one task (dpo, rm, pipeline)
        raise UsageError(f"task.name={name!r}: this stage runs on task.name={tp().name} only")
    return cls, current if type(current) is cls else None


def _dotted_keys(obj, prefix=""):
    """Every leaf key of a config instance, dotted (sections at their current class: the task and
    algorithm picked by name)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _dotted_keys(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


def _suggest(obj, key, names, prefix) -> str:
    leafs = {k.rsplit(".", 1)[-1]: k for k in _dotted_keys(obj)}
    if key in leafs and "." in leafs[key]:  # an exact key of a section: `lr` is `optim.lr`
        return f"; did you mean '{prefix}{leafs[key]}'?"
    close = difflib.get_close_matches(key, names, n=1)
    if close:
        return f"; did you mean '{prefix}{close[0]}'?"
    # a key given at the wrong level: `lrr=...` for `optim.lr`
    close = difflib.get_close_matches(key, list(leafs), n=1)
    if close:
        return f"; did you mean '{prefix}{leafs[close[0]]}'?"
    return f"; valid keys: {', '.join(names)}"


def _coerce(tp, value, key):
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise UsageError(f"config key {key!r} is a section; give it as {key}.<field>=value")
        return build(tp, value, f"{key}.")
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        for a in args[:-1]:  # the first type that takes the value (`bool | str`: true, false or auto)
            try:
                return _coerce(a, value, key)
            except UsageError:
                pass
        return _coerce(args[-1], value, key)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            items = ",".join(str(value).replace(",", " ").split())  # '1.0,0.1' or '1.0 0.1' → 1.0,0.1
            raise UsageError(f"config key {key!r} expects a list, got {value!r}; write it in brackets: {key}=[{items}]")
        args = typing.get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise UsageError(f"config key {key!r} expects {len(args)} values, got {len(value)}")
            return tuple(_coerce(a, v, key) for a, v in zip(args, value))
        item = args[0] if args else typing.Any
        return origin(_coerce(item, v, key) for v in value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:
            return float(value)  # YAML 1.1 reads "1e-3" as a string
        except ValueError:
            pass
    if tp is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if tp in (int, float, str, bool) and not (isinstance(value, tp) and not (tp is int and isinstance(value, bool))):
        raise UsageError(f"config key {key!r} expects {tp.__name__}, got {value!r} ({type(value).__name__})")
    return value


def to_dict(cfg) -> dict:
    d = dataclasses.asdict(cfg)
    return _plain(d)


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def save_config(cfg, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
