"""posttrain serve: a real uvicorn server on 127.0.0.1, real HTTP clients (httpx and the openai package).

Every request is bounded: a handful per test, each with a timeout."""

import json
import threading

import pytest
import torch

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from posttrain.framework.logprobs import sequence_logprobs
from posttrain.framework.rollout import Engine
from posttrain.framework.sample import Sample
from posttrain.serve.app import RLPolicy, create_app
from posttrain.serve.batcher import (
    Batcher,
    Params,
)
from posttrain.serve.protocol import Request, choice_of
from posttrain.serve.records import Recorder
from posttrain.serve.server import Server

T = 10.0  # seconds: every request's bound


@pytest.fixture(scope="module")
def served():
    from posttrain.models.gpt_mini import GPTMini, ModelConfig
    from posttrain.models.tokenizer import CharTokenizer

    tok = CharTokenizer()
    torch.manual_seed(0)
    model = GPTMini(ModelConfig(preset="nano").resolved(tok.vocab_size)).eval()
    engine = Engine(model, tok, max_slots=64)
    batcher = Batcher(engine, seed=0)
    server = Server(create_app(batcher, tok, "nano", engine.max_len)).start()
    yield server.url, model, tok, batcher
    server.close()
    batcher.close()


def chat(url, body, **kw):
    return httpx.post(url + "/chat/completions", json={"model": "nano", **body}, timeout=T, **kw)


def test_openai_client_chat_returns_the_served_tokens_and_their_logprobs(served):
    openai = pytest.importorskip("openai")
    url, model, tok, _ = served
    client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=T)
    messages = [{"role": "user", "content": "3+4+5"}]
    out = client.chat.completions.create(
        model="nano",
        messages=messages,
        n=3,
        max_tokens=12,
        temperature=1.0,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    prompt = tok.encode(tok.chat_prompt(messages))
    assert out.model_extra["prompt_token_ids"] == prompt == tok.encode("<3+4+5>")
    assert len(out.choices) == 3 and out.usage.prompt_tokens == len(prompt)
    for ch in out.choices:
        ids = ch.model_extra["token_ids"]
        assert 1 <= len(ids) <= 12 and len(ch.logprobs.content) == len(ids)
        stopped = ch.finish_reason == "stop"
        assert stopped == (ids[-1] == tok.eot_id)
        assert ch.message.content == tok.decode(ids[:-1] if stopped else ids)  # the stop token is not text
        # the served logprobs are the model's own at T=1: recompute with the trainer's function (fp32)
        lp, _ = sequence_logprobs(model, torch.tensor([prompt + ids]), 1.0)
        served_lp = torch.tensor([c.logprob for c in ch.logprobs.content])
        assert torch.allclose(lp[0, len(prompt) :], served_lp, atol=1e-5)
    assert [m.id for m in client.models.list().data] == ["nano"]


def test_completions_take_strings_and_token_ids(served):
    url, _, tok, _ = served
    r = httpx.post(
        url + "/completions",
        json={
            "model": "nano",
            "prompt": ["<3+4>", tok.encode("<1+2>")],
            "n": 2,
            "max_tokens": 5,
            "logprobs": 0,
            "return_token_ids": True,
        },
        timeout=T,
    )
    assert r.status_code == 200
    body = r.json()
    assert len(body["choices"]) == 4  # 2 prompts × n=2, prompt-major
    assert [c["prompt_token_ids"] for c in body["choices"]] == [tok.encode("<3+4>")] * 2 + [tok.encode("<1+2>")] * 2
    for c in body["choices"]:
        assert len(c["logprobs"]["token_logprobs"]) == len(c["token_ids"]) <= 5
        toks = c["logprobs"]["tokens"]
        assert c["logprobs"]["text_offset"] == [sum(map(len, toks[:j])) for j in range(len(toks))]
        assert "".join(toks) == c["text"] or c["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"model": "gpt-4", "messages": [{"role": "user", "content": "1+1"}]}, 404, "model"),
        ({"messages": [{"role": "user", "content": "1+1"}], "n": 1000}, 400, "n"),
        ({"messages": [{"role": "user", "content": "1+1"}], "max_tokens": 100000}, 400, "max_tokens"),
        ({"messages": [{"role": "user", "content": "1+1"}], "max_tokens": 0}, 400, "max_tokens"),
        ({"messages": [{"role": "wizard", "content": "1+1"}]}, 400, "messages"),
        ({"messages": [{"role": "user", "content": "€"}]}, 400, "messages"),
        ({"messages": [{"role": "user", "content": "1+1"}], "top_logprobs": 5, "logprobs": True}, 400, "top_logprobs"),
        ({"messages": [{"role": "user", "content": "1+1"}], "temperature": "hot"}, 400, "temperature"),
        ({"messages": [{"role": "user", "content": "1+1"}], "tools": [{"type": "function"}]}, 400, "tools"),
        ({"messages": "1+1"}, 400, "messages"),
    ],
)
def test_bad_requests_are_4xx_naming_the_field_and_the_server_keeps_serving(served, body, status, param):
    url = served[0]
    r = httpx.post(url + "/chat/completions", json=body, timeout=T)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["param"] == param and err["message"]
    assert chat(url, {"messages": [{"role": "user", "content": "1+1"}], "max_tokens": 3}).status_code == 200


def test_malformed_json_is_400(served):
    url = served[0]
    r = httpx.post(
        url + "/chat/completions", content=b'{"messages": [', headers={"content-type": "application/json"}, timeout=T
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(url + "/completions", content=b"[1, 2]", timeout=T)  # JSON, but not an object
    assert r.status_code == 400


def test_a_client_that_leaves_mid_stream_ends_only_its_own_stream(served):
    url = served[0]
    body = {
        "model": "nano",
        "messages": [{"role": "user", "content": "1+2"}],
        "max_tokens": 40,
        "seed": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.Client(timeout=T) as c, c.stream("POST", url + "/chat/completions", json=body) as r:
        assert r.status_code == 200
        first = next(r.iter_lines())  # one event, then hang up
        assert first.startswith("data: ")
    # the server goes on: a full stream reassembles to the non-streamed reply of the same seed
    with httpx.Client(timeout=T) as c, c.stream("POST", url + "/chat/completions", json=body) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks if ch["choices"])
    assert chunks[-1]["usage"]["completion_tokens"] >= 1
    plain = chat(url, {**{k: v for k, v in body.items() if k not in ("stream", "stream_options", "model")}}).json()
    assert text == plain["choices"][0]["message"]["content"]


def test_a_seed_reproduces_and_concurrent_requests_share_engine_calls(served):
    url, _, _, batcher = served
    body = {"messages": [{"role": "user", "content": "5+6"}], "max_tokens": 20, "seed": 3}
    a, b = chat(url, body).json(), chat(url, body).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    calls = batcher.stats["serve/calls"]
    replies = [None] * 16

    def one(i):
        replies[i] = chat(url, {"messages": [{"role": "user", "content": f"{i}+1"}], "max_tokens": 8})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=3 * T)
    assert all(r is not None and r.status_code == 200 for r in replies)
    assert batcher.stats["serve/calls"] - calls < 16  # grouped: fewer engine calls than requests


def test_a_stop_string_cuts_the_served_tokens_and_the_text(tok):
    ids = tok.encode("12ab34#")
    sample = Sample(
        prompt_ids=[1],
        response_ids=ids,
        response_logprobs=[-0.5] * len(ids),
        response_mask=[1] * len(ids),
        finish_reason="stop",
        policy_version=0,
        group=0,
        index=0,
    )
    req = Request("chat", [[1]], Params(), stop_strings=("ab", "3"))
    c = choice_of(sample, req, tok)
    assert c.ids == tok.encode("12ab") and c.text == "12" and c.finish_reason == "stop" and len(c.logprobs) == 4
    c = choice_of(sample, Request("chat", [[1]], Params()), tok)
    assert c.ids == ids and c.text == "12ab34" and c.finish_reason == "stop"  # eot served, not text


def test_inside_rl_requests_name_an_open_episode_and_sample_at_the_run_temperature(served):
    _, model, tok, _ = served
    engine = Engine(model, tok, max_slots=8)
    batcher, rec = Batcher(engine), Recorder()
    policy = RLPolicy(temperature=1.0, max_new_tokens=6, recorder=rec)
    server = Server(create_app(batcher, tok, "nano", engine.max_len, policy=policy)).start()
    try:
        msg = {"messages": [{"role": "user", "content": "2+2"}]}
        r = chat(server.url, msg)
        assert r.status_code == 400 and r.json()["error"]["param"] == "user"
        assert chat(server.url, {**msg, "user": "nobody"}).status_code == 409
        rec.open(["ep1"])
        r = chat(server.url, {**msg, "temperature": 0.3, "max_tokens": 50}, headers={"X-Episode-Id": "ep1"})
        assert r.status_code == 200 and policy.overridden == 1
        turns = rec.close(["ep1"])["ep1"]
        assert len(turns) == 1 and 1 <= len(turns[0].completion_ids) <= 6  # capped at the run's max_new_tokens
        assert chat(server.url, {**msg, "user": "ep1"}).status_code == 409  # closed: no longer trained on
    finally:
        server.close()
        batcher.close()


def test_the_serve_command_serves_a_checkpoint_on_loopback(sft_ckpt):
    """`posttrain serve RUN --port 0` as a subprocess: it names its URL, answers, and stops on SIGTERM."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "posttrain.cli",
            "serve",
            str(sft_ckpt),
            "--port",
            "0",
            "--threads",
            "1",
            "--served-model-name",
            "sft",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        line = ""
        for line in proc.stdout:  # bounded: the process prints this line or exits
            if line.startswith("serving "):
                break
        url = line.split(" on ")[1].split(" ")[0]
        assert url.startswith("http://127.0.0.1:")
        r = httpx.post(
            url + "/chat/completions",
            timeout=30,
            json={"model": "sft", "messages": [{"role": "user", "content": "2+3"}], "max_tokens": 16},
        )
        assert r.status_code == 200 and r.json()["model"] == "sft"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_serve_command_refuses_a_missing_checkpoint_in_one_line(tmp_path):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "serve", str(tmp_path / "nope")],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "does not exist" in out.stderr and len(out.stderr.strip().splitlines()) <= 2
