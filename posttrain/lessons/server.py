"""`posttrain lessons`: serve the site on the standard library's http.server, or export it.

    posttrain lessons [--port N]        http://127.0.0.1:N/ (N = 0: any free port)
    posttrain lessons --export DIR      a static copy; every widget's grid precomputed in DIR/data/

Routes: /index.html, /gpt_mini.html, /glossary.html, /search-index.js, /lessons/<id>.html,
/source/<path of a repository file>.html, /static/<asset> (katex/ included),
/api/<widget>?knob=value&... (JSON; a bad knob is a 400 with a one-line error).
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from posttrain.errors import UsageError
from posttrain.lessons import content, home, pages, registry, search

STATIC = Path(__file__).resolve().parent / "static"


def plotly_js() -> Path:
    """plotly's own bundled plotly.min.js (no CDN)."""
    try:
        import plotly
    except ImportError:
        raise UsageError("the lessons need plotly for their plots: pip install 'posttrain[lessons]'") from None
    path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    if not path.exists():
        raise UsageError(f"plotly is installed but has no {path}; reinstall plotly (pip install -U plotly)")
    return path


TYPES = {".js": "application/javascript", ".css": "text/css", ".woff2": "font/woff2"}


def asset(name: str) -> Path | None:
    """A file under static/ (plotly's bundle stands in for static/plotly.min.js); None outside it."""
    if name == "plotly.min.js":
        return plotly_js()
    path = (STATIC / name).resolve()
    return path if path.is_file() and path.is_relative_to(STATIC) and path.suffix in TYPES else None


def route(path: str, query: str) -> tuple[int, str, bytes]:
    """(status, content type, body) of a GET."""
    path = unquote(path)
    if path in ("/", "/index.html"):
        return 200, "text/html", home.render_index().encode()
    if path == "/gpt_mini.html":
        return 200, "text/html", pages.render_gpt_index().encode()
    if path == "/glossary.html":
        return 200, "text/html", pages.render_glossary().encode()
    if path == "/search-index.js":
        return 200, "application/javascript", search.script().encode()
    if path.startswith("/lessons/") and path.endswith(".html"):
        lesson = content.by_id(path[len("/lessons/") : -5])
        return 200, "text/html", pages.render_lesson(lesson).encode()
    if path.startswith("/source/") and path.endswith(".html"):
        rel = path[len("/source/") : -5]
        return 200, "text/html", pages.render_source(rel).encode()
    if path.startswith("/static/"):
        f = asset(path[len("/static/") :])
        if f is None:
            return 404, "text/plain", b"not found"
        return 200, TYPES[f.suffix], f.read_bytes()
    if path.startswith("/api/"):
        out = registry.compute(path[len("/api/") :], dict(parse_qsl(query, keep_blank_values=True)))
        return 200, "application/json", json.dumps(out).encode()
    return 404, "text/plain", b"not found"


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        url = urlsplit(self.path)
        try:
            status, kind, body = route(url.path, url.query)
        except UsageError as e:
            status, kind, body = 400, "application/json", json.dumps({"error": str(e)}).encode()
        except Exception as e:  # a widget bug must not kill the server; the page shows the error
            status, kind, body = 500, "application/json", json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", kind if kind.startswith("font/") else f"{kind}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):  # quiet: the terminal shows the address, not every GET
        pass


def start(port: int = 0, host: str = "127.0.0.1") -> tuple[ThreadingHTTPServer, str]:
    """A running server in a daemon thread (tests use this) and its address."""
    plotly_js()  # fail early, with the fix, if plotly is missing
    httpd = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://{host}:{httpd.server_address[1]}/"


def serve(port: int) -> None:
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port} is not a TCP port; use 1-65535 (or 0 for any free port)")
    try:
        httpd, url = start(port)
    except OSError as e:
        raise UsageError(f"cannot listen on port {port} ({e.strerror}); pick another with --port N") from None
    print(f"posttrain lessons: {url}  (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        httpd.shutdown()


def export(out: str | Path, widgets: list[str] | None = None, log=print) -> Path:
    """Write the whole site to `out`, every widget's knob grid precomputed as data/<widget>.js
    (script files, not JSON fetches, so the pages work from file:// without a server).
    `widgets` limits the precomputation to those (tests); by default every widget on a page."""
    bundle = plotly_js()  # before writing anything: a missing extra is one line
    out = Path(out)
    for sub in ("lessons", "source", "data"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    (out / "index.html").write_text(home.render_index(static=True))
    (out / "gpt_mini.html").write_text(pages.render_gpt_index(static=True))
    (out / "glossary.html").write_text(pages.render_glossary(static=True))
    (out / "search-index.js").write_text(search.script())
    on_pages = set(pages.gpt_view().widgets)
    for ls in content.LESSONS:
        (out / "lessons" / f"{ls.id}.html").write_text(pages.render_lesson(ls, static=True))
        on_pages |= set(pages.lesson_view(ls).widgets)
    for rel in pages.source_files():
        dest = out / "source" / pages.source_name(rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(pages.render_source(rel, static=True))
    shutil.copytree(STATIC, out / "static", dirs_exist_ok=True)
    shutil.copyfile(bundle, out / "static" / "plotly.min.js")
    for name in widgets or sorted(on_pages):
        w = registry.get(name)
        t0 = time.perf_counter()
        data = {
            w.key(knobs): registry.compute(name, {k: registry.fmt(v) for k, v in knobs.items()}) for knobs in w.grid()
        }
        (out / "data" / f"{name}.js").write_text(f"PT.data[{json.dumps(name)}] = {json.dumps(data)};\n")
        log(f"[lessons] {name}: {len(data)} settings ({time.perf_counter() - t0:.1f} s)")
    return out


def main(port: int = 8000, export_dir: str | None = None) -> None:
    if export_dir:
        path = export(export_dir)
        print(f"posttrain lessons: static copy in {path.resolve()}; open {path.resolve() / 'index.html'}")
        return
    serve(port)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8000)
