"""HTML of the lesson site: the index, one page per lesson, and a source view of posttrain's files.

Every page uses relative links, so the same HTML works served (`posttrain lessons`) and from
disk (`--export`). `static=True` pages load their widgets' precomputed data from `data/*.js`
instead of calling `/api/`.
"""

from __future__ import annotations

import html
import importlib
import inspect
import json
from functools import lru_cache
from pathlib import Path

from posttrain.lessons import content, registry

ROOT = Path(__file__).resolve().parents[2]          # the directory holding the posttrain package
PKG = Path(__file__).resolve().parents[1]           # posttrain/


def esc(s) -> str:
    return html.escape(str(s), quote=True)


@lru_cache(maxsize=None)
def code_ref(spec: str) -> tuple[str, int, int]:
    """'posttrain.algorithms.grpo:advantages' → ('posttrain/algorithms/grpo.py', first, last line),
    read from the live source with inspect, so links stay true when the code moves."""
    module, _, qual = spec.partition(":")
    obj = importlib.import_module(module)
    for part in qual.split(".") if qual else []:
        obj = getattr(obj, part)
    obj = inspect.unwrap(obj)                        # decorated functions (torch.no_grad) → the real one
    path = Path(inspect.getsourcefile(obj)).resolve()
    if qual:
        lines, first = inspect.getsourcelines(obj)
        last = first + len(lines) - 1
    else:
        first, last = 1, len(path.read_text().splitlines())
    return path.relative_to(ROOT).as_posix(), first, last


def source_name(relpath: str) -> str:
    return relpath.replace("/", "__") + ".html"


def source_files() -> list[str]:
    """Every file a lesson or a widget links to."""
    refs = {spec for ls in content.LESSONS for spec in ls.code}
    refs |= {spec for w in registry.load_all().values() for spec in w.uses}
    return sorted({code_ref(s)[0] for s in refs})


def code_link(spec: str, prefix: str) -> str:
    rel, a, b = code_ref(spec)
    module, _, qual = spec.partition(":")
    label = f"{module.rsplit('.', 1)[-1]}.{qual}" if qual else rel
    return (f'<a class="code" href="{prefix}source/{source_name(rel)}#L{a}-L{b}">'
            f'<code>{esc(label)}</code></a> <span class="where">{esc(rel)}:{a}–{b}</span>')


def page(title: str, body: str, prefix: str, static: bool, scripts: list[str] = ()) -> str:
    head_js = [f'<script>window.PT = {{data: {{}}, static: {json.dumps(static)}, api: "{prefix}api/"}};</script>']
    head_js += [f'<script src="{prefix}{s}"></script>' for s in scripts]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)} · posttrain lessons</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{prefix}static/style.css">
{chr(10).join(head_js)}
</head><body>
<nav class="top"><a href="{prefix}index.html">posttrain lessons</a></nav>
<main>{body}</main>
<script src="{prefix}static/app.js"></script>
</body></html>
"""


# ---- the index ------------------------------------------------------------------------------------

ROLES_SVG = """<svg class="diagram" viewBox="0 0 780 215" role="img" aria-label="the six roles">
<defs><marker id="arr" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto">
<path d="M0,0L10,5L0,10z" fill="#555"/></marker></defs>
{nodes}
{edges}
</svg>"""
W2 = 62                                              # half the width of a role box
ROLES = [  # (x, y, name, hover, lesson)
    (80, 35, "ROLLOUT", "samples K responses per prompt and records their behaviour logprobs", "rl-02"),
    (285, 35, "REWARD", "the task's verifier (or a reward model) scores each response", "rl-03"),
    (490, 35, "REFERENCE", "a frozen copy of the start policy: logprobs for the KL anchor", "rl-03"),
    (695, 35, "ALGORITHM", "turns rewards into advantages and a loss (one file per algorithm)", "rl-04"),
    (695, 180, "TRAINER", "forward, the loss, the one backward, clip, optimizer step", "rl-05"),
    (285, 180, "WEIGHT SYNC", "hands the new weights to the sampler, with a version number", "rl-06"),
    (490, 108, "CONTROLLER", "runs the loop: calls each role in order, skips empty groups, logs", "rl-07"),
]
EDGES = [(0, 1, "responses"), (1, 2, "+ rewards"), (2, 3, "ref logp"), (3, 4, "loss fn"), (4, 5, "new weights")]


def roles_svg(prefix: str) -> str:
    nodes = []
    for x, y, name, hover, lid in ROLES:
        nodes.append(f'<a href="{prefix}lessons/{lid}.html"><g class="role"><title>{esc(hover)}</title>'
                     f'<rect x="{x - W2}" y="{y - 22}" width="{2 * W2}" height="44" rx="8"/>'
                     f'<text x="{x}" y="{y + 5}" text-anchor="middle">{name}</text></g></a>')
    edges = []
    for a, b, label in EDGES:
        (x1, y1), (x2, y2) = ROLES[a][:2], ROLES[b][:2]
        if y1 == y2:
            sx, ex = (x1 + W2, x2 - W2) if x2 > x1 else (x1 - W2, x2 + W2)
            edges.append(f'<line x1="{sx}" y1="{y1}" x2="{ex}" y2="{y2}" marker-end="url(#arr)"/>'
                         f'<text class="edge" x="{(sx + ex) / 2}" y="{y1 - 8}" text-anchor="middle">{label}</text>')
        else:
            edges.append(f'<line x1="{x1}" y1="{y1 + 22}" x2="{x2}" y2="{y2 - 22}" marker-end="url(#arr)"/>'
                         f'<text class="edge" x="{x1 + 6}" y="{(y1 + y2) / 2 + 4}">{label}</text>')
    edges.append(f'<path d="M{285 - W2},180 Q80,180 80,59" fill="none" marker-end="url(#arr)"/>'
                 '<text class="edge" x="92" y="150">sync</text>'
                 '<text class="edge" x="490" y="146" text-anchor="middle">calls every role, in order</text>')
    return ROLES_SVG.format(nodes="\n".join(nodes), edges="\n".join(edges))


def lineage_html(prefix: str) -> str:
    rows = []
    for lid, name, delta in content.LINEAGE:
        rows.append(f'<li><a href="{prefix}lessons/{lid}.html">{esc(name)}</a> <span>{esc(delta)}</span></li>')
    return '<ol class="lineage">' + "".join(rows) + "</ol>"


def render_index(static: bool = False) -> str:
    by_part: dict[str, list] = {}
    for ls in content.LESSONS:
        by_part.setdefault(ls.part, []).append(ls)
    parts = []
    for part, lessons in by_part.items():
        items = "".join(f'<li data-lesson="{ls.id}"><a href="lessons/{ls.id}.html">{esc(ls.number)} · {esc(ls.title)}</a>'
                        f'<span class="done-mark"></span></li>' for ls in lessons)
        parts.append(f"<h3>{esc(part)}</h3><ul class='toc'>{items}</ul>")
    paths = "".join(f"<li><b>{esc(goal)}</b>: " + " → ".join(f'<a href="lessons/{i}.html">{esc(content.by_id(i).number)}</a>'
                                                              for i in ids) + "</li>" for goal, ids in content.PATHS)
    linear = " → ".join(f'<a href="lessons/{ls.id}.html">{esc(ls.number)}</a>' for ls in content.LESSONS)
    decisions = "".join(f"<tr><td>{esc(where)}</td><td>{esc(bug)}</td><td><b>{esc(choice)}</b> {esc(why)}</td></tr>"
                        for where, bug, choice, why in content.DECISIONS)
    missing = "".join(f"<li>{esc(m)}</li>" for m in content.NOT_YET)
    body = f"""
<h1>RL post-training, lesson by lesson, on posttrain's own code</h1>
<p class="lede">{esc(content.INTRO)}</p>
<p class="progress-line">Your progress (kept in this browser only): <b id="progress-count">0</b> of {len(content.LESSONS)} lessons done.
<button id="progress-reset" type="button">forget progress</button></p>
<h2>The six roles around the loss</h2>
<p>Click a role to open its lesson; hover for what it does.</p>
{roles_svg("")}
<h2>The algorithm lineage</h2>
<p>Each algorithm is one file in <code>posttrain/algorithms/</code>, a small patch on the one before it.</p>
{lineage_html("")}
<h2>Reading paths</h2>
<p><b>Linear</b>: {linear}</p>
<ul>{paths}</ul>
<h2>All lessons</h2>
{"".join(parts)}
<h2>The course's widget bugs: what we did with each</h2>
<table class="decisions"><tr><th>lesson</th><th>the course's widget</th><th>decision</th></tr>{decisions}</table>
<h2>Not here yet</h2><ul>{missing}</ul>
"""
    return page("index", body, "", static)


# ---- a lesson -------------------------------------------------------------------------------------

def widget_html(name: str) -> str:
    w = registry.get(name)
    brk = ", ".join(f"{k} = {registry.fmt(v)}" for k, v in w.breaks["knobs"].items())
    return f"""<section class="widget" data-widget="{esc(name)}" data-rev="0">
<h3>{esc(w.title)}</h3>
<script type="application/json">{json.dumps(w.spec())}</script>
<div class="controls"></div><button type="button" class="reset-knobs">reset knobs</button>
<div class="plot" id="plot-{esc(name)}"></div>
<div class="kpis"></div>
<p class="note"></p><p class="explain">{esc(w.explain)}</p><p class="error"></p>
<div class="callout warn"><b>What breaks training:</b> set <code>{esc(brk)}</code>
<button type="button" class="apply-break">try it</button>. {esc(w.breaks["what"])}</div>
</section>"""


def render_lesson(lesson, static: bool = False) -> str:
    idx = content.LESSONS.index(lesson)
    prev_ = content.LESSONS[idx - 1] if idx else None
    next_ = content.LESSONS[idx + 1] if idx + 1 < len(content.LESSONS) else None
    nav = '<nav class="lesson-nav">'
    nav += f'<a href="{prev_.id}.html">← {esc(prev_.number)} {esc(prev_.title)}</a>' if prev_ else "<span></span>"
    nav += f'<a href="{next_.id}.html">{esc(next_.number)} {esc(next_.title)} →</a>' if next_ else "<span></span>"
    nav += "</nav>"
    code = "".join(f"<li>{code_link(spec, '../')}</li>" for spec in lesson.code)
    widgets = "".join(widget_html(n) for n in lesson.widgets)
    scripts = ["static/plotly.min.js"] + ([f"data/{n}.js" for n in lesson.widgets] if static else [])
    body = f"""{nav}
<p class="crumbs">{esc(lesson.part)}</p>
<h1>{esc(lesson.number)} · {esc(lesson.title)}</h1>
<label class="done"><input type="checkbox" class="lesson-done" data-lesson="{lesson.id}"> I have worked through this lesson</label>
<h2>The idea</h2><p>{lesson.idea}</p>
<h2>Why it exists</h2><p>{lesson.why}</p>
<h2>The code</h2><ul class="code-refs">{code}</ul>
<h2>Try it</h2>{widgets}
{nav}"""
    return page(f"{lesson.number} {lesson.title}", body, "../", static, scripts)


# ---- source view ----------------------------------------------------------------------------------

def render_source(relpath: str, static: bool = False) -> str:
    if relpath not in source_files():
        from posttrain import UsageError
        raise UsageError(f"no source view for {relpath!r}")
    lines = (ROOT / relpath).read_text().splitlines()
    rows = "".join(f'<tr id="L{i}"><td class="ln"><a href="#L{i}">{i}</a></td><td><pre>{esc(t) or " "}</pre></td></tr>'
                   for i, t in enumerate(lines, 1))
    body = f'<h1 class="src-title"><code>{esc(relpath)}</code></h1><table class="source">{rows}</table>'
    return page(relpath, body, "../", static)
