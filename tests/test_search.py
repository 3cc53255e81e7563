"""The search-tool environment (tasks/search.py): BM25 on a literal corpus, the generated encyclopedia
and its split, episodes (masks, rewards, Tool-N1's binary reward), config, the HF tag syntax."""

import math

import pytest
import torch

pytest.importorskip("bm25s")

from posttrain import UsageError
from posttrain.eval import evaluate_episodes
from posttrain.framework.agent import run_episodes
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.framework.sample import Sample
from posttrain.tasks.search import BM25Index, SearchConfig, SearchTask, calls_in, encyclopedia, final_answer

from test_agent import ScriptedEngine
from test_agent_hf import hf_dir  # noqa: F401 (the fixture: a BPE tokenizer and a tiny Llama trained here)

DOCS = ["the cat sat on the mat", "dogs chase the cat", "zorblat is a city in vemia", "vemia exports cats"]


def bm25(query, docs, k1=1.5, b=0.75):
    """BM25 by hand as Lucene scores it: idf = ln(1 + (N − df + ½)/(df + ½)), times tf / (tf + k1·(1 − b +
    b·|d|/avgdl)) — without the classic (k1 + 1) numerator, a constant factor that ranks the same."""
    toks = [d.split() for d in docs]
    avg = sum(map(len, toks)) / len(toks)
    out = []
    for t in toks:
        s = 0.0
        for w in set(query.split()):
            df = sum(w in d for d in toks)
            if df == 0:
                continue
            tf = t.count(w)
            s += math.log(1 + (len(toks) - df + 0.5) / (df + 0.5)) * tf / (tf + k1 * (1 - b + b * len(t) / avg))
        out.append(s)
    return out


def test_bm25_scores_and_ranking_on_a_literal_corpus():
    index = BM25Index(DOCS)
    for q in ["the cat", "vemia", "zorblat city", "cat vemia the", "unknown words"]:
        assert index.scores(q) == pytest.approx(bm25(q, DOCS), rel=1e-5)
    # both documents hold "the" and "cat"; document 0 holds "the" twice, which outweighs its length
    assert bm25("the cat", DOCS)[0] > bm25("the cat", DOCS)[1] > bm25("the cat", DOCS)[2] == 0
    assert index.search("the cat", 3) == [0, 1]
    assert index.search("vemia", 4) == [3, 2]  # the shorter document first; zero scores never returned
    assert index.search("Zorblat?", 1) == [2]  # case and punctuation do not matter
    assert index.search("nothing matches", 3) == [] and index.search("", 3) == []


def test_encyclopedia_is_pure_and_heldout_facts_are_in_no_training_text():
    a, b = encyclopedia(200, 3), encyclopedia(200, 3)
    assert a == b and a != encyclopedia(200, 4)
    assert len({e["name"] for e in a}) == 200
    assert all(e["doc"] == f"{e['name']} year {e['year']} size {e['size']} code {e['code']}" for e in a)
    task = SearchTask(SearchConfig(entities=200, corpus_seed=3))
    held = {e["name"] for e in task.split["test"]}
    assert 0.1 < len(held) / 200 < 0.3
    words = set(
        task.corpus(20000, 0)
        .replace("⟦", " ")
        .replace("⟧", " ")
        .replace("⟨", " ")
        .replace("⟩", " ")
        .replace("?", " ")
        .replace("=", " ")
        .split()
    )
    assert not held & words  # no held-out name in the pretraining / SFT text
    assert {q.name for q in task.items(100, "test", 0)} <= held
    assert task.items(20, "train", 5) == task.items(20, "train", 5)
    demo = task.items(400, "train", 0)
    frac = sum(q.demo_search for q in demo) / len(demo)
    assert 0.2 < frac < 0.4  # demo_search_frac = 0.3
    q = next(q for q in demo if q.demo_search)
    assert q.target() == f"⟦{q.name}⟧⟨{q.doc}⟩{q.answer}"


def searcher(query_of=lambda name: name, answer=True):
    """A policy that searches for the asked name, then copies the asked attribute from the result."""

    def script(text):
        question = text[1 : text.index(">")]
        attribute, name = question[:-1].split(" of ")
        if "⟩" not in text:
            return f"⟦{query_of(name)}⟧"
        doc = text.rsplit("⟨", 1)[1].split("⟩")[0].split()
        value = doc[doc.index(attribute) + 1] if attribute in doc else "0"
        return (value if answer else "no idea") + "#"

    return script


@pytest.fixture
def task():
    return SearchTask(SearchConfig(entities=60))


def test_episode_masks_observation_and_reward(tok, task):
    item = task.items(1, "test", 0)[0]
    [ep] = run_episodes(ScriptedEngine(tok, searcher()), tok, task, [item], 1, SamplingParams(max_new_tokens=40))
    call, obs, answer = f"⟦{item.name}⟧", f"⟨{item.doc}⟩", f"{item.answer}#"
    assert ep.text == call + obs + answer
    assert ep.response_mask == [1] * len(call) + [0] * len(obs) + [1] * len(answer)
    assert ep.response_logprobs == [-0.5] * len(call) + [0.0] * len(obs) + [-0.5] * len(answer)
    assert ep.reward == 1.0
    assert ep.reward_components == {"correct": 1.0, "format": 1.0, "call_hit": 1.0, "searched": 1.0}
    assert ep.prompt_ids + ep.response_ids == tok.encode(tok.render(item.question, ep.conversation))


def test_answer_and_tool_n1_rewards(tok):
    items = SearchTask(SearchConfig(entities=60)).items(4, "test", 1)
    cases = {  # script: (answer reward, tool_n1 reward, components)
        "right": (searcher(), 1.0, 1.0, {"correct": 1.0, "format": 1.0, "call_hit": 1.0, "searched": 1.0}),
        "wrong name": (
            searcher(lambda n: n + "x"),
            0.0,
            0.0,
            {"correct": 0.0, "format": 1.0, "call_hit": 0.0, "searched": 1.0},
        ),
        "right call, no answer": (
            searcher(answer=False),
            0.0,
            0.0,
            {"correct": 0.0, "format": 0.0, "call_hit": 1.0, "searched": 1.0},
        ),
        "no search": (
            lambda text: "1234#",
            0.0,
            0.0,
            {"correct": 0.0, "format": 1.0, "call_hit": 0.0, "searched": 0.0},
        ),
    }
    for name, (script, r_answer, r_n1, comps) in cases.items():
        for mode, want in (("answer", r_answer), ("tool_n1", r_n1)):
            t = SearchTask(SearchConfig(entities=60, reward=mode))
            eps = run_episodes(ScriptedEngine(tok, script), tok, t, items, 1, SamplingParams(max_new_tokens=40))
            assert [e.reward for e in eps] == [want] * 4, (name, mode)
            assert all(e.reward_components == comps for e in eps), (name, mode)
    # a call that misses the document but an answer from memory that is right: the answer reward pays,
    # Tool-N1's does not (no call hit); evaluation counts it correct either way (the "correct" component)
    t = SearchTask(SearchConfig(entities=60, reward="tool_n1"))
    lucky = {it.question: it.answer for it in items}
    script = lambda text: "⟦nothing⟧" if "⟩" not in text else f"{lucky[text[1 : text.index('>')]]}#"
    eps = run_episodes(ScriptedEngine(tok, script), tok, t, items, 1, SamplingParams(max_new_tokens=40))
    assert [e.reward for e in eps] == [0.0] * 4 and all(e.reward_components["correct"] == 1.0 for e in eps)
    assert "no results" in eps[0].conversation[1][1]
    engine = ScriptedEngine(tok, script)
    engine.model = torch.nn.Module()  # evaluate_episodes puts the model in eval mode
    res = evaluate_episodes(engine, tok, t, items, n=0, max_new_tokens=40)
    assert res["eval/greedy_acc"] == 1.0 and res["eval/greedy_tool_call_rate"] == 1.0


def test_call_limit_ends_the_episode(tok, task):
    items = task.items(2, "train", 0)
    eps = run_episodes(
        ScriptedEngine(tok, lambda text: "⟦again⟧"), tok, task, items, 1, SamplingParams(max_new_tokens=20)
    )
    assert all(e.tool_calls == 2 and e.turns == 3 and e.reward == 0.0 for e in eps)
    assert eps[0].reward_components["format"] == 0.0  # the last turn is still a call, not an answer


def test_real_engine_episodes_keep_masks_and_template(tok, nano, task):
    """An untrained gpt_mini in real episodes: whatever it writes, the observation tokens (and only
    they) are masked, and the tokens are exactly the template's rendering of the conversation."""
    items = task.items(6, "train", 0)
    eps = run_episodes(
        Engine(nano, tok), tok, task, items, 2, SamplingParams(temperature=1.0, max_new_tokens=24), seed=1
    )
    for ep in eps:
        assert ep.prompt_ids + ep.response_ids == tok.encode(tok.render(ep.item.question, ep.conversation))
        masked = sum(len(tok.encode(tok.chat_tool_result(t))) for role, t in ep.conversation if role == "observation")
        assert ep.response_mask.count(0) == masked
        assert all(lp == 0.0 for lp, m in zip(ep.response_logprobs, ep.response_mask) if m == 0)


def test_hf_style_tags_and_parsing():
    assert calls_in("a <search>velmora year</search> b ⟦x⟧") == ["x", "velmora year"]
    assert final_answer("⟦a⟧⟨a year 1423⟩so it is 1423") == 1423
    assert final_answer("<search>a</search>\n<information>a year 9</information>\n12") == 12
    assert final_answer("no number") is None
    task = SearchTask(SearchConfig(entities=30))

    class HFLike:  # a tokenizer without the built-in vocabulary
        pass

    task.check(HFLike())
    assert task.stop == ("</search>",)
    demo = next(q for q in task.items(50, "train", 0) if q.demo_search)  # demonstrations in the tags too
    assert demo.target() == f"<search>{demo.name}</search>\n<information>{demo.doc}</information>\n{demo.answer}"
    env = task.make_env(item := task.items(1, "train", 0)[0])
    env.reset(item)
    obs, _, done, _ = env.step(f"let me look <search>{item.name}</search>")
    assert obs == item.doc and not done
    _, reward, done, info = env.step(f"<answer>{item.answer}</answer>")
    assert done and reward == 1.0 and info["components"]["format"] == 1.0


@pytest.mark.parametrize(
    "key,msg",
    [
        ("task.reward=exact", "task.reward='exact' is unknown"),
        ("task.entities=5", "need entities >= 10"),
        ("task.top_k=0", "top_k >= 1"),
    ],
)
def test_bad_search_config_is_one_line(key, msg):
    from posttrain import tasks
    from posttrain.config import RLConfig, load_config

    with pytest.raises(UsageError, match=msg):
        tasks.make(load_config(RLConfig, None, ["task.name=search", key]).task)


def test_search_r1_tags_with_a_subword_tokenizer(hf_dir):
    """A Hugging Face tokenizer: the policy searches with `<search>…</search>` (several tokens: the
    turn is cut after the token that closes it), the result comes back as `<information>…</information>`,
    masked, and the answer after it is scored."""
    from posttrain.models.hf import load_hf

    from test_agent_hf import Scripted as HFScripted

    _, tok = load_hf(hf_dir)
    task = SearchTask(SearchConfig(entities=40))
    task.check(tok)
    assert task.stop == ("</search>",) and len(tok.encode("</search>")) > 1
    item = task.items(1, "test", 0)[0]

    class Searcher(HFScripted):
        def generate(self, prompts, n, sampling, seed=0, step=0, items=None, group_offset=0):
            out = []
            for g, p in enumerate(prompts):
                text = self.tok.decode(p)
                turn = (
                    f"<search>{item.name}</search> and more words"
                    if "<information>" not in text
                    else text.rsplit(f"{item.attribute} ", 1)[1].split(" ")[0].split("<")[0] + "<|im_end|>"
                )
                ids = self.tok.encode(turn)
                cut = next((i + 1 for i, t in enumerate(ids) if t in {self.tok.eot_id, *sampling.stop_ids}), len(ids))
                out += [Sample(list(p), ids[:cut], [-0.5] * cut, [1] * cut, "stop", 0, g, j) for j in range(n)]
            return out

    [ep] = run_episodes(Searcher(tok), tok, task, [item], 1, SamplingParams(temperature=1.0, max_new_tokens=40))
    text = tok.decode(ep.response_ids)
    assert text.startswith(f"<search>{item.name}</search>") and "more words" not in text
    obs = [i for i, m in zip(ep.response_ids, ep.response_mask) if m == 0]
    assert tok.decode(obs) == f"\n<information>{item.doc}</information>\n"
    assert ep.reward == 1.0 and ep.reward_components["call_hit"] == 1.0 and ep.tool_calls == 1
