"""The OpenAI wire format: request bodies checked and turned into prompts, samples turned into replies.

Field names follow the OpenAI API, and vLLM's where the API has none: `return_token_ids: true`
adds the served token ids (a chat reply's `prompt_token_ids` and each choice's `token_ids`; a
completion choice carries both), and `top_k` and `ignore_eos` are accepted as in vLLM. Every
refusal is a `RequestError` with the status and a message naming the field."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from posttrain.chat import check_messages
from posttrain.errors import UsageError
from posttrain.serve.batcher import Params


class RequestError(Exception):
    """A request the server refuses: HTTP `status`, a message naming the field, OpenAI's error type."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


@dataclass
class Limits:
    max_n: int = 64  # samples per request
    max_prompts: int = 64  # prompts per /v1/completions request


@dataclass
class Request:
    kind: str  # chat | completion
    prompts: list[list[int]]  # one for chat; one or more for completions
    params: Params
    stop_strings: tuple[str, ...] = ()  # multi-token stops, cut after sampling
    logprobs: bool = False
    token_ids: bool = False  # return_token_ids
    stream: bool = False
    include_usage: bool = False
    episode: str | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])


def _get(body: dict, key: str, types, default=None, check=None, why: str = ""):
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise RequestError(400, f"'{key}' must be {why or types}, got {value!r}", key)
    if not isinstance(value, types) or (check is not None and not check(value)):
        raise RequestError(400, f"'{key}' must be {why or types}, got {json.dumps(value)[:60]}", key)
    return value


def parse(body, kind: str, tok, model_name: str, max_len: int, limits: Limits, headers) -> Request:
    """A request body (already JSON-decoded) as a `Request`, or a RequestError naming what is wrong."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != model_name:
        raise RequestError(
            404,
            f"The model '{model}' does not exist; this server serves '{model_name}' (GET /v1/models)",
            "model",
            "not_found_error",
        )
    for unsupported in ("tools", "functions", "suffix") + (("echo",) if body.get("echo") else ()):
        if body.get(unsupported):
            raise RequestError(
                400,
                f"'{unsupported}' is not supported by this server (the policy writes tool calls as text); leave it out",
                unsupported,
            )
    if kind == "chat":
        try:
            messages = check_messages(body.get("messages"), "messages")
            prompts = [tok.encode(tok.chat_prompt(messages))]
        except UsageError as e:
            raise RequestError(400, str(e), "messages") from None
    else:
        prompts = _completion_prompts(body.get("prompt"), tok, limits)
    n = _get(body, "n", int, 1, lambda v: 1 <= v <= limits.max_n, f"an integer in [1, {limits.max_n}]")
    temperature = float(_get(body, "temperature", (int, float), 1.0, lambda v: 0 <= v <= 100, "a number >= 0"))
    top_p = float(_get(body, "top_p", (int, float), 1.0, lambda v: 0 < v <= 1, "a number in (0, 1]"))
    top_k = _get(body, "top_k", int, 0, lambda v: v >= -1, "an integer >= -1 (-1 or 0 = off)")
    seed = _get(body, "seed", int, None, None, "an integer")
    longest = max(len(p) for p in prompts)
    room = max_len - longest
    if room < 1:
        raise RequestError(
            400,
            f"This model's maximum context length is {max_len} tokens; the prompt has {longest} "
            "tokens, which leaves no room for a completion",
            "messages" if kind == "chat" else "prompt",
        )
    cap_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_new = _get(body, cap_key, int, room, lambda v: v >= 1, "an integer >= 1")
    if max_new > room:
        raise RequestError(
            400,
            f"This model's maximum context length is {max_len} tokens; the prompt has {longest} "
            f"tokens and {cap_key}={max_new} asks for {longest + max_new}; lower {cap_key} to at most "
            f"{room}",
            cap_key,
        )
    stop_ids, stop_strings = _stops(body.get("stop"), tok)
    if kind == "chat":
        logprobs = bool(_get(body, "logprobs", bool, False, None, "true or false"))
        top = _get(body, "top_logprobs", int, 0, lambda v: v >= 0, "an integer >= 0")
    else:
        lp = _get(body, "logprobs", int, None, lambda v: v >= 0, "an integer >= 0")
        logprobs, top = lp is not None, lp or 0
    if top:
        raise RequestError(
            400,
            f"top_logprobs={top}: the engine records the sampled token's logprob only; ask for "
            "logprobs without alternatives (top_logprobs=0)",
            "top_logprobs" if kind == "chat" else "logprobs",
        )
    stream = bool(_get(body, "stream", bool, False, None, "true or false"))
    options = _get(body, "stream_options", dict, {}, None, "an object")
    episode = (
        headers.get("x-episode-id") or headers.get("x-session-id") or _get(body, "user", str, None, None, "a string")
    )
    return Request(
        kind,
        prompts,
        Params(
            n=n,
            temperature=temperature,
            top_k=max(top_k, 0),
            top_p=top_p,
            max_new_tokens=max_new,
            stop_ids=stop_ids,
            seed=seed,
            ignore_eos=bool(_get(body, "ignore_eos", bool, False, None, "true or false")),
        ),
        stop_strings,
        logprobs,
        bool(_get(body, "return_token_ids", bool, False, None, "true or false")),
        stream,
        bool(options.get("include_usage")),
        episode,
    )


def _completion_prompts(prompt, tok, limits: Limits) -> list[list[int]]:
    """A string, a list of token ids, or a list of either (several prompts), as token ids."""
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise RequestError(
            400, "'prompt' must be a string, a list of token ids, or a non-empty list of those", "prompt"
        )
    if len(prompt) > limits.max_prompts:
        raise RequestError(
            400, f"'prompt' holds {len(prompt)} prompts; at most {limits.max_prompts} per request", "prompt"
        )
    out = []
    for i, p in enumerate(prompt):
        if isinstance(p, str):
            try:
                ids = tok.encode(p)
            except UsageError as e:
                raise RequestError(400, f"prompt {i}: {e}", "prompt") from None
        elif isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            ids = p
            if any(not 0 <= t < tok.vocab_size for t in ids):
                raise RequestError(400, f"prompt {i}: token ids must be in [0, {tok.vocab_size})", "prompt")
        else:
            raise RequestError(400, f"prompt {i} must be a string or a list of token ids", "prompt")
        if not ids:
            raise RequestError(400, f"prompt {i} is empty", "prompt")
        out.append(ids)
    return out


def _stops(stop, tok) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """`stop` strings: one-token ones stop the engine there; longer ones are cut after sampling."""
    if stop is None:
        return (), ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError(400, "'stop' must be a non-empty string or a list of them", "stop")
    ids, strings = [], []
    for s in stops:
        try:
            enc = tok.encode(s)
        except UsageError as e:
            raise RequestError(400, f"stop {s!r}: {e}", "stop") from None
        (ids.append(enc[0]) if len(enc) == 1 else strings.append(s))
    return tuple(ids), tuple(strings)


# ---- replies ---------------------------------------------------------------------------------


@dataclass
class Choice:
    """One served completion: the tokens the reply reports and the policy sampled."""

    ids: list[int]  # served completion ids (cut at a stop string)
    logprobs: list[float]
    versions: list[int]
    text: str
    finish_reason: str
    policy_version: int


def choice_of(sample, req: Request, tok) -> Choice:
    """Cut a sample at its first stop string; the text leaves out the stop (token or string), as vLLM does."""
    ids, stopped = list(sample.response_ids), sample.finish_reason == "stop"
    text_ids = ids[:-1] if stopped and ids else ids  # the stop token is not text
    text = tok.decode(text_ids)
    if req.stop_strings:
        for j in range(1, len(ids) + 1):
            part = tok.decode(ids[:j])
            hits = [part.find(s) for s in req.stop_strings if s in part]
            if hits:
                ids, text, stopped = ids[:j], part[: min(hits)], True
                break
    n = len(ids)
    versions = (sample.token_versions or [sample.policy_version] * len(sample.response_ids))[:n]
    return Choice(
        ids, list(sample.response_logprobs[:n]), versions, text, "stop" if stopped else "length", sample.policy_version
    )


def _token_logprobs(choice: Choice, tok) -> list[dict]:
    out = []
    for t, lp in zip(choice.ids, choice.logprobs):
        s = tok.decode([t])
        out.append({"token": s, "logprob": lp, "bytes": list(s.encode()), "top_logprobs": []})
    return out


def reply(req: Request, prompts: list[list[int]], choices: list[Choice], model: str, tok) -> dict:
    """The whole (non-streamed) reply: chat.completion or text_completion."""
    usage = {
        "prompt_tokens": sum(len(p) for p in prompts) if req.kind == "completion" else len(prompts[0]),
        "completion_tokens": sum(len(c.ids) for c in choices),
    }
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    body = {
        "id": ("chatcmpl-" if req.kind == "chat" else "cmpl-") + req.id,
        "object": "chat.completion" if req.kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage,
        "policy_version": min(c.policy_version for c in choices),
    }
    for i, c in enumerate(choices):
        if req.kind == "chat":
            ch = {
                "index": i,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": {"content": _token_logprobs(c, tok)} if req.logprobs else None,
                "finish_reason": c.finish_reason,
            }
        else:
            toks = [tok.decode([t]) for t in c.ids]
            offsets = [sum(len(x) for x in toks[:j]) for j in range(len(toks))]
            ch = {
                "index": i,
                "text": c.text,
                "finish_reason": c.finish_reason,
                "logprobs": {"tokens": toks, "token_logprobs": c.logprobs, "top_logprobs": None, "text_offset": offsets}
                if req.logprobs
                else None,
            }
            if req.token_ids:
                ch["prompt_token_ids"] = prompts[i // req.params.n]
        if req.token_ids:
            ch["token_ids"] = c.ids
        body["choices"].append(ch)
    if req.token_ids and req.kind == "chat":
        body["prompt_token_ids"] = prompts[0]
    return body


def stream_events(full: dict, req: Request):
    """The reply as server-sent events, a few characters per chunk (the tokens are all sampled
    already: streaming shapes the delivery, not the latency), then usage if asked, then [DONE]."""
    base = {k: full[k] for k in ("id", "created", "model")}
    obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
    for ch in full["choices"]:
        pieces = list(_pieces(ch, req))
        for j, piece in enumerate(pieces):
            last = j == len(pieces) - 1
            if req.kind == "chat":
                delta = {"role": "assistant", "content": piece} if j == 0 else {"content": piece}
                c = {
                    "index": ch["index"],
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": ch["finish_reason"] if last else None,
                }
            else:
                c = {
                    "index": ch["index"],
                    "text": piece,
                    "logprobs": None,
                    "finish_reason": ch["finish_reason"] if last else None,
                }
            if last and req.token_ids:
                c["token_ids"] = ch["token_ids"]
            yield f"data: {json.dumps({**base, 'object': obj, 'choices': [c]})}\n\n"
    if req.include_usage:
        yield f"data: {json.dumps({**base, 'object': obj, 'choices': [], 'usage': full['usage']})}\n\n"
    yield "data: [DONE]\n\n"


def _pieces(ch: dict, req: Request):
    text = ch["message"]["content"] if req.kind == "chat" else ch["text"]
    chunks = [text[i : i + 4] for i in range(0, len(text), 4)] or [""]
    yield from chunks
