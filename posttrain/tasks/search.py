"""A search-tool environment (Search-R1 style): questions about made-up entities, answered by searching.

    <year of velmora?>⟦velmora⟧⟨velmora year 1423 size 87⟩1423#
                      ^ the policy's search  ^ the top document (response_mask 0)  ^ its answer

The encyclopedia is generated here (`encyclopedia`): `entities` invented names, each with random
attributes, one short document per entity. No model has seen these facts, and the held-out
questions ask about entities whose facts appear in no training text at all (entities, not
questions, are split by a hash of the name), so a right held-out answer comes from a search.

Retrieval is BM25 (bm25s, Lù 2024, 2407.03618) over the documents; a search returns the `top_k`
best documents, or "no results". A turn that ends in a call (`⟦query⟧` for the built-in tokenizer,
Search-R1's `<search>query</search>` for a Hugging Face one, whose result comes back in
`<information>…</information>`) runs a search; any other turn ends the episode and is scored.

Rewards (`reward`):
  answer   1 when the last number the policy wrote after the last result is the asked attribute
           (Search-R1's exact-match outcome reward);
  tool_n1  Tool-N1's binary format-and-call reward (Zhang et al. 2025, 2505.00024): 1 only when
           every call is well formed, the answer turn holds an answer and no stray call markers, and
           a call retrieved the asked entity's document; no partial credit, and the answer itself
           is not checked (what the paper rewards is the right call in the right format).
Components logged either way: correct, format, call_hit, searched; evaluation counts `correct`.

Demonstrations (pretraining corpus, SFT) search on `demo_search_frac` of the questions and answer
from memory on the rest, so the warm-up model searches sometimes: RL has room to raise it. They are
written in the syntax of the tokenizer `check` saw (the markers, or the tags for a Hugging Face one).
"""

from __future__ import annotations

import random
import re
import zlib
from dataclasses import dataclass
from functools import cached_property

from posttrain.chat import CALL_CLOSE, CALL_OPEN, RESULT_CLOSE, RESULT_OPEN
from posttrain.errors import UsageError
from posttrain.tasks.base import LineCorpus, RewardResult, TaskConfig, in_heldout

ATTRIBUTES = {"year": (1000, 1999), "size": (10, 99), "code": (100, 999)}
TAG_OPEN, TAG_CLOSE = "<search>", "</search>"
_SYLLABLES = [
    "ba",
    "ce",
    "di",
    "fo",
    "gu",
    "ka",
    "le",
    "mi",
    "no",
    "pu",
    "ra",
    "se",
    "ti",
    "vo",
    "zu",
    "xa",
    "qe",
    "ly",
    "mo",
    "ne",
    "ri",
    "ta",
    "vel",
    "dor",
    "an",
    "ul",
    "or",
    "is",
]


@dataclass
class SearchConfig(TaskConfig):
    name: str = "search"
    entities: int = 3000  # made-up entities in the encyclopedia (one document each); this many facts
    # (3 each) are too many for a small warm-up model to memorise from its
    # demonstrations, so even on training questions a search is the way up
    heldout_frac: float = 0.2  # share of entities whose questions are held out (their facts are in no training text)
    top_k: int = 1  # documents a search returns (the built-in tokenizer shows 64 characters of them)
    max_calls: int = 2  # searches per episode; the turn limit is max_calls + 1
    demo_search_frac: float = 0.3  # demonstrations that search (the rest answer from memory)
    reward: str = (
        "answer"  # answer (exact match) | tool_n1 (binary: well-formed calls and a call that hit the document)
    )
    corpus_seed: int = 0  # which encyclopedia: names and facts are pure in it


def encyclopedia(n: int, seed: int = 0) -> list[dict]:
    """`n` entities: {"name", "year", "size", "code", "doc"}, names unique, pure in `seed`."""
    rng, names, out = random.Random(f"encyclopedia/{seed}"), set(), []
    while len(out) < n:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
        if name in names or len(name) < 4:
            continue
        names.add(name)
        facts = {a: rng.randint(lo, hi) for a, (lo, hi) in ATTRIBUTES.items()}
        out.append({"name": name, **facts, "doc": f"{name} " + " ".join(f"{a} {v}" for a, v in facts.items())})
    return out


class BM25Index:
    """BM25 over `docs` (bm25s, Lucene's scoring: no (k1 + 1) factor; k1 = 1.5, b = 0.75; words are lowercase runs of
    letters and digits, no stop words, no stemming: made-up names must match as written)."""

    def __init__(self, docs: list[str], k1: float = 1.5, b: float = 0.75):
        try:
            import bm25s
        except ImportError:
            raise UsageError("task.name=search needs bm25s for retrieval; pip install 'posttrain[search]'") from None
        self.bm25s, self.docs = bm25s, list(docs)
        self.index = bm25s.BM25(k1=k1, b=b)
        self.index.index(self._tokens(self.docs), show_progress=False)

    def _tokens(self, texts: list[str]):
        return self.bm25s.tokenize(texts, lower=True, stopwords=None, token_pattern=r"(?u)\b\w+\b", show_progress=False)

    def scores(self, query: str) -> list[float]:
        """BM25 score of every document for `query` (0 where no query word occurs)."""
        words = re.findall(r"\w+", query.lower())
        return [float(x) for x in self.index.get_scores(words)] if words else [0.0] * len(self.docs)

    def search(self, query: str, k: int) -> list[int]:
        """Indices of the k best documents with a positive score, best first (ties: lower index first)."""
        s = self.scores(query)
        return [i for i in sorted(range(len(s)), key=lambda i: (-s[i], i))[:k] if s[i] > 0]


@dataclass(frozen=True)
class Question:
    name: str  # the entity asked about
    attribute: str  # year | size | code
    answer: int
    doc: str  # the entity's document (what a good search returns)
    demo_search: bool = False  # whether this question's demonstration searches
    tags: bool = False  # demonstrations in Search-R1's tags (a Hugging Face tokenizer), else the markers

    @property
    def question(self) -> str:
        return f"{self.attribute} of {self.name}?"

    def target(self, cot: bool = True) -> str:
        """The demonstration (built-in markers): a search, its result (masked in SFT), the answer; or
        the answer from memory."""
        if not self.demo_search:
            return str(self.answer)
        if self.tags:
            return f"{TAG_OPEN}{self.name}{TAG_CLOSE}\n<information>{self.doc}</information>\n{self.answer}"
        return f"{CALL_OPEN}{self.name}{CALL_CLOSE}{RESULT_OPEN}{self.doc}{RESULT_CLOSE}{self.answer}"


def calls_in(text: str) -> list[str]:
    """The query of every complete call in a turn: `⟦q⟧` or `<search>q</search>`."""
    return re.findall(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), text) + re.findall(
        re.escape(TAG_OPEN) + r"(.*?)" + re.escape(TAG_CLOSE), text, re.S
    )


def final_answer(text: str) -> int | None:
    """The last integer the policy wrote after the last search result."""
    tail = re.split(re.escape(RESULT_CLOSE) + "|</information>", text)[-1]
    found = re.findall(r"-?\d+", tail)
    return int(found[-1]) if found else None


class SearchEnv:
    """One episode: a turn ending in a call gets the search results; any other turn is the answer."""

    def __init__(self, task: SearchTask, item: Question):
        self.task, self.item = task, item

    def reset(self, item: Question) -> str:
        self.item, self.turns, self.hits, self.calls = item, [], 0, 0
        return item.question

    def step(self, text: str):
        self.turns.append(text)
        queries = calls_in(text)
        ends_in_call = text.rstrip().endswith((CALL_CLOSE, TAG_CLOSE))
        if ends_in_call and queries and self.calls < self.task.config.max_calls:
            self.calls += 1
            found = self.task.index.search(queries[-1], self.task.config.top_k)
            self.hits += any(self.task.entities[i]["name"] == self.item.name for i in found)
            obs = " | ".join(self.task.entities[i]["doc"] for i in found) or "no results"
            return obs, 0.0, False, {}
        res = self.task.score(self.item, self.turns, self.calls, self.hits)
        return None, res.reward, True, {"components": res.components}


class SearchTask(LineCorpus):
    name = "search"

    def __init__(self, config: SearchConfig | None = None):
        self.config = c = config or SearchConfig()
        if c.reward not in ("answer", "tool_n1"):
            raise UsageError(f"task.reward={c.reward!r} is unknown for task.name=search; use answer or tool_n1")
        if c.entities < 10 or not 0 < c.heldout_frac < 1 or c.top_k < 1 or c.max_calls < 1:
            raise UsageError("task: need entities >= 10, 0 < heldout_frac < 1, top_k >= 1, max_calls >= 1")
        self.max_turns = c.max_calls + 1
        self.entities = encyclopedia(c.entities, c.corpus_seed)
        held = [in_heldout("search/" + e["name"], c.heldout_frac) for e in self.entities]
        self.split = {
            "train": [e for e, h in zip(self.entities, held) if not h],
            "test": [e for e, h in zip(self.entities, held) if h],
        }
        if not self.split["train"] or not self.split["test"]:
            raise UsageError(f"task.entities={c.entities}: too few for a train and a held-out split; raise it")
        self.stop: tuple[str, ...] = (CALL_CLOSE,)

    @cached_property
    def index(self) -> BM25Index:
        return BM25Index([e["doc"] for e in self.entities])

    def check(self, tok, max_len=None, max_new_tokens=0) -> None:
        """A Hugging Face tokenizer searches with Search-R1's tags; the built-in one with its call markers."""
        self.stop = (CALL_CLOSE,) if hasattr(tok, "stoi") else (TAG_CLOSE,)
        _ = self.index  # build it (and fail on a missing bm25s) before step 1

    @property
    def observation_template(self) -> str:
        return "\n<information>{}</information>\n"

    def items(self, n: int, split: str = "train", seed=0) -> list[Question]:
        pool = self.split["train" if split == "train" else "test"]
        rng, out = random.Random(f"search/{split}/{seed}"), []
        for _ in range(n):
            e, a = rng.choice(pool), rng.choice(list(ATTRIBUTES))
            demo = zlib.crc32(f"demo/{e['name']}/{a}".encode()) % 10_000 < self.config.demo_search_frac * 10_000
            out.append(Question(e["name"], a, e[a], e["doc"], demo, self.stop == (TAG_CLOSE,)))
        return out

    def prompt(self, item: Question) -> str:
        return item.question

    def gold(self, item: Question) -> int:
        return item.answer

    def make_env(self, item: Question) -> SearchEnv:
        return SearchEnv(self, item)

    def score(self, item: Question, turns: list[str], calls: int, hits: int) -> RewardResult:
        *call_turns, last = turns
        correct = float(final_answer(last) == item.answer)
        well_formed = all(len(calls_in(t)) == 1 and t.rstrip().endswith((CALL_CLOSE, TAG_CLOSE)) for t in call_turns)
        fmt = float(
            well_formed
            and not calls_in(last)
            and CALL_OPEN not in last
            and TAG_OPEN not in last
            and final_answer(last) is not None
        )
        comps = {"correct": correct, "format": fmt, "call_hit": float(hits > 0), "searched": float(calls > 0)}
        reward = correct if self.config.reward == "answer" else float(fmt and hits > 0)
        return RewardResult(reward, comps, correct=correct)

    def corpus_line(self, item: Question) -> str:
        """`question=demonstration` lines of train entities only. (LineCorpus)"""
        return f"{item.question}={item.target()}"
