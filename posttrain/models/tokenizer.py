"""The built-in character tokenizer: no downloads, chat and reasoning specials.

One character is one token. The chat template is the course's, with single-character
specials so a sequence reads as plain text:

    <3+4+5>{3+4=7;7+5=12}12#
    ^ user  ^ think open   ^ end of turn
          ^ assistant    ^ think close

`_` is padding and never appears in text. Any other character outside the vocabulary is
an error that names it (silently dropping characters would corrupt prompts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from posttrain import UsageError

USER, ASSISTANT, EOT, THINK_OPEN, THINK_CLOSE, PAD = "<", ">", "#", "{", "}", "_"
SPECIALS = PAD + USER + ASSISTANT + EOT + THINK_OPEN + THINK_CLOSE
# Digits and the trace operators first, then enough plain text for free-form responses
# (reward-hacking phrases, tool calls, verifier test cases such as "let me think... 12#").
DEFAULT_CHARS = SPECIALS + "0123456789+-*=;:,.?!()[] \n" + "abcdefghijklmnopqrstuvwxyz"
FILE_NAME = "tokenizer.posttrain.json"


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

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError as e:
            raise UsageError(
                f"character {e.args[0]!r} is not in the tokenizer vocabulary; "
                f"use only {self.chars[1:]!r}"
            ) from None

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids if int(i) != self.pad_id)

    # The chat template. `prompt` renders the user turn and opens the assistant turn, so a
    # response is exactly what the model generates after it, end-of-turn included.
    def chat_prompt(self, question: str) -> str:
        return f"{USER}{question}{ASSISTANT}"

    def chat_response(self, answer: str) -> str:
        return f"{answer}{EOT}"

    def save(self, directory: str | Path) -> None:
        Path(directory, FILE_NAME).write_text(json.dumps({"chars": self.chars}))

    @classmethod
    def load(cls, directory: str | Path) -> "CharTokenizer":
        path = Path(directory, FILE_NAME)
        if not path.exists():
            return cls()
        return cls(chars=json.loads(path.read_text())["chars"])

    def to_hf_json(self) -> dict:
        """The vocabulary as a `tokenizers` tokenizer.json (a WordLevel model that splits
        every character), so an exported directory opens with `AutoTokenizer`."""
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [
                {"id": self.stoi[c], "content": c, "single_word": False, "lstrip": False,
                 "rstrip": False, "normalized": False, "special": True}
                for c in SPECIALS
            ],
            "normalizer": None,
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."},
                              "behavior": "Isolated", "invert": False},
            "post_processor": None,
            "decoder": {"type": "Fuse"},
            "model": {"type": "WordLevel", "vocab": dict(self.stoi), "unk_token": PAD},
        }
