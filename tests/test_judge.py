"""Judge rewards (reward_models/judge.py, reward_models/judge_backends.py): parsing, order randomisation, failure counting
against real HTTP servers started here, the in-process judge, the frozen template, config."""

import re
import socket
import threading
import time

import pytest

from posttrain import UsageError
from posttrain.reward_models.judge import JudgeError, JudgeTask, comparisons, parse_choice, parse_score, render
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from posttrain.tasks.base import JudgeConfig

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

    def start(self, probe):
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
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=0))  # hangs: no wait
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
    task.backend.start(task.probe())
    assert task.backend.name == "judge-1"  # the first model the server lists
    items = task.items(6, "train", 1)
    texts = ["17#", "19#", str(items[2].answer) + "#", str(items[3].answer + 1) + "#", "29#", "7#"]
    res = task.reward_batch(items, texts, step=0)
    assert task.logged["judge_errors"] == 4.0 and task.logged["judge_calls"] == 6.0
    errors = [r.error for r in res]
    assert [e is not None for e in errors] == [True, True, False, False, True, True]
    assert "JudgeError" in errors[0] and "JudgeError" in errors[5]  # garbage replies
    assert "TimeoutError" in errors[1] and "TimeoutError" in errors[4]  # both hangs cut at the deadline
    assert [r.reward for r in res[2:4]] == [1.0, 0.0]
    assert all(r.reward == 0.0 for k, r in enumerate(res) if errors[k])
    assert calls[0]["model"] == "judge-1" and calls[0]["max_tokens"] == 64 and calls[0]["temperature"] == 0.0


def test_http_judge_unreachable_is_one_line():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    task = JudgeTask(_task(), JudgeConfig(model=f"http://127.0.0.1:{port}/v1", timeout_s=2))
    with pytest.raises(UsageError, match=r"task.judge.model=http://127.0.0.1:\d+/v1: GET .*/models failed"):
        task.backend.start(task.probe())


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
