"""Any reasoning-gym dataset as a task: `task.name=reasoning_gym task.dataset=chain_sum`.

    posttrain rl ... task.name=reasoning_gym task.dataset=chain_sum task.options.max_terms=2

reasoning-gym (preinstalled, imported only here) generates problems offline from a seed; its
dataset's own `score_answer(answer, entry)` is the verifier, so every generator brings its
scorer. `task.options` are the generator's config keys (e.g. `min_digits`), passed through.

Items of a split come from generator seeds derived from (split, seed); train and held-out
stay disjoint by a stable hash of the question (`heldout_frac`), as for the built-in tasks.
The char tokenizer covers plain ASCII text but not the chat specials (`< > # { } _`) and
a few symbols: a generated problem whose question or answer uses another character, or whose
question is longer than `max_prompt_chars`, is skipped (counted in `skipped`); a dataset that
yields almost nothing usable is a usage error naming the characters.

The answer is the response text after the last think-close and before end-of-turn, stripped.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

from posttrain.chat import DEFAULT_CHARS, EOT, SPECIALS, THINK_CLOSE
from posttrain.errors import UsageError
from posttrain.tasks.base import LineCorpus, RewardResult, TaskConfig, in_heldout

TEXT_CHARS = set(DEFAULT_CHARS) - set(SPECIALS)


@dataclass
class ReasoningGymConfig(TaskConfig):
    name: str = "reasoning_gym"
    dataset: str = "chain_sum"  # a reasoning-gym dataset name (reasoning_gym.factory.DATASETS)
    options: dict = field(default_factory=dict)  # the dataset's own config keys, e.g. {min_digits: 1}
    heldout_frac: float = 0.1  # share of problems reserved for evaluation
    max_prompt_chars: int = 160  # longer questions are skipped (the model's context is short)
    question_subs: dict = field(default_factory=dict)  # text replacements in questions only, to fit the char
    # tokenizer: {"->": "to"} for spell_backward's "(example: sun -> nus)"


@dataclass(frozen=True)
class GymItem:
    question: str
    answer_text: str
    entry: Any = field(compare=False, hash=False)  # the generator's row (metadata for its scorer)

    def target(self, cot: bool = True) -> str:
        return self.answer_text


def answer_of(response: str) -> str:
    return response.split(EOT, 1)[0].rsplit(THINK_CLOSE, 1)[-1].strip()


class ReasoningGymTask(LineCorpus):
    name = "reasoning_gym"
    CHUNK = 256  # problems generated per generator seed

    def __init__(self, config: ReasoningGymConfig | None = None):
        try:
            import reasoning_gym
        except ImportError:
            raise UsageError(
                "task.name=reasoning_gym needs the reasoning-gym package: pip install reasoning-gym"
            ) from None
        self.config = c = config or ReasoningGymConfig()
        self._rg = reasoning_gym
        try:
            self._scorer = reasoning_gym.create_dataset(c.dataset, seed=0, size=1, **c.options)
        except Exception as e:
            names = ", ".join(sorted(reasoning_gym.factory.DATASETS)[:12])
            raise UsageError(
                f"task.dataset={c.dataset!r} with options {c.options} failed ({type(e).__name__}: "
                f"{str(e)[:100]}); use a reasoning-gym dataset name (e.g. {names}, ...) and its keys"
            ) from None
        self.skipped = 0

    def _usable(self, q: str, a: str) -> bool:
        return len(q) <= self.config.max_prompt_chars and set(q) <= TEXT_CHARS and set(a) <= TEXT_CHARS and bool(a)

    def items(self, n: int, split: str = "train", seed=0) -> list[GymItem]:
        c, out, chunk = self.config, [], 0
        want_heldout = split != "train"
        while len(out) < n:
            gen_seed = zlib.crc32(f"{c.dataset}/{split}/{seed}/{chunk}".encode())
            rows = self._rg.create_dataset(c.dataset, seed=gen_seed, size=self.CHUNK, **c.options)
            usable = 0
            for row in rows:
                q, a = str(row["question"]), str(row["answer"])
                for old, new in c.question_subs.items():
                    q = q.replace(old, new)
                if not self._usable(q, a):
                    self.skipped += 1
                    continue
                usable += 1
                if in_heldout(q, c.heldout_frac) == want_heldout and len(out) < n:
                    out.append(GymItem(q, a, row))
            if chunk == 0 and usable < self.CHUNK // 10:
                text = "".join(str(row["question"]) + str(row["answer"]) for row in rows)
                for old, new in c.question_subs.items():
                    text = text.replace(old, new)
                bad = "".join(sorted(set(text) - TEXT_CHARS))[:30]
                raise UsageError(
                    f"task.dataset={c.dataset!r}: only {usable} of {self.CHUNK} problems fit the char "
                    f"tokenizer (characters {bad!r}, or longer than max_prompt_chars="
                    f"{c.max_prompt_chars}); pick another dataset, raise max_prompt_chars, or map the "
                    f"characters away with task.question_subs"
                )
            chunk += 1
            if chunk > 1000:
                raise UsageError(
                    f"task.dataset={c.dataset!r}: fewer than {n} usable {split} problems in "
                    f"{chunk * self.CHUNK} generated; raise heldout_frac or widen task.options"
                )
        return out

    def prompt(self, item: GymItem) -> str:
        return item.question

    def gold(self, item: GymItem) -> str:
        return item.answer_text

    def final_answer(self, response: str) -> str:
        return answer_of(response)

    def reward(self, item: GymItem, response: str) -> RewardResult:
        score = float(self._scorer.score_answer(answer=answer_of(response), entry=item.entry) or 0.0)
        return RewardResult(score, {"score": score, "correct": float(score >= 1.0)})

    def corpus_line(self, item) -> str:
        """`question answer` lines of train problems. (LineCorpus)"""
        return _line(item)


def _line(it: GymItem) -> str:
    return f"{it.question} {it.answer_text}"
