"""posttrain.lessons.render: a page in plain Markdown as a reader sees it, for outside reads of the
course (docs/course_reviews.md): every directive resolved as the site resolves it, nothing left in
braces, an unresolved one named and exit 1."""

from __future__ import annotations

from posttrain.lessons import content, directives, facts, markdown, registry, render

TEXT = """## Worked numbers

GAE's discount at a distance of 100: {{fact:rl10_lam095_100}}, and a KPI: {{kpi:stragglers:mean response}}.

{{table:rl22b_overlong_table}}

{{code:posttrain.algorithms.dapo:overlong_penalty}}

```python
x = "{{fact:not_resolved_inside_a_fence}}"
```

{{widget:stragglers}}
"""


def test_every_directive_resolves_as_the_site_prints_it():
    errors: list[str] = []
    out, placed = render.resolve(TEXT, errors)
    assert errors == [] and placed == ["stragglers"]
    assert f"distance of 100: {facts.value('rl10_lam095_100')}," in out
    assert f"a KPI: {directives.kpi_text('stragglers:mean response')}." in out
    table = facts.value("rl22b_overlong_table")
    assert "| " + " | ".join(table["columns"]) + " |" in out
    assert "| " + " | ".join(directives.js_str(c) for c in table["rows"][0]) + " |" in out
    assert "`dapo.overlong_penalty` (posttrain/algorithms/dapo.py:" in out and "def overlong_penalty" in out
    assert '"{{fact:not_resolved_inside_a_fence}}"' in out  # code fences are left as written
    w = registry.get("stragglers")
    assert f"**Widget: {w.title}**" in out and "responses K = **16** (values: 4, 8, 16, 32, 64)" in out
    for label, value in registry.compute("stragglers")["kpis"]:
        assert f"> - {label}: {directives.js_str(value)}" in out
    assert f"What breaks training: set cv = 2.0. {w.breaks['what']}" in out
    assert "{{" not in out.replace("{{fact:not_resolved_inside_a_fence}}", "")


def test_an_unresolved_directive_is_named_and_fails(monkeypatch, capsys):
    errors: list[str] = []
    out, _ = render.resolve("a {{fact:no_such_fact}} b\n\n{{table:no_such_table}}\n", errors)
    assert "[unresolved: {{fact:no_such_fact}}]" in out and "[unresolved: {{table:no_such_table}}]" in out
    assert len(errors) == 2 and "no_such_fact" in errors[0]
    page = content.LESSONS[0]
    monkeypatch.setattr(markdown, "lesson_text", lambda pid: "x {{fact:no_such_fact}}\n" if pid == page.id else None)
    assert render.main([page.id]) == 1
    cap = capsys.readouterr()
    assert cap.out.startswith(f"# {page.number} · {page.title}") and f"{page.id}: unresolved" in cap.err
    assert "## Try it" in cap.out and all(f"**Widget: {registry.get(w).title}**" in cap.out for w in page.widgets)


def test_the_page_list_is_every_text_and_the_gpt_index(capsys):
    assert render.main(["--list"]) == 0
    ids = capsys.readouterr().out.split()
    assert sorted(ids) == sorted(p.stem for p in content.TEXT_DIR.glob("*.md"))
    assert ids[:2] == ["rl-00", "rl-01"] and "rl-18a" in ids and ids[-1] == "gpt-index"  # reading order
