"""Judge rewards: a language model grades the policy's responses (LLM-as-a-judge).

    posttrain rl ... task.judge.model=http://127.0.0.1:8000/v1            # any OpenAI-compatible server
    posttrain rl ... task.judge.model=runs/judge task.judge.mode=pairwise  # a checkpoint, in this process

Any single-turn task can be judged: `task.judge.*` wraps it in a `JudgeTask`. Items, prompts and
demonstrations stay the task's; the reward is the judge's verdict, and the task's own verifier
scores the same samples beside it, so every RL step logs

    reward/judge             mean judge reward          what the policy is pushed up on
    reward/verifier          mean verifier reward       the task's ground truth
    reward/judge_agreement   judge verdict = verifier's correctness (pointwise: score ≥ ½; pairwise:
                             the verifier-correct response wins, over pairs the verifier separates)
    reward/judge_errors      judge calls that failed: an error, no reply by the deadline, an unparsable reply
    reward/judge_first_frac  pairwise: share of decisive verdicts that picked the response shown first

Pointwise: one call per response; the reply's score on 0..`scale` (parse_score) over `scale` is the
reward. Pairwise: each response meets `pairs` others of its group (same prompt); its reward is its
win rate (a tie counts ½). Which of the two is shown first is a coin flip per comparison, seeded by
(step, group, pair), so a judge that favours a position (Zheng et al. 2023, "Judging LLM-as-a-judge",
2306.05685) favours no response systematically; `judge_first_frac` shows how much it leans.

The prompt template is frozen: RL writes it to RUN_DIR/judge_prompt.txt at the start, and a resumed
run refuses a different one (a judge that changes mid-run changes the reward under the optimiser).
A failed judge call never kills a step: it is counted, and a response left without any verdict
scores 0 with an error (reward/errors). Evaluation (greedy accuracy, pass@k) keeps the task's
verifier: the judge is a training signal, never the measure of success.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from posttrain.chat import prompt_text
from posttrain.errors import UsageError
from posttrain.reward_models.judge_backends import make_backend
from posttrain.tasks.base import BatchScored, JudgeConfig, RewardResult, batch_lists, correctness, safe_reward

POINTWISE = """Please act as an impartial judge and evaluate the response of an AI assistant to the question below.
Judge correctness first, then helpfulness. {reference_note}
[Question]
{question}
[Response]
{response}
Rate the response on a scale of 0 to 10. End your reply with the line "Score: N", N an integer from 0 to 10."""

PAIRWISE = """Please act as an impartial judge and compare the two responses of AI assistants to the question below.
Judge correctness first, then helpfulness. Do not let the order of the responses, their length or style sway you.
{reference_note}
[Question]
{question}
[Response A]
{response_a}
[Response B]
{response_b}
End your reply with "[[A]]" if response A is better, "[[B]]" if response B is better, or "[[C]]" for a tie."""

FIELDS = ("question", "response", "response_a", "response_b", "reference", "reference_note")
_FIELD = re.compile(r"\{(" + "|".join(FIELDS) + r")\}")


class JudgeError(ValueError):
    """A judge reply that does not say what the template asked for."""


# ---- parsing: what the judge said --------------------------------------------------------------

_NUM = r"(-?\d+(?:\.\d+)?)"
_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_BRACKETS = re.compile(r"\[\[\s*" + _NUM + r"\s*\]\]")
_OUT_OF = re.compile(_NUM + r"\s*(?:/|out of)\s*(\d+(?:\.\d+)?)", re.I)
_LABELLED = re.compile(r"(?:score|rating|grade|mark)\**\s*(?:is|of|[:=])?\s*\**\s*\[*" + _NUM, re.I)
_ONLY = re.compile(r"^[\s*\[\]()\"'`]*" + _NUM + r"[\s*\[\]()\"'`.!]*$")


def _json_objects(body: str):
    """The flat JSON objects in a reply, last first (`{"score": 7}`; a brace that is not JSON is skipped)."""
    for obj in re.findall(r"\{[^{}]*\}", body)[::-1]:
        try:
            data = json.loads(obj)
        except ValueError:
            continue
        if isinstance(data, dict):
            yield data


def _strip(text: str) -> str:
    """The reply without hidden reasoning (`<think>…</think>`)."""
    return _THINK.sub(" ", text).split("</think>")[-1]


def parse_score(text: str, scale: float) -> float:
    """A pointwise reply as a reward in [0, 1]: its score divided by `scale`.

    The first form that matches wins, the LAST match of that form counts (a judge that revises
    itself ends with its verdict): a JSON object with "score" or "rating"; "[[7]]"; "Score: 7" (also
    "Rating: 7/10", "**Score:** 7"); "7/10" or "7 out of 10" (scaled by its own denominator); a reply
    that is one number. Anything else (no score, several bare numbers, a score outside 0..scale)
    raises JudgeError."""
    body = _strip(text)
    for data in _json_objects(body):
        value = next((data[k] for k in ("score", "rating") if k in data), None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _in_range(float(value), scale, text)
    denominator = scale
    if m := _BRACKETS.findall(body):
        value = float(m[-1])
    elif m := _LABELLED.findall(body):
        value = float(m[-1])
        after = _OUT_OF.findall(body)
        if after and float(after[-1][0]) == value:  # "Score: 7/10": its own scale
            denominator = float(after[-1][1])
    elif m := _OUT_OF.findall(body):
        value, denominator = float(m[-1][0]), float(m[-1][1])
    elif m := _ONLY.match(body):
        value = float(m[1])
    else:
        raise JudgeError(f"no score in the judge's reply {text[-80:]!r}")
    if denominator <= 0:
        raise JudgeError(f"score out of {denominator:g} in {text[-80:]!r}")
    return _in_range(value * scale / denominator, scale, text)


def _in_range(value: float, scale: float, text: str) -> float:
    if not 0 <= value <= scale:
        raise JudgeError(f"score {value:g} outside 0..{scale:g} in {text[-80:]!r}")
    return value / scale


_CHOICE_BRACKETS = re.compile(r"\[\[\s*(A|B|C|tie)\s*\]\]", re.I)
_CHOICE_LABELLED = re.compile(
    r"\b(?:winner|better|verdict|choice|prefer(?:red|ence)?)\W*"
    r"(?:(?:response|output|assistant|one|is|was)\W+)*\(?(A|B|tie)\b",
    re.I,
)
_CHOICE_NAMED = re.compile(r"\b(?:response|output|assistant)\s*\(?\s*(A|B)\b\)?", re.I)
_CHOICE_ONLY = re.compile(r"^[\s*\[\]()\"'`]*(A|B|C|tie)[\s*\[\]()\"'`.!]*$", re.I)
_TIE = re.compile(r"\b(?:tie|equally good|equally bad|both (?:are )?(?:equally|correct|wrong))\b", re.I)


def parse_choice(text: str) -> str:
    """A pairwise reply as "A", "B" or "tie".

    First match wins, its last occurrence counts: "[[A]]" / "[[B]]" / "[[C]]" (MT-Bench; C = tie);
    a JSON object with "winner"; "Winner: B", "Response B is better" style labels; a reply that is
    one letter; a reply that names exactly one of "Response A" / "Response B"; a stated tie.
    Anything else (both named, neither) raises JudgeError."""
    body = _strip(text)
    for data in _json_objects(body):
        if str(data.get("winner", "")).strip().upper() in ("A", "B", "C", "TIE"):
            return _choice(str(data["winner"]))
    for pattern in (_CHOICE_BRACKETS, _CHOICE_LABELLED):
        if m := pattern.findall(body):
            return _choice(m[-1])
    if m := _CHOICE_ONLY.match(body):
        return _choice(m[1])
    named = {x.upper() for x in _CHOICE_NAMED.findall(body)}
    if len(named) == 1 and not _TIE.search(body):
        return named.pop()
    if _TIE.search(body):
        return "tie"
    raise JudgeError(f"no verdict (A, B or tie) in the judge's reply {text[-80:]!r}")


def _choice(x: str) -> str:
    x = x.strip().upper()
    return "tie" if x in ("C", "TIE") else x


# ---- the template ------------------------------------------------------------------------------


def load_template(cfg: JudgeConfig) -> str:
    """The template text of `cfg` (a file, or the built-in one of its mode), checked for the
    fields its mode needs."""
    if cfg.mode not in ("pointwise", "pairwise"):
        raise UsageError(f"task.judge.mode={cfg.mode!r} is unknown; use pointwise or pairwise")
    if not cfg.template:
        return POINTWISE if cfg.mode == "pointwise" else PAIRWISE
    path = Path(cfg.template)
    if not path.is_file():
        raise UsageError(f"task.judge.template: file {cfg.template!r} not found")
    text = path.read_text()
    need = ("{question}", "{response}") if cfg.mode == "pointwise" else ("{question}", "{response_a}", "{response_b}")
    missing = [f for f in need if f not in text]
    if missing:
        raise UsageError(
            f"task.judge.template={cfg.template}: a {cfg.mode} template needs the fields "
            f"{', '.join(missing)} (available: {', '.join('{' + f + '}' for f in FIELDS)})"
        )
    return text


def render(template: str, **values: str) -> str:
    """The template with its {fields} filled in one pass (a response that contains "{question}"
    stays as written; other braces, e.g. a JSON example, are left alone)."""
    return _FIELD.sub(lambda m: values.get(m[1], m[0]), template)


# ---- the task wrapper --------------------------------------------------------------------------


class JudgeTask(BatchScored):
    """`task` with its reward replaced by a judge's verdicts (see the module docstring); wants_ids:
    score_samples hands over the step (it seeds the order coin flips) and the completions."""

    def __init__(self, task, cfg: JudgeConfig, backend=None):
        if hasattr(task, "make_env"):
            raise UsageError(
                f"task.judge: task {task.name!r} runs multi-turn episodes (make_env); a judge scores "
                "single-turn responses only"
            )
        if cfg.pairs < 1 or cfg.scale <= 0 or cfg.max_tokens < 1 or cfg.timeout_s <= 0 or cfg.concurrency < 1:
            raise UsageError("task.judge: need pairs >= 1, scale > 0, max_tokens >= 1, timeout_s > 0, concurrency >= 1")
        if cfg.opponent not in ("group", "reference"):
            raise UsageError(f"task.judge.opponent={cfg.opponent!r} is unknown; use group or reference")
        self.task, self.cfg, self.template = task, cfg, load_template(cfg)
        self.name = f"judge/{task.name}"
        self.heldout_task = task  # evaluation scores with the task's verifier (recipes/rl.py)
        self._backend, self.logged, self.eot = backend, {}, ""

    def __getattr__(self, name):  # items, prompt, corpus, target, vocabulary…: the task's own
        if name.startswith("__") or name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)

    @property
    def backend(self):
        if self._backend is None:
            self._backend = make_backend(self.cfg)
        return self._backend

    def check(self, tok, max_len=None, max_new_tokens=0) -> None:
        """The task's own checks; the policy's end-of-turn text is cut from responses before judging."""
        if hasattr(self.task, "check"):
            self.task.check(tok, max_len, max_new_tokens)
        self.eot = getattr(tok, "chars", "")[getattr(tok, "eot_id", 0)] if hasattr(tok, "chars") else ""

    def start(self, run_dir: Path, resume: bool, samples_per_prompt: int) -> None:
        """Before RL: freeze the template in RUN_DIR/judge_prompt.txt (a resumed run must find the
        same), check group sizes, and reach the judge (a one-line error here, not at step 1)."""
        path = Path(run_dir, "judge_prompt.txt")
        if resume and path.exists() and path.read_text() != self.template:
            raise UsageError(
                f"{path} differs from the template this run is given (task.judge.template); a run keeps "
                "its judge: restore the template, or start a new run (out=NEW_DIR)"
            )
        path.write_text(self.template)
        if self.cfg.mode == "pairwise" and self.cfg.opponent == "group" and samples_per_prompt < 2:
            raise UsageError(
                "task.judge.mode=pairwise compares responses of one prompt: rollout.samples_per_prompt "
                "must be >= 2 (or task.judge.opponent=reference)"
            )
        self.backend.start(self.probe())

    def probe(self) -> str:
        """The judge prompt of the first train item with empty responses: what a backend checks at start."""
        fields = self._fields(self.task.items(1, "train", 0)[0])
        return render(self.template, response="", response_a="", response_b="", **fields)

    # ---- scoring ---------------------------------------------------------------------------
    def reward_batch(
        self, items, responses, ids=None, step=None, completions=None, finish_reasons=None
    ) -> list[RewardResult]:
        """The judge reads each completion as TRL would hand it over (no end-of-turn marker or special
        token: tasks/base.verifier_args); a response given by hand is cut at the policy's end of turn."""
        ids, completions, finish = batch_lists(len(items), ids, completions, finish_reasons)
        truth = [
            safe_reward(self.task, it, t, i, c, f) for it, t, i, c, f in zip(items, responses, ids, completions, finish)
        ]
        right = [correctness(r) if getattr(self.task, "correctness", "task") is not None else None for r in truth]
        texts = [
            c if c is not None else t.split(self.eot, 1)[0] if self.eot else t for t, c in zip(responses, completions)
        ]
        judged = self._pointwise if self.cfg.mode == "pointwise" else self._pairwise
        scores, errors, stats = judged(items, texts, right, step or 0)
        self.logged = stats
        return [
            RewardResult(
                0.0 if s is None else s,
                {"judge": 0.0 if s is None else s, "verifier": float(v.reward)},
                error=e,
                correct=c,
            )
            for s, e, v, c in zip(scores, errors, truth, right)
        ]

    def _question(self, item) -> str:
        return prompt_text(self.task.prompt(item))

    def _reference(self, item) -> str:
        for get in (lambda: item.target(True), lambda: self.task.gold(item)):
            try:
                value = get()
            except Exception:  # noqa: BLE001 — a task without demonstrations: judged without a reference
                continue
            if value is not None:
                return str(value)
        return ""

    def _fields(self, item) -> dict:
        ref = self._reference(item) if "{reference" in self.template else ""
        return {
            "question": self._question(item),
            "reference": ref,
            "reference_note": f"A reference answer: {ref}" if ref else "",
        }

    def _pointwise(self, items, texts, right, step):
        prompts = [render(self.template, response=t, **self._fields(it)) for it, t in zip(items, texts)]
        replies = self.backend.complete(prompts, step)
        scores, errors, agree = [], [], []
        for reply, ok in zip(replies, right):
            try:
                if isinstance(reply, Exception):
                    raise reply
                scores.append(parse_score(reply, self.cfg.scale))
                errors.append(None)
                if ok is not None:
                    agree.append(float((scores[-1] >= 0.5) == (ok >= 1.0)))
            except Exception as e:  # noqa: BLE001 — counted in reward/judge_errors, scored 0
                scores.append(None)
                errors.append(f"judge: {type(e).__name__}: {e}")
        stats = {"judge_errors": float(sum(e is not None for e in errors)), "judge_calls": float(len(prompts))}
        if agree:
            stats["judge_agreement"] = sum(agree) / len(agree)
        return scores, errors, stats

    def _pairwise(self, items, texts, right, step):
        comps = comparisons(items, texts, self.cfg, step, lambda it: json.dumps(self.task.prompt(it), sort_keys=True))
        prompts = []
        for i, j, swap in comps:
            a, b = texts[i], (texts[j] if j >= 0 else self._reference(items[i]))
            first, second = (b, a) if swap else (a, b)
            prompts.append(render(self.template, response_a=first, response_b=second, **self._fields(items[i])))
        replies = self.backend.complete(prompts, step) if prompts else []
        wins: list[list[float]] = [[] for _ in texts]
        failed: list[str | None] = [None] * len(texts)
        agree, first_picked, decisive, n_err = [], 0, 0, 0
        for (i, j, swap), reply in zip(comps, replies):
            try:
                if isinstance(reply, Exception):
                    raise reply
                choice = parse_choice(reply)
            except Exception as e:  # noqa: BLE001 — counted; the pair is left out of both win rates
                n_err += 1
                failed[i] = f"judge: {type(e).__name__}: {e}"
                if j >= 0:
                    failed[j] = failed[i]
                continue
            if choice != "tie":
                decisive += 1
                first_picked += choice == "A"
            w = 0.5 if choice == "tie" else float((choice == "A") != swap)  # 1 = texts[i] won
            wins[i].append(w)
            if j >= 0:
                wins[j].append(1.0 - w)
                if right[i] is not None and right[j] is not None and right[i] != right[j]:
                    agree.append(w if right[i] > right[j] else 1.0 - w)
            elif right[i] is not None:  # against the reference: a tie = correct
                agree.append(float((w >= 0.5) == (right[i] >= 1.0)))
        scores = [sum(w) / len(w) if w else None for w in wins]
        errors = [None if s is not None else (failed[k] or "judge: no comparison") for k, s in enumerate(scores)]
        stats = {"judge_errors": float(n_err), "judge_calls": float(len(prompts))}
        if agree:
            stats["judge_agreement"] = sum(agree) / len(agree)
        if decisive:
            stats["judge_first_frac"] = first_picked / decisive
        return scores, errors, stats


def comparisons(items, texts, cfg: JudgeConfig, step: int, key) -> list[tuple[int, int, bool]]:
    """The pairwise comparisons of a batch as (i, j, swap): response i against response j of the
    same prompt (j = -1: against the task's reference answer), `swap` = j's text is shown first.

    Group (same `key(item)`) members sit on a ring; response k meets the next `pairs` ones, so each
    response is in about 2·pairs comparisons and no pair is asked twice. The coin flip of each pair
    is pure in (step, group, pair): a resumed run asks the same questions in the same order."""
    if cfg.opponent == "reference":
        return [(i, -1, _coin(step, key(it), i, -1)) for i, it in enumerate(items)]
    groups: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault(key(it), []).append(i)
    out = []
    for g, members in groups.items():
        seen = set()
        n = len(members)
        for k in range(n):
            for off in range(1, min(cfg.pairs, n - 1) + 1):
                a, b = members[k], members[(k + off) % n]
                if (min(a, b), max(a, b)) in seen:
                    continue
                seen.add((min(a, b), max(a, b)))
                out.append((a, b, _coin(step, g, a - members[0], b - members[0])))
    return out


def _coin(step: int, group: str, i: int, j: int) -> bool:
    return random.Random(f"judge/{step}/{group}/{i}/{j}").random() < 0.5
