"""HTML of the lesson site: the page chrome (top bar, search, the sidebar table of contents), one
page per lesson, the gpt_mini track's index, the glossary, and the source view of posttrain's files.
The RL track's index (the role diagram, the lineage) is in home.py.

Every page uses relative links, so the same HTML works served (`posttrain lessons`) and from
disk (`--export`). `static=True` pages load their widgets' precomputed data from `data/*.js`
instead of calling `/api/`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from posttrain.errors import UsageError
from posttrain.lessons import content, glossary, markdown, registry, sources
from posttrain.lessons.directives import Env, esc, highlight, widget_html
from posttrain.lessons.sources import ROOT, code_ref, source_name  # noqa: F401  (pages.code_ref etc. for callers)

KATEX = ["static/katex/katex.min.js", "static/katex/auto-render.min.js"]


def page(
    title: str,
    body: str,
    prefix: str,
    static: bool,
    scripts: list[str] = (),
    current: str = "",
    sections: list[tuple[str, str]] = (),
) -> str:
    """A whole page: `current` is the id of the page the sidebar marks (a lesson id, 'index',
    'gpt-index', 'glossary'); `sections` its h2s, listed under it in the sidebar."""
    head_js = [
        f'<script>window.PT = {{data: {{}}, static: {json.dumps(static)}, api: "{prefix}api/", '
        f'root: "{prefix}"}};</script>'
    ]
    head_js += [f'<script src="{prefix}{s}" defer></script>' for s in KATEX]
    head_js += [f'<script src="{prefix}{s}"></script>' for s in scripts]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)} · posttrain lessons</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{prefix}static/katex/katex.min.css">
<link rel="stylesheet" href="{prefix}static/style.css">
{chr(10).join(head_js)}
</head><body>
<header class="top"><a class="home" href="{prefix}index.html">posttrain lessons</a>
<a href="{prefix}gpt_mini.html">gpt_mini track</a> <a href="{prefix}glossary.html">glossary</a>
<div class="search"><input type="search" id="search" placeholder="search the lessons" aria-label="search the lessons"
autocomplete="off"><ol id="search-results" hidden></ol></div></header>
<div class="layout">{sidebar(prefix, current, sections)}
<main>{body}</main></div>
<script src="{prefix}static/app.js"></script>
</body></html>
"""


def sidebar(prefix: str, current: str, sections: list[tuple[str, str]]) -> str:
    """The table of contents on every page: parts, lessons, and the current page's sections."""
    subs = "".join(f'<li><a href="#{a}">{esc(t)}</a></li>' for a, t in sections)
    subs = f'<ol class="sections">{subs}</ol>' if subs else ""

    def item(ls) -> str:
        here = ls.id == current
        return (
            f'<li data-lesson="{ls.id}"{" class=current aria-current=page" if here else ""}>'
            f'<a href="{prefix}lessons/{ls.id}.html"><span class="num">{esc(ls.number)}</span> {esc(ls.title)}</a>'
            + (subs if here else "")
            + "</li>"
        )

    groups = []
    for part in content.PARTS + [content.G]:
        lessons = [ls for ls in content.LESSONS if ls.part == part]
        head = (
            f'<a href="{prefix}gpt_mini.html"{" aria-current=page" if current == "gpt-index" else ""}>{esc(part)}</a>'
            if part == content.G
            else esc(part)
        )
        mine = subs if part == content.G and current == "gpt-index" else ""
        groups.append(f'<h4>{head}</h4>{mine}<ol class="toc">{"".join(item(ls) for ls in lessons)}</ol>')
    home = subs if current == "index" else ""
    return (
        f'<nav class="sidebar" aria-label="table of contents"><details class="toc-box"><summary>Contents</summary>'
        f'<a class="course-home" href="{prefix}index.html">Course home</a>{home}{"".join(groups)}'
        f'<h4><a href="{prefix}glossary.html">Glossary</a></h4></details></nav>'
    )


# ---- a lesson -------------------------------------------------------------------------------------


@dataclass
class View:
    """A rendered text page: its body HTML, the widgets on it (in order), its h2 sections."""

    html: str
    widgets: list[str]
    sections: list[tuple[str, str]]


def text_view(page_id: str, widgets: list[str], prefix: str, fallback: str = "", strict: bool = True) -> View:
    """The page's text/<id>.md rendered, then the page's widgets the text did not place (under
    "Try it"). Without a .md file the fallback HTML stands in, so the site works mid-way."""
    text = markdown.lesson_text(page_id)
    env = Env(prefix=prefix)
    body = markdown.render(text, env, strict=strict)[0] if text is not None else fallback
    rest = [w for w in widgets if w not in env.widgets]
    if rest:
        env.sections.append(("try-it", "Try it"))
        body += '<h2 id="try-it">Try it</h2>' + "".join(widget_html(w) for w in rest)
    return View(body, env.widgets + rest, env.sections)


def lesson_view(lesson, prefix: str = "../", strict: bool = True) -> View:
    fallback = (
        f'<h2 id="the-idea">The idea</h2><p>{lesson.idea}</p>'
        f'<h2 id="why-it-exists">Why it exists</h2><p>{lesson.why}</p>'
    )
    view = text_view(lesson.id, lesson.widgets, prefix, fallback, strict)
    if markdown.lesson_text(lesson.id) is None:
        view.sections[:0] = [("the-idea", "The idea"), ("why-it-exists", "Why it exists")]
    return view


def code_link(spec: str, prefix: str) -> str:
    rel, a, b = code_ref(spec)
    module, _, qual = spec.partition(":")
    label = f"{module.rsplit('.', 1)[-1]}.{qual}" if qual else rel
    return (
        f'<a class="code" href="{prefix}source/{source_name(rel)}#L{a}-L{b}">'
        f'<code>{esc(label)}</code></a> <span class="where">{esc(rel)}:{a}–{b}</span>'
    )


def lesson_nav(lesson) -> str:
    """Previous / next inside the lesson's track; the track's ends lead to its index."""
    track = content.track(lesson)
    i = track.index(lesson)
    home = f"../{content.TRACKS[lesson.track][1]}"
    prev_ = (
        f'<a rel="prev" href="{track[i - 1].id}.html">← {esc(track[i - 1].number)} {esc(track[i - 1].title)}</a>'
        if i
        else f'<a rel="prev" href="{home}">← the track\'s index</a>'
    )
    next_ = (
        f'<a rel="next" href="{track[i + 1].id}.html">{esc(track[i + 1].number)} {esc(track[i + 1].title)} →</a>'
        if i + 1 < len(track)
        else f'<a rel="next" href="{home}">the track\'s index →</a>'
    )
    return f'<nav class="lesson-nav">{prev_}{next_}</nav>'


def render_lesson(lesson, static: bool = False, strict: bool = True) -> str:
    track = content.track(lesson)
    view = lesson_view(lesson, strict=strict)
    code = "".join(f"<li>{code_link(spec, '../')}</li>" for spec in lesson.code)
    view.sections.append(("code-links", "Code links"))
    scripts = ["static/plotly.min.js"] + ([f"data/{n}.js" for n in view.widgets] if static else [])
    body = f"""{lesson_nav(lesson)}
<p class="crumbs">{esc(lesson.part)} · <span class="position">lesson {track.index(lesson) + 1} of {len(track)}</span></p>
<h1>{esc(lesson.number)} · {esc(lesson.title)}</h1>
<label class="done"><input type="checkbox" class="lesson-done" data-lesson="{lesson.id}"> I have worked through this lesson</label>
<article class="lesson-text">{view.html}</article>
<h2 id="code-links">Code links</h2><ul class="code-refs">{code}</ul>
{lesson_nav(lesson)}"""
    return page(f"{lesson.number} {lesson.title}", body, "../", static, scripts, lesson.id, view.sections)


# ---- the gpt_mini track's index and the glossary ----------------------------------------------------


def gpt_view(strict: bool = True) -> View:
    lessons = [ls for ls in content.LESSONS if ls.track == "gpt"]
    items = "".join(
        f'<li data-lesson="{ls.id}"><a href="lessons/{ls.id}.html">{esc(ls.number)} · {esc(ls.title)}</a>'
        f'<span class="done-mark"></span><p>{ls.idea.split(". ")[0].rstrip(".")}.</p></li>'
        for ls in lessons
    )
    view = text_view("gpt-index", [], "", strict=strict)
    view.html += f'<h2 id="the-lessons">The lessons</h2><ol class="toc track-list">{items}</ol>'
    view.sections.append(("the-lessons", "The lessons"))
    return view


def render_gpt_index(static: bool = False, strict: bool = True) -> str:
    view = gpt_view(strict)
    scripts = (["static/plotly.min.js"] if view.widgets else []) + (
        [f"data/{n}.js" for n in view.widgets] if static else []
    )
    body = f"""<p class="crumbs">{esc(content.G)}</p><h1>{esc(content.TRACKS["gpt"][0])}</h1>
<p class="lede">The whole pipeline (pretraining, SFT, chain of thought, DPO and RL with a verifier) on posttrain's
built-in tiny model, small enough to train on a laptop CPU while you read.</p>
<article class="lesson-text">{view.html}</article>"""
    return page("gpt_mini", body, "", static, scripts, "gpt-index", view.sections)


def render_glossary(static: bool = False) -> str:
    body = "<h1>Glossary</h1>" + glossary.html("")
    return page("glossary", body, "", static, current="glossary")


# ---- source view ----------------------------------------------------------------------------------


def source_files() -> list[str]:
    """Every file a lesson, its text or a widget links to."""
    refs = {spec for ls in content.LESSONS for spec in ls.code}
    refs |= {spec for w in registry.load_all().values() for spec in w.uses}
    for page_id in [ls.id for ls in content.LESSONS] + ["gpt-index"]:
        refs |= sources.text_specs(markdown.lesson_text(page_id) or "")
    return sorted({code_ref(s)[0] for s in refs})


def render_source(relpath: str, static: bool = False) -> str:
    if relpath not in source_files():
        raise UsageError(f"no source view for {relpath!r}")
    text = (ROOT / relpath).read_text()
    lines = highlight(text)[: len(text.splitlines())]
    rows = "".join(
        f'<tr id="L{i}"><td class="ln"><a href="#L{i}">{i}</a></td><td><pre>{t or " "}</pre></td></tr>'
        for i, t in enumerate(lines, 1)
    )
    body = f'<h1 class="src-title"><code>{esc(relpath)}</code></h1><table class="source">{rows}</table>'
    return page(relpath, body, sources.depth_prefix(relpath), static, current="source")
