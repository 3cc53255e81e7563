"""Judge rewards (tasks/judge.py, tasks/judges.py): parsing, order randomisation, failure counting
against real HTTP servers started here, the in-process judge, the frozen template, config."""

import json
import re
import socket
import threading
import time

import pytest

from posttrain import UsageError
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from posttrain.tasks.base import JudgeConfig
from posttrain.tasks.judge import JudgeError, JudgeTask, comparisons, parse_choice, parse_score, render

from test_agent_hf import hf_dir  # noqa: F401 (the fixture: a BPE tokenizer and a tiny Llama trained here)

SCORES = [  # reply, scale, reward
    ("Score: 7", 10, 0.7),
    ("The response is right.\nScore: 10", 10, 1.0),
    ("**Score:** 3", 10, 0.3),
    ("Rating: [[8]]", 10, 0.8),
    ("I'd give it 4/5.", 10, 0.8),  # its own denominator wins
    ("Score: 6/10", 10, 0.6),
    ("3 out of 4", 1, 0.75),
    ("9", 10, 0.9),
    ("**5**", 10, 0.5),
    ('{"score": 2, "why": "wrong sum"}', 10, 0.2),
    ("<think>maybe 2? no, score: 1</think>Score: 9", 10, 0.9),  # hidden reasoning is ignored
    ("score: 2 ... on reflection, score: 5", 10, 0.5),  # the last verdict counts
    ("{3+4=7;7+5=12}12 score: 1", 1, 1.0),  # the built-in judge's own trace first
    ("score: 0.5", 1, 0.5),
]
BAD_SCORES = ["", "It is good.", "Score: 11", "Score: -1", "3 and 4", "12/0", "[[12]]"]
CHOICES = [
    ("[[A]]", "A"),
    ("My verdict: [[B]]", "B"),
    ("[[C]]", "tie"),
    ("Winner: B", "B"),
    ("Response A is better.", "A"),
    ("Output (b) is more accurate", "B"),
    ("A", "A"),
    ("**B**", "B"),
    ('{"winner": "A"}', "A"),
    ("It's a tie.", "tie"),
    ("<think>[[A]]</think>[[B]]", "B"),
    ("Both are equally good", "tie"),
    ("The better response is B", "B"),
    ("[[A]] hmm no [[B]]", "B"),
]
BAD_CHOICES = ["", "Response A says 3 and Response B says 4", "I cannot decide", "Winner: D"]


@pytest.mark.parametrize("reply,scale,want", SCORES)
def test_parse_score_table(reply, scale, want):
    assert parse_score(reply, scale) == pytest.approx(want)


@pytest.mark.parametrize("reply", BAD_SCORES)
def test_parse_score_refuses(reply):
    with pytest.raises(JudgeError):
        parse_score(reply, 10)


@pytest.mark.parametrize("reply,want", CHOICES)
def test_parse_choice_table(reply, want):
    assert parse_choice(reply) == want


@pytest.mark.parametrize("reply", BAD_CHOICES)
def test_parse_choice_refuses(reply):
    with pytest.raises(JudgeError):
        parse_choice(reply)


def test_render_fills_fields_once():
    t = 'Q {question} R {response} {"score": N}'
    assert render(t, question="1+2", response="says {question}") == 'Q 1+2 R says {question} {"score": N}'


def test_comparisons_ring_and_coin():
    """Each response of a group of 8 meets its 2 ring neighbours each way (4 comparisons, no pair twice,
    never across groups); the coin flips are pure in (step, group, pair) and near half over 4 groups × 100 steps."""
    cfg = JudgeConfig(model="x", mode="pairwise", pairs=2)
    items = [g for g in range(4) for _ in range(8)]
    comps = comparisons(items, [""] * 32, cfg, step=3, key=str)
    assert len(comps) == 4 * 16
    assert len({(min(i, j), max(i, j)) for i, j, _ in comps}) == len(comps)
    assert all(items[i] == items[j] for i, j, _ in comps)
    assert all(sum(k in (i, j) for i, j, _ in comps) == 4 for k in range(32))
    assert comps == comparisons(items, [""] * 32, cfg, step=3, key=str)
    flips = [s for step in range(100) for _, _, s in comparisons(items, [""] * 32, cfg, step, str)]
    assert 0.45 < sum(flips) / len(flips) < 0.55
    assert comparisons(items, [""] * 32, cfg, 4, str) != comps
    small = comparisons([0, 0], ["", ""], cfg, 0, str)  # a pair meets once whatever `pairs` is
    assert [(i, j) for i, j, _ in small] == [(0, 1)]


class Scripted:
    """A judge backend that answers from a function of the prompt (stands in for the model, not for
    any integration: the HTTP and in-process backends are tested against real servers and models below)."""

    def __init__(self, answer):
        self.answer, self.prompts = answer, []

    def start(self, task):
        pass

    def complete(self, prompts, step=0):
        self.prompts += prompts
        return [self.answer(p) for p in prompts]


def _task(**judge):
    return ArithmeticTask(ArithmeticConfig(max_terms=2))


def _batch(task, n_items=4, per=4):
    """Responses to `n_items` problems, `per` each: the even ones right, the odd ones off by one."""
    items = [it for it in task.items(n_items, "train", 0) for _ in range(per)]
    texts = [f"{it.answer + (k % 2)}#" for k, it in enumerate(items)]
    return items, texts


def _truth(prompt, tag="Response"):
    """The verifier's verdict on a rendered prompt: is the response's number the sum?"""
    q = re.search(r"\[Question\]\n(.*)\n", prompt)[1]
    gold = sum(map(int, q.split("+")))
    return [int(x) == gold for x in re.findall(rf"\[{tag}[^\]]*\]\n(-?\d+)", prompt)]


def test_pointwise_a_faithful_judge_agrees_and_cuts_the_end_of_turn(tok):
    task = JudgeTask(_task(), JudgeConfig(model="x"), Scripted(lambda p: f"Score: {10 * _truth(p)[0]}"))
    task.check(tok)
    items, texts = _batch(task)
    res = task.reward_batch(items, texts, step=1)
    assert [r.reward for r in res] == [1.0, 0.0] * 8
    assert [r.components["verifier"] for r in res] == [1.0, 0.0] * 8
    assert task.logged == {"judge_errors": 0.0, "judge_calls": 16.0, "judge_agreement": 1.0}
    assert all("#" not in p.split("[Response]")[1] for p in task.backend.prompts)  # end-of-turn cut


def test_pairwise_random_order_cancels_position_bias():
    """A judge that always picks the first response: random order gives every response the same
    expected win rate (½, within noise) and `judge_first_frac` = 1 exposes it; a faithful judge
    gives the right responses every win (agreement 1) whatever the order."""
    cfg = JudgeConfig(model="x", mode="pairwise", pairs=3)
    biased = JudgeTask(_task(), cfg, Scripted(lambda p: "[[A]]"))
    items, texts = _batch(biased, n_items=16, per=8)
    rewards = [r.reward for r in biased.reward_batch(items, texts, step=0)]
    right = [rw for k, rw in enumerate(rewards) if k % 2 == 0]
    wrong = [rw for k, rw in enumerate(rewards) if k % 2 == 1]
    assert biased.logged["judge_first_frac"] == 1.0
    assert abs(sum(right) / len(right) - 0.5) < 0.1 and abs(sum(wrong) / len(wrong) - 0.5) < 0.1
    assert biased.logged["judge_agreement"] == pytest.approx(0.5, abs=0.1)

    def faithful(p):
        a, b = _truth(p, "Response [AB]")
        return "[[C]]" if a == b else "[[A]]" if a else "[[B]]"

    fair = JudgeTask(_task(), cfg, Scripted(faithful))
    res = fair.reward_batch(items, texts, step=0)
    # a right response beats the 4 wrong ones it meets and ties the right ones: its win rate is above ½
    assert all(r.reward > 0.5 for r in res[0::2]) and all(r.reward < 0.5 for r in res[1::2])
    assert fair.logged["judge_agreement"] == 1.0 and fair.logged["judge_errors"] == 0.0
    assert 0.3 < fair.logged["judge_first_frac"] < 0.7


def test_pairwise_against_the_reference():
    cfg = JudgeConfig(model="x", mode="pairwise", opponent="reference")
    seen = []

    def judge(p):
        a, b = re.findall(r"\[Response [AB]\]\n(.*)", p)
        seen.append((a, b))
        return "[[C]]" if a == b else "[[B]]"  # only the reference's own text ties

    task = JudgeTask(_task(), cfg, Scripted(judge))
    items, texts = _batch(task, 2, 2)
    texts[0] = items[0].target(True)  # exactly the demonstration
    res = task.reward_batch(items, texts, step=0)
    assert res[0].reward == 0.5 and task.logged["judge_calls"] == 4.0
    assert any(items[0].target(True) in pair for pair in seen)


@pytest.fixture
def faulty_judge():
    """A real HTTP server (FastAPI on uvicorn, 127.0.0.1, a free port) that answers the OpenAI chat
    API like a judge: "Score: 10" or "Score: 0" by the response's truth, garbage when the response
    ends in 7, and never in time when it ends in 9 (a hang under the client's deadline)."""
    uvicorn = pytest.importorskip("uvicorn")
    fastapi = pytest.importorskip("fastapi")
    import asyncio

    app = fastapi.FastAPI()
    calls = []

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "judge-1", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        calls.append(body)
        prompt = body["messages"][-1]["content"]
        number = re.search(r"\[Response\]\n(-?\d+)", prompt)[1]
        if number.endswith("9"):
            await asyncio.sleep(5)
        text = "I refuse." if number.endswith("7") else f"Score: {10 * _truth(prompt)[0]}"
        return {
            "id": "x",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        }

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1", calls
    server.should_exit = True
    thread.join(10)


def test_http_judge_counts_garbage_and_hangs_and_goes_on(faulty_judge, tok):
    url, calls = faulty_judge
    task = JudgeTask(_task(), JudgeConfig(model=url, timeout_s=1.0, concurrency=4))
    task.check(tok)
    task.backend.start(task)
    assert task.backend.name == "judge-1"  # the first model the server lists
    items = task.items(6, "train", 1)
    texts = ["17#", "19#", str(items[2].answer) + "#", str(items[3].answer + 1) + "#", "29#", "7#"]
    t0 = time.perf_counter()
    res = task.reward_batch(items, texts, step=0)
    assert time.perf_counter() - t0 < 4.5  # the two hangs ran in parallel, each cut at 1 s
    assert task.logged["judge_errors"] == 4.0 and task.logged["judge_calls"] == 6.0
    errors = [r.error for r in res]
    assert [e is not None for e in errors] == [True, True, False, False, True, True]
    assert "TimeoutError" in errors[1] and "JudgeError" in errors[0]
    assert [r.reward for r in res[2:4]] == [1.0, 0.0]
    assert all(r.reward == 0.0 for k, r in enumerate(res) if errors[k])
    assert calls[0]["model"] == "judge-1" and calls[0]["max_tokens"] == 64 and calls[0]["temperature"] == 0.0


def test_http_judge_unreachable_is_one_line():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    task = JudgeTask(_task(), JudgeConfig(model=f"http://127.0.0.1:{port}/v1", timeout_s=2))
    with pytest.raises(UsageError, match=r"task.judge.model=http://127.0.0.1:\d+/v1: GET .*/models failed"):
        task.backend.start(task)


def _random_ckpt(tmp_path, tok, nano):
    from posttrain import checkpoint

    checkpoint.save(tmp_path / "judge", 1, nano, tok)
    return tmp_path / "judge"


def test_engine_judge_random_weights_fail_every_call_and_are_counted(tmp_path, tok, nano):
    """An untrained checkpoint as the judge: its replies parse as no score, every call is counted
    and scored 0; the step's results all come back."""
    short = tmp_path / "t.txt"
    short.write_text("{question}={response}?")
    task = JudgeTask(
        _task(),
        JudgeConfig(model=str(_random_ckpt(tmp_path, tok, nano)), template=str(short), max_tokens=8, temperature=0.0),
    )
    task.check(tok)
    task.start(tmp_path, False, 4)
    items, texts = _batch(task, 2, 2)
    res = task.reward_batch(items, texts, step=0)
    assert len(res) == 4 and task.logged["judge_calls"] == 4.0
    assert task.logged["judge_errors"] == sum(r.error is not None for r in res)
    assert all(r.reward == 0.0 for r in res if r.error)
    again = task.reward_batch(items, texts, step=0)  # greedy: the same replies, the same verdicts
    assert [r.error for r in again] == [r.error for r in res]


def test_engine_judge_template_too_long_is_refused(tmp_path, tok, nano):
    long = tmp_path / "t.txt"
    long.write_text("x" * 300 + "{question}{response}")
    task = JudgeTask(_task(), JudgeConfig(model=str(_random_ckpt(tmp_path, tok, nano)), template=str(long)))
    with pytest.raises(UsageError, match="leaves no room in the judge's context"):
        task.start(tmp_path, False, 4)


def test_template_is_frozen_in_the_run_dir(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("Q {question} R {response} score?")
    b.write_text("Other {question} {response}")
    run = tmp_path / "run"
    run.mkdir()
    JudgeTask(_task(), JudgeConfig(model="x", template=str(a)), Scripted(str)).start(run, False, 4)
    assert (run / "judge_prompt.txt").read_text() == a.read_text()
    JudgeTask(_task(), JudgeConfig(model="x", template=str(a)), Scripted(str)).start(run, True, 4)  # same: fine
    with pytest.raises(UsageError, match="judge_prompt.txt differs"):
        JudgeTask(_task(), JudgeConfig(model="x", template=str(b)), Scripted(str)).start(run, True, 4)


@pytest.mark.parametrize(
    "keys,msg",
    [
        (["task.judge.mode=triple"], "task.judge.mode='triple' is unknown"),
        (["task.judge.template=nope.txt"], "file 'nope.txt' not found"),
        (["task.judge.pairs=0"], "need pairs >= 1"),
        (["task.judge.opponent=crowd"], "task.judge.opponent='crowd' is unknown"),
        (["task.judge.mode=pairwise", "task.judge.template=T"], "needs the fields {response_a}, {response_b}"),
    ],
)
def test_bad_judge_config_is_one_line(tmp_path, keys, msg):
    from posttrain import tasks
    from posttrain.config import RLConfig, load_config

    t = tmp_path / "t.txt"
    t.write_text("{question} {response}")
    cfg = load_config(
        RLConfig, None, ["task.judge.model=http://127.0.0.1:1/v1", *[k.replace("=T", f"={t}") for k in keys]]
    )
    with pytest.raises(UsageError, match=re.escape(msg)):
        tasks.make(cfg.task)


def test_config_wraps_any_task_and_records_the_judge(tmp_path):
    from posttrain import tasks
    from posttrain.config import RLConfig, load_config, save_config

    cfg = load_config(
        RLConfig, None, ["task.name=countdown", "task.judge.model=http://127.0.0.1:1/v1", "task.judge.mode=pairwise"]
    )
    task = tasks.make(cfg.task)
    assert isinstance(task, JudgeTask) and task.name == "judge/countdown"
    assert task.items(3, "test", 0) == task.task.items(3, "test", 0)  # the task's own problems
    save_config(cfg, tmp_path / "config.yaml")
    assert "judge:\n    model: http://127.0.0.1:1/v1\n    mode: pairwise" in (tmp_path / "config.yaml").read_text()
    assert not isinstance(tasks.make(load_config(RLConfig, None, []).task), JudgeTask)  # no model: no judge
    with pytest.raises(UsageError, match="multi-turn episodes"):
        tasks.make(load_config(RLConfig, None, ["task.name=tool_arith", "task.judge.model=x"]).task)


def test_dataset_rows_without_answers_train_on_a_judge(tmp_path):
    from posttrain import tasks
    from posttrain.config import RLConfig, load_config

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"say hi to {n}"}) + "\n" for n in "abcdefghij"))
    keys = ["task.name=dataset", f"task.train={rows}", "task.test_frac=0.2"]
    with pytest.raises(UsageError, match="no answer column"):
        tasks.make(load_config(RLConfig, None, keys).task)
    task = tasks.make(load_config(RLConfig, None, [*keys, "task.judge.model=http://127.0.0.1:1/v1"]).task)
    task._backend = Scripted(lambda p: "Score: 8" if "hi a" in p else "Score: 2")
    res = task.reward_batch(task.items(2, "train", 0), ["hi a", "hi b"], step=0)
    assert [r.reward for r in res] == [0.8, 0.2]
    assert "judge_agreement" not in task.logged  # no verifier to agree with


@pytest.mark.slow
def test_judge_through_posttrain_serve_equals_the_in_process_judge(sft_ckpt, tmp_path):
    """The same checkpoint as a judge two ways: `posttrain serve` (a subprocess, OpenAI chat API on
    127.0.0.1) and in this process. Greedy, so the replies are the same text and the verdicts, errors
    and counts match one for one."""
    import os
    import subprocess
    import sys

    import httpx

    from posttrain.models.tokenizer import CharTokenizer

    pytest.importorskip("fastapi")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "posttrain.cli", "serve", str(sft_ckpt), "--port", str(port), "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        url, deadline = f"http://127.0.0.1:{port}/v1", time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        template = tmp_path / "t.txt"
        template.write_text("judge {question} answer {response} score")
        keys = dict(template=str(template), scale=1.0, max_tokens=24, timeout_s=60)
        remote = JudgeTask(_task(), JudgeConfig(model=url, **keys))
        local = JudgeTask(_task(), JudgeConfig(model=str(sft_ckpt), **keys))
        items, texts = _batch(remote, 4, 2)
        for t in (remote, local):
            t.check(CharTokenizer())
            t.start(tmp_path, False, 2)
        assert remote.backend.name == str(sft_ckpt)  # what the server lists
        prompts = [render(remote.template, response=x, **remote._fields(it)) for it, x in zip(items, texts)]
        assert remote.backend.complete(prompts) == local.backend.complete(prompts)
        a, b = remote.reward_batch(items, texts, step=0), local.reward_batch(items, texts, step=0)
        assert [(r.reward, r.error) for r in a] == [(r.reward, r.error) for r in b]
        assert remote.logged == local.logged and remote.logged["judge_calls"] == 8.0
    finally:
        proc.terminate()
        proc.wait(20)


def test_rl_with_a_pairwise_judge_logs_and_freezes(sft_ckpt, tmp_path):
    """Two GRPO steps rewarded by a checkpoint judge, pairwise, through the Python API: the judge's
    counts per step are the hand-computed ones (2 prompts × a ring of 4 with pairs=2: 6 comparisons
    each), every failure is scored 0 and counted, the verifier is logged beside, evaluation keeps
    the verifier, and the template sits in the run directory."""
    import posttrain

    template = tmp_path / "t.txt"
    template.write_text("{question} a {response_a} b {response_b} better")
    run = posttrain.rl(
        init=str(sft_ckpt),
        out=str(tmp_path / "rl"),
        steps=2,
        eval_every=0,
        threads=1,
        tensorboard=False,
        rollout={"prompts_per_step": 2, "samples_per_prompt": 4},
        eval={"problems": 4, "samples": 2},
        task={
            "name": "arithmetic",
            "max_terms": 3,
            "judge": {"model": str(sft_ckpt), "mode": "pairwise", "template": str(template), "max_tokens": 8},
        },
    )
    steps = [m for m in run.metrics if m["step"] > 0]
    assert len(steps) == 2
    for m in steps:
        assert m["reward/judge_calls"] == 12.0
        assert 0 <= m["reward/judge_errors"] <= 12
        assert {"reward/judge", "reward/verifier", "reward/errors"} <= set(m)
        if m["reward/judge_errors"] == 12:  # every comparison failed: every sample scored 0
            assert m["reward/mean"] == 0.0 and m["reward/errors"] == 8.0
    assert "eval/pass@1" in run.metrics[-1]  # the verifier's evaluation
    assert (tmp_path / "rl" / "judge_prompt.txt").read_text() == template.read_text()
    assert "judge:\n    model: " + str(sft_ckpt) in (tmp_path / "rl" / "config.yaml").read_text()


def test_engine_judge_on_a_hugging_face_directory(hf_dir, tmp_path):
    """A local Hugging Face model directory as the judge: the prompt goes through its chat template,
    every reply comes back as text (an untrained model: whatever it says is parsed or counted)."""
    template = tmp_path / "t.txt"
    template.write_text("{question} = {response}? Score:")
    task = JudgeTask(_task(), JudgeConfig(model=str(hf_dir), template=str(template), max_tokens=6))
    task.start(tmp_path, False, 2)
    prompt = render(task.template, response="5", **task._fields(task.items(1, "train", 0)[0]))
    assert task.backend.tok.decode(task.backend._encode(prompt)).startswith("<|im_start|>user\n")
    items, texts = _batch(task, 2, 2)
    replies = task.backend.complete(
        [render(task.template, response=t, **task._fields(it)) for it, t in zip(items, texts)]
    )
    assert len(replies) == 4 and all(isinstance(r, str) for r in replies)
    res = task.reward_batch(items, texts, step=0)
    assert task.logged["judge_calls"] == 4.0
    assert task.logged["judge_errors"] == sum(r.error is not None for r in res)


def test_rl_with_a_judge_resumes_to_the_same_numbers(sft_ckpt, tmp_path, monkeypatch):
    """A judge-rewarded run killed in step 3 and resumed logs what the uninterrupted run logs: the
    judge samples greedily and the order coin flips are pure in (step, group, pair)."""
    from posttrain.config import RLConfig, load_config
    from posttrain.recipes import rl

    from test_recipes import _metrics_without_time, run_killed

    template = tmp_path / "t.txt"
    template.write_text("{question} a {response_a} b {response_b} better")
    common = [
        f"init={sft_ckpt}",
        "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=4",
        "eval.problems=2",
        "eval.samples=1",
        "save_every=1",
        "eval_every=0",
        "steps=3",
        "threads=1",
        "task.max_terms=3",
        f"task.judge.model={sft_ckpt}",
        "task.judge.mode=pairwise",
        f"task.judge.template={template}",
        "task.judge.max_tokens=8",
        "task.judge.temperature=1.0",
    ]
    rl.run(load_config(RLConfig, None, [f"out={tmp_path}/full", *common]))
    cfg = load_config(RLConfig, None, [f"out={tmp_path}/half", *common])
    run_killed(monkeypatch, rl, cfg, die_on_step=3)
    rl.run(cfg, resume=True)
    full = _metrics_without_time(tmp_path / "full")
    assert [m["step"] for m in full] == [0, 1, 2, 3] and all(m["reward/judge_calls"] == 12.0 for m in full[1:])
    assert full == _metrics_without_time(tmp_path / "half")


def test_rl_refuses_a_judge_in_verifier_workers(sft_ckpt, tmp_path):
    from posttrain.config import RLConfig, load_config
    from posttrain.recipes import rl

    cfg = load_config(
        RLConfig,
        None,
        [
            f"init={sft_ckpt}",
            f"out={tmp_path}/rl",
            "verifier.workers=2",
            "steps=1",
            "task.judge.model=http://127.0.0.1:1/v1",
        ],
    )
    with pytest.raises(UsageError, match=r"verifier.workers > 0.*set verifier.workers=0"):
        rl.run(cfg)
