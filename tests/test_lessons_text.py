"""The lessons' text layer: the Markdown renderer and its directives, every page rendering, the course's
structure (parts, tracks, lesson n of N, the sidebar), the glossary, the search index, the source
view's paths (dunder files included), and a static export whose every relative link resolves."""

from __future__ import annotations

import fnmatch
import json
import re
import urllib.request
from html import unescape
from pathlib import Path

import pytest
import tomllib

from posttrain import UsageError
from posttrain.lessons import (
    content,
    directives,
    facts,
    glossary,
    home,
    markdown,
    pages,
    registry,
    search,
    server,
    sources,
)


def render(text: str) -> tuple[str, directives.Env]:
    return markdown.render(text, strict=False)


@pytest.fixture
def fake_facts(monkeypatch):
    """Three facts of each kind, registered the way facts_a/b/c register theirs."""
    table = {"columns": ["K", "P(degenerate)"], "rows": [[2, 0.5], [4, 0.125]]}
    for name, fn in {
        "t_num": lambda: 0.123456,
        "t_str": lambda: "8.6 GB",
        "t_table": lambda: table,
        "t_bad": lambda: [1, 2],
    }.items():
        monkeypatch.setitem(facts.load_all(), name, fn)
    facts.value.cache_clear()
    yield
    facts.value.cache_clear()


# ---- math ------------------------------------------------------------------------------------------


def test_math_reaches_katex_untouched_by_markdown():
    html, env = render(
        r"Take $a_i * b_{j}$ and $x_1 < y_2$; money $5 and $6 stays; \$ too."
        "\n\n"
        "$$\n\\frac{1}{2} * a_i\n$$\n"
    )
    assert r'<span class="math">\(a_i * b_{j}\)</span>' in html  # no <em> from the _ or *
    assert r'<span class="math">\(x_1 &lt; y_2\)</span>' in html
    assert "money $5 and $6 stays; $ too." in html
    assert r'<div class="math display">\[\frac{1}{2} * a_i\]</div>' in html
    assert not env.errors


def test_math_inside_a_table_cell_and_a_reveal():
    html = render(
        "| a | b |\n|---|---|\n| $x\\|y$ | 2 |\n\n<details><summary>Answer</summary>\n\nSet $\\beta = 0$.\n</details>\n"
    )[0]
    assert r'<td><span class="math">\(x|y\)</span></td>' in html
    assert (
        r"<details><summary>Answer</summary>" in html and r'<p>Set <span class="math">\(\beta = 0\)</span>.</p>' in html
    )


# ---- directives ------------------------------------------------------------------------------------


def test_kpi_reads_like_the_widget_shows_it():
    """advantages at its defaults: r = (0, 0, 1), population std → mean 0.333, std 0.471 (row 10)."""
    html, env = render("The mean is {{kpi:advantages:mean}} and the std {{kpi:advantages:std (population)}}.")
    assert "The mean is 0.333 and the std 0.471." in html and not env.errors
    shown = dict(registry.compute("advantages")["kpis"])
    assert directives.kpi_text("advantages:GRPO") == directives.js_str(shown["GRPO"])


@pytest.mark.parametrize(
    "value, text",
    [
        (1.0, "1"),
        (0.5, "0.5"),
        (-0.25, "-0.25"),
        (1e-7, "1e-7"),
        (0.00001, "0.00001"),
        (1234.5, "1234.5"),
        (1e21, "1e+21"),
        (2.5e-10, "2.5e-10"),
        (100.0, "100"),
        (0.1 + 0.2, "0.30000000000000004"),
        (True, "true"),
        (7, "7"),
        ("8.6 GB", "8.6 GB"),
    ],
)
def test_js_str_is_javascripts_string_of_a_number(value, text):
    assert directives.js_str(value) == text


def test_facts_inline_formatted_and_as_a_table(fake_facts):
    html, env = render("p = {{fact:t_num}}, {{fact:t_num:.2f}}, {{fact:t_str}}.\n\n{{table:t_table}}\n")
    assert "p = 0.123456, 0.12, 8.6 GB." in html and not env.errors
    assert (
        "<thead><tr><th>K</th><th>P(degenerate)</th></tr></thead><tbody><tr><td>2</td><td>0.5</td></tr>"
        "<tr><td>4</td><td>0.125</td></tr></tbody>"
    ) in html


def test_code_excerpt_is_the_live_source_with_a_link_to_its_lines():
    html = render("{{code:posttrain.algorithms.grpo:advantages:2-4}}")[0]
    rel, first, _ = sources.code_ref("posttrain.algorithms.grpo:advantages")
    lines = (sources.ROOT / rel).read_text().splitlines()[first : first + 3]  # object lines 2..4
    assert f'href="../source/posttrain/algorithms/grpo.py.html#L{first + 1}-L{first + 3}"' in html
    shown = re.findall(r'<span class="l" data-n="(\d+)">(.*)</span>\n', html)
    assert [int(n) for n, _ in shown] == [first + 1, first + 2, first + 3]
    assert [unescape(re.sub("<[^>]+>", "", t)) for _, t in shown] == [x[4:] for x in lines]  # dedented by the def's 4
    assert '<span class="s' in html  # the docstring is coloured


def test_every_ranged_excerpt_still_shows_the_lines_it_was_written_for():
    """A range counts lines from the object's start: code added above them moves the excerpt onto other
    lines. tools/excerpts.py pins the text; a drift names the lesson and the fix (`--remap`)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("excerpts", Path(__file__).parents[1] / "tools" / "excerpts.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert len(tool.ranged_specs()) >= 50
    assert tool.check() == []
    lines = ["def f(a,", "      b):", "    return g(a, 'x',", "             b,)"]
    assert tool.find(lines, 'return g(a, "x", b)') == (3, 4)  # re-anchored across a reformat
    assert tool.find(lines, "return h(a)") is None


def test_widgets_are_placed_once_and_the_rest_appended(tmp_path, monkeypatch):
    monkeypatch.setattr(content, "TEXT_DIR", tmp_path)
    (tmp_path / "rl-03.md").write_text("## The idea\n\nWords.\n\n{{widget:kl}}\n\n## What to try\n\nMore.\n")
    view = pages.lesson_view(content.by_id("rl-03"))
    assert view.widgets == ["kl", "verifier", "beta"]  # placed first, then the lesson's others
    assert (
        view.html.index('data-widget="kl"')
        < view.html.index('id="what-to-try"')
        < view.html.index('data-widget="verifier"')
    )
    assert view.sections == [("the-idea", "The idea"), ("what-to-try", "What to try"), ("try-it", "Try it")]
    page = pages.render_lesson(content.by_id("rl-03"), static=True)
    assert page.count('src="../data/kl.js"') == 1 and 'src="../data/beta.js"' in page


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("{{nope:x}}", "unknown directive {{nope:x}}"),
        ("{{widget:no_such_widget}}", "unknown widget 'no_such_widget'"),
        ("{{widget:kl}}\n\n{{widget:kl}}", "{{widget:kl}} is placed twice"),
        ("a {{widget:kl}} b", "{{widget:kl}} must stand alone on its own line"),
        ("{{kpi:advantages:no such label}}", "widget advantages has no KPI 'no such label'"),
        ("{{kpi:advantages}}", "write {{kpi:WIDGET:LABEL}}"),
        ("{{fact:nobody_defined_this}}", "unknown fact 'nobody_defined_this'"),
        ("{{code:posttrain.algorithms.grpo:nope}}", "does not resolve"),
        ("{{code:posttrain.algorithms.grpo:advantages:5-900}}", "the range must be A-B"),
    ],
)
def test_a_directive_that_does_not_resolve_is_an_error(text, fragment):
    html, env = render(text)
    assert len(env.errors) == 1 and fragment in env.errors[0], env.errors
    assert 'class="directive-error"' in html
    with pytest.raises(UsageError) as e:
        markdown.render(text)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_fact_errors_name_the_fix(fake_facts):
    assert "place it with {{table:t_table}}" in render("{{fact:t_table}}")[1].errors[0]
    assert "not a" in render("{{table:t_num}}")[1].errors[0]
    assert "format spec" in render("{{fact:t_str:.2f}}")[1].errors[0]
    assert "return a number, a string or a table" in render("{{fact:t_bad}}")[1].errors[0]


def test_code_spans_keep_directives_literal_and_words_are_prose_only():
    html, env = render("Write `{{kpi:x:y}}` to quote a KPI.")
    assert "<code>{{kpi:x:y}}</code>" in html and not env.errors
    text = "## The idea\n\nOne two three $x^2$ four {{kpi:a:b}}.\n\n$$\nE = mc^2\n$$\n\n```python\nnot prose at all\n```\n{{widget:kl}}\n"
    assert markdown.word_count(text) == 8  # The idea / One two three / formula / four / value


# ---- every page renders; the structure ---------------------------------------------------------


def test_every_page_renders_strictly():
    """A text/<id>.md with a directive that does not resolve fails here (the text engineers run this)."""
    for ls in content.LESSONS:
        assert f"{ls.number} · " in pages.render_lesson(ls)
    assert "gpt_mini" in pages.render_gpt_index()
    for name, _fn in facts.load_all().items():
        facts.value(name)  # each fact returns a valid value


def test_parts_tracks_and_lesson_n_of_n():
    rl = [ls for ls in content.LESSONS if ls.track == "rl"]
    numbers = {part: [ls.number for ls in rl if ls.part == part] for part in content.PARTS}
    assert list(numbers.values()) == [
        ["00"],
        [f"{i:02d}" for i in range(1, 9)],
        [f"{i:02d}" for i in range(9, 15)],
        ["15", "16", "17", "18", "18a", "19", "20", "21", "22", "22a", "22b", "22c", "23"],
        ["24", "25"],
        ["26", "27", "28"],
    ]
    assert len(rl) == 33 and [ls.number for ls in content.LESSONS if ls.track == "gpt"] == [
        f"G0{i}" for i in range(1, 7)
    ]
    assert "lesson 20 of 33" in pages.render_lesson(content.by_id("rl-18a"))
    assert "lesson 2 of 6" in pages.render_lesson(content.by_id("gpt-02"))
    first, last = pages.render_lesson(content.by_id("gpt-01")), pages.render_lesson(content.by_id("rl-28"))
    assert 'rel="prev" href="../gpt_mini.html"' in first and 'rel="next" href="../index.html"' in last


def test_every_page_has_the_table_of_contents_and_marks_itself():
    page = pages.render_lesson(content.by_id("rl-22b"))
    toc = page[page.index('<nav class="sidebar"') : page.index("</nav>", page.index('<nav class="sidebar"'))]
    assert all(f'href="../lessons/{ls.id}.html"' in toc for ls in content.LESSONS)
    assert '<li data-lesson="rl-22b" class=current aria-current=page>' in toc and toc.count("class=current") == 1
    assert '<a href="#code-links">' in toc  # the current lesson's sections
    for html_ in (
        home.render_index(),
        pages.render_glossary(),
        pages.render_gpt_index(),
        pages.render_source("posttrain/algorithms/__init__.py"),
    ):
        assert '<nav class="sidebar"' in html_ and 'id="search"' in html_


def test_glossary_terms_link_to_their_lessons():
    assert len(glossary.TERMS) >= 40
    anchors = [glossary.anchor(t) for t, _, _ in glossary.TERMS]
    assert len(set(anchors)) == len(anchors)
    page = pages.render_glossary()
    for term, lesson_id, text in glossary.TERMS:
        content.by_id(lesson_id)
        assert f'id="{glossary.anchor(term)}"' in page and 1 <= text.count(". ") + 1 <= 3, term
    assert r'<span class="math">\(A = R - b\)</span>' in page and 'href="lessons/rl-04.html"' in page


def test_search_index_covers_every_lesson_and_the_glossary():
    index = json.loads(search.script()[len("PT.searchIndex = ") : -2])
    urls = {e["u"].split("#")[0] for e in index}
    assert {f"lessons/{ls.id}.html" for ls in content.LESSONS} <= urls and "glossary.html" in urls
    kl = [e for e in index if e["u"] == "glossary.html#g-kl-estimators-k1-k2-k3"][0]
    assert "unbiased and never negative" in kl["x"] and "\\" not in kl["x"]


# ---- the source view: every file at its own path (issue 17, item 8) ---------------------------------


def test_source_view_of_a_dunder_file_is_served():
    httpd, url = server.start(0)
    try:
        rel = "posttrain/algorithms/__init__.py"
        assert rel in pages.source_files()
        with urllib.request.urlopen(url + "source/" + pages.source_name(rel), timeout=60) as res:
            body = res.read().decode()
        assert (
            res.status == 200
            and "def get(" in unescape(re.sub("<[^>]+>", "", body))
            and '<link rel="stylesheet" href="../../../static/style.css">' in body
        )
    finally:
        httpd.shutdown()
    names = [pages.source_name(r) for r in pages.source_files()]
    assert len(set(names)) == len(names)
    with pytest.raises(UsageError):
        pages.render_source("posttrain/../pyproject.toml")


# ---- the export and the package -------------------------------------------------------------------


def test_export_links_all_resolve(tmp_path):
    """Every src/href of every exported page names a file of the export (KaTeX, search, sources)."""
    out = server.export(tmp_path / "site", widgets=["kl"], log=lambda *a: None)
    pages_ = list(out.rglob("*.html"))
    assert len(pages_) >= len(content.LESSONS) + 3 + len(pages.source_files())
    missing = set()
    for page in pages_:
        for link in re.findall(r'(?:src|href)="([^"#]+)', page.read_text()):
            if not link.startswith(("data:", "http")) and not (page.parent / link).resolve().exists():
                missing.add(f"{page.relative_to(out)} → {link}")
    data_links = {m for m in missing if "/data/" in m and "kl.js" not in m}  # only kl was computed
    assert missing == data_links, sorted(missing - data_links)[:5]
    css = (out / "static" / "katex" / "katex.min.css").read_text()
    assert all((out / "static" / "katex" / f).exists() for f in re.findall(r"url\((fonts/[^)]+\.woff2)\)", css))


def test_package_data_ships_the_static_files_and_the_texts():
    globs = tomllib.loads((sources.ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "posttrain.lessons"
    ]
    pkg = Path(pages.__file__).parent
    shipped = [p for p in (pkg / "static").rglob("*") if p.is_file()] + list((pkg / "text").glob("*.md"))
    for path in shipped:
        rel = path.relative_to(pkg).as_posix()
        assert any(fnmatch.fnmatch(rel, g) and rel.count("/") == g.count("/") for g in globs), rel
