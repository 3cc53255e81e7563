"""A lesson page as a reader sees it, in plain Markdown, for an outside read of the course.

    python -m posttrain.lessons.render rl-05 > /tmp/rl-05.md     # one page
    python -m posttrain.lessons.render --all --out /tmp/pages      # every page, one file each
    python -m posttrain.lessons.render --list                      # the page ids

Every directive of the page's text/<id>.md is resolved the way the site resolves it: `{{fact:…}}`
and `{{kpi:…}}` become the text the page prints, `{{table:…}}` a Markdown table, `{{code:…}}` the
excerpt of the live source with its file and lines, and `{{widget:…}}` the widget at its default
knobs: its title, what it shows, its knobs and their values, the KPIs and the note the page
prints, and its "what breaks training" setting. The page's widgets the text does not place follow
under "Try it", as on the site. A directive that does not resolve is printed in place as
`[unresolved: …]`, listed on stderr, and makes the command exit 1. The page's own history (git,
earlier reviews) is not part of the output: a blind reader gets only what the site shows.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

from posttrain.errors import UsageError
from posttrain.lessons import content, directives, facts, markdown, registry, sources

FENCE = re.compile(r"^(```|~~~)")


def cell(v) -> str:
    return directives.js_str(v).replace("|", "\\|").replace("\n", " ")


def table_md(name: str) -> str:
    v = facts.value(name)
    if not facts.is_table(v):
        raise UsageError(f"{{{{table:{name}}}}}: fact {name} is not a table")
    head = "| " + " | ".join(cell(c) for c in v["columns"]) + " |"
    rule = "|" + "---|" * len(v["columns"])
    rows = ["| " + " | ".join(cell(c) for c in row) + " |" for row in v["rows"]]
    return "\n".join([head, rule, *rows])


def code_md(spec: str) -> str:
    rel, a, b = sources.excerpt_ref(spec)
    module, qual = spec.split(":")[:2]
    lines = (sources.ROOT / rel).read_text().splitlines()[a - 1 : b]
    body = textwrap.dedent("\n".join(lines))
    return f"`{module.rsplit('.', 1)[-1]}.{qual}` ({rel}:{a}–{b}):\n\n```python\n{body}\n```"


def values_md(values) -> str:
    """A knob's values, separated so that values with commas in them ("12, 11, 14") stay apart."""
    shown = [registry.fmt(v) for v in values]
    return (" | " if any("," in v for v in shown) else ", ").join(shown)


def widget_md(name: str) -> str:
    w = registry.get(name)
    out = registry.compute(name)
    knobs = "; ".join(f"{k.label} = **{registry.fmt(k.default)}** (values: {values_md(k.values)})" for k in w.knobs)
    kpis = "\n".join(f"- {label}: {directives.js_str(value)}" for label, value in out["kpis"])
    brk = ", ".join(f"{k} = {registry.fmt(v)}" for k, v in w.breaks["knobs"].items())
    parts = [
        f"> **Widget: {w.title}** (an interactive plot on the site; shown here at its default knobs)",
        f"> {w.explain}" if w.explain else "",
        f"> Knobs: {knobs}.",
        "> KPIs the page prints at the defaults:\n" + "\n".join(f"> {line}" for line in kpis.splitlines()),
        f"> Note under the plot: {out.get('note', '')}",
        f"> What breaks training: set {brk}. {w.breaks['what']}",
    ]
    return "\n>\n".join(p for p in parts if p)


def inline(name: str, arg: str) -> str:
    if name == "fact":
        return directives.fact_text(arg)
    if name == "kpi":
        return directives.kpi_text(arg)
    raise UsageError(f"{{{{{name}:{arg}}}}} must stand alone on its own line")


def block(name: str, arg: str) -> str:
    if name == "table":
        return table_md(arg)
    if name == "code":
        return code_md(arg)
    if name == "widget":
        return widget_md(arg)
    return inline(name, arg)


def resolve(text: str, errors: list[str]) -> tuple[str, list[str]]:
    """The text with every directive outside code fences resolved; the widgets it placed."""

    def attempt(fn, name, arg):
        try:
            return fn(name, arg)
        except (UsageError, KeyError, ValueError) as e:
            errors.append(f"{{{{{name}:{arg}}}}}: {e}")
            return f"[unresolved: {{{{{name}:{arg}}}}}]"

    out, placed, fence = [], [], None
    for line in text.splitlines():
        m = FENCE.match(line.strip())
        if fence:
            fence = None if m and line.strip().startswith(fence) else fence
            out.append(line)
            continue
        if m:
            fence = m[1]
            out.append(line)
            continue
        whole = markdown.LINE_DIRECTIVE.fullmatch(line.strip())
        if whole and whole[1] in directives.BLOCK:
            placed += [whole[2]] if whole[1] == "widget" else []
            out.append(attempt(block, whole[1], whole[2]))
            continue
        out.append(markdown.DIRECTIVE.sub(lambda d: attempt(inline, d[1], d[2]), line))
    return "\n".join(out), placed


def page_md(page_id: str) -> tuple[str, list[str]]:
    """(the page as Markdown, its unresolved directives)."""
    text = markdown.lesson_text(page_id)
    if text is None:
        raise UsageError(f"{page_id}: no {content.text_path(page_id)}; pick one of `--list`")
    errors: list[str] = []
    body, placed = resolve(text, errors)
    if page_id == "gpt-index":
        title, widgets = content.TRACKS["gpt"][0], []
    else:
        lesson = content.by_id(page_id)
        title, widgets = f"{lesson.number} · {lesson.title}", lesson.widgets
    rest = [w for w in widgets if w not in placed]
    if rest:
        body += "\n\n## Try it\n\n" + "\n\n".join(widget_md(w) for w in rest)
    return f"# {title}\n\n{body}\n", errors


def page_ids() -> list[str]:
    return [ls.id for ls in content.LESSONS if content.text_path(ls.id).exists()] + ["gpt-index"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m posttrain.lessons.render", description=__doc__.split("\n\n")[0])
    p.add_argument("page", nargs="?", help="a page id (rl-05, rl-18a, gpt-01, gpt-index)")
    p.add_argument("--all", action="store_true", help="every page, one PAGE.md each, into --out")
    p.add_argument("--out", default="", help="a directory to write PAGE.md into (default: stdout)")
    p.add_argument("--list", action="store_true", help="print the page ids and exit")
    args = p.parse_args(argv)
    if args.list:
        print("\n".join(page_ids()))
        return 0
    if not args.all and not args.page:
        p.error("name a page (e.g. rl-05), or pass --all or --list")
    if args.all and not args.out:
        p.error("--all writes one file per page: give --out DIR")
    bad = 0
    for page_id in page_ids() if args.all else [args.page]:
        try:
            md, errors = page_md(page_id)
        except UsageError as e:
            print(f"render: error: {e}", file=sys.stderr)
            return 2
        for e in errors:
            print(f"{page_id}: unresolved {e}", file=sys.stderr)
        bad += bool(errors)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / f"{page_id}.md").write_text(md, encoding="utf-8")
        else:
            sys.stdout.write(md)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
