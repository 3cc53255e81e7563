"""Your own data as a task: `task.name=dataset task.train=PATH [task.test=PATH] [task.reward=...]`.

    posttrain rl task.name=dataset task.train=data/train.jsonl task.test=data/test.jsonl \\
        task.reward=rewards.py:correct,rewards.py:fmt task.reward_weights=[1.0,0.1] init=runs/sft
    posttrain rl task.name=dataset task.train=openai/gsm8k task.test=openai/gsm8k task.subset=main \\
        task.prompt_template="{question} Let's think step by step…" init=Qwen/Qwen2.5-0.5B-Instruct

Rows (tasks/rows.py reads JSONL, JSON, CSV, Parquet, `datasets` folders and, by id, datasets on the
Hugging Face Hub: tasks/hub_data.py, with `subset`, `split` and `test_split`) carry:
  prompt         a string, or {role, content} messages (system allowed): `prompt_key` (default
                 `prompt`), else `messages` (SFT: split at its last assistant message), else `question`;
                 or `prompt_template` filled with the row's columns ("{question} Let's think…", the
                 instruction a recipe adds, as verl's preprocessing scripts add it): the user message.
  answer         under `answer`, else `ground_truth`, else `solution`, else verl's
                 `reward_model.ground_truth` (`answer_key` names another column); optional.
  columns        `columns` renames before all of this: {prompt: question} reads the prompt from
                 the `question` column (the original column stays, for reward functions).
  completion     the demonstration for SFT (`completion_key`), or the last assistant message.
  everything     else is kept and passed to the reward functions by column name (TRL), and
                 verl's `data_source` / `extra_info` to compute_score.
Train and held-out rows: `test` rows when given, else a stable hash of the prompt puts
`test_frac` of the train rows aside (disjoint by construction, like the built-in tasks).

Reward: the user's functions (tasks/rewards.py), or without any, 1 when the last number of the
response equals the answer's. Every one of them reads the completion as TRL hands it to reward
functions (no end-of-turn marker or special token; tasks/base.verifier_args), and TRL functions get
its `finish_reason` ("stop" | "length") beside it. Correctness (eval: greedy accuracy, pass@k, maj@k) is its own
signal, not the reward: `correct=FILE.py:FUNC` (True/1 = correct, same signatures as a reward),
else `correct_threshold` on the reward, else "last number equals the answer" when rows have
answers; with none of them the evaluation reports rewards only, and says why.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

from posttrain import postmortem
from posttrain.chat import EOT, SYSTEM, THINK_CLOSE, check_messages, prompt_text, split_last_assistant
from posttrain.errors import UsageError
from posttrain.tasks.base import BatchScored, RewardResult, TaskConfig, batch_lists, in_heldout
from posttrain.tasks.rewards import RewardFn, describe, reward_fns, split_specs
from posttrain.tasks.rows import read_rows, rename_columns, render_template

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@dataclass
class DatasetConfig(TaskConfig):
    """Rows from your own files, scored by your own reward functions."""

    name: str = "dataset"
    train: str = ""  # training rows: .jsonl, .json, .csv, .parquet, a `datasets` save_to_disk folder, or a
    # Hugging Face dataset id org/name[@revision][:subset[:split]] (HF_HOME, HF_TOKEN, HF_HUB_OFFLINE apply)
    test: str = ""  # held-out rows (same forms); "" = test_frac of the train rows, by a hash of the prompt
    subset: str = ""  # a hub dataset's configuration (load_dataset's name, e.g. main for openai/gsm8k)
    split: str = "train"  # the split `train` reads (a hub dataset or a saved DatasetDict)
    test_split: str = "test"  # the split `test` reads
    test_frac: float = 0.1  # share of train rows held out when `test` is not given
    columns: dict = field(default_factory=dict)  # renames applied first, {prompt: question, answer: final}:
    # the prompt read from column `question`, the answer from `final` (task.columns.prompt=question)
    prompt_key: str = "prompt"  # column of the prompt (a string or {role, content} messages); else messages, question
    prompt_template: str = ""  # the user message made from each row's columns, "{question} Let's think…"
    # ({{ }} for literal braces); "" = the prompt column as it is
    answer_key: str = ""  # the reference answer's column; "" = answer, ground_truth, solution or verl's one
    completion_key: str = "completion"  # SFT: the demonstration column (a `messages` column works without it)
    system: str = ""  # a system message put before every prompt that has none
    reward: str = ""  # reward functions, comma-separated FILE.py:FUNC or module:FUNC (TRL or verl signature);
    # "" = 1 when the response's last number equals the answer
    reward_weights: list[float] = field(default_factory=list)  # one weight per reward function (default 1 each)
    correct: str = ""  # FILE.py:FUNC or module:FUNC returning True/1 when a response is correct (eval)
    correct_threshold: float | None = (
        None  # else: correct = reward ≥ this; else the answer match when rows have answers
    )
    text_subs: dict = field(default_factory=dict)  # replacements in every text before tokenizing, e.g. {"<": "lt"}
    # (the built-in tokenizer's chat markers < > # _ cannot appear in text)
    max_rows: int = 0  # read at most this many rows of each file (0 = all)


@dataclass
class Row:
    prompt: Any  # str | list[{role, content}]
    answer: Any = None  # the reference answer (any JSON value), or None
    completion: str | None = None  # the SFT demonstration, or None
    columns: dict = field(default_factory=dict)  # every column of the row (for the reward functions)
    where: str = ""  # FILE:LINE, for errors

    def target(self, cot: bool = True) -> str:
        """The demonstration (SFT, eval budget); `cot` has no meaning for given data."""
        if self.completion is None:
            raise UsageError(
                f"{self.where}: no completion to learn from; give a `completion` column (or "
                "task.completion_key) or a `messages` column ending with an assistant message"
            )
        return self.completion


def last_number(text: str) -> str | None:
    """The decoded response's last number before its end of turn (majority vote's answer)."""
    return final_number(text.split(EOT, 1)[0])


def final_number(text: str) -> str | None:
    """The text's last number, normalised ("1,234.50" → "1234.5"): the built-in answer check, on
    the completion as TRL gives it (no end-of-turn marker to cut at: a `#` there is the model's)."""
    found = _NUMBER.findall(text)
    return _norm(found[-1]) if found else None


def _norm(s: str) -> str:
    s = s.replace(",", "")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def _answer_number(answer) -> str | None:
    if isinstance(answer, bool) or answer is None:
        return None
    if isinstance(answer, (int, float)):
        return _norm(repr(float(answer)) if isinstance(answer, float) else str(answer))
    found = _NUMBER.findall(str(answer))
    return _norm(found[-1]) if found else None


class DatasetTask(BatchScored):  # wants_ids: verifier_args passes TRL's completion_ids, completion, finish reason
    name = "dataset"

    def __init__(self, config: DatasetConfig | None = None, reward_funcs=None, correct_func=None):
        self.config = c = config or DatasetConfig()
        if not c.train:
            raise UsageError(
                "task.name=dataset needs task.train=PATH (a .jsonl/.json/.csv/.parquet file or a `datasets` folder)"
            )
        if not 0 <= c.test_frac < 1:
            raise UsageError(f"task.test_frac={c.test_frac} must be in [0, 1)")
        rows = [self._row(w, r) for w, r in self._read(c.train, "task.train", c.split)]
        if c.test:
            self.train, self.test = rows, [self._row(w, r) for w, r in self._read(c.test, "task.test", c.test_split)]
        else:
            held = [in_heldout(json.dumps(r.prompt, sort_keys=True), c.test_frac) for r in rows]
            self.train = [r for r, h in zip(rows, held) if not h]
            self.test = [r for r, h in zip(rows, held) if h]
        if not self.train:
            raise UsageError(f"task.train={c.train!r}: no training rows left after holding out test_frac={c.test_frac}")
        self.fns: list[RewardFn] = reward_fns(
            reward_funcs if reward_funcs is not None else split_specs(c.reward), c.reward_weights
        )
        self.correct_fn = (
            reward_fns([correct_func], [], "task.correct")[0]
            if correct_func is not None
            else reward_fns([c.correct], [], "task.correct")[0]
            if c.correct
            else None
        )
        self.user_code = bool(self.fns) or self.correct_fn is not None  # pool.runs_user_code: workers by default
        has_answers = all(r.answer is not None for r in self.train[:50])
        if not self.fns and not has_answers and not c.judge.model:  # a judge can score rows without answers
            raise UsageError(
                f"task.train={c.train!r}: rows have no answer column (answer, ground_truth or "
                "reward_model.ground_truth) and no task.reward is given: nothing can score a response; "
                "add an answer column or task.reward=FILE.py:FUNCTION"
            )
        self.correctness = (
            "task.correct"
            if self.correct_fn
            else "task.correct_threshold"
            if c.correct_threshold is not None
            else "answer"
            if has_answers
            else None
        )

    # ---- rows ------------------------------------------------------------------------------
    def _read(self, path, key, split):
        c = self.config
        return rename_columns(read_rows(path, key, split, c.subset, c.max_rows), c.columns)

    def _sub(self, text: str) -> str:
        for a, b in self.config.text_subs.items():
            text = text.replace(a, b)
        return text

    def _row(self, where: str, row: dict) -> Row:
        c = self.config
        completion = None
        if "messages" in row and not c.prompt_template and c.prompt_key not in row:
            prompt, completion = split_last_assistant(check_messages(row["messages"], f"{where} messages"), where)
        elif c.prompt_template or c.prompt_key in row or "question" in row:
            prompt = (
                render_template(c.prompt_template, row, where)
                if c.prompt_template
                else row[c.prompt_key if c.prompt_key in row else "question"]
            )
            if row.get(c.completion_key) is not None:
                completion = row[c.completion_key]
                if not isinstance(completion, str):  # conversational completion: its assistant text
                    completion = "".join(
                        m["content"]
                        for m in check_messages(completion, f"{where} {c.completion_key}")
                        if m["role"] == "assistant"
                    )
        else:
            raise UsageError(
                f"{where}: no {c.prompt_key!r}, messages or question column (columns: {', '.join(map(str, row))}); "
                "set task.columns.prompt=COLUMN (or task.prompt_template)"
            )
        if isinstance(prompt, str):
            prompt = self._sub(prompt)
            if c.system:
                prompt = [{"role": "system", "content": c.system}, {"role": "user", "content": prompt}]
        else:
            prompt = [
                {**m, "content": self._sub(m["content"])} for m in check_messages(prompt, f"{where} {c.prompt_key}")
            ]
            if c.system and prompt[0]["role"] != "system":
                prompt = [{"role": "system", "content": c.system}] + prompt
        if completion is not None:
            completion = self._sub(completion)
        return Row(prompt, self._answer(row, where), completion, dict(row), where)

    def _answer(self, row: dict, where: str):
        key = self.config.answer_key
        if key:
            if key not in row:
                raise UsageError(f"{where}: no {key!r} column (task.answer_key); columns: {', '.join(map(str, row))}")
            return row[key]
        for k in ("answer", "ground_truth", "solution"):
            if k in row:
                return row[k]
        rm = row.get("reward_model")
        return rm.get("ground_truth") if isinstance(rm, dict) else None

    # ---- the Task protocol -----------------------------------------------------------------
    def items(self, n: int, split: str = "train", seed=0) -> list[Row]:
        """`n` rows of `split`: held-out rows in file order (the first n); train rows drawn without
        replacement, pure in `seed` (every row once before any twice when n exceeds the rows)."""
        rows = self.train if split == "train" else self.test
        if split != "train" or not rows:
            if not rows:
                raise UsageError(
                    f"no held-out rows: give task.test=PATH or task.test_frac > 0 ({len(self.train)} train rows)"
                )
            return rows[:n]
        rng = random.Random(f"dataset/{split}/{seed}")
        out = []
        while len(out) < n:
            out += rng.sample(rows, min(len(rows), n - len(out)))
        return out

    def num_rows(self, split: str) -> int:
        return len(self.train if split == "train" else self.test)

    def prompt(self, item: Row):
        return item.prompt

    def gold(self, item: Row):
        return _answer_number(item.answer) if item.answer is not None else None

    def final_answer(self, response: str) -> str | None:
        """The extracted answer for majority vote: the last number (only when rows have answers)."""
        return last_number(response) if self.correctness == "answer" else None

    def reward_batch(
        self, items, responses, ids=None, step=None, completions=None, finish_reasons=None
    ) -> list[RewardResult]:
        """Every function once over the batch (TRL style); a function that fails on the batch is
        retried sample by sample, so an error costs only the samples it belongs to. Reward and
        correctness functions and the answer match all read `completions` (the text without the
        end-of-turn marker, as TRL hands it over), never the raw `responses` (issue 29)."""
        n = len(items)
        ids, completions, finish_reasons = batch_lists(n, ids, completions, finish_reasons)
        texts = [r if c is None else c for r, c in zip(responses, completions)]
        finish = [f or "stop" for f in finish_reasons]
        values: list[dict] = [{} for _ in range(n)]
        errors: list[str | None] = [None] * n
        logged: dict = {}
        for fn in self.fns:
            for i, v in enumerate(self._each(fn, items, texts, ids, finish, step, logged, errors)):
                if v is not None:
                    values[i][fn.name] = v
        out = []
        for i, (item, text) in enumerate(zip(items, texts)):
            if errors[i] is not None:
                out.append(RewardResult(0.0, error=errors[i]))
                continue
            if self.fns:
                reward = sum(fn.weight * values[i][fn.name] for fn in self.fns if fn.name in values[i])
                comps = dict(values[i])
            else:  # the built-in reward: the answer's number
                reward = comps = None
            correct = self._correct(item, text, ids[i], finish[i], reward, step, errors, i)
            if reward is None:
                reward, comps = float(correct or 0.0), {"correct": float(correct or 0.0)}
            out.append(RewardResult(reward, comps, error=errors[i], correct=correct))
        self.logged = logged
        return out

    def _each(self, fn: RewardFn, items, texts, ids, finish, step, logged, errors) -> list:
        todo = [i for i in range(len(items)) if errors[i] is None]
        if not todo:
            return []
        with postmortem.doing(f"while calling reward function {fn.where} on {len(todo)} responses"):
            try:
                vals = fn(*([x[i] for i in todo] for x in (items, texts, ids)), step, logged, [finish[i] for i in todo])
                return _scatter(len(items), todo, vals)
            except Exception:  # find the sample(s) at fault, one by one
                pass
            out = [None] * len(items)
            for i in todo:
                try:
                    out[i] = fn([items[i]], [texts[i]], [ids[i]], step, logged, [finish[i]])[0]
                except Exception as e:  # counted in reward/errors; the step goes on
                    errors[i] = f"reward function {fn.name}: {type(e).__name__}: {e}"
            return out

    def _correct(self, item: Row, text: str, ids, finish: str, reward, step, errors, i) -> float | None:
        if self.correct_fn is not None:
            try:
                with postmortem.doing(f"while calling correctness function {self.correct_fn.where}"):
                    v = self.correct_fn([item], [text], [ids], step, None, [finish])[0]
            except Exception as e:
                errors[i] = f"correctness function {self.correct_fn.name}: {type(e).__name__}: {e}"
                return 0.0
            return None if v is None else float(v >= 0.5)
        if self.config.correct_threshold is not None and reward is not None:
            return float(reward >= self.config.correct_threshold)
        if item.answer is not None:
            got, gold = final_number(text), _answer_number(item.answer)
            if gold is None:  # a text answer: what follows the reasoning must match it
                return float(text.rsplit(THINK_CLOSE, 1)[-1].strip() == str(item.answer).strip())
            return float(got is not None and got == gold)
        return None

    # ---- pretraining text ------------------------------------------------------------------
    def corpus_line(self, item: Row) -> str:
        text = prompt_text(item.prompt)
        return f"{text} {item.completion}" if item.completion is not None else text

    def corpus(self, n_chars: int, seed: int) -> str:
        rng, lines, size = random.Random(f"dataset/corpus/{seed}"), [], 0
        while size < n_chars:
            for row in rng.sample(self.train, len(self.train)):
                lines.append(self.corpus_line(row) + "\n")
                size += len(lines[-1])
                if size >= n_chars:
                    break
        return "".join(lines)

    def validation_text(self, seed: int) -> str:
        return "".join(self.corpus_line(r) + "\n" for r in (self.test or self.train)[:400])

    # ---- startup checks --------------------------------------------------------------------
    def check(self, tok, max_len: int | None = None, max_new_tokens: int = 0) -> None:
        """Every prompt renders, encodes and fits the context; every function answers a dry call on
        the first training rows. One UsageError naming the row or the function otherwise."""
        for r in self.train + self.test:
            try:
                n = len(tok.encode(tok.chat_prompt(r.prompt)))
            except UsageError as e:
                raise UsageError(f"{r.where}: {e} (task.text_subs can replace characters)") from None
            if max_len and n + max(max_new_tokens, 1) > max_len:
                raise UsageError(
                    f"{r.where}: the prompt is {n} tokens; with max_new_tokens={max_new_tokens} it "
                    f"exceeds the model's context ({max_len}); shorten or drop the row"
                )
        rows = self.train[:2]
        texts = [
            r.completion if r.completion is not None else str(r.answer if r.answer is not None else "") for r in rows
        ]
        ids = [tok.encode(t) if all(ch in getattr(tok, "stoi", {ch: 0 for ch in t}) for ch in t) else [] for t in texts]
        for fn in self.fns + ([self.correct_fn] if self.correct_fn else []):
            try:
                with postmortem.doing(f"while calling {fn.where} on the first training rows (a dry call)"):
                    fn(rows, texts, ids, 0, {})
            except Exception as e:
                raise UsageError(
                    f"reward function {fn.name} ({describe(fn.fn)}) failed on a dry call with the "
                    f"first training rows ({rows[0].where}): {type(e).__name__}: {e}"
                ) from None

    def vocabulary(self) -> str:
        """Every character of the rows' texts (a character tokenizer trained from scratch needs them)."""
        chars = set()
        for r in self.train + self.test:
            if not isinstance(r.prompt, str) and any(m["role"] == "system" for m in r.prompt):
                chars.add(SYSTEM)  # the built-in template's system-turn marker
            chars |= set(prompt_text(r.prompt))
            chars |= set(r.completion or "")
            chars |= set(str(r.answer) if r.answer is not None else "")
        return "".join(sorted(chars))


def _scatter(n: int, where: list[int], values: list) -> list:
    out = [None] * n
    for i, v in zip(where, values):
        out[i] = v
    return out
