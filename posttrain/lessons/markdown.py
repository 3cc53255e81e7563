"""The renderer of a lesson's text, posttrain/lessons/text/<lesson-id>.md, into the page's HTML.

The dialect: CommonMark + pipe tables + raw HTML (markdown-it-py), plus

- math: `$...$` inline and `$$...$$` display, handed untouched to KaTeX in the browser (the
  vendored copy in static/katex, so pages work offline and from an export); `\\$` is a dollar;
  `$5 and $6` stays money (a closing `$` must not follow a space nor precede a digit); inside a
  pipe table write `\\|` for a `|` in math, as GFM splits cells before anything else;
- directives, `{{name:args}}` (directives.py says what each becomes): {{widget:NAME}},
  {{code:MODULE:QUALNAME[:A-B]}} and {{table:FACT}} alone on a line; {{kpi:WIDGET:LABEL}} and
  {{fact:NAME[:FMT]}} inline.

Math and directives are markdown-it rules, not text substitutions, so `_` and `*` inside math stay
TeX and a directive inside a code span stays literal. A directive that does not resolve is an
error: `render(..., strict=True)` raises one UsageError naming all of them; the preview renders
them in red and lists them.
"""

from __future__ import annotations

import re
from functools import lru_cache
from html import escape

from markdown_it import MarkdownIt

from posttrain.errors import UsageError
from posttrain.lessons import content, directives

DIRECTIVE = re.compile(r"\{\{(\w+):([^{}\n]*)\}\}")
LINE_DIRECTIVE = re.compile(r"\{\{(\w+):([^{}\n]*)\}\}\s*")


# ---- math ------------------------------------------------------------------------------------------


def _closing_dollar(src: str, start: int, end: int) -> int:
    """Index of the `$` closing an inline math span opened just before `start`, or -1."""
    j = start
    while j < end:
        c = src[j]
        if c == "\\":
            j += 2
            continue
        if c == "$":
            if src[j - 1].isspace() or (j + 1 < end and src[j + 1].isdigit()):
                return -1  # "$5 and $6" is money, not math
            return j
        j += 1
    return -1


def math_inline(state, silent: bool) -> bool:
    src, pos, end = state.src, state.pos, state.posMax
    if src[pos] != "$":
        return False
    if src.startswith("$$", pos):  # display math inside a paragraph
        close = src.find("$$", pos + 2, end)
        if close < 0 or close == pos + 2:
            return False
        kind, body, after = "math_display", src[pos + 2 : close], close + 2
    else:
        if pos + 1 >= end or src[pos + 1].isspace():
            return False
        close = _closing_dollar(src, pos + 1, end)
        if close < 0:
            return False
        kind, body, after = "math_inline", src[pos + 1 : close], close + 1
    if not silent:
        state.push(kind, "", 0).content = body
    state.pos = after
    return True


def math_block(state, start: int, end: int, silent: bool) -> bool:
    if state.sCount[start] - state.blkIndent >= 4:
        return False
    first = state.src[state.bMarks[start] + state.tShift[start] : state.eMarks[start]]
    if not first.startswith("$$"):
        return False
    rest = first[2:].rstrip()
    if rest.endswith("$$") and len(rest) >= 2:  # $$ ... $$ on one line
        body, last = rest[:-2], start
    else:
        last = start + 1
        while last < end:
            line = state.src[state.bMarks[last] + state.tShift[last] : state.eMarks[last]].rstrip()
            if line.endswith("$$"):
                break
            last += 1
        else:
            return False  # never closed: an ordinary paragraph
        body = "\n".join(
            [rest]
            + [state.src[state.bMarks[i] + state.tShift[i] : state.eMarks[i]] for i in range(start + 1, last)]
            + [line[:-2]]
        )
    if silent:
        return True
    tok = state.push("math_block", "div", 0)
    tok.content, tok.map, tok.block = body.strip(), [start, last + 1], True
    state.line = last + 1
    return True


# ---- directives ------------------------------------------------------------------------------------


def directive_block(state, start: int, end: int, silent: bool) -> bool:
    if state.sCount[start] - state.blkIndent >= 4:
        return False
    line = state.src[state.bMarks[start] + state.tShift[start] : state.eMarks[start]]
    m = LINE_DIRECTIVE.fullmatch(line)
    if not m or m[1] in directives.INLINE:  # an inline directive alone is a paragraph
        return False
    if silent:
        return True
    tok = state.push("directive_block", "", 0)
    tok.meta, tok.map, tok.block = {"name": m[1], "arg": m[2]}, [start, start + 1], True
    state.line = start + 1
    return True


def directive_inline(state, silent: bool) -> bool:
    if not state.src.startswith("{{", state.pos):
        return False
    m = DIRECTIVE.match(state.src, state.pos, state.posMax)
    if not m:
        return False
    if not silent:
        state.push("directive_inline", "", 0).meta = {"name": m[1], "arg": m[2]}
    state.pos = m.end()
    return True


def _expand(tokens, idx, env, block: bool) -> str:
    e: directives.Env = env["pt"]
    meta = tokens[idx].meta
    try:
        return directives.expand(meta["name"], meta["arg"], e, block)
    except Exception as err:  # noqa: BLE001 — a fact's own bug is reported like a typo
        msg = (
            str(err)
            if isinstance(err, UsageError)
            else f"{{{{{meta['name']}:{meta['arg']}}}}}: {type(err).__name__}: {err}"
        )
        e.errors.append(msg)
        tag = "div" if block else "span"
        return f'<{tag} class="directive-error">{escape(msg)}</{tag}>'


# ---- headings get anchors; the h2s are the page's sections -----------------------------------------


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


def heading_text(source: str) -> str:
    """A heading's Markdown source as the sidebar shows it (markup and directives dropped)."""
    return re.sub(r"[`*_$]|\{\{[^}]*\}\}", "", source).strip()


def heading_open(self, tokens, idx, options, env) -> str:
    tok = tokens[idx]
    text = tokens[idx + 1].content if idx + 1 < len(tokens) else ""
    plain = heading_text(text)
    e: directives.Env = env["pt"]
    anchor, n = slug(plain), 2
    taken = {a for a, _ in e.sections} | env.setdefault("anchors", set())
    while anchor in taken:
        anchor, n = f"{slug(plain)}-{n}", n + 1
    env["anchors"].add(anchor)
    if tok.tag == "h2":
        e.sections.append((anchor, plain))
    return f'<{tok.tag} id="{anchor}">'


@lru_cache(maxsize=1)
def parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    md.inline.ruler.before("escape", "math_inline", math_inline)
    md.inline.ruler.before("math_inline", "directive_inline", directive_inline)
    alt = {"alt": ["paragraph", "reference", "blockquote", "list"]}
    md.block.ruler.before("fence", "math_block", math_block, alt)
    md.block.ruler.before("math_block", "directive_block", directive_block, alt)
    md.add_render_rule("math_inline", lambda s, t, i, o, e: f'<span class="math">\\({escape(t[i].content)}\\)</span>')
    md.add_render_rule(
        "math_display", lambda s, t, i, o, e: f'<span class="math display">\\[{escape(t[i].content)}\\]</span>'
    )
    md.add_render_rule(
        "math_block", lambda s, t, i, o, e: f'<div class="math display">\\[{escape(t[i].content)}\\]</div>\n'
    )
    md.add_render_rule("directive_inline", lambda s, t, i, o, e: _expand(t, i, e, block=False))
    md.add_render_rule("directive_block", lambda s, t, i, o, e: _expand(t, i, e, block=True) + "\n")
    md.add_render_rule("heading_open", heading_open)
    return md


def render(text: str, env: directives.Env | None = None, strict: bool = True) -> tuple[str, directives.Env]:
    """HTML of a text in the lessons' dialect, and what it placed and defined (env)."""
    env = env or directives.Env()
    out = parser().render(text, {"pt": env})
    if strict and env.errors:
        raise UsageError(f"{len(env.errors)} directive error(s): " + " | ".join(env.errors))
    return out, env


def lesson_text(lesson_id: str) -> str | None:
    path = content.text_path(lesson_id)
    return path.read_text(encoding="utf-8") if path.exists() else None


# ---- word count (prose only) -----------------------------------------------------------------------


def word_count(text: str) -> int:
    """Words of prose: code blocks, display math, block directives and HTML tags are not prose;
    an inline formula or an inline directive counts as one word."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", " ", text, flags=re.S | re.M)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    text = re.sub(r"^\s*\{\{(?:widget|code|table):[^}]*\}\}\s*$", " ", text, flags=re.M)
    text = re.sub(r"(?<!\\)\$[^$\n]+\$", " formula ", text)
    text = DIRECTIVE.sub(" value ", text)
    text = re.sub(r"<[^>]+>", " ", text)
    return len(re.findall(r"[A-Za-z0-9][\w'’.,;:!?()/−–-]*", text))
