"""Prefill by a token budget (`rollout.prefill_chunk`, framework/decode_loop.DecodeLoop._prefill): a
forward takes the prompts whose padded tokens fit the budget, and a prompt longer than the budget is
prefilled alone, chunk by chunk through its cache. The samples are the same as one forward's (token ids
equal; logprobs to float noise: a chunk attends to the cached keys of the earlier ones)."""

import pytest
import torch

from posttrain import UsageError
from posttrain.config import RLConfig
from posttrain.config_load import load_config
from posttrain.framework.decode_loop import DecodeLoop
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.models.gpt_mini import GPTMini, ModelConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.tasks.arithmetic import ArithmeticTask

TOK = CharTokenizer()
PROMPTS = [TOK.encode(TOK.chat_prompt(i.question)) for i in ArithmeticTask().items(5, seed=3)]
SP = SamplingParams(max_new_tokens=10, stop_ids=tuple(TOK.encode("01")))


def _model(name):
    if name == "gpt_mini":
        torch.manual_seed(0)
        return GPTMini(ModelConfig(preset="nano").resolved(TOK.vocab_size)).eval()
    pytest.importorskip("transformers")
    from test_decode_families import FAST, build

    return build(*FAST[name], 0)


def _sample(model, chunk):
    """Samples of 5 prompts × 3 through 4 slots with `prefill_chunk=chunk`, and the engine's stats."""
    e = Engine(model, TOK, max_slots=4)
    e.prefill_chunk = chunk
    samples = e.generate(PROMPTS, 3, SP, seed=4)
    return [(s.response_ids, s.response_logprobs) for s in samples], e.stats


def test_the_budget_groups_prompts_and_chunks_long_ones(monkeypatch):
    """Prompt lengths 14, 12, 14, 13, 8: a budget of 30 tokens takes (14, 12) at width 14, (14, 13)
    at 14, then 8 alone; a budget of 5 prefills each prompt alone in chunks of 5 (14 = 5 + 5 + 4)."""
    assert [len(p) for p in PROMPTS] == [14, 12, 14, 13, 8]
    model = _model("gpt_mini")
    widths: list = []  # each prefill forward's [rows, width]; 'fill': a chunk that only writes the cache
    last, fill = DecodeLoop._last_logits, DecodeLoop._fill
    monkeypatch.setattr(
        DecodeLoop, "_last_logits", lambda s, ids, n: widths.append(tuple(ids.shape)) or last(s, ids, n)
    )
    monkeypatch.setattr(DecodeLoop, "_fill", lambda s, ids: widths.append(("fill", *ids.shape)) or fill(s, ids))
    _, st = _sample(model, 30)
    assert widths == [(2, 14), (2, 14), (1, 8)]
    assert st["rollout/prefill_tokens"] == 14 + 12 + 14 + 13 + 8  # real tokens, pads not counted
    widths.clear()
    _sample(model, 5)
    chunks = {14: [("fill", 1, 5), ("fill", 1, 5), (1, 4)], 12: [("fill", 1, 5), ("fill", 1, 5), (1, 2)]}
    chunks |= {13: [("fill", 1, 5), ("fill", 1, 5), (1, 3)], 8: [("fill", 1, 5), (1, 3)]}
    assert widths == [w for n in (14, 12, 14, 13, 8) for w in chunks[n]]
    widths.clear()
    _sample(model, 16384)
    assert widths == [(5, 14)]  # the default: all five in one forward, as before the budget


@pytest.mark.parametrize("name", ["gpt_mini", "qwen2"])
def test_chunked_prefill_samples_what_one_forward_samples(name):
    model = _model(name)
    whole, _ = _sample(model, 16384)
    for chunk in (30, 5, 1):
        got, _ = _sample(model, chunk)
        assert [ids for ids, _ in got] == [ids for ids, _ in whole]
        worst = max(abs(x - y) for (_, a), (_, b) in zip(got, whole) for x, y in zip(a, b))
        assert worst < 1e-5
    assert _sample(model, 16384)[0] == whole  # deterministic: a second run is the same bit for bit


def test_the_key_is_checked_in_one_line():
    cfg = load_config(RLConfig, None, ["rollout.prefill_chunk=4096"])
    assert cfg.rollout.prefill_chunk == 4096
    with pytest.raises(UsageError, match=r"rollout.prefill_chunk.*≥ 1"):
        load_config(RLConfig, None, ["rollout.prefill_chunk=0"])
