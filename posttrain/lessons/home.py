"""The RL track's index page: the six roles as a clickable diagram, the algorithm lineage, reading
paths, the parts and their lessons, and what we decided about each of the course's widget bugs."""

from __future__ import annotations

from posttrain.lessons import content
from posttrain.lessons.directives import esc
from posttrain.lessons.markdown import slug
from posttrain.lessons.pages import page

ROLES_SVG = """<svg class="diagram" viewBox="0 0 780 215" role="img" aria-label="the six roles">
<defs><marker id="arr" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto">
<path d="M0,0L10,5L0,10z" fill="#555"/></marker></defs>
{nodes}
{edges}
</svg>"""
W2 = 62  # half the width of a role box
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
        nodes.append(
            f'<a href="{prefix}lessons/{lid}.html"><g class="role"><title>{esc(hover)}</title>'
            f'<rect x="{x - W2}" y="{y - 22}" width="{2 * W2}" height="44" rx="8"/>'
            f'<text x="{x}" y="{y + 5}" text-anchor="middle">{name}</text></g></a>'
        )
    edges = []
    for a, b, label in EDGES:
        (x1, y1), (x2, y2) = ROLES[a][:2], ROLES[b][:2]
        if y1 == y2:
            sx, ex = (x1 + W2, x2 - W2) if x2 > x1 else (x1 - W2, x2 + W2)
            edges.append(
                f'<line x1="{sx}" y1="{y1}" x2="{ex}" y2="{y2}" marker-end="url(#arr)"/>'
                f'<text class="edge" x="{(sx + ex) / 2}" y="{y1 - 8}" text-anchor="middle">{label}</text>'
            )
        else:
            edges.append(
                f'<line x1="{x1}" y1="{y1 + 22}" x2="{x2}" y2="{y2 - 22}" marker-end="url(#arr)"/>'
                f'<text class="edge" x="{x1 + 6}" y="{(y1 + y2) / 2 + 4}">{label}</text>'
            )
    edges.append(
        f'<path d="M{285 - W2},180 Q80,180 80,59" fill="none" marker-end="url(#arr)"/>'
        '<text class="edge" x="92" y="150">sync</text>'
        '<text class="edge" x="490" y="146" text-anchor="middle">calls every role, in order</text>'
    )
    return ROLES_SVG.format(nodes="\n".join(nodes), edges="\n".join(edges))


def lineage_html(prefix: str) -> str:
    rows = []
    for lid, name, delta in content.LINEAGE:
        rows.append(f'<li><a href="{prefix}lessons/{lid}.html">{esc(name)}</a> <span>{esc(delta)}</span></li>')
    return '<ol class="lineage">' + "".join(rows) + "</ol>"


def render_index(static: bool = False) -> str:
    parts = []
    for part in content.PARTS + [content.G]:
        items = "".join(
            f'<li data-lesson="{ls.id}"><a href="lessons/{ls.id}.html">{esc(ls.number)} · {esc(ls.title)}</a>'
            f'<span class="done-mark"></span></li>'
            for ls in content.LESSONS
            if ls.part == part
        )
        head = f'<a href="gpt_mini.html">{esc(part)}</a>' if part == content.G else esc(part)
        parts.append(f'<h3 id="{slug(part)}">{head}</h3><ul class="toc">{items}</ul>')
    paths = "".join(
        f"<li><b>{esc(goal)}</b>: "
        + " → ".join(f'<a href="lessons/{i}.html">{esc(content.by_id(i).number)}</a>' for i in ids)
        + "</li>"
        for goal, ids in content.PATHS
    )
    rl = [ls for ls in content.LESSONS if ls.track == "rl"]
    linear = " → ".join(f'<a href="lessons/{ls.id}.html">{esc(ls.number)}</a>' for ls in rl)
    decisions = "".join(
        f"<tr><td>{esc(where)}</td><td>{esc(bug)}</td><td><b>{esc(choice)}</b> {esc(why)}</td></tr>"
        for where, bug, choice, why in content.DECISIONS
    )
    missing = "".join(f"<li>{esc(m)}</li>" for m in content.NOT_YET)
    sections = [
        ("the-six-roles", "The six roles"),
        ("the-algorithm-lineage", "The algorithm lineage"),
        ("reading-paths", "Reading paths"),
        ("all-lessons", "All lessons"),
    ]
    body = f"""
<h1>RL post-training, lesson by lesson, on posttrain's own code</h1>
<p class="lede">{esc(content.INTRO)}</p>
<p class="progress-line">Your progress (kept in this browser only): <b id="progress-count">0</b> of {len(content.LESSONS)} lessons done.
<button id="progress-reset" type="button">forget progress</button></p>
<h2 id="the-six-roles">The six roles around the loss</h2>
<p>Click a role to open its lesson; hover for what it does.</p>
<div class="diagram-wrap">{roles_svg("")}</div>
<h2 id="the-algorithm-lineage">The algorithm lineage</h2>
<p>Each algorithm is one file in <code>posttrain/algorithms/</code>, a small patch on the one before it.</p>
{lineage_html("")}
<h2 id="reading-paths">Reading paths</h2>
<p><b>Linear</b> ({len(rl)} lessons, then the <a href="gpt_mini.html">gpt_mini track</a>): {linear}</p>
<ul>{paths}</ul>
<h2 id="all-lessons">All lessons</h2>
{"".join(parts)}
<h2>The course's widget bugs: what we did with each</h2>
<div class="table-wrap"><table class="decisions"><tr><th>lesson</th><th>the course's widget</th><th>decision</th></tr>{decisions}</table></div>
<h2>Not here yet</h2><ul>{missing}</ul>
"""
    return page("index", body, "", static, current="index", sections=sections)
