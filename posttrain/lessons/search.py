"""The search index of the lesson text: one entry per lesson section, per index page and per glossary
term, written as a script (`search-index.js`) so a static export searches from file:// with no server.
It is built from the Markdown sources, never by rendering, so building it computes no widget."""

from __future__ import annotations

import json
import re

from posttrain.lessons import content, glossary, markdown


def plain(text: str) -> str:
    """Markdown → searchable words: directives dropped, TeX commands and markup stripped."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", " ", text, flags=re.S | re.M)  # code blocks
    text = markdown.DIRECTIVE.sub(" ", text)
    text = re.sub(r"<[^>]+>", " ", text)
    text = re.sub(r"\\[a-zA-Z]+", " ", text)  # \frac, \log …
    text = re.sub(r"[$#*_`>|{}\[\]\\^]", " ", text)
    return re.sub(r"\s+", " ", text).strip()


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) per `## ` section; the text before the first heading has heading ''."""
    out, head, lines = [], "", []
    for line in text.splitlines():
        if line.startswith("## "):
            out.append((head, "\n".join(lines)))
            head, lines = line[3:].strip(), []
        else:
            lines.append(line)
    out.append((head, "\n".join(lines)))
    return [(h, b) for h, b in out if h or b.strip()]


def entries() -> list[dict]:
    """[{u: url from the site root, t: title, s: section, x: text}], in reading order."""
    out = []
    for ls in content.LESSONS:
        title = f"{ls.number} · {ls.title}"
        text = markdown.lesson_text(ls.id)
        if text is None:
            text = f"## The idea\n{ls.idea}\n## Why it exists\n{ls.why}"
        out.append({"u": f"lessons/{ls.id}.html", "t": title, "s": "", "x": plain(ls.part)})
        for head, body in sections(text):
            anchor = f"#{markdown.slug(markdown.heading_text(head))}" if head else ""
            out.append({"u": f"lessons/{ls.id}.html{anchor}", "t": title, "s": plain(head), "x": plain(body)})
    gpt = markdown.lesson_text("gpt-index")
    for head, body in sections(gpt or ""):
        out.append({"u": "gpt_mini.html", "t": "gpt_mini track", "s": plain(head), "x": plain(body)})
    for term, _lesson, text in glossary.TERMS:
        out.append({"u": f"glossary.html#{glossary.anchor(term)}", "t": "Glossary", "s": term, "x": plain(text)})
    return out


def script() -> str:
    return f"PT.searchIndex = {json.dumps(entries(), ensure_ascii=False)};\n"
