"""`posttrain lessons`: serve the site on the standard library's http.server, or export it.

    posttrain lessons [--port N]        http://127.0.0.1:N/ (N = 0: any free port)
    posttrain lessons --export DIR      a static copy; every widget's grid precomputed in DIR/data/

Routes: /index.html, /lessons/<id>.html, /source/<file>.html, /static/<asset>,
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

from posttrain import UsageError
from posttrain.lessons import content, pages, registry

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


def asset(name: str) -> Path | None:
    if name == "plotly.min.js":
        return plotly_js()
    path = STATIC / name
    return path if path.is_file() and path.parent == STATIC else None


def route(path: str, query: str) -> tuple[int, str, bytes]:
    """(status, content type, body) of a GET."""
    path = unquote(path)
    if path in ("/", "/index.html"):
        return 200, "text/html", pages.render_index().encode()
    if path.startswith("/lessons/") and path.endswith(".html"):
        lesson = content.by_id(path[len("/lessons/"):-5])
        return 200, "text/html", pages.render_lesson(lesson).encode()
    if path.startswith("/source/") and path.endswith(".html"):
        rel = path[len("/source/"):-5].replace("__", "/")
        return 200, "text/html", pages.render_source(rel).encode()
    if path.startswith("/static/"):
        f = asset(path[len("/static/"):])
        if f is None:
            return 404, "text/plain", b"not found"
        kind = "application/javascript" if f.suffix == ".js" else "text/css"
        return 200, kind, f.read_bytes()
    if path.startswith("/api/"):
        out = registry.compute(path[len("/api/"):], dict(parse_qsl(query, keep_blank_values=True)))
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
        self.send_header("Content-Type", f"{kind}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):  # quiet: the terminal shows the address, not every GET
        pass


def start(port: int = 0, host: str = "127.0.0.1") -> tuple[ThreadingHTTPServer, str]:
    """A running server in a daemon thread (tests use this) and its address."""
    plotly_js()                                          # fail early, with the fix, if plotly is missing
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
    (script files, not JSON fetches, so the pages work from file:// without a server)."""
    out = Path(out)
    for sub in ("lessons", "source", "static", "data"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    (out / "index.html").write_text(pages.render_index(static=True))
    for ls in content.LESSONS:
        (out / "lessons" / f"{ls.id}.html").write_text(pages.render_lesson(ls, static=True))
    for rel in pages.source_files():
        (out / "source" / pages.source_name(rel)).write_text(pages.render_source(rel, static=True))
    for name in ("app.js", "style.css"):
        shutil.copyfile(STATIC / name, out / "static" / name)
    shutil.copyfile(plotly_js(), out / "static" / "plotly.min.js")
    names = widgets or sorted({n for ls in content.LESSONS for n in ls.widgets})
    for name in names:
        w = registry.get(name)
        t0 = time.perf_counter()
        data = {w.key(knobs): registry.compute(name, {k: registry.fmt(v) for k, v in knobs.items()})
                for knobs in w.grid()}
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
