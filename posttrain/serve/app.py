"""The HTTP routes of `posttrain serve` (FastAPI, the `serve` extra): /v1/chat/completions, /v1/completions, /v1/models.

    app = create_app(batcher, tokenizer, "runs/rl", max_len=256)        # plain serving
    app = create_app(..., policy=RLPolicy(temperature=1.0, max_new_tokens=64, recorder=rec))   # inside RL

A handler parses the body (serve/protocol.py), queues each prompt on the batcher, awaits the
samples and answers; the event loop never runs the model. A bad request is a 4xx JSON error
naming the field, and the server goes on serving; a client that leaves mid-stream only ends
its own stream.

Inside RL (`policy`), sampling belongs to the run, not the agent: every request must name an
open episode (header X-Episode-Id / X-Session-ID, or `user`), is sampled at the run's
temperature with top-k/top-p off (the trainer recomputes logprobs at that temperature), and is
capped at the run's `rollout.max_new_tokens`; a request whose sampling was changed that way is
counted (`rollout/sampling_overridden`). Each served choice is recorded for its episode
(serve/records.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, StreamingResponse

from posttrain.serve.protocol import (
    Limits,
    Request,
    RequestError,
    choice_of,
    parse,
    reply,
    stream_events,
)
from posttrain.serve.records import Recorder, Turn


@dataclass
class RLPolicy:
    """The run's sampling and the episode recorder, for a server inside an RL run."""

    temperature: float
    max_new_tokens: int
    recorder: Recorder
    overridden: int = 0  # requests whose temperature / top-k / top-p the run replaced

    def apply(self, req: Request) -> Request:
        if req.episode is None:
            raise RequestError(
                400,
                "inside an RL run every request names its episode: send the header X-Episode-Id "
                "(or X-Session-ID) or the 'user' field with the id the run gave the agent",
                "user",
            )
        if not self.recorder.is_open(req.episode):
            raise RequestError(
                409,
                f"episode {req.episode!r} is not open: it was never started by this step or it has "
                "already ended (its tokens are no longer trained on)",
                "user",
            )
        p = req.params
        if (p.temperature, p.top_k, p.top_p) != (self.temperature, 0, 1.0):
            self.overridden += 1
        params = dataclasses.replace(
            p,
            temperature=self.temperature,
            top_k=0,
            top_p=1.0,
            seed=None,
            ignore_eos=False,
            max_new_tokens=min(p.max_new_tokens, self.max_new_tokens),
        )
        return dataclasses.replace(req, params=params)


def create_app(
    batcher, tok, model_name: str, max_len: int, limits: Limits | None = None, policy: RLPolicy | None = None
):
    limits = limits or Limits()
    app = FastAPI(title="posttrain", docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())

    @app.exception_handler(RequestError)
    async def refused(_request, exc: RequestError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [
                {
                    "id": model_name,
                    "object": "model",
                    "created": created,
                    "owned_by": "posttrain",
                    "max_model_len": max_len,
                }
            ],
        }

    @app.post("/v1/chat/completions")
    async def chat(request: HTTPRequest):
        return await serve(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest):
        return await serve(request, "completion")

    async def serve(request, kind: str):
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(400, f"the request body is not valid JSON ({e})") from None
        req = parse(body, kind, tok, model_name, max_len, limits, request.headers)
        if policy is not None:
            req = policy.apply(req)
        futures = [asyncio.wrap_future(batcher.submit(p, req.params)) for p in req.prompts]
        try:
            results = await asyncio.gather(*futures)
        except RequestError:
            raise
        except Exception as e:  # noqa: BLE001 - the engine failed on this call: a 500 that names it
            raise RequestError(500, f"generation failed: {type(e).__name__}: {e}", kind="server_error") from None
        choices = [choice_of(s, req, tok) for samples in results for s in samples]
        if policy is not None:
            for i, c in enumerate(choices):
                turn = Turn(
                    req.prompts[i // req.params.n], c.ids, c.logprobs, c.versions, c.policy_version, c.finish_reason
                )
                if not policy.recorder.add(req.episode, turn):
                    raise RequestError(
                        409,
                        f"episode {req.episode!r} ended while this request was sampled; its tokens are not trained on",
                        "user",
                    )
        full = reply(req, req.prompts, choices, model_name, tok)
        if req.stream:
            return StreamingResponse(stream_events(full, req), media_type="text/event-stream")
        return JSONResponse(full)

    return app
