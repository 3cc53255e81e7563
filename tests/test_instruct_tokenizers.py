"""Real instruct tokenizers (models/hf_tokenizer.py): the chat template as transformers'
apply_chat_template renders it (Qwen2.5's default system turn included), and a response stops at
every end-of-sequence id of the model's generation_config.json, as transformers' `generate` stops.

The tokenizers are byte-level BPEs trained here with each family's special tokens and published
chat template (tests/hub_util.py); the expected strings are written out from the published formats.
"""

import pytest
import torch

pytest.importorskip("transformers")
import hub_util  # noqa: E402

from posttrain.framework.rollout import Engine, SamplingParams  # noqa: E402
from posttrain.models.hf import load_hf  # noqa: E402
from posttrain.models.hf_tokenizer import HFTokenizer  # noqa: E402

QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("instruct")
    small = dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96
    )
    return {
        "qwen": hub_util.write_model(root / "qwen", "qwen"),
        "llama3": hub_util.write_model(root / "l", "llama3", small),
    }


def test_qwen_prompts_carry_its_default_system_turn_and_end_at_im_end(dirs):
    _, tok = load_hf(dirs["qwen"])
    assert tok.chat_prompt("What is 2+3?") == (
        f"<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    own = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert (
        tok.chat_prompt(own)
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.chat_response("#### 5") == "#### 5<|im_end|>"  # the template's "\n" after it is not the model's
    ids = {t: tok.tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    assert tok.eot_id == ids["<|im_end|>"] and tok.pad_id == ids["<|endoftext|>"]
    assert tok.stop_ids == tuple(sorted(ids.values()))  # generation_config.json: [<|im_end|>, <|endoftext|>]
    assert tok.encode("<|im_end|>") == [ids["<|im_end|>"]]  # one special token, not its characters
    assert tok.completion_text(tok.encode("#### 5<|im_end|>")) == "#### 5"  # as TRL and verl decode


def test_llama3_prompts_open_with_bos_and_headers_and_end_at_eot_id(dirs):
    _, tok = load_hf(dirs["llama3"])
    assert tok.chat_prompt("What is 2+3?") == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+3?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert tok.chat_response("4") == "4<|eot_id|>"
    ids = {t: tok.tok.convert_tokens_to_ids(t) for t in ("<|eot_id|>", "<|end_of_text|>")}
    assert tok.eot_id == ids["<|eot_id|>"] and tok.stop_ids == tuple(sorted(ids.values()))


@pytest.mark.parametrize("family,other", [("qwen", "<|endoftext|>"), ("llama3", "<|end_of_text|>")])
def test_a_response_stops_at_the_generation_configs_other_eos(dirs, family, other):
    """A model whose LM head is zero gives every token logit 0, so greedy decoding picks id 0 — here
    the family's other end-of-sequence token (<|endoftext|>, <|end_of_text|>): the response is that
    one token and stops. A tokenizer that knew only its eos would run on to the cap."""
    model, tok = load_hf(dirs[family])
    with torch.no_grad():
        model.head.weight.zero_()
    assert tok.tok.convert_tokens_to_ids(other) == 0
    prompt = [tok.encode(tok.chat_prompt("2+2?"))]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    (s,) = Engine(model, tok).generate(prompt, 1, greedy, seed=0)
    assert s.response_ids == [0] and s.finish_reason == "stop" and s.completion == ""
    (s,) = Engine(model, HFTokenizer(tok.tok)).generate(prompt, 1, greedy, seed=0)  # eos only
    assert s.response_ids == [0] * 6 and s.finish_reason == "length"
