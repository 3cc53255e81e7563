"""A transformers tokenizer behind CharTokenizer's interface (models/hf.py loads it beside the model):
`encode`/`decode`, `pad_id`, `eot_id`, the completion as TRL and verl hand it to reward functions,
and the model's chat template as `chat_prompt` / `chat_response` / `chat_continuation`.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.chat import check_messages
from posttrain.errors import UsageError


class HFTokenizer:
    """A transformers tokenizer behind CharTokenizer's interface; prompts go through its chat template.

    eot_id (the end of turn a demonstration is written with) is the tokenizer's eos token;
    `stop_ids`, where a sampled response stops, are eot_id and the model's generation_config
    eos ids (`extra_eos`), as transformers' `generate` stops. pad_id is its pad token, or eos when
    it has none (pads never reach a loss: masks travel with the tokens). Prompts and responses go
    through the model's chat template exactly as `apply_chat_template` renders them, its default
    system prompt included (Qwen2.5's "You are Qwen, created by Alibaba Cloud. …" when the
    conversation has no system turn). Without a chat template a prompt is the bare question and a
    response `answer + eos`.
    """

    def __init__(self, tok, extra_eos=()):
        if tok.eos_token_id is None:
            raise UsageError(
                "the tokenizer has no eos_token; set eos_token (the end-of-turn token) in tokenizer_config.json"
            )
        self.tok = tok
        self.eot_id = tok.eos_token_id
        self.stop_ids = tuple(sorted({self.eot_id, *(int(i) for i in extra_eos if 0 <= int(i) < len(tok))}))
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.vocab_size = len(tok)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)  # templates write their own BOS

    def encode_data(self, text: str) -> list[int]:
        """Text that must stay data (tool output): special-token strings in it are split into plain
        tokens instead of becoming specials, so an observation can never end a turn."""
        return self.tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids if int(i) != self.pad_id or self.pad_id == self.eot_id]
        return self.tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def completion_text(self, ids) -> str:
        """The response as TRL's GRPOTrainer (`batch_decode(completion_ids, skip_special_tokens=True)`)
        and verl's reward managers (`decode(response_ids, skip_special_tokens=True)`) hand it to reward
        functions: no end-of-turn token, no special token, the tokenizer's own space clean-up."""
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def chat_prompt(self, prompt) -> str:
        """The conversation (a question string, or {role, content} messages) and the opened
        assistant turn, through the model's chat template: a response is what follows it."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else check_messages(prompt)
        if not self.tok.chat_template:  # no template: the turns' texts, one per line
            return "\n".join(m["content"] for m in messages)
        try:
            return self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as e:  # jinja's TemplateError: e.g. no system role
            raise UsageError(
                f"the model's chat template cannot render this conversation ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:120]}); roles: {[m['role'] for m in messages]}"
            ) from None

    def chat_response(self, answer: str) -> str:
        """What the template renders after chat_prompt for an assistant answer, through its
        end-of-turn token (a trailing newline some templates add after it is dropped)."""
        eos = self.tok.eos_token
        if not self.tok.chat_template:
            return answer + eos
        msgs = [{"role": "user", "content": "?"}]
        prompt = self.chat_prompt("?")
        full = self.tok.apply_chat_template(msgs + [{"role": "assistant", "content": answer}], tokenize=False)
        rest = full[len(prompt) :] if full.startswith(prompt) else answer + eos
        end = rest.find(eos, rest.find(answer) + len(answer))
        return rest[: end + len(eos)] if end >= 0 else rest + eos

    def chat_continuation(self, prompt, completion) -> str:
        """What follows chat_prompt(prompt) when the reply is `completion`: a response string, or the
        assistant's message(s), as the model's template renders the whole conversation."""
        if isinstance(completion, str) or not self.tok.chat_template:
            text = completion if isinstance(completion, str) else "".join(m["content"] for m in completion)
            return self.chat_response(text)
        head = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else check_messages(prompt)
        full = self.tok.apply_chat_template(head + check_messages(completion), tokenize=False)
        start = self.chat_prompt(prompt)
        if not full.startswith(start):
            raise UsageError(
                "the chat template renders the reply differently from the opened assistant turn "
                "(a template that rewrites earlier turns); give chosen/rejected as strings"
            )
        return full[len(start) :]

    def save(self, directory: str | Path) -> None:
        self.tok.save_pretrained(directory)
