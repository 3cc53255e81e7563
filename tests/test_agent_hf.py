"""Multi-turn episodes with a Hugging Face tokenizer: a real byte-level BPE tokenizer trained here
(no download), a ChatML template, a user's own env with a multi-token stop string."""

import re

import pytest
import torch
from chatml_util import chatml_tokenizer

from posttrain.framework.agent import run_episodes
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.framework.sample import Sample
from posttrain.tasks.base import RewardResult


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("bpe")
    corpus = [
        f"<call>{a}+{b}</call> <result>{a + b}</result> the answer is {a + b}" for a in range(50) for b in range(20)
    ]
    tok = chatml_tokenizer(corpus, 400)
    tok.save_pretrained(out)
    torch.manual_seed(0)
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=256,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            bos_token_id=None,
        )
    ).save_pretrained(out)
    return out


class CalcEnv:
    def __init__(self, item):
        self.item = item

    def reset(self, item):
        return [
            {"role": "system", "content": "use the calculator"},
            {"role": "user", "content": f"{item[0]}+{item[1]}"},
        ]

    def step(self, text):
        m = re.search(r"<call>(\d+)\+(\d+)</call>", text)
        if m:  # the tool's output carries a special-token string: it must stay data
            return f"{int(m[1]) + int(m[2])} <|im_end|>", 0.0, False, {}
        ok = text.replace("<|im_end|>", "").strip().endswith(str(sum(self.item)))  # the turn ends with eos
        return None, float(ok), True, {"components": {"correct": float(ok)}}


class CalcTask:
    """A user's multi-turn task for a subword tokenizer: its own stop string and observation format."""

    stop = ("</call>",)
    observation_template = "<result>{}</result>"
    max_turns = 3

    def items(self, n, split, seed):
        return [(12, 30), (7, 5)][:n]

    def prompt(self, item):
        return CalcEnv(item).reset(item)

    def make_env(self, item):
        return CalcEnv(item)

    def reward(self, item, response):
        return RewardResult(0.0)


class Scripted:
    """The policy writes a call and keeps going past the stop string (a stop the engine cannot see
    as one token), then answers from the observation."""

    def __init__(self, tok):
        self.tok, self.max_len, self.policy_version, self.stats = tok, 256, 0, {}

    def generate(self, prompts, n, sampling, seed=0, step=0, items=None, group_offset=0):
        out = []
        for g, p in enumerate(prompts):
            text = self.tok.decode(p)
            if "<result>" in text:
                turn = text.rsplit("<result>", 1)[1].split(" ")[0] + "<|im_end|>"
            else:
                a, b = re.findall(r"(\d+)\+(\d+)<\|im_end\|>", text)[-1]
                turn = f"<call>{a}+{b}</call> then more words"
            ids = self.tok.encode(turn)
            stops = {self.tok.eot_id, *sampling.stop_ids}
            cut = next((i + 1 for i, t in enumerate(ids) if t in stops), len(ids))
            for j in range(n):
                out.append(Sample(list(p), ids[:cut], [-0.5] * cut, [1] * cut, "stop", 0, g, j))
        return out


def test_multi_turn_episodes_with_a_subword_tokenizer(hf_dir):
    from posttrain.models.hf import load_hf

    _, tok = load_hf(hf_dir)
    assert len(tok.encode("</call>")) > 1  # a stop string of several tokens
    eps = run_episodes(
        Scripted(tok),
        tok,
        CalcTask(),
        CalcTask().items(2, "train", 0),
        2,
        SamplingParams(temperature=1.0, max_new_tokens=40),
    )
    assert [e.reward for e in eps] == [1.0, 1.0, 1.0, 1.0] and all(e.tool_calls == 1 for e in eps)
    e = eps[0]
    text = tok.decode(e.response_ids)
    assert "then more words" not in text  # cut after the token closing </call>
    assert text.startswith("<call>12+30</call>") and "<result>42 <|im_end|></result>" in text
    obs = [i for i, m in zip(e.response_ids, e.response_mask) if m == 0]
    assert tok.decode(obs) == "<result>42 <|im_end|></result>" and tok.eot_id not in obs  # data, not a special
    assert all(lp == 0.0 for lp, m in zip(e.response_logprobs, e.response_mask) if m == 0)
    assert tok.decode(e.prompt_ids).startswith("<|im_start|>system\nuse the calculator<|im_end|>")


def test_episodes_run_on_the_real_engine_with_a_hugging_face_model(hf_dir):
    from posttrain.models.hf import load_hf

    model, tok = load_hf(hf_dir)
    eps = run_episodes(
        Engine(model, tok),
        tok,
        CalcTask(),
        CalcTask().items(2, "train", 0),
        3,
        SamplingParams(temperature=1.0, max_new_tokens=12),
        seed=1,
    )
    assert len(eps) == 6
    for e in eps:
        assert len(e.response_ids) == len(e.response_mask) == len(e.response_logprobs) > 0
        assert all(lp < 0 for lp, m in zip(e.response_logprobs, e.response_mask) if m == 1)
