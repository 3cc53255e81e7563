"""The fast decode path (models/decode.py + decode_weights.py) for each Llama-like family, against
transformers itself, and what happens to every other architecture.

Tiny randomly initialised models of each family, built in memory. HF initialises biases to 0,
norm weights to 1 and weights with std 0.02, under which a missing bias, norm or multiplier
would change nothing measurable; here every weight gets std 1/√fan_in, every bias N(0, 0.3²)
and every norm weight 1 + N(0, 0.3²), so logits spread over several units and each part counts.
"""

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")
from hf_util import plain_logprobs  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from posttrain import UsageError, cli  # noqa: E402
from posttrain.framework.rollout import Engine, SamplingParams  # noqa: E402
from posttrain.models.decode import Decoder  # noqa: E402
from posttrain.models.gpt_mini import KVCache  # noqa: E402
from posttrain.models.hf import HFCausalLM, check_cache_path, write_tiny  # noqa: E402
from posttrain.models.tokenizer import CharTokenizer  # noqa: E402

CT = CharTokenizer()
BASE = dict(
    vocab_size=CT.vocab_size,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    tie_word_embeddings=False,
    bos_token_id=None,
    eos_token_id=CT.eot_id,
    pad_token_id=CT.pad_id,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
# name: (model_type, config fields): the fast path's families and the flags they bring
FAST = {
    "llama": ("llama", {}),
    "llama3_biases_tied": (
        "llama",
        dict(rope_scaling=LLAMA3_ROPE, rope_theta=5e5, attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    ),
    "llama_yarn_head_dim": ("llama", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}, head_dim=32)),
    "llama_mha": ("llama", dict(num_key_value_heads=4)),
    "mistral": ("mistral", dict(sliding_window=None, head_dim=24)),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", dict(head_dim=32)),
    "granite": (
        "granite",
        dict(embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=3.0),
    ),
    "phi3": ("phi3", {}),
    "smollm3": ("smollm3", dict(num_hidden_layers=4)),  # layer 3 is NoPE
}
# outside the fast path: decoded through model.forward, correctly, with a one-line note on why
SLOW = {
    "gemma": ("gemma", dict(head_dim=16), "no fast decoder for this class"),
    "olmo2": ("olmo2", {}, "no fast decoder for this class"),
    "llama_gelu": ("llama", dict(hidden_act="gelu"), "hidden_act='gelu'"),
    "llama_dynamic": ("llama", dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "rope_type 'dynamic'"),
    "phi3_partial": ("phi3", dict(partial_rotary_factor=0.5), "partial rotary (8 of 16 head dims)"),
}


def build(model_type: str, fields: dict, seed: int) -> HFCausalLM:
    cfg = AutoConfig.for_model(model_type, **{**BASE, **fields})
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa").eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[1]))
    return HFCausalLM(hf)


@pytest.fixture(scope="module")
def fast_models():
    return {name: build(mt, fields, seed) for seed, (name, (mt, fields)) in enumerate(FAST.items())}


def _decode_against_transformers(model: HFCausalLM, steps: int = 6) -> float:
    """Prefill 5 rows of different lengths through the cache, then decode `steps` tokens a row
    with models/decode.py; the largest logit difference from a plain transformers forward over
    each whole sequence."""
    dec = Decoder.for_model(model)
    assert dec is not None, Decoder.why_not(model)
    n, lens = 5, torch.tensor([12, 9, 7, 11, 4])
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, CT.vocab_size, (n, 12), generator=g)
    cache = KVCache(model.config, 8, 40)
    worst = 0.0
    with torch.inference_mode():
        cache.begin(12, slice(0, n))
        model(ids, cache=cache)
        cache.lengths[:n] = lens  # ragged rows
        seqs = [ids[i, : lens[i]].tolist() for i in range(n)]
        last = torch.randint(3, CT.vocab_size, (n,), generator=g)
        for _ in range(steps):
            for i in range(n):
                seqs[i].append(int(last[i]))
            got = dec(last, cache, n)  # [n, V]
            full = torch.zeros(n, max(map(len, seqs)), dtype=torch.long)  # right-padded: causal
            for i, q in enumerate(seqs):  # attention never sees the pads after a row's tokens
                full[i, : len(q)] = torch.tensor(q)
            logits = model.hf(input_ids=full).logits  # [n, T, V]
            want = logits[torch.arange(n), torch.tensor([len(q) for q in seqs]) - 1]  # [n, V]
            assert want.std() > 0.3  # logits spread: every part of the model counts
            worst = max(worst, (got - want).abs().max().item())
            last = torch.multinomial(want.softmax(-1), 1, generator=g)[:, 0]
    return worst


@pytest.mark.parametrize("name", FAST)
def test_decoder_logits_equal_transformers(fast_models, name):
    assert _decode_against_transformers(fast_models[name]) < 1e-5


@pytest.mark.parametrize("name", FAST)
def test_engine_on_the_fast_path_records_transformers_logprobs(fast_models, name):
    """Shared prompts, 5 slots for 12 samples (refills, packed rows): every behaviour logprob
    equals a plain transformers forward; the slow path (model.forward through the cache bridge)
    samples the same tokens."""
    model = fast_models[name]
    check_cache_path(model)  # the slow path is right for this family too
    prompts = [CT.encode(CT.chat_prompt(q)) for q in ("3+4", "12+5+6", "1+1+1+1+1+1")]
    eng = Engine(model, CT, max_slots=5)
    assert eng.decoder() is not None
    sp = SamplingParams(temperature=0.7, max_new_tokens=12)
    fast = eng.generate(prompts, 4, sp, seed=3)
    assert len(fast) == 12 and sum(len(s.response_ids) for s in fast) > 40
    for s, want in zip(fast, plain_logprobs(model.hf, fast, 0.7)):
        assert torch.allclose(torch.tensor(s.response_logprobs), want, atol=1e-5, rtol=0)
    eng.fast_decode = False
    slow = eng.generate(prompts, 4, sp, seed=3)
    assert [s.response_ids for s in slow] == [s.response_ids for s in fast]


@pytest.mark.parametrize("name,parts", [("qwen2", ("q_proj.bias",)), ("qwen3", ("q_norm.weight", "k_norm.weight"))])
def test_fused_copies_follow_in_place_updates_of_biases_and_norms(fast_models, name, parts):
    """The optimizer updates in place: the fused q/k/v bias and the stacked per-head norms must
    be rebuilt from the new values (their `_version` moved), not left at the old ones."""
    model = fast_models[name]
    before = _decode_against_transformers(model, steps=1)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith(parts):
                p.mul_(-2.0)
    assert before < 1e-5 and _decode_against_transformers(model, steps=2) < 1e-5


# The slow path against one plain forward: not the same kernels. The engine prefills each prompt and
# then decodes one token a step through transformers' cache (matmuls of one row per sample, attention
# of one query over the cached keys); plain_logprobs runs each whole sequence at once (matmuls over
# every position, causal attention over the padded batch). MKL and sdpa's CPU kernel cut and sum those
# shapes in other orders, so the two agree to fp32 rounding only. Measured on the five models here
# across MKL's AVX-512/AVX2/SSE4.2 paths, ATen's AVX-512/AVX2/scalar kernels and 1 or 2 threads: at
# most 8.1e-6 (gemma: embeddings ×√d and (1 + w) norms make its activations the largest; 1.07e-5 on an
# AMD EPYC), the others under 2e-6. A sampler that is wrong is far off: a temperature off by 0.1% moves
# them by 1.8e-3 to 3.6e-3, a context token dropped from the cache by 1.8 to 5.3.
SLOW_PATH_ATOL = 1e-4


@pytest.mark.parametrize("name", SLOW)
def test_other_architectures_decode_on_the_slow_path_and_say_why_once(name, capsys):
    model_type, fields, why = SLOW[name]
    model = build(model_type, fields, seed=1)
    check_cache_path(model)
    assert why in Decoder.why_not(model) and Decoder.for_model(model) is None
    prompts = [CT.encode(CT.chat_prompt(q)) for q in ("3+4", "12+5+6")]
    sp = SamplingParams(temperature=1.0, max_new_tokens=10)
    samples = Engine(model, CT, max_slots=3).generate(prompts, 3, sp, seed=2)
    again = Engine(model, CT, max_slots=3).generate(prompts, 3, sp, seed=2)  # a second engine: no second note
    # the same kernels in the same order: the same samples and logprobs, bit for bit
    assert [(s.response_ids, s.response_logprobs) for s in again] == [
        (s.response_ids, s.response_logprobs) for s in samples
    ]
    for s, want in zip(samples, plain_logprobs(model.hf, samples)):
        assert torch.allclose(torch.tensor(s.response_logprobs), want, atol=SLOW_PATH_ATOL, rtol=0)
    notes = [line for line in capsys.readouterr().out.splitlines() if "decodes through model.forward" in line]
    assert notes == [
        f"note: {type(model.hf).__name__} decodes through model.forward, the slow path ({Decoder.why_not(model)})"
    ]


def test_a_patched_layer_leaves_the_fast_path_and_says_which():
    model = build(*FAST["qwen3"], seed=0)

    class Patched(torch.nn.Linear):  # e.g. an adapter around a Linear
        pass

    old = model.hf.model.layers[1].self_attn.k_proj
    model.hf.model.layers[1].self_attn.k_proj = Patched(old.in_features, old.out_features)
    assert Decoder.for_model(model) is None
    assert (
        Decoder.why_not(model)
        == "layers.1.self_attn.k_proj is a Patched (an adapter or a patch), not a plain nn.Linear"
    )


# ---- bad input: architectures the engine cannot decode at all --------------------------------


@pytest.mark.parametrize(
    "model_type,fields,cls,fix",
    [
        ("mistral", dict(sliding_window=16), "MistralForCausalLM", '"sliding_window": null'),
        ("phi3", dict(sliding_window=16), "Phi3ForCausalLM", '"sliding_window": null'),
        (
            "qwen2",
            dict(use_sliding_window=True, sliding_window=16, max_window_layers=0),
            "Qwen2ForCausalLM",
            "use_sliding_window=false",
        ),
    ],
)
def test_a_binding_sliding_window_is_refused_in_one_line(model_type, fields, cls, fix):
    """The engine attends over the whole sequence; a window shorter than the context would
    make the sampler's model differ from the trainer's past `window` tokens."""
    with pytest.raises(UsageError) as e:
        build(model_type, fields, seed=0)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{cls}: sliding-window attention (16 tokens")
    assert f"set {fix} in config.json (the same model for sequences up to 16 tokens)" in msg


def test_a_bidirectional_model_is_refused_in_one_line():
    with pytest.raises(UsageError, match=r"^LlamaForCausalLM: config.json sets is_causal=false \(bidirectional"):
        build("llama", dict(is_causal=False), seed=0)


def test_a_window_as_long_as_the_context_never_binds_and_is_accepted():
    model = build("mistral", dict(sliding_window=128), seed=0)  # = max_position_embeddings
    assert _decode_against_transformers(model, steps=2) < 1e-5


@pytest.mark.parametrize(
    "arch,fields,needles",
    [
        (
            "mistral",
            dict(sliding_window=16),
            ["MistralForCausalLM: sliding-window attention", '"sliding_window": null'],
        ),
        (
            "bert",
            dict(is_decoder=True),
            ["BertLMHeadModel: the posttrain engine cannot decode it", "use a decoder-only causal LM"],
        ),
    ],
)
def test_cli_exits_2_in_one_line_before_training(tmp_path, capsys, arch, fields, needles):
    d = write_tiny(tmp_path / arch, arch, **fields)
    capsys.readouterr()  # transformers' save progress
    rc = cli.main(["rl", f"init={d}", f"out={tmp_path}/run", "steps=2", "threads=1", "tensorboard=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("posttrain rl: error: "), err
    assert all(n in err[0] for n in needles), err[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
