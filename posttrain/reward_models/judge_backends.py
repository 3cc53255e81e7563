"""Where a judge's replies come from: a model in this process, or an OpenAI-compatible server.

Both answer `complete(prompts, step) -> [reply text | Exception]`: one user message per prompt,
one reply each, an exception in place of a reply that failed, so reward_models/judge.py counts failures
per call and the step goes on.

  EngineJudge   a posttrain run/checkpoint or a Hugging Face directory, loaded once and sampled
                by the rollout engine (framework/rollout.py) with the model's chat template.
  HTTPJudge     `POST {url}/chat/completions` (any OpenAI-compatible server: `posttrain serve`,
                vLLM, SGLang, a hosted API) through httpx, `concurrency` requests in flight, each
                under a hard deadline of `timeout_s` (asyncio.wait_for: a server that accepts and
                never answers costs one failed call, not a stalled step).
"""

from __future__ import annotations

import asyncio
import os

import torch

from posttrain import checkpoint
from posttrain.errors import UsageError
from posttrain.framework.backends import make_engine
from posttrain.framework.rollout import SamplingParams
from posttrain.tasks.base import JudgeConfig
from posttrain.tasks.rewards import _await


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def make_backend(cfg: JudgeConfig):
    return HTTPJudge(cfg) if is_url(cfg.model) else EngineJudge(cfg)


class EngineJudge:
    """A checkpoint sampled in this process: greedy (temperature 0) unless `temperature` says otherwise."""

    def __init__(self, cfg: JudgeConfig, device="cpu"):
        self.cfg = cfg
        self.model, self.tok, path = checkpoint.load_model(cfg.model, device)  # a UsageError names a bad path
        self.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)  # frozen: never in an optimizer
        self.engine, self.name = make_engine(self.model, self.tok), str(path)

    def start(self, probe: str) -> None:
        """The template must fit the judge's context with room for its reply: `probe` is the judge prompt
        of a real item with empty responses (JudgeTask.probe)."""
        text = probe
        n = len(self._encode(text))
        if n + self.cfg.max_tokens > self.engine.max_len:
            raise UsageError(
                f"task.judge.template: the judge prompt is {n} tokens before any response; with "
                f"task.judge.max_tokens={self.cfg.max_tokens} it leaves no room in the judge's context "
                f"({self.engine.max_len}); shorten the template"
            )

    def _encode(self, text: str) -> list[int]:
        return self.tok.encode(self.tok.chat_prompt(text))

    def complete(self, prompts: list[str], step: int = 0) -> list:
        out: list = [None] * len(prompts)
        todo, ids = [], []
        for k, text in enumerate(prompts):
            try:
                enc = self._encode(text)
            except Exception as e:  # noqa: BLE001 — a character the judge cannot read: this call fails
                out[k] = e
                continue
            if len(enc) + self.cfg.max_tokens > self.engine.max_len:
                out[k] = ValueError(f"judge prompt of {len(enc)} tokens + max_tokens exceeds the judge's context")
                continue
            todo.append(k)
            ids.append(enc)
        if ids:
            params = SamplingParams(temperature=self.cfg.temperature, max_new_tokens=self.cfg.max_tokens)
            with torch.no_grad():
                samples = self.engine.generate(ids, 1, params, seed=0, step=step)
            for k, s in zip(todo, samples):
                out[k] = self.tok.completion_text(s.response_ids)  # the reply without its end of turn
        return out


class HTTPJudge:
    """An OpenAI-compatible chat endpoint (`model` = its base URL, ending in /v1)."""

    def __init__(self, cfg: JudgeConfig):
        try:
            import httpx
        except ImportError:
            raise UsageError(
                "task.judge.model is a URL: the HTTP client needs httpx; pip install 'posttrain[judge]'"
            ) from None
        self.httpx, self.cfg, self.url = httpx, cfg, cfg.model.rstrip("/")
        self.name = cfg.api_model

    def _headers(self) -> dict:
        key = os.environ.get(self.cfg.api_key_env, "") if self.cfg.api_key_env else ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    def start(self, probe: str = "") -> None:
        """Reach the server once before training and learn the model's name when none is given (the
        server sizes its own context: `probe` is not needed)."""
        try:
            r = self.httpx.get(f"{self.url}/models", headers=self._headers(), timeout=self.cfg.timeout_s)
            r.raise_for_status()
            listed = [m["id"] for m in r.json().get("data", [])]
        except Exception as e:  # noqa: BLE001 — one line naming the key, before any step
            raise UsageError(
                f"task.judge.model={self.url}: GET {self.url}/models failed ({type(e).__name__}: "
                f"{str(e)[:100]}); start the server or fix the URL (it ends in /v1)"
            ) from None
        if not self.name:
            if not listed:
                raise UsageError(f"task.judge.model={self.url}: the server lists no model; set task.judge.api_model")
            self.name = listed[0]

    def complete(self, prompts: list[str], step: int = 0) -> list:
        if not self.name:
            self.start()

        return _await(self._all(prompts))

    async def _all(self, prompts: list[str]) -> list:
        gate = asyncio.Semaphore(self.cfg.concurrency)
        async with self.httpx.AsyncClient(timeout=self.cfg.timeout_s, headers=self._headers()) as client:

            async def one(text: str):
                async with gate:
                    try:
                        return await asyncio.wait_for(self._call(client, text), self.cfg.timeout_s)
                    except asyncio.TimeoutError:
                        return TimeoutError(f"no reply within task.judge.timeout_s={self.cfg.timeout_s:g}")
                    except Exception as e:  # noqa: BLE001 — the reply of this call is the error
                        return e

            return list(await asyncio.gather(*(one(t) for t in prompts)))

    async def _call(self, client, text: str) -> str:
        body = {
            "model": self.name,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": self.cfg.max_tokens,
            "temperature": self.cfg.temperature,
            "n": 1,
        }
        r = await client.post(f"{self.url}/chat/completions", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:100]}")
        content = r.json()["choices"][0]["message"]["content"]
        if not isinstance(content, str):
            raise ValueError(f"reply content is {type(content).__name__}, not text")
        return content
