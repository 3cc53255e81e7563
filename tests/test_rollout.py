"""Rollout engine (framework/rollout.py): equivalence with naive decoding and a full forward,
stop handling, seeding, batch invariance, continuous batching, shared prompts, the sampler."""

import math

import pytest
import torch

from posttrain.framework.rollout import (
    Engine,
    SamplingParams,
    draw_keys,
    sample_keys,
    sample_tokens,
    splitmix64,
    token_logprobs,
)
from posttrain.tasks.arithmetic import ArithmeticTask


@pytest.fixture
def prompts(tok):
    items = ArithmeticTask().items(5, seed=3)
    ps = [tok.encode(tok.chat_prompt(i.question)) for i in items]
    assert len({len(p) for p in ps}) > 1, "want prompts of different lengths"
    return ps


@pytest.fixture
def model(nano):
    return nano.eval()


def _key(samples):
    return [(s.group, s.index, tuple(s.response_ids)) for s in samples]


# ---- pure functions -----------------------------------------------------------------------


def test_token_logprobs_by_hand():
    logits = torch.tensor([[0.0, math.log(2.0)]])  # p = [1/3, 2/3]
    tokens = torch.tensor([1])
    assert token_logprobs(logits, tokens, 1.0).item() == pytest.approx(math.log(2 / 3), abs=1e-6)
    assert token_logprobs(logits, tokens, 0.0).item() == pytest.approx(math.log(2 / 3), abs=1e-6)
    # T = 0.5 doubles the logits: p ∝ [1, 4]
    assert token_logprobs(logits, tokens, 0.5).item() == pytest.approx(math.log(4 / 5), abs=1e-6)


def _splitmix64_reference(x: int) -> int:
    m = 2**64
    z = (x + 0x9E3779B97F4A7C15) % m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % m
    return z ^ (z >> 31)


def test_splitmix64_matches_reference():
    xs = [0, 1, 12345, 2**62 + 7, 2**63 - 1, -1, -(2**63)]
    got = splitmix64(torch.tensor(xs, dtype=torch.long)).tolist()
    for x, g in zip(xs, got):
        assert g % 2**64 == _splitmix64_reference(x % 2**64)


def test_uniforms_drawn_at_admission_equal_the_keyed_draws():
    """The engine's precomputed uniforms (draw_uniforms) give exactly the draws of the keys."""
    from posttrain.framework.sampler import draw_uniforms

    base = sample_keys(7, 3, torch.tensor([0, 0, 5]), torch.tensor([0, 1, 2]))
    u = draw_uniforms(base, 6)  # [3, 6]
    logits = torch.randn(3, 11)
    for t in range(6):
        keys = draw_keys(base, torch.full((3,), t))
        for temperature in (1.0, 0.7):
            sp = SamplingParams(temperature=temperature, top_p=0.9)
            a, b = sample_tokens(logits, sp, keys), sample_tokens(logits, sp, None, u[:, t])
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert 0 < float(u.min()) and float(u.max()) <= 1 and len(set(u.flatten().tolist())) == 18


def _draws(logits, sampling, n, seed=0, along="sample"):
    """n draws from one logits row: n samples of one prompt at t = 0, or one sample at t < n."""
    zeros, count = torch.zeros(n, dtype=torch.long), torch.arange(n)
    if along == "sample":
        keys = draw_keys(sample_keys(seed, 0, zeros, count), zeros)
    else:
        keys = draw_keys(sample_keys(seed, 0, zeros, zeros), count)
    return sample_tokens(logits.expand(n, -1), sampling, keys)


def _chi2(tokens, probs):
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() * tokens.numel()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a zero-probability token was sampled"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()), int(keep.sum()) - 1


@pytest.mark.parametrize("temperature,along", [(1.0, "sample"), (0.5, "sample"), (1.0, "t")])
def test_sampled_frequencies_match_softmax(temperature, along):
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0, 0.5, -3.0, 1.5, 0.2])
    tokens, lps = _draws(logits[None], SamplingParams(temperature=temperature), 40_000, along=along)
    probs = torch.softmax(logits / temperature, -1)
    chi2, dof = _chi2(tokens, probs)
    assert chi2 < dof + 6 * math.sqrt(2 * dof), (chi2, dof)  # ≈ 6 sigma of a chi-square(7)
    assert torch.allclose(lps, probs.log()[tokens], atol=1e-6)  # full-distribution logprob


def test_top_k_and_top_p_truncate_but_logprobs_do_not():
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0, 0.5, -3.0, 1.5, 0.2])
    probs = torch.softmax(logits, -1)
    tokens, lps = _draws(logits[None], SamplingParams(top_k=3), 30_000)
    top3 = torch.zeros(8).index_fill_(0, probs.topk(3).indices, 1.0) * probs
    chi2, dof = _chi2(tokens, top3 / top3.sum())
    assert chi2 < dof + 6 * math.sqrt(2 * dof)
    assert torch.allclose(lps, probs.log()[tokens], atol=1e-6)  # untruncated, as documented
    # top_p = 0.6: sorted probs .44 .27 .16 ...: the first two reach .71 >= .6, the rest go
    tokens, _ = _draws(logits[None], SamplingParams(top_p=0.6), 20_000)
    assert set(tokens.unique().tolist()) == {3, 6}


# ---- the engine against independent computations -------------------------------------------


@torch.no_grad()
def _naive_greedy(model, prompt, max_new, stops):
    ids, out = list(prompt), []
    for _ in range(max_new):
        nxt = int(model(torch.tensor([ids]))[0, -1].argmax())  # full recompute, no cache
        out.append(nxt)
        ids.append(nxt)
        if nxt in stops:
            break
    return out


def _stop_token_for_coverage(free, eot):
    """A stop token that one prompt's greedy output opens with while another prompt's output
    never produces it (nor end-of-turn) within the cap: both exits of the decode loop."""
    for a in free:
        stop = a[0]
        if stop != eot and any(stop not in b and eot not in b for b in free):
            return stop
    raise AssertionError(f"no stop token covers both exits for this init: {free}")


def test_greedy_matches_naive_full_recompute(model, tok, prompts):
    free = [_naive_greedy(model, p, 14, set()) for p in prompts]  # no stops: the full 14
    stops = {tok.eot_id, _stop_token_for_coverage(free, tok.eot_id)}
    sp = SamplingParams(temperature=0.0, max_new_tokens=14, stop_ids=tuple(stops - {tok.eot_id}))
    samples = Engine(model, tok, max_slots=3).generate(prompts, 2, sp)  # 10 samples in 3 slots
    assert len(samples) == 10
    naive = [_naive_greedy(model, p, 14, stops) for p in prompts]
    for s in samples:
        assert s.response_ids == naive[s.group]
    assert {len(r) for r in naive} >= {1, 14}  # stop at the first token, and length


def test_behaviour_logprobs_equal_full_forward(model, tok, prompts):
    T = 0.7
    sp = SamplingParams(temperature=T, max_new_tokens=20)
    samples = Engine(model, tok, max_slots=4).generate(prompts, 3, sp, seed=1)
    worst = 0.0
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.prompt_ids + s.response_ids])
            P, L = len(s.prompt_ids), len(s.response_ids)
            logits = model(ids)[0, P - 1 : P - 1 + L]  # predicts each response token
            ref = token_logprobs(logits, torch.tensor(s.response_ids), T)
            worst = max(worst, (ref - torch.tensor(s.response_logprobs)).abs().max().item())
            assert s.response_mask == [1] * L
    assert worst < 1e-5, worst


def test_stop_token_handling(model, tok, prompts):
    digits = tuple(tok.encode("0123"))
    stops = {tok.eot_id, *digits}
    sp = SamplingParams(temperature=1.0, max_new_tokens=8, stop_ids=digits)
    samples = Engine(model, tok).generate(prompts, 6, sp, seed=2)
    reasons = {s.finish_reason for s in samples}
    assert reasons == {"stop", "length"}, reasons  # both happen with this seed
    for s in samples:
        r = s.response_ids
        assert len(r) == len(s.response_logprobs) == len(s.response_mask)
        assert not stops & set(r[:-1]), "generation went on past a stop token"
        if s.finish_reason == "stop":
            assert r[-1] in stops and 1 <= len(r) <= 8
        else:
            assert len(r) == 8 and r[-1] not in stops
        assert s.text == tok.decode(r)
    # ignore_eos: every response runs to the cap, stop ids or not
    samples = Engine(model, tok).generate(
        prompts, 6, SamplingParams(max_new_tokens=8, stop_ids=digits, ignore_eos=True), seed=2
    )
    assert {len(s.response_ids) for s in samples} == {8}
    assert {s.finish_reason for s in samples} == {"length"}


def test_determinism_and_seeds(model, tok, prompts):
    e = Engine(model, tok, max_slots=5)
    sp = SamplingParams(max_new_tokens=10)
    a = e.generate(prompts, 3, sp, seed=7, step=3)
    b = e.generate(prompts, 3, sp, seed=7, step=3)
    assert _key(a) == _key(b)
    assert [s.response_logprobs for s in a] == [s.response_logprobs for s in b]
    assert _key(a) != _key(e.generate(prompts, 3, sp, seed=8, step=3))
    assert _key(a) != _key(e.generate(prompts, 3, sp, seed=7, step=4))
    # the n samples of one prompt differ from one another, and so do two copies of a prompt
    assert len({tuple(s.response_ids) for s in a if s.group == 0}) == 3
    twice = e.generate([prompts[0], prompts[0]], 2, sp, seed=7)
    assert [s.response_ids for s in twice[:2]] != [s.response_ids for s in twice[2:]]
    # group_offset is part of the prompt's identity: prompt 0 at offset 0 is prompt 1 at offset -1
    shifted = e.generate(prompts[1:3], 3, sp, seed=7, step=3, group_offset=1)
    assert [s.response_ids for s in shifted] == [s.response_ids for s in a[3:9]]


def test_batch_invariance(model, tok, prompts):
    """A group's tokens do not depend on what else shares the batch or on max_slots.

    Float-level differences between batch shapes (matmul blocking, padded prefill, attention
    span) can change logprobs by ~1e-7; a token could flip only if a uniform fell that close
    to a CDF boundary, which this seed does not hit."""
    sp = SamplingParams(max_new_tokens=12)
    together = Engine(model, tok, max_slots=64).generate(prompts, 4, sp, seed=5)
    for g in (0, 3):
        alone = Engine(model, tok, max_slots=3).generate([prompts[g]], 4, sp, seed=5, group_offset=g)
        mine = [s for s in together if s.group == g]
        assert [s.response_ids for s in alone] == [s.response_ids for s in mine]
        for x, y in zip(alone, mine):
            assert max(abs(p - q) for p, q in zip(x.response_logprobs, y.response_logprobs)) < 1e-5


def test_continuous_batching_refills_slots(model, tok, prompts):
    sp = SamplingParams(max_new_tokens=12, stop_ids=tuple(tok.encode("01")))
    e = Engine(model, tok, max_slots=4)
    samples = e.generate(prompts, 3, sp, seed=4)  # 15 samples through 4 slots
    st = e.stats
    assert [(s.group, s.index) for s in samples] == [(g, j) for g in range(5) for j in range(3)]
    assert all(s.finish_reason in ("stop", "length") and s.response_ids for s in samples)
    lengths = [len(s.response_ids) for s in samples]
    assert len(set(lengths)) > 1  # ragged: slots free at different times
    assert st["rollout/slots"] == 4 and st["rollout/generated_tokens"] == sum(lengths)
    # every decode forward feeds one token per active slot; a sample's last token is never fed
    fed = st["rollout/slot_occupancy"] * 4 * st["rollout/decode_steps"]
    assert fed == pytest.approx(sum(lengths) - len(samples))
    assert st["rollout/decode_steps"] >= math.ceil(fed / 4)
    # static batches of 4 would take the sum of each batch's longest response; refilling is faster
    static = sum(max(lengths[i : i + 4]) for i in range(0, 15, 4))
    assert st["rollout/decode_steps"] < static
    assert 0 < st["rollout/cache_occupancy"] <= 1
    assert _key(samples) == _key(Engine(model, tok, max_slots=64).generate(prompts, 3, sp, seed=4))


@pytest.mark.parametrize("fast", [True, False])
def test_kv_positions_count_what_each_decode_step_attends(model, tok, fast):
    # a sample with prompt P and M tokens has M − 1 decode forwards (the first token comes from the
    # prefill's logits, the last is never fed); the j-th attends over P + j cached positions
    ps = [[5, 6, 7], [5, 6, 7, 8, 9]]
    e = Engine(model, tok, max_slots=3)  # 4 samples through 3 slots: a refill on the way
    e.fast_decode = fast
    e.generate(ps, 2, SamplingParams(max_new_tokens=4, ignore_eos=True), seed=1)
    per_sample = {P: sum(P + j for j in range(1, 4)) for P in (3, 5)}  # 3·P + 6: 15 and 21
    assert e.stats["rollout/kv_positions"] == 2 * per_sample[3] + 2 * per_sample[5] == 72


@pytest.mark.parametrize("max_slots", [64, 3])
def test_shared_prompt_prefilled_once_per_group(model, tok, prompts, max_slots):
    e = Engine(model, tok, max_slots=max_slots)
    n = 5
    e.generate(prompts, n, SamplingParams(max_new_tokens=4), items=list(range(5)))
    st = e.stats
    total = sum(map(len, prompts))
    assert st["rollout/prefills"] == len(prompts)  # groups, not samples
    assert st["rollout/prefill_tokens"] == total
    assert st["rollout/prompt_tokens"] == n * total
    assert st["rollout/prefix_reuse"] == pytest.approx(n)


def test_top_k_1_equals_greedy(model, tok, prompts):
    e = Engine(model, tok)
    greedy = e.generate(prompts, 2, SamplingParams(temperature=0.0, max_new_tokens=10))
    top1 = e.generate(prompts, 2, SamplingParams(temperature=1.0, top_k=1, max_new_tokens=10), seed=9)
    assert [s.response_ids for s in greedy] == [s.response_ids for s in top1]
    for a, b in zip(greedy, top1):  # both recorded at T = 1
        assert a.response_logprobs == pytest.approx(b.response_logprobs, abs=1e-6)


def test_samples_carry_items_version_and_order(model, tok, prompts):
    e = Engine(model, tok)
    e.policy_version = 3
    items = [f"item{g}" for g in range(5)]
    samples = e.generate(prompts, 2, SamplingParams(max_new_tokens=3), items=items)
    assert [(s.group, s.index, s.item) for s in samples] == [(g, j, f"item{g}") for g in range(5) for j in range(2)]
    assert {s.policy_version for s in samples} == {3}
    assert all(s.prompt_ids == prompts[s.group] for s in samples)


def test_size_errors_name_the_sizes(model, tok):
    e = Engine(model, tok, max_len=32)
    with pytest.raises(ValueError, match=r"40 tokens.*max_len=32"):
        e.generate([[1] * 40], 1, SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match=r"20 tokens.*max_new_tokens \(16\).*36.*max_len=32"):
        e.generate([[1] * 20], 1, SamplingParams(max_new_tokens=16))
    with pytest.raises(ValueError, match="max_seq_len"):
        Engine(model, tok, max_len=model.config.max_seq_len + 1)
