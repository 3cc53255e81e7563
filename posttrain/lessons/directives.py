"""What each `{{directive}}` of a lesson text becomes in HTML (the dialect is in markdown.py).

    {{widget:NAME}}                 the widget, placed here (own line)
    {{code:MODULE:QUALNAME[:A-B]}}  an excerpt of the live source + a link to the source view (own line)
    {{table:NAME}}                  a fact returning {"columns", "rows"}, as an HTML table (own line)
    {{kpi:WIDGET:LABEL}}            a KPI of WIDGET at its default knobs, as the widget shows it (inline)
    {{fact:NAME[:FMT]}}             a fact's value, optionally through format(value, FMT) (inline)

A directive that does not resolve raises UsageError with one line naming it; the renderer collects
them (markdown.py).
"""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import dataclass, field
from decimal import Decimal
from html import escape

from pygments.lexers import PythonLexer
from pygments.token import STANDARD_TYPES

from posttrain.errors import UsageError
from posttrain.lessons import facts, registry, sources

BLOCK = ("widget", "code", "table")
COLOURED = {
    "k",
    "kn",
    "kc",
    "kd",
    "ow",
    "s",
    "s1",
    "s2",
    "sa",
    "se",
    "si",
    "sd",
    "c",
    "c1",
    "ch",
    "cm",
    "nf",
    "fm",
    "nc",
    "mi",
    "mf",
    "mh",
    "mo",
    "nb",
    "bp",
    "nd",
}  # pygments classes style.css colours
INLINE = ("kpi", "fact")


@dataclass
class Env:
    """What one page's render collects: the widgets placed (in order), its h2 sections, its errors."""

    prefix: str = "../"
    widgets: list[str] = field(default_factory=list)
    sections: list[tuple[str, str]] = field(default_factory=list)  # (anchor, heading text)
    errors: list[str] = field(default_factory=list)


def esc(s) -> str:
    return escape(str(s), quote=True)


def js_str(v) -> str:
    """Text of a JSON value as the page's JavaScript shows it (String(v)), so a KPI quoted in the
    text reads exactly like the KPI box: 1.0 → "1", 1e-07 → "1e-7", 0.00001 → "0.00001"."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        if v == 0:
            return "0"
        sign, digits, exp = Decimal(repr(v)).normalize().as_tuple()  # v = digits × 10^exp (shortest digits)
        s, k = "".join(map(str, digits)), len(digits)
        n = k + exp  # position of the decimal point (ECMA-262 Number::toString)
        if k <= n <= 21:
            out = s + "0" * (n - k)
        elif 0 < n <= 21:
            out = s[:n] + "." + s[n:]
        elif -6 < n <= 0:
            out = "0." + "0" * -n + s
        else:
            e = n - 1
            out = s[0] + ("." + s[1:] if k > 1 else "") + "e" + ("+" if e >= 0 else "-") + str(abs(e))
        return ("-" if sign else "") + out
    if isinstance(v, (list, tuple)):
        return ",".join("" if x is None else js_str(x) for x in v)
    return str(v)


# ---- block directives ------------------------------------------------------------------------------


def widget_html(name: str) -> str:
    w = registry.get(name)
    brk = ", ".join(f"{k} = {registry.fmt(v)}" for k, v in w.breaks["knobs"].items())
    spec = json.dumps(w.spec()).replace("</", "<\\/")  # no "</script>" inside the script tag
    return f"""<section class="widget" data-widget="{esc(name)}" data-rev="0" data-busy="1">
<h3>{esc(w.title)}</h3>
<script type="application/json">{spec}</script>
<div class="controls"></div><button type="button" class="reset-knobs">reset knobs</button>
<div class="plot-wrap"><div class="plot" id="plot-{esc(name)}" role="img" aria-label="{esc(w.title)}"></div>
<div class="busy" aria-hidden="true">computing…</div></div>
<div class="kpis"></div>
<p class="note" aria-live="polite"></p><p class="explain">{esc(w.explain)}</p><p class="error"></p>
<div class="callout warn"><b>What breaks training:</b> set <code>{esc(brk)}</code>
<button type="button" class="apply-break">try it</button>. {esc(w.breaks["what"])}</div>
</section>"""


def highlight(code: str) -> list[str]:
    """Python source → one HTML string per line, tokens in pygments' short classes (k, s, c1, nf …;
    style.css colours a few). pygments comes with rich, a core dependency."""
    lines, cur = [], []
    for ttype, value in PythonLexer(stripnl=False, ensurenl=False).get_tokens(code):
        while ttype not in STANDARD_TYPES:
            ttype = ttype.parent
        cls = STANDARD_TYPES[ttype]
        for i, part in enumerate(value.split("\n")):
            if i:
                lines.append("".join(cur))
                cur = []
            if part:
                cur.append(f'<span class="{cls}">{esc(part)}</span>' if cls in COLOURED else esc(part))
    return lines + ["".join(cur)]


def code_excerpt(spec: str, prefix: str) -> str:
    rel, a, b = sources.excerpt_ref(spec)
    module, qual = spec.split(":")[:2]
    lines = highlight(textwrap.dedent("\n".join((sources.ROOT / rel).read_text().splitlines()[a - 1 : b])))
    body = "".join(f'<span class="l" data-n="{a + i}">{t}</span>\n' for i, t in enumerate(lines))
    label = f"{module.rsplit('.', 1)[-1]}.{qual}"
    return (
        f'<figure class="excerpt"><figcaption><a class="code" href="{prefix}source/{sources.source_name(rel)}'
        f'#L{a}-L{b}"><code>{esc(label)}</code></a> <span class="where">{esc(rel)}:{a}–{b}</span></figcaption>'
        f'<pre><code class="language-python">{body}</code></pre></figure>'
    )


def table_html(name: str) -> str:
    v = facts.value(name)
    if not facts.is_table(v):
        raise UsageError(
            f"{{{{table:{name}}}}}: fact {name} returned a {type(v).__name__}, not a "
            '{"columns": [...], "rows": [...]} table; quote it inline with {{fact:...}}'
        )
    head = "".join(f"<th>{esc(c)}</th>" for c in v["columns"])
    rows = "".join("<tr>" + "".join(f"<td>{esc(js_str(c))}</td>" for c in row) + "</tr>" for row in v["rows"])
    return f'<div class="table-wrap"><table class="fact" data-fact="{esc(name)}"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>'


# ---- inline directives -----------------------------------------------------------------------------


def kpi_text(arg: str) -> str:
    widget, _, label = arg.partition(":")
    if not label:
        raise UsageError(f"{{{{kpi:{arg}}}}}: write {{{{kpi:WIDGET:LABEL}}}}")
    shown = dict(registry.compute(widget)["kpis"])
    if label not in shown:
        raise UsageError(
            f"{{{{kpi:{arg}}}}}: widget {widget} has no KPI {label!r} at its defaults; "
            f"its KPIs: {' | '.join(map(str, shown))}"
        )
    return js_str(shown[label])


def fact_text(arg: str) -> str:
    name, _, spec = arg.partition(":")
    v = facts.value(name)
    if facts.is_table(v):
        raise UsageError(
            f"{{{{fact:{arg}}}}}: fact {name} is a table; place it with {{{{table:{name}}}}} on its own line"
        )
    if not spec:
        return js_str(v)
    try:
        return format(v, spec)
    except (ValueError, TypeError) as e:
        raise UsageError(f"{{{{fact:{arg}}}}}: format spec {spec!r} does not apply to {v!r} ({e})") from None


def expand(name: str, arg: str, env: Env, block: bool) -> str:
    """HTML of one directive; UsageError naming it when it does not resolve."""
    if name in BLOCK:
        if not block:
            raise UsageError(f"{{{{{name}:{arg}}}}} must stand alone on its own line")
        if name == "widget":
            registry.get(arg)
            if arg in env.widgets:
                raise UsageError(f"{{{{widget:{arg}}}}} is placed twice on this page")
            env.widgets.append(arg)
            return widget_html(arg)
        if name == "code":
            return code_excerpt(arg, env.prefix)
        return table_html(arg)
    if name == "kpi":
        return esc(kpi_text(arg))
    if name == "fact":
        return esc(fact_text(arg))
    raise UsageError(f"unknown directive {{{{{name}:{arg}}}}}; directives: {', '.join(BLOCK + INLINE)}")
