"""`posttrain serve RUN_OR_MODEL`: an OpenAI-compatible endpoint on the rollout engine.

    posttrain serve runs/rl [--port 8000] [--host 127.0.0.1]
    curl localhost:8000/v1/chat/completions -d '{"model": "runs/rl", "messages": [{"role": "user", "content": "3+4"}]}'

Any OpenAI client (the `openai` package, an agent framework, a `verifiers` environment) can chat
with or evaluate a posttrain checkpoint, a local Hugging Face model directory or a hub id
(`posttrain serve Qwen/Qwen2.5-0.5B-Instruct`: models/hub.py). The model runs
in the same `Engine` as RL's rollouts (framework/rollout.py); concurrent requests are grouped
into shared engine calls (serve/batcher.py). It binds 127.0.0.1 unless told otherwise.

`Server` runs uvicorn on a socket bound here, in the foreground (the command) or on a
background thread (an RL run serving its live policy to external agents, tests, benchmarks).
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time

from posttrain.errors import UsageError


def load_engine(run_or_model: str, device: str = "auto", threads: int = 0, max_slots: int = 256):
    """(engine, tokenizer) for a run, a checkpoint, a local Hugging Face model directory or a hub id."""
    from posttrain import checkpoint, runtime  # entry: no torch until called
    from posttrain.framework.backends import make_engine  # entry: no torch until called

    rt = runtime.resolve(device, "auto", threads)
    model, tok, _ = checkpoint.load_model(run_or_model, rt.device)
    model.eval()
    return make_engine(model, tok, max_slots=max_slots, runtime=rt), tok


class Server:
    """An app served by uvicorn on host:port (port 0 = a free one); `.url` is the OpenAI base URL."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        try:
            import uvicorn
        except ImportError:
            raise UsageError("posttrain serve needs FastAPI and uvicorn: pip install 'posttrain[serve]'") from None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
            self.sock.listen(2048)  # connections queue from now on, before uvicorn runs
        except OSError as e:
            raise UsageError(f"cannot listen on {host}:{port} ({e.strerror}); pick another --port") from None
        self.port = self.sock.getsockname()[1]
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        self.url = f"http://{shown}:{self.port}/v1"
        self.server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5)
        )
        self.thread: threading.Thread | None = None

    def start(self, timeout_s: float = 30.0) -> Server:
        """Serve on a background thread; return once it accepts connections."""
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, name="posttrain-serve", daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def run(self) -> None:
        """Serve in the foreground until Ctrl-C."""
        self.server.run(sockets=[self.sock])

    def close(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=15)
        self.sock.close()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="posttrain serve", description="An OpenAI-compatible server on the rollout engine."
    )
    p.add_argument(
        "model",
        metavar="RUN_OR_MODEL",
        help="a run directory, checkpoints/step_N, a local HF model directory or a hub id org/name[@revision]",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", help="the model name clients send (default: RUN_OR_MODEL as given)")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--max-slots", type=int, default=256, help="engine decode slots (continuous batching)")
    p.add_argument("--max-n", type=int, default=64, help="largest n (samples per request)")
    p.add_argument("--seed", type=int, default=0, help="seed of unseeded requests' draws")
    args = p.parse_args(argv)
    from posttrain.serve.app import create_app
    from posttrain.serve.batcher import Batcher  # entry: no torch until called
    from posttrain.serve.protocol import Limits  # entry: no torch until called

    engine, tok = load_engine(args.model, args.device, args.threads, args.max_slots)
    name = args.served_model_name or args.model
    batcher = Batcher(engine, args.seed)
    server = Server(create_app(batcher, tok, name, engine.max_len, Limits(max_n=args.max_n)), args.host, args.port)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: listening on {args.host}: anyone who can reach this address can sample from the model",
            file=sys.stderr,
        )
    print(f"serving {args.model} as {name!r} on {server.url} (OpenAI-compatible; Ctrl-C stops)", flush=True)
    try:
        server.run()
    finally:
        batcher.close()
