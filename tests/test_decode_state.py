"""The decode loop's state kept across generate() calls (framework/decode_state.py): the buffers a CUDA
graph holds keep their addresses from call to call, a reused state samples what a fresh one samples,
bit for bit, and the graph key moves exactly when something a graph reads moved.

On the CPU nothing is captured, but the reuse is the same code: the samples of an engine that keeps
its state through optimizer steps, a size change and a temperature change equal those of a new engine
for every call. On a GPU (`@gpu`) the graphs of the first call replay in the second."""

from dataclasses import replace

import pytest
import torch

from posttrain.framework.decode_loop import DecodeLoop
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.models.gpt_mini import GPTMini, ModelConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.tasks.arithmetic import ArithmeticTask

TOK = CharTokenizer()
SP = SamplingParams(max_new_tokens=10, stop_ids=tuple(TOK.encode("01")))
PROMPTS = [TOK.encode(TOK.chat_prompt(i.question)) for i in ArithmeticTask().items(5, seed=3)]
# (prompts, samples, sampling): a size change and a temperature change between calls of one engine
CALLS = [
    (PROMPTS, 3, SP),
    (PROMPTS, 3, SP),
    (PROMPTS[:2], 2, SP),
    (PROMPTS, 3, SP),
    (PROMPTS, 3, replace(SP, temperature=0.7)),
]


def _models():
    torch.manual_seed(0)
    nano = GPTMini(ModelConfig(preset="nano").resolved(TOK.vocab_size))
    out = {"gpt_mini": nano}
    try:
        from test_decode_families import FAST, build
    except pytest.skip.Exception:  # transformers missing
        return out
    out["qwen2"] = build(*FAST["qwen2"], 0)
    return out


def _step(model, k: int) -> None:
    """An in-place optimizer step, as the trainer takes one between two rollouts."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    ids = torch.tensor([PROMPTS[k % len(PROMPTS)]], device=next(model.parameters()).device)
    model(ids).float().logsumexp(-1).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _run(model, keep_engine: bool, device="cpu", capture=True):
    """CALLS through one engine (kept) or a new engine per call, an optimizer step between calls."""
    torch.manual_seed(1)
    m = model
    state0 = {k: v.clone() for k, v in m.state_dict().items()}
    out, stats, engine = [], [], None
    for k, (prompts, n, sp) in enumerate(CALLS):
        if engine is None or not keep_engine:
            engine = Engine(m, TOK, max_slots=4)
            engine.decode_window, engine.decode_bucket, engine.decode_span_bucket = 4, 2, 8
            engine.capture_decode = capture
        out.append([(s.response_ids, s.response_logprobs) for s in engine.generate(prompts, n, sp, seed=4, step=k)])
        stats.append(engine.stats)
        _step(m, k)
    m.load_state_dict(state0)  # the fixture's model as it was
    return out, stats


@pytest.fixture(scope="module")
def models():
    return _models()


@pytest.mark.parametrize("name", ["gpt_mini", "qwen2"])
def test_a_kept_state_samples_what_a_fresh_one_samples(models, name):
    if name not in models:
        pytest.skip("transformers is not installed")
    kept, _ = _run(models[name], keep_engine=True)
    fresh, _ = _run(models[name], keep_engine=False)
    assert kept == fresh  # token ids and logprobs, bit for bit, call after call
    assert kept[0] != kept[1]  # the optimizer step between the calls changed what is sampled


@pytest.mark.parametrize("name", ["gpt_mini", "qwen2"])
def test_buffers_and_weights_keep_their_addresses_across_calls(models, name):
    """What a graph reads: the slot state, the slot cache and the decoder's weights stay where they
    were through an in-place optimizer step (HF: q/k/v and gate/up re-fused into the same copies, with
    the new values), and the graph key with them; a parameter replaced by a new tensor moves the key."""
    if name not in models:
        pytest.skip("transformers is not installed")
    model = models[name]
    state0 = {k: v.clone() for k, v in model.state_dict().items()}
    e = Engine(model, TOK, max_slots=4)
    e.generate(PROMPTS, 3, SP, seed=4)
    with torch.inference_mode():  # as generate() makes it
        loop = DecodeLoop(e, PROMPTS, 3, SP, 4, 0, 0)
    st, key = e._state, loop._graph_key(SP)
    ptrs = [b.data_ptr() for b in (st.logits, *st.slot_buffers(), st.version, st.stop_ids)]
    _step(model, 0)
    e.generate(PROMPTS, 3, SP, seed=4)
    with torch.inference_mode():
        loop = DecodeLoop(e, PROMPTS, 3, SP, 4, 0, 0)
    assert e._state is st and [b.data_ptr() for b in (st.logits, *st.slot_buffers(), st.version, st.stop_ids)] == ptrs
    assert loop._graph_key(SP) == key
    assert loop._graph_key(replace(SP, temperature=0.5)) != key  # a Python number a graph bakes in
    if name == "qwen2":  # the fused copies hold the stepped weights
        attn = model.hf.model.layers[0].self_attn
        want = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        assert torch.equal(loop.decoder.w.current().layers[0].qkv, want)
        target = model.hf.model.layers[1].mlp.up_proj
    else:
        target = model.blocks[1].mlp.gate_up
    target.weight = torch.nn.Parameter(target.weight.detach().clone())  # a new tensor: a graph would miss it
    loop.decoder.refresh()
    assert loop._graph_key(SP) != key
    model.load_state_dict(state0, assign=False)


def test_the_policy_version_is_stamped_per_call(models):
    """The version a token carries is the engine's at the call, read from a device scalar (a graph
    replays the call's version, not its capture's)."""
    e = Engine(models["gpt_mini"], TOK, max_slots=4)
    for version in (3, 7):
        e.policy_version = version
        samples = e.generate(PROMPTS, 2, SP, seed=4)
        assert {v for s in samples for v in s.token_versions} == {version}
        assert {s.policy_version for s in samples} == {version}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graphs_of_one_call_replay_in_the_next(models, dtype):
    """CUDA: the second call with the same shapes captures nothing and replays the first call's graphs,
    after an optimizer step in between, and samples what uncaptured steps sample."""
    model = models["gpt_mini"].to("cuda")
    runs = {}
    for capture in (True, False):
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            runs[capture] = _run(model, keep_engine=True, capture=capture)
    (got, st), (want, _) = runs[True], runs[False]
    assert [[ids for ids, _ in c] for c in got] == [[ids for ids, _ in c] for c in want]
    worst = max(abs(x - y) for a, b in zip(got, want) for (_, la), (_, lb) in zip(a, b) for x, y in zip(la, lb))
    assert worst < 1e-5
    assert st[0]["rollout/graph_captures"] > 0
    assert st[1]["rollout/graph_captures"] == 0 and st[1]["rollout/graph_replays"] > 0  # steady: replays only
    models["gpt_mini"].to("cpu")
