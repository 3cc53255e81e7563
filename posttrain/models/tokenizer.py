"""The built-in character tokenizer: no downloads, chat and reasoning specials.

One character is one token. The chat template is the course's, with single-character
specials so a sequence reads as plain text:

    <3+4+5>{3+4=7;7+5=12}12#
    ^ user  ^ think open   ^ end of turn
          ^ assistant    ^ think close

`_` is padding and never appears in text. Any other character outside the vocabulary is
an error that names it (silently dropping characters would corrupt prompts).

Tool use (framework/agent.py) adds four specials, appended after the original vocabulary so
the ids of every older checkpoint's characters stay the same:

    <12345+67890>⟦12345+67890⟧⟨80235⟩80235#
                 ^ call open  ^ call close: the engine stops here and the env runs the tool
                              ^ result open ... result close: injected by the env (mask 0)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from posttrain.chat import (  # noqa: F401
    ASSISTANT,
    BASE_CHARS,
    CALL_CLOSE,
    CALL_OPEN,
    DEFAULT_CHARS,
    EOT,
    PAD,
    RESULT_CLOSE,
    RESULT_OPEN,
    SPECIALS,
    SYSTEM,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_SPECIALS,
    USER,
    check_messages,
    render_builtin,
)
from posttrain.errors import UsageError

FILE_NAME = "tokenizer.posttrain.json"
HF_SPECIALS = PAD + EOT + USER + ASSISTANT + SYSTEM  # special in an HF export: what skip_special_tokens drops


@dataclass
class CharTokenizer:
    chars: str = DEFAULT_CHARS

    def __post_init__(self):
        if len(set(self.chars)) != len(self.chars):
            raise ValueError("tokenizer characters must be unique")
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.pad_id = self.stoi[PAD]
        self.user_id = self.stoi[USER]
        self.assistant_id = self.stoi[ASSISTANT]
        self.eot_id = self.stoi[EOT]
        self.think_open_id = self.stoi[THINK_OPEN]
        self.think_close_id = self.stoi[THINK_CLOSE]
        # tool specials exist only in vocabularies that have them (checkpoints older than tool use do not)
        self.call_open_id, self.call_close_id, self.result_open_id, self.result_close_id = (
            self.stoi.get(c) for c in TOOL_SPECIALS
        )

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError as e:
            raise UsageError(
                f"character {e.args[0]!r} is not in the tokenizer vocabulary; use only {self.chars[1:]!r}"
            ) from None

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids if int(i) != self.pad_id)

    def completion_text(self, ids) -> str:
        """The response as TRL's GRPOTrainer and verl's reward managers hand it to reward functions,
        `decode(completion_ids, skip_special_tokens=True)`: the end of turn `#` and every marker the
        exported tokenizer calls special (HF_SPECIALS) dropped, the think and tool delimiters kept.
        The same string the Hugging Face export decodes (tests/test_completions.py)."""
        return "".join(c for c in (self.chars[int(i)] for i in ids) if c not in HF_SPECIALS)

    # The chat template (posttrain/chat.py). `chat_prompt` renders the conversation and opens the
    # assistant turn, so a response is exactly what the model generates after it, end-of-turn included.
    def chat_prompt(self, prompt) -> str:
        """A question string (one user turn) or a list of {role, content} messages."""
        if isinstance(prompt, str):
            return f"{USER}{prompt}{ASSISTANT}"
        messages = check_messages(prompt)
        if SYSTEM not in self.stoi and any(m["role"] == "system" for m in messages):
            raise UsageError(
                f"this vocabulary has no system marker {SYSTEM!r} (the model was trained without system "
                "messages); drop the system message, or start from a model built for data that has them"
            )
        return render_builtin(messages)

    def chat_response(self, answer: str) -> str:
        return f"{answer}{EOT}"

    def chat_continuation(self, prompt, completion) -> str:
        """What follows chat_prompt(prompt) when the reply is `completion`: a response string, or
        the assistant's message(s) (preference rows), through the template's end of turn."""
        if isinstance(completion, str):
            return self.chat_response(completion)
        head = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else check_messages(prompt)
        full = render_builtin(head + check_messages(completion), add_generation_prompt=False)
        return full[len(self.chat_prompt(prompt)) :]

    def chat_tool_result(self, text: str) -> str:
        """An observation as the env injects it into the assistant turn (response_mask 0)."""
        return f"{RESULT_OPEN}{text}{RESULT_CLOSE}"

    def render(self, question: str, turns: list[tuple[str, str]]) -> str:
        """The whole conversation: the prompt, then ("policy", text) and ("observation", text)
        turns in order; what an agent episode's prompt + response tokens must decode to."""
        parts = [self.chat_prompt(question)]
        for role, text in turns:
            parts.append(self.chat_tool_result(text) if role == "observation" else text)
        return "".join(parts)

    def policy_mask(self, ids) -> list[int]:
        """1 on tokens the policy writes, 0 on injected tool results (open marker to close marker),
        for demonstrations (SFT) that contain tool results."""
        mask, inside = [], False
        for i in ids:
            if i == self.result_open_id:
                inside = True
            mask.append(0 if inside else 1)
            if i == self.result_close_id:
                inside = False
        return mask

    def save(self, directory: str | Path) -> None:
        Path(directory, FILE_NAME).write_text(json.dumps({"chars": self.chars}))

    @classmethod
    def load(cls, directory: str | Path) -> CharTokenizer:
        path = Path(directory, FILE_NAME)
        if not path.exists():
            return cls()
        return cls(chars=json.loads(path.read_text())["chars"])

    def to_hf_json(self) -> dict:
        """The vocabulary as a `tokenizers` tokenizer.json (a WordLevel model that splits
        every character), so an exported directory opens with `AutoTokenizer`.

        Every marker is an added token, but only padding, end-of-turn and the role markers are
        special: `decode(..., skip_special_tokens=True)` (the `pipeline` default) drops exactly
        those. The think and tool delimiters are part of what the model says, so they stay in
        the text, as Qwen3 marks <think> and <tool_call> (`{3+4=7}7#` decodes to `{3+4=7}7`,
        not `3+4=77`)."""
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [
                {
                    "id": self.stoi[c],
                    "content": c,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": c in HF_SPECIALS,
                }
                for c in SPECIALS
                if c in self.stoi
            ],
            "normalizer": None,
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": False},
            "post_processor": None,
            "decoder": {"type": "Fuse"},
            "model": {"type": "WordLevel", "vocab": dict(self.stoi), "unk_token": PAD},
        }
