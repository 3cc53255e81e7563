"""Headless Chromium walks every page of `posttrain lessons`, at a desktop width and at a phone's
(390 px): every widget draws, every knob moved once redraws the plot, the widget's breaking setting
draws too, and each of those figures is checked for overlapping or clipped labels
(lessons_browser_checks.py). A page fails on a console error, a failed request, text that overflows
its box, or a formula KaTeX could not typeset. The exported static copy is opened from disk: its
widgets answer from the precomputed data, its math is typeset and its search works with no server.
Screenshots go to $POSTTRAIN_SCREENSHOTS (default: pytest's tmp dir).

Needs Debian's chromium at /usr/bin/chromium (`apt-get install -y chromium`, done by .ci/run)
and the python package playwright (the `test` extra); `playwright install` is never run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from posttrain.lessons import content, registry, server

from lessons_browser_checks import FIGURE_CHECK, MATH_CHECK, TEXT_CHECK

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DESKTOP, PHONE = {"width": 1100, "height": 900}, {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():  # CI sets POSTTRAIN_REQUIRE_CHROMIUM: never a silent skip there
        if os.environ.get("POSTTRAIN_REQUIRE_CHROMIUM"):
            pytest.fail(
                f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium); "
                ".ci/run does this before the tests"
            )
        pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def site():
    httpd, url = server.start(0)
    yield url
    httpd.shutdown()


def _open(browser, viewport: dict):
    """A page that records console errors, uncaught exceptions, failed requests and HTTP errors."""
    page = browser.new_page(viewport=viewport)
    page.problems = []
    page.on("console", lambda m: page.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: page.problems.append(f"uncaught: {e}"))
    page.on("requestfailed", lambda r: page.problems.append(f"request failed: {r.url} ({r.failure})"))
    page.on("response", lambda r: page.problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    return page


def _plot_state(page, name: str):
    return page.evaluate(
        "n => { const el = document.querySelector(`.widget[data-widget='${n}']`);"
        " const p = el.querySelector('.plot');"
        " return [el.dataset.rev, JSON.stringify(p.data || null), el.querySelector('.error').textContent]; }",
        name,
    )


def _wait_rev(page, name: str, after: int, timeout=120_000):  # generous: CI machines are shared
    page.wait_for_function(
        "([n, r]) => { const el = document.querySelector(`.widget[data-widget='${n}']`);"
        " return (+el.dataset.rev > r || el.querySelector('.error').textContent) && el.dataset.busy === '0'; }",
        arg=[name, after],
        timeout=timeout,
    )


def _set(page, name: str, knob: registry.Knob, value: str) -> None:
    """Set a knob to `value` (its text form) as a user would."""
    sel = f".widget[data-widget='{name}'] [data-knob='{knob.name}']"
    values = [registry.fmt(v) for v in knob.values]
    if knob.kind == "check":
        page.click(sel)
    elif knob.kind == "select":
        page.select_option(sel, value)
    else:
        page.eval_on_selector(
            sel, "(el, j) => { el.value = j; el.dispatchEvent(new Event('input')); }", values.index(value)
        )


def _other(knob: registry.Knob) -> str:
    values = [registry.fmt(v) for v in knob.values]
    i = values.index(registry.fmt(knob.default))
    return values[i + 1 if i + 1 < len(values) else i - 1]


def _figure_ok(page, where: str, name: str) -> None:
    problems = page.eval_on_selector(f".widget[data-widget='{name}']", FIGURE_CHECK)
    assert not problems, f"{where}/{name}: {problems}"


def _walk_widget(page, where: str, name: str) -> int:
    """Every knob moved alone from the defaults, then the breaking setting; each redraw checked."""
    _wait_rev(page, name, 0)
    default = _plot_state(page, name)
    assert default[1] != "null" and not default[2], f"{where}/{name}: no plot ({default[2]})"
    _figure_ok(page, where, name)
    alt = page.eval_on_selector(f".widget[data-widget='{name}'] .plot", "p => p.getAttribute('aria-label')")
    note = registry.compute(name).get("note") or ""
    assert alt == registry.get(name).title + (f". {note}" if note else ""), f"{where}/{name}: alt text {alt!r}"
    rev = default[0]
    for knob in registry.get(name).knobs:
        _set(page, name, knob, _other(knob))
        _wait_rev(page, name, int(rev))
        after = _plot_state(page, name)
        assert not after[2], f"{where}/{name}: {after[2]}"
        assert after[1] != default[1], f"{where}/{name}: setting {knob.name}={_other(knob)} did not change the plot"
        _figure_ok(page, f"{where} ({knob.name}={_other(knob)})", name)
        rev = after[0]
        page.eval_on_selector(f".widget[data-widget='{name}']", "el => el.ptReset()")  # no redraw
    page.click(f".widget[data-widget='{name}'] .apply-break")
    _wait_rev(page, name, int(rev))
    _figure_ok(page, f"{where} (its breaking setting)", name)
    rev = _plot_state(page, name)[0]
    page.click(f".widget[data-widget='{name}'] .reset-knobs")  # the screenshot shows the defaults
    _wait_rev(page, name, int(rev))
    return len(registry.get(name).knobs)


def _check_page(page, where: str) -> None:
    assert not page.evaluate(TEXT_CHECK), f"{where}: {page.evaluate(TEXT_CHECK)}"
    assert not page.evaluate(MATH_CHECK), f"{where}: KaTeX did not typeset {page.evaluate(MATH_CHECK)}"
    assert not page.problems, f"{where}: {page.problems}"


def _walk(browser, base: str, viewport: dict, tag: str, shots: Path) -> int:
    page, moved = _open(browser, viewport), 0
    for ls in content.LESSONS:
        page.goto(f"{base}lessons/{ls.id}.html")
        page.wait_for_function(
            "() => [...document.querySelectorAll('.widget')].every(w => w.dataset.busy === '0')", timeout=120_000
        )
        for el in page.query_selector_all(".widget"):
            moved += _walk_widget(page, f"{tag} {ls.id}", el.get_attribute("data-widget"))
        page.screenshot(path=str(shots / f"{tag}-{ls.id}.png"), full_page=True)
        _check_page(page, f"{tag} {ls.id}")
    for other in ("index.html", "gpt_mini.html", "glossary.html", "source/posttrain/algorithms/__init__.py.html"):
        page.goto(base + other)
        page.wait_for_load_state("load")
        page.screenshot(path=str(shots / f"{tag}-{other.replace('/', '_')}.png"), full_page=True)
        _check_page(page, f"{tag} {other}")
    page.close()
    return moved


def _shots(tmp_path) -> Path:
    shots = Path(os.environ.get("POSTTRAIN_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    return shots


def _knobs_on_pages() -> int:
    from posttrain.lessons import pages

    return sum(len(registry.get(n).knobs) for ls in content.LESSONS for n in pages.lesson_view(ls).widgets)


@pytest.mark.slow
def test_every_page_every_knob_desktop(browser, site, tmp_path):
    assert _walk(browser, site, DESKTOP, "desktop", _shots(tmp_path)) == _knobs_on_pages()
    page = _open(browser, DESKTOP)  # progress is saved in the browser: tick 01, the index counts it
    page.goto(f"{site}lessons/rl-01.html")
    page.check(".lesson-done")
    page.goto(f"{site}index.html")
    assert page.text_content("#progress-count") == "1"
    page.close()


@pytest.mark.slow
def test_every_page_every_knob_phone(browser, site, tmp_path):
    assert _walk(browser, site, PHONE, "phone", _shots(tmp_path)) == _knobs_on_pages()


@pytest.mark.slow
def test_search_and_math_from_an_export_on_disk(browser, tmp_path):
    """A static copy opens from file://: a widget answers from precomputed data, the glossary's math is
    typeset by the vendored KaTeX, and the search box finds a glossary term and a lesson with no server."""
    out = server.export(tmp_path / "site", widgets=["advantages", "sync"], log=lambda *a: None)
    page = _open(browser, PHONE)
    page.goto((out / "lessons" / "rl-06.html").as_uri())
    _wait_rev(page, "sync", 0)
    knob = registry.get("sync").knobs[0]
    before = _plot_state(page, "sync")
    _set(page, "sync", knob, _other(knob))
    _wait_rev(page, "sync", int(before[0]))
    assert _plot_state(page, "sync")[1] != before[1]
    _figure_ok(page, "export rl-06", "sync")
    page.eval_on_selector(".widget[data-widget='sync']", "el => { el.dataset.busy = '1'; }")  # as while computing
    page.wait_for_function("() => +getComputedStyle(document.querySelector('.widget .busy')).opacity > 0.5")
    page.goto((out / "glossary.html").as_uri())
    page.wait_for_function("() => document.querySelectorAll('.katex').length > 20")
    assert not page.evaluate(MATH_CHECK)
    page.fill("#search", "baseline")
    page.wait_for_selector("#search-results li a")
    hits = page.eval_on_selector_all("#search-results li a", "as => as.map(a => a.textContent)")
    assert hits[0].startswith("Glossary · Baseline") and any(h.startswith("09 · REINFORCE") for h in hits)
    page.click("#search-results li a")
    page.wait_for_load_state("load")
    assert page.url.endswith("glossary.html#g-baseline")
    assert not page.problems, page.problems
    page.close()
