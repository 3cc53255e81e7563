"""The graph-ready decode loop (framework/decode_loop.py): k decode steps between two read-backs,
rows rounded up to a slot-count bucket, finished rows frozen and masked until the window ends.

The samples are pinned to what main sampled before the loop changed (929387e: 15 samples through 4
slots, stops on, ragged lengths): every window k, bucket and span rounding must give those token
ids. k = 1 with buckets of 1 (the CPU default) is the old loop op for op, logprobs included, bit
for bit; larger windows and buckets change the row count and attended span of a forward, which
moves an fp32 logit by ~1e-7 on the CPU (matmul blocking), so there the logprobs agree to 1e-5.
"""

import pytest
import torch

from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.tasks.arithmetic import ArithmeticTask

# response ids of Engine(max_slots=4).generate(prompts, 3, SP, seed=4) on 929387e, and Σ logprobs
MAIN = {
    "nano": (
        [[40, 18, 51, 63, 12, 24, 48, 77, 22, 7], [82, 10, 45, 1, 19, 79, 34, 9, 74, 17, 42, 15], [59, 6],
         [70, 18, 17, 9, 56, 18, 85, 90, 11, 4, 25, 28], [43, 29, 45, 41, 56, 83, 87, 84, 67, 28, 59, 87],
         [79, 70, 55, 82, 22, 9, 24, 32, 71, 13, 78, 79], [56, 15, 61, 65, 17, 11, 86, 34, 65, 33, 2, 19],
         [49, 50, 15, 43, 48, 30, 12, 28, 73, 38, 17, 78], [61, 77, 86, 44, 8, 16, 1, 71, 48, 2, 26, 0],
         [23, 51, 89, 75, 90, 28, 5, 9, 9, 90, 44, 45], [11, 51, 68, 44, 85, 90, 12, 90, 80, 54, 7],
         [86, 10, 8, 57, 74, 78, 31, 7], [71, 73, 23, 86, 38, 16, 67, 21, 89, 53, 32, 7],
         [90, 19, 21, 24, 75, 79, 80, 34, 50, 82, 18, 82], [13, 72, 89, 55, 76, 7]],
        -708.4882,
    ),
    "llama": (
        [[37, 12, 52, 61, 9, 24, 50, 73, 22, 7], [80, 19, 34, 3], [58, 5, 76, 47, 19, 2, 30, 26, 32, 84, 19, 89],
         [62, 12, 12, 8, 55, 16, 76, 89, 9, 5, 23, 24], [38, 24, 46, 38, 52, 76, 85, 81, 62, 28, 62, 82],
         [75, 62, 51, 73, 15, 11, 17, 27, 73, 13, 64, 76], [56, 18, 57, 61, 18, 14, 76, 42, 62, 40, 4, 18],
         [47, 44, 14, 44, 44, 27, 13, 24, 62, 35, 16, 65], [60, 72, 84, 47, 7], [24, 48, 90, 75, 90, 22, 4, 10, 6],
         [12, 46, 65, 45, 83, 86, 15, 89, 75, 60, 5, 62], [82, 11, 10, 43, 65, 76, 28, 3],
         [68, 78, 19, 84, 34, 16, 63, 16, 85, 55, 29, 10], [91, 18, 17, 21, 79, 69, 79, 32, 50, 82, 16, 81],
         [10, 63, 85, 54, 76, 7]],
        -605.05,
    ),
    "qwen2": (
        [[45, 17, 54, 63, 14, 27, 45, 84, 23, 11, 54, 53], [84, 13, 39, 2, 22, 86, 35, 14, 76, 17, 46, 20],
         [61, 2, 84, 49, 22, 1, 38, 27, 31, 84, 23, 89], [61, 23, 20, 11, 52, 20, 87, 89, 17, 2, 31, 32],
         [44, 31, 49, 39, 52, 87, 87, 84, 75, 31, 54, 87], [80, 58, 48, 81, 29, 14, 29, 34, 60, 17, 80, 80],
         [53, 17, 60, 58, 17, 11, 87, 38, 54, 34, 1, 22], [49, 46, 17, 45, 49, 32, 15, 32, 77, 43, 23, 80],
         [55, 77, 88, 49, 7], [29, 49, 88, 75, 89, 35, 3], [16, 49, 62, 40, 83, 88, 17, 89, 83, 49, 7],
         [87, 11, 11, 49, 77, 77, 29, 11, 55, 39, 4, 80], [64, 63, 17, 87, 39, 13, 64, 20, 88, 49, 25, 2],
         [88, 20, 22, 28, 78, 83, 81, 35, 49, 87, 20, 87], [18, 65, 88, 49, 77, 2, 34, 35, 7]],
        -645.9277,
    ),
}  # fmt: skip
# (window k, row bucket, span bucket): the CPU default, windows, buckets with padding rows, CUDA's shapes
SHAPES = [(1, 1, None), (4, 1, None), (3, 4, None), (8, 16, 64)]


@pytest.fixture(scope="module")
def setup():
    from posttrain.models.gpt_mini import GPTMini, ModelConfig
    from posttrain.models.tokenizer import CharTokenizer

    tok = CharTokenizer()
    torch.manual_seed(0)
    nano = GPTMini(ModelConfig(preset="nano").resolved(tok.vocab_size)).eval()
    prompts = [tok.encode(tok.chat_prompt(i.question)) for i in ArithmeticTask().items(5, seed=3)]
    sp = SamplingParams(max_new_tokens=12, stop_ids=tuple(tok.encode("01")))
    return tok, nano, prompts, sp


def _generate(model, tok, prompts, sp, shape, **kw):
    e = Engine(model, tok, max_slots=4)
    e.decode_window, e.decode_bucket, e.decode_span_bucket = shape
    return e.generate(prompts, 3, sp, seed=4, **kw), e.stats


def _check(samples, name, setup):
    ids, total = MAIN[name]
    assert [s.response_ids for s in samples] == ids
    tok, _, _, sp = setup
    stops = {tok.eot_id, *sp.stop_ids}
    assert [s.finish_reason for s in samples] == ["stop" if r[-1] in stops else "length" for r in ids]
    assert sum(sum(s.response_logprobs) for s in samples) == pytest.approx(total, abs=1e-3)  # 4 decimals pinned


@pytest.mark.parametrize("shape", SHAPES)
def test_every_window_and_bucket_samples_what_main_sampled(setup, shape):
    tok, nano, prompts, sp = setup
    samples, st = _generate(nano, tok, prompts, sp, shape)
    _check(samples, "nano", setup)
    base, base_st = _generate(nano, tok, prompts, sp, SHAPES[0])
    for a, b in zip(samples, base):
        worst = max(abs(x - y) for x, y in zip(a.response_logprobs, b.response_logprobs))
        assert worst == 0.0 if shape[:2] == (1, 1) else worst < 1e-5
    # frozen and padding rows are computed but never counted: the live work is the same
    for key in ("rollout/generated_tokens", "rollout/kv_positions", "rollout/prefill_tokens"):
        assert st[key] == base_st[key]
    fed = st["rollout/slot_occupancy"] * 4 * st["rollout/decode_steps"]
    assert fed == pytest.approx(sum(len(s.response_ids) for s in samples) - len(samples))
    assert base_st["rollout/row_use"] == 1.0  # k = 1, bucket 1: every forwarded row is live
    if shape[0] > 1:
        assert st["rollout/row_use"] < 1.0  # finished rows decoded on until their window ended
    assert st["rollout/graph_replays"] == 0  # no CUDA here


def test_the_cut_off_reads_back_every_step(setup):
    """keep < n: which samples count as the first to finish is decided per step, so a window would
    change them; the loop runs k = 1 and keeps exactly what k = 1 keeps."""
    tok, nano, prompts, sp = setup
    a, st = _generate(nano, tok, prompts, sp, (8, 1, None), keep=2)
    b, _ = _generate(nano, tok, prompts, sp, SHAPES[0], keep=2)
    assert [(s.group, s.index, s.response_ids, s.response_logprobs) for s in a] == [
        (s.group, s.index, s.response_ids, s.response_logprobs) for s in b
    ]
    assert st["rollout/cancelled"] > 0 and st["rollout/row_use"] == 1.0  # no window: no frozen rows


def test_the_slow_path_freezes_finished_rows_too(setup):
    """model.forward advances every row it decodes; the loop puts a frozen row back."""
    tok, nano, prompts, sp = setup
    e = Engine(nano, tok, max_slots=4)
    e.fast_decode, e.decode_window = False, 4
    _check(e.generate(prompts, 3, sp, seed=4), "nano", setup)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_hf_families_sample_what_main_sampled(setup, name):
    pytest.importorskip("transformers")
    from test_decode_families import FAST, build

    tok, _, prompts, sp = setup
    model = build(name, FAST[name][1], 0)
    for shape in (SHAPES[0], SHAPES[2]):
        _check(_generate(model, tok, prompts, sp, shape)[0], name, setup)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_captured_steps_sample_what_eager_steps_sample(setup, dtype):
    """On CUDA the in-window steps replay as CUDA graphs: the same kernels on the same buffers, so
    the same tokens as the uncaptured loop of the same shapes, and its logprobs (1e-5: cuBLAS may
    pick another algorithm inside a capture)."""
    tok, nano, prompts, sp = setup
    model = nano.to("cuda")
    runs = {}
    for capture in (True, False):
        e = Engine(model, tok, max_slots=4)
        e.capture_decode, e.decode_span_bucket = capture, 64  # the same shapes, captured or not
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            samples = e.generate(prompts * 4, 3, sp, seed=4)  # 60 samples through 4 slots: shapes recur
        runs[capture] = ([(s.response_ids, s.response_logprobs) for s in samples], e.stats)
    (got, _), (want, _) = runs[True], runs[False]
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    assert max(abs(x - y) for (_, a), (_, b) in zip(got, want) for x, y in zip(a, b)) < 1e-5
    assert runs[True][1]["rollout/graph_replays"] > 0 and runs[False][1]["rollout/graph_replays"] == 0
    nano.to("cpu")
