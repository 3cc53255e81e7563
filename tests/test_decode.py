"""models/decode.py: the one-token decode path computes what GPTMini.forward computes."""

import pytest
import torch

from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.models.decode import Decoder
from posttrain.models.gpt_mini import KVCache, ModelConfig, build_model


@pytest.mark.parametrize("n_kv_heads", [0, 2])  # full heads, and grouped-query (rep 2)
def test_decode_matches_forward_on_ragged_rows(n_kv_heads):
    torch.manual_seed(0)
    m = build_model(ModelConfig(preset="nano", n_kv_heads=n_kv_heads), 40).eval()
    dec = Decoder.for_model(m)
    n = 6
    ids = torch.randint(0, 40, (n, 9))
    caches = [KVCache(m.config, 8, 32), KVCache(m.config, 8, 32)]
    with torch.inference_mode():
        for c in caches:
            c.begin(9, slice(0, n))
            m(ids, cache=c)
            c.lengths[:n] -= torch.arange(n) % 4  # rows of different lengths
        last = torch.randint(0, 40, (n,))
        for _ in range(4):
            caches[0].begin(1, slice(0, n))
            ref = m(last[:, None], cache=caches[0])[:, 0]
            got = dec(last, caches[1], n)
            assert (ref - got).abs().max().item() < 1e-5
            assert torch.equal(caches[0].lengths, caches[1].lengths)
            last = ref.argmax(-1)
        L = int(caches[0].lengths[0])
        assert torch.allclose(caches[0].k[:, 0, :, :L], caches[1].k[:, 0, :, :L], atol=1e-6)


def test_decoder_only_for_plain_gpt_mini():
    m = build_model(ModelConfig(preset="nano"), 40)
    assert Decoder.for_model(m) is not None

    class Patched(torch.nn.Linear):  # e.g. an adapter around a Linear
        pass

    old = m.blocks[1].mlp.down
    m.blocks[1].mlp.down = Patched(old.in_features, old.out_features, bias=False)
    assert Decoder.for_model(m) is None  # patched linears: generic path


def test_engine_samples_identical_with_and_without_fast_path(nano, tok):
    prompts = [tok.encode(tok.chat_prompt(q)) for q in ("3+4=", "12+7=", "1+1+1=")]
    sp = SamplingParams(temperature=1.0, max_new_tokens=16)
    eng = Engine(nano.eval(), tok, max_slots=4)
    fast = eng.generate(prompts, 3, sp, seed=5)
    eng.fast_decode = False
    slow = eng.generate(prompts, 3, sp, seed=5)
    assert [s.response_ids for s in fast] == [s.response_ids for s in slow]
    worst = max(abs(a - b) for f, s in zip(fast, slow) for a, b in zip(f.response_logprobs, s.response_logprobs))
    assert worst < 1e-5


def test_engine_drops_the_fast_path_once_a_layer_is_wrapped(nano, tok):
    """A layer wrapped after the engine decoded (an adapter added later) is never bypassed."""
    eng = Engine(nano.eval(), tok, max_slots=4)
    prompt = [tok.encode(tok.chat_prompt("3+4="))]
    eng.generate(prompt, 2, SamplingParams(max_new_tokens=4))
    assert eng.decoder() is not None

    class Patched(torch.nn.Linear):
        pass

    old = nano.blocks[0].mlp.down
    nano.blocks[0].mlp.down = Patched(old.in_features, old.out_features, bias=False)
    assert eng.decoder() is None


def test_fast_path_sees_a_replaced_parameter_at_the_next_generate(nano, tok):
    """The decode step holds the weight list between refreshes; a parameter replaced by a new
    tensor (not updated in place) must be what the next generate() samples from."""
    prompts = [tok.encode(tok.chat_prompt(q)) for q in ("3+4=", "12+7=")]
    sp = SamplingParams(temperature=1.0, max_new_tokens=12)
    eng = Engine(nano.eval(), tok, max_slots=4)
    before = eng.generate(prompts, 2, sp, seed=1)
    down = nano.blocks[0].mlp.down
    torch.manual_seed(3)
    down.weight = torch.nn.Parameter(torch.randn_like(down.weight))  # a new tensor, not an in-place copy
    fast = eng.generate(prompts, 2, sp, seed=1)
    eng.fast_decode = False
    slow = eng.generate(prompts, 2, sp, seed=1)
    assert [s.response_ids for s in fast] == [s.response_ids for s in slow]
    assert max(abs(a - b) for f, s in zip(fast, slow) for a, b in zip(f.response_logprobs, s.response_logprobs)) < 1e-5
    assert [s.response_logprobs for s in fast] != [s.response_logprobs for s in before]  # the new weight counts
