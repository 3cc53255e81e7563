"""`posttrain STAGE --help`: every config key with its value and the one-line doc written beside it.

The docs are the comments on the dataclass fields in the source (config.py, the tasks' and the
algorithms' Config classes), read with `inspect`, so the help cannot drift from the code:

    rollout:  how each RL step samples.
      rollout.samples_per_prompt = 8      responses per prompt: the group size G (TRL: num_generations)

`posttrain rl --help algo` lists every algorithm's own keys, `--help task` every task's.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from functools import cache

from posttrain.errors import UsageError
from posttrain.tasks import TASKS, config_class

_FIELD = re.compile(r"^\s+(\w+)\s*:[^#]*?(?:#\s?(.*))?$")
_CONTINUED = re.compile(r"^\s+#\s?(.*)$")


@cache
def field_docs(cls) -> dict[str, str]:
    """name -> the comment written beside the field (and comment lines right below it), for `cls`
    and its dataclass bases (a subclass's own comment wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            lines = inspect.getsource(klass).splitlines()
        except (OSError, TypeError):
            continue
        names = {f.name for f in dataclasses.fields(klass)}
        last = None
        for line in lines[1:]:
            m = _FIELD.match(line)
            if m and m.group(1) in names and not line.strip().startswith("#"):
                last = m.group(1)
                if m.group(2):
                    docs[last] = m.group(2).strip()
                continue
            c = _CONTINUED.match(line)
            if c and last is not None:
                docs[last] = f"{docs.get(last, '')} {c.group(1).strip()}".strip()
            elif line.strip().startswith("def "):
                break
            else:
                last = None
    return docs


def _value(v) -> str:
    if isinstance(v, str):
        return repr(v) if v == "" else v
    if isinstance(v, tuple):
        return "[" + ", ".join(map(str, v)) + "]"
    return str(v)


def _summary(cls) -> str:
    doc = (cls.__doc__ or "").strip().splitlines()
    first = doc[0] if doc else ""
    return "" if first.startswith(cls.__name__ + "(") else first  # dataclasses' generated signature


def key_lines(obj, prefix: str = "", width: int = 34) -> list[str]:
    """`prefix.key = value   doc` for every leaf of the config instance `obj`, sections as headers."""
    out, docs = [], field_docs(type(obj))
    fields = dataclasses.fields(obj)  # a level's own keys first, then its sections
    for f in sorted(fields, key=lambda f: dataclasses.is_dataclass(getattr(obj, f.name))):
        value = getattr(obj, f.name)
        key = f"{prefix}{f.name.rstrip('_')}"
        if dataclasses.is_dataclass(value):
            head = _summary(type(value)) or docs.get(f.name, "")
            out.append("")
            out.append(f"{key}:  {head}" if head else f"{key}:")
            out += key_lines(value, f"{key}.", width)
        else:
            left = f"  {key} = {_value(value)}"
            out.append(f"{left:<{width}} {docs.get(f.name, '')}".rstrip())
    return out


def stage_help(stage: str, cfg, topic: str = "") -> str:
    """The text of `posttrain STAGE --help [TOPIC]` for the resolved config `cfg`."""
    if topic in ("algo", "algorithm", "algorithms"):
        return algorithms_help()
    if topic in ("task", "tasks"):
        return tasks_help()
    if topic:
        raise UsageError(f"--help {topic!r}: topics are algo (every algorithm's keys) and task (every task's keys)")
    lines = [
        f"posttrain {stage} [CONFIG.yaml] [key=value ...] [--resume RUN_DIR]",
        "",
        "Every key, as key=value on the command line (dotted for sections) or in a YAML file; the value",
        "shown is the one this command would run with.",
    ]
    lines += key_lines(cfg)
    extra = [n for n in ("task", "algo") if hasattr(cfg, n)]
    if extra:
        lines += [
            "",
            "Other tasks and algorithms have their own keys: "
            + ", ".join(f"posttrain {stage} --help {n}" for n in extra)
            + ".",
        ]
    return "\n".join(lines)


def algorithms_help() -> str:
    from posttrain.algorithms import ALGORITHMS  # entry: no torch until called

    lines = ["The algo: section. algo.name picks the algorithm; the other keys are its own (defaults shown):"]
    for name, module in ALGORITHMS.items():
        doc = (module.__doc__ or "").strip().splitlines()[0]
        lines += ["", f"algo.name={name}:  {doc}"]
        lines += [ln for ln in key_lines(module.Config(), "algo.") if "algo.name" not in ln]
    return "\n".join(lines)


def tasks_help() -> str:
    lines = ["The task: section. task.name picks the task; the other keys are its own (defaults shown):"]
    for name in [*TASKS, "verifiers:ENV"]:
        cls = config_class(name)
        lines += ["", f"task.name={name}:  {_summary(cls)}".rstrip()]
        lines += [ln for ln in key_lines(cls(), "task.") if "task.name" not in ln]
    return "\n".join(lines)
