"""Chat messages and the built-in chat template: shared by the tokenizers, the tasks and the datasets.

A prompt is either a plain string (one user turn) or a list of messages, as in TRL and verl:

    [{"role": "system", "content": "Answer with a number."},
     {"role": "user", "content": "3+4+5"}]

The built-in template (the character tokenizer's) writes each role with a one-character marker,
so a rendered conversation reads as plain text (models/export.py writes the same as jinja):

    §Answer with a number.<3+4+5>{3+4=7;7+5=12}12#
    ^ system               ^ user ^ assistant   ^ end of turn

`<` opens a user turn and `>` closes it and opens the assistant's, which ends at `#`; `{ }` hold
the reasoning; a tool message is an observation inside the assistant turn, `⟨…⟩`. A Hugging Face
tokenizer renders the same messages with the model's own chat template (models/hf.py).
"""

from __future__ import annotations

from typing import Any

from posttrain.errors import UsageError

USER, ASSISTANT, EOT, THINK_OPEN, THINK_CLOSE, PAD = "<", ">", "#", "{", "}", "_"
CALL_OPEN, CALL_CLOSE, RESULT_OPEN, RESULT_CLOSE = "⟦", "⟧", "⟨", "⟩"
SYSTEM = "§"
TOOL_SPECIALS = CALL_OPEN + CALL_CLOSE + RESULT_OPEN + RESULT_CLOSE
SPECIALS = PAD + USER + ASSISTANT + EOT + THINK_OPEN + THINK_CLOSE + TOOL_SPECIALS + SYSTEM
# Digits and the trace operators first, then enough plain text for free-form responses. Appended
# later (the ids of the characters before never change): the tool specials, division, capitals and
# quotes for countdown and reasoning-gym questions. The system marker joins a vocabulary built for
# data that has system messages (recipes/common.new_tokenizer).
BASE_CHARS = (
    PAD
    + USER
    + ASSISTANT
    + EOT
    + THINK_OPEN
    + THINK_CLOSE
    + "0123456789+-*=;:,.?!()[] \n"
    + "abcdefghijklmnopqrstuvwxyz"
)
DEFAULT_CHARS = BASE_CHARS + TOOL_SPECIALS + "/ABCDEFGHIJKLMNOPQRSTUVWXYZ\"'%"

ROLES = ("system", "user", "assistant", "tool")


def check_messages(messages: Any, where: str = "prompt") -> list[dict]:
    """`messages` as a list of {role, content} dicts with known roles and string content; a
    UsageError naming `where` (a file and row, say) and the fix otherwise."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise UsageError(f"{where}: a prompt must be a string or a non-empty list of {{role, content}} messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise UsageError(f"{where}: message {i} must be a {{role, content}} object, got {str(m)[:60]!r}")
        if m["role"] not in ROLES:
            raise UsageError(f"{where}: message {i} has the unknown role {m['role']!r}; use one of {', '.join(ROLES)}")
        content = m["content"]
        if isinstance(content, list):  # content blocks [{"type": "text", "text": ...}] as in the OpenAI API
            content = "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
        if not isinstance(content, str):
            raise UsageError(f"{where}: message {i} content must be text, got {type(content).__name__}")
        out.append({"role": m["role"], "content": content})
    return out


def is_conversational(prompt: Any) -> bool:
    return isinstance(prompt, (list, tuple))


def render_builtin(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The built-in template: `§system<user>assistant#<user>…`; with `add_generation_prompt` the
    text ends where the assistant's next tokens go (after `>`, or after a tool observation)."""
    parts = []
    for i, m in enumerate(messages):
        role, text = m["role"], m["content"]
        after_user = i > 0 and messages[i - 1]["role"] == "user"
        tool_next = i + 1 < len(messages) and messages[i + 1]["role"] == "tool"
        if role == "system":
            parts.append(SYSTEM + text)
        elif role == "user":
            parts.append(USER + text)
        elif role == "assistant":  # the turn goes on when a tool observation follows
            parts.append((ASSISTANT if after_user else "") + text + ("" if tool_next else EOT))
        else:  # tool: an observation inside the assistant turn
            parts.append(RESULT_OPEN + text + RESULT_CLOSE)
    if add_generation_prompt:
        if messages[-1]["role"] == "assistant":
            raise UsageError("a prompt must not end with an assistant message: the model writes the next one")
        if messages[-1]["role"] == "user":
            parts.append(ASSISTANT)
    return "".join(parts)


def split_last_assistant(messages: list[dict], where: str) -> tuple[list[dict], str]:
    """(the conversation before the last assistant message, that message's text): an SFT example
    from a `messages` row, or a preference completion."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "assistant":
            if i == 0:
                raise UsageError(f"{where}: the conversation starts with the assistant; it needs a user turn first")
            return list(messages[:i]), messages[i]["content"]
    raise UsageError(f"{where}: the conversation has no assistant message to learn from")


def prompt_text(prompt: Any) -> str:
    """A prompt's text without any template (the user's words): for hashing, audits and corpora."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(m["content"] for m in prompt)
