"""Preference pairs: built from the task by sampling the policy, or loaded from TRL-style JSONL.

    Pair(prompt="3+4+5", chosen="{3+4=7;7+5=12}12", rejected="{3+4=7;7+5=13}13")

Texts are plain: `prompt` is the question (the chat template is applied when tokenizing),
`chosen` / `rejected` are responses without the end-of-turn token. Two sources:

- `pairs_from_policy`: sample n responses per train-split prompt, verify them; chosen = a
  correct one, rejected = a wrong one (the course's verifier-labelled pairs). Prompts whose
  samples are all right or all wrong give no pair and are counted; an empty response (the
  model ended its turn at once) is never a rejected text, since a pair file cannot hold it. `same_length=True` keeps
  only pairs whose two responses have equal token counts (the course's control for DPO's
  length bias); a prompt with no equal-length pair is counted as skipped.
- `load_jsonl`: one object per line with `prompt`, `chosen`, `rejected` (TRL's "standard"
  format), or the "conversational" one where each is a list of `{"role", "content"}`
  messages — every turn is kept: the prompt's system message and earlier turns go through
  the chat template, and TRL's implicit-prompt rows (chosen/rejected as whole conversations)
  take their shared turns as the prompt; an optional numeric `margin` (Llama-2-style, used by
  the reward model).
  A bad row is a one-line error naming file and line, or with `on_bad="skip"` it is skipped
  and counted.
- `corrupted_pairs`: chosen = the task's gold chain of thought, rejected = the same trace with
  one mistake of the kinds the policy makes (the course's "corrupted answer" pairs, gpt_mini 05).
  Unlimited and free to build, they teach a reward model to check each partial sum.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from posttrain.chat import check_messages
from posttrain.errors import UsageError
from posttrain.framework.backends import make_engine
from posttrain.framework.batch import collate
from posttrain.framework.roles import RolloutEngine
from posttrain.framework.rollout import SamplingParams
from posttrain.progress import generate_with_progress
from posttrain.tasks.base import score_samples


@dataclass
class Pair:
    prompt: str | list  # a question, or {role, content} messages (every turn of the conversation)
    chosen: str | list  # a response, or the assistant's message(s)
    rejected: str | list
    margin: float = 0.0
    item: object = None  # the task item, when the pair came from the task


# ---- from the task ------------------------------------------------------------------------


def pairs_from_policy(
    model,
    tok,
    task,
    items,
    samples_per_prompt: int = 8,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    seed: int = 0,
    same_length: bool = False,
    engine: RolloutEngine | None = None,
    pairs_per_prompt: int = 1,
) -> tuple[list[Pair], dict]:
    """Up to `pairs_per_prompt` (correct, wrong) pairs per prompt whose samples are mixed, no
    response in two pairs (so 8 samples give at most 4); stats count the rest."""
    engine = engine or make_engine(model, tok)
    prompts = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    sp = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, stop_ids=(tok.eot_id,))
    samples = generate_with_progress(engine, prompts, samples_per_prompt, sp, "sampling pairs", seed=seed, items=items)
    score_samples(task, samples)
    groups: dict[int, list] = {}
    for s in samples:
        groups.setdefault(s.group, []).append(s)
    rng = random.Random(seed)
    pairs, stats = (
        [],
        {"prompts": len(items), "all_correct": 0, "all_wrong": 0, "no_equal_length": 0, "empty_responses": 0},
    )
    for g in sorted(groups):
        good = [s for s in groups[g] if s.reward > 0.5 and s.finish_reason == "stop"]
        bad = [s for s in groups[g] if s.reward <= 0.5 and _strip(tok, s).strip()]
        stats["empty_responses"] += sum(not _strip(tok, s).strip() for s in groups[g])
        if not bad:
            stats["all_correct"] += 1
            continue
        if not good:
            stats["all_wrong"] += 1
            continue
        options = [(c, r) for c in good for r in bad]
        if same_length:
            options = [(c, r) for c, r in options if len(c.response_ids) == len(r.response_ids)]
            if not options:
                stats["no_equal_length"] += 1
                continue
        for c, r in _disjoint(options, pairs_per_prompt, rng):
            pairs.append(Pair(task.prompt(items[g]), _strip(tok, c), _strip(tok, r), item=items[g]))
    stats["pairs"] = len(pairs)
    return pairs, stats


def _disjoint(options: list, k: int, rng: random.Random) -> list:
    """k (or fewer) pairs of `options` in random order with no sample used twice; k = 1 is one
    uniform choice (the draw earlier versions made, so their pairs are unchanged)."""
    if k <= 1:
        return [rng.choice(options)]
    rng.shuffle(options)
    used, out = set(), []
    for c, r in options:
        if id(c) not in used and id(r) not in used:
            out.append((c, r))
            used |= {id(c), id(r)}
            if len(out) == k:
                break
    return out


def _strip(tok, sample) -> str:
    ids = sample.response_ids
    if ids and ids[-1] == tok.eot_id:
        ids = ids[:-1]
    return tok.decode(ids)


CORRUPTIONS = ("slip", "term", "skip", "answer")


def corrupt_trace(terms: tuple[int, ...], rng: random.Random) -> str:
    """A wrong chain-of-thought response for the sum of `terms` (at least 2), made of the
    gold trace with ONE mistake, every later step consistent with it:

        slip    one partial sum off by ±1..±10       {3+4=7;7+5=13;13+6=19}19
        term    one step adds a wrong term            {3+4=7;7+8=15;15+6=21}21
        skip    one term (not the first) left out     {3+4=7;7+6=13}13
        answer  a correct trace, a wrong final answer {3+4=7;7+5=12;12+6=18}17

    So a reader can only tell it from the gold response by checking a step against the
    prompt or its own arithmetic, which is what the reward model should learn to do."""
    kind = rng.choice(CORRUPTIONS if len(terms) > 2 else ("slip", "term", "answer"))
    ts = list(terms)
    at = rng.randrange(1, len(ts))  # the step (term index) that goes wrong
    if kind == "skip":
        nonzero = [i for i in range(1, len(ts)) if ts[i]]  # leaving out a 0 would not be a mistake
        if nonzero:
            del ts[rng.choice(nonzero)]
        else:
            kind = "slip"
    if kind == "term":
        ts[at] = rng.choice([v for v in range(max(0, ts[at] - 9), ts[at] + 10) if v != ts[at]])
    steps, acc = [], ts[0]
    for i, t in enumerate(ts[1:], 1):
        new = acc + t
        if kind == "slip" and i == at:
            new += rng.choice([d for d in range(-10, 11) if d and new + d >= 0])
        steps.append(f"{acc}+{t}={new}")
        acc = new
    answer = acc
    if kind == "answer":
        answer = rng.choice([a for a in range(max(0, acc - 10), acc + 11) if a != acc])
    return "{" + ";".join(steps) + "}" + str(answer)


def corrupted_pairs(task, items, seed: int = 0) -> list[Pair]:
    """One (gold CoT, corrupted CoT) pair per item (items with `terms`, `target`)."""
    rng = random.Random(f"corrupted/{seed}")
    pairs = []
    for it in items:
        if len(it.terms) < 2:
            continue
        chosen, rejected = it.target(True), corrupt_trace(it.terms, rng)
        if rejected != chosen:
            pairs.append(Pair(task.prompt(it), chosen, rejected, item=it))
    return pairs


# ---- from a file --------------------------------------------------------------------------


def load_jsonl(path: str | Path, on_bad: str = "error", fits=None) -> tuple[list[Pair], int]:
    """(pairs, skipped rows). `on_bad`: "error" raises on the first bad row, "skip" counts it.
    `fits(pair) -> reason | None` refuses rows a model cannot take (fits_context), as bad rows."""
    if on_bad not in ("error", "skip"):
        raise UsageError(f"on_bad={on_bad!r} is unknown; use error or skip")
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"preference file {str(path)!r} not found; give a JSONL file with prompt/chosen/rejected")
    pairs, skipped = [], 0
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            pair = parse_row(line)
            why = fits(pair) if fits is not None else None
            if why is not None:
                raise ValueError(why)
            pairs.append(pair)
        except ValueError as e:
            if on_bad == "error":
                raise UsageError(f"{path}:{n}: {e} (fix the row, or pass on_bad=skip to skip and count it)") from None
            skipped += 1
    if not pairs:
        raise UsageError(f"{path}: no usable preference rows")
    return pairs, skipped


def fits_context(tok, context: int):
    """`fits` for load_jsonl: a row whose prompt plus its longer response is past the model's
    context (`model.config.max_seq_len`) is refused by name: the checkpoint's context is
    fixed, so the fix is in the data (shorten or drop the row), never "raise it"."""

    def fits(p: Pair) -> str | None:
        try:
            n = len(tok.encode(tok.chat_prompt(p.prompt))) + max(
                len(tok.encode(tok.chat_continuation(p.prompt, r))) for r in (p.chosen, p.rejected)
            )  # as encode_pairs
        except UsageError:  # a character the tokenizer lacks: encode_pairs names it
            return None
        if n <= context:
            return None
        return f"prompt + response is {n} tokens, past the model's context of {context} tokens; shorten or drop the row"

    return fits


def parse_row(line: str) -> Pair:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise ValueError("a row must be a JSON object with prompt, chosen, rejected")
    return row_pair(row)


def row_pair(row: dict) -> Pair:
    """A TRL preference row as a Pair, every turn kept: `prompt` a string or messages (system and
    earlier turns included); `chosen`/`rejected` strings or assistant message lists. Without a
    `prompt` (TRL's implicit-prompt rows), the turns chosen and rejected share are the prompt."""
    for key in ("chosen", "rejected"):
        if key not in row:
            raise ValueError(f"missing field {key!r}")
    chosen, rejected = (_value(row[k], k) for k in ("chosen", "rejected"))
    if "prompt" in row:
        prompt = _value(row["prompt"], "prompt")
    elif isinstance(chosen, list) and isinstance(rejected, list):
        n = 0
        while n < min(len(chosen), len(rejected)) - 1 and chosen[n] == rejected[n]:
            n += 1
        if n == 0:
            raise ValueError("no 'prompt' and chosen/rejected share no turn to take as the prompt")
        prompt, chosen, rejected = chosen[:n], chosen[n:], rejected[n:]
    else:
        raise ValueError("missing field 'prompt'")
    for key, v in (("prompt", prompt), ("chosen", chosen), ("rejected", rejected)):
        if not (v.strip() if isinstance(v, str) else "".join(m["content"] for m in v).strip()):
            raise ValueError(f"empty {key!r}")
    if isinstance(prompt, list) and prompt[-1]["role"] == "assistant":
        raise ValueError("the prompt ends with an assistant message; chosen/rejected are the assistant's reply")
    if chosen == rejected:
        raise ValueError("chosen and rejected are identical")
    margin = row.get("margin", 0.0)
    if not isinstance(margin, (int, float)) or isinstance(margin, bool):
        raise ValueError(f"margin must be a number, got {margin!r}")
    return Pair(prompt, chosen, rejected, float(margin))


def _value(value, key: str):
    """A string, or a conversational message list (checked: known roles, text content)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        try:
            return check_messages(value, key)
        except UsageError as e:
            raise ValueError(str(e)) from None
    raise ValueError(f"{key!r} must be a string or a list of {{role, content}} messages")


def encode_pairs(tok, pairs: list[Pair]) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt ids, chosen ids, rejected ids): the prompt through the chat template with the
    assistant turn opened, each completion as the template continues it (end of turn included).
    A character outside the tokenizer's alphabet is a one-line error naming the pair."""
    out = []
    for i, p in enumerate(pairs):
        try:
            out.append(
                (
                    tok.encode(tok.chat_prompt(p.prompt)),
                    tok.encode(tok.chat_continuation(p.prompt, p.chosen)),
                    tok.encode(tok.chat_continuation(p.prompt, p.rejected)),
                )
            )
        except UsageError as e:
            raise UsageError(f"preference pair {i} (prompt {str(p.prompt)[:40]!r}): {e}") from None
    return out


def collate_pairs(encoded, idx, pad_id: int) -> dict:
    """Rows interleaved chosen, rejected, chosen, … (pair i = rows 2i, 2i+1); loss_mask on the
    responses (framework/batch.collate)."""
    prompts, responses = [], []
    for i in idx:
        p, c, r = encoded[i]
        prompts += [p, p]
        responses += [c, r]
    return collate(prompts, responses, pad_id)


def seq_logps(lp: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row sums of token logprobs over `mask` and the token counts: ([B], [B])."""
    return (lp * mask).sum(-1), mask.sum(-1)
