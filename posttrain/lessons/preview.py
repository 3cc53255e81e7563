"""Render lesson pages from their text/<id>.md for proofreading, with every directive error listed.

    python -m posttrain.lessons.preview rl-03            # → /tmp/posttrain-preview/lessons/rl-03.html
    python -m posttrain.lessons.preview gpt-index        # the gpt_mini track's index page
    python -m posttrain.lessons.preview --all            # every page: words, errors (a table)
    python -m posttrain.lessons.preview rl-03 --out DIR --grids

It writes a small static site (the page, the assets, KaTeX) that opens from disk. Widgets show
their default setting; --grids precomputes every knob setting of the page's widgets, as
`posttrain lessons --export` does (slower). Unlike the server, a directive that does not resolve
is drawn in red in place and listed here, so one typo does not hide the rest of the page.
Prints the prose word count (700–1,500 wanted). Exit 1 when a page has directive errors.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

from posttrain.errors import UsageError
from posttrain.lessons import content, markdown, pages, registry, search, server

WANT = (700, 1500)


def check(page_id: str) -> tuple[int | None, list[str]]:
    """(prose words, directive errors) of one page; words None when it has no .md yet."""
    text = markdown.lesson_text(page_id)
    if text is None:
        return None, []
    return markdown.word_count(text), markdown.render(text, strict=False)[1].errors


def write(page_id: str, out: Path, grids: bool) -> Path:
    """The page as a static copy under `out`, with the assets it loads."""
    if page_id == "gpt-index":
        view, path = pages.gpt_view(strict=False), out / "gpt_mini.html"
        html = pages.render_gpt_index(static=True, strict=False)
    else:
        lesson = content.by_id(page_id)
        view, path = pages.lesson_view(lesson, strict=False), out / "lessons" / f"{page_id}.html"
        html = pages.render_lesson(lesson, static=True, strict=False)
    (out / "lessons").mkdir(parents=True, exist_ok=True)
    (out / "data").mkdir(exist_ok=True)
    path.write_text(html)
    (out / "search-index.js").write_text(search.script())
    shutil.copytree(server.STATIC, out / "static", dirs_exist_ok=True)
    shutil.copyfile(server.plotly_js(), out / "static" / "plotly.min.js")
    for name in view.widgets:
        w = registry.get(name)
        settings = list(w.grid()) if grids else [w.defaults()]
        data = {w.key(k): registry.compute(name, {n: registry.fmt(v) for n, v in k.items()}) for k in settings}
        (out / "data" / f"{name}.js").write_text(f"PT.data[{json.dumps(name)}] = {json.dumps(data)};\n")
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m posttrain.lessons.preview", description=__doc__.split("\n\n")[0])
    p.add_argument("page", nargs="?", help="a lesson id (rl-03, rl-18a, gpt-01) or gpt-index")
    p.add_argument("--all", action="store_true", help="check every page: word counts and directive errors")
    p.add_argument("--out", default="/tmp/posttrain-preview", help="directory to write the page into")
    p.add_argument("--grids", action="store_true", help="precompute every knob setting of the page's widgets")
    args = p.parse_args(argv)
    try:
        if args.all:
            return check_all()
        if not args.page:
            p.error("name a page (e.g. rl-03) or pass --all")
        words, errors = check(args.page)
        path = write(args.page, Path(args.out), args.grids)
    except UsageError as e:
        print(f"preview: error: {e}", file=sys.stderr)
        return 2
    if words is None:
        print(f"{args.page}: no {content.text_path(args.page)} yet; the page shows the lesson's old idea/why text")
    else:
        lo, hi = WANT
        verdict = "ok" if lo <= words <= hi else f"outside {lo}–{hi}"
        print(f"{args.page}: {words} words of prose ({verdict})")
    for e in errors:
        print(f"  directive error: {e}")
    print(f"wrote {path}  (open it in a browser; `posttrain lessons` serves every knob live)")
    return 1 if errors else 0


def check_all() -> int:
    bad, counts = 0, []
    for page_id in [ls.id for ls in content.LESSONS] + ["gpt-index"]:
        words, errors = check(page_id)
        bad += bool(errors)
        counts += [words] if words is not None else []
        print(f"{page_id:8} {'—' if words is None else words:>6}  {len(errors)} error(s)")
        for e in errors:
            print(f"  directive error: {e}")
    if counts:
        print(f"{len(counts)} pages with text: {sum(counts)} words, median {statistics.median(counts):g}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
