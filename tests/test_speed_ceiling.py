"""benchmarks/speed_ceiling.py: the work it times is the model's, and its ceilings are the
right arithmetic on given times. Nothing here asserts a speed."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from posttrain.models.gpt_mini import ModelConfig, build_model
from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer

ROOT = Path(__file__).resolve().parents[1]
VOCAB = CharTokenizer(BASE_CHARS).vocab_size


@pytest.fixture(scope="module")
def sc():
    saved = list(sys.path)  # the script puts the repo root on sys.path
    spec = importlib.util.spec_from_file_location("speed_ceiling", ROOT / "benchmarks" / "speed_ceiling.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    sys.path[:] = saved


@pytest.mark.parametrize("preset", ["nano", "micro"])
def test_the_projections_timed_are_every_matrix_of_the_model(sc, preset):
    model = build_model(ModelConfig(preset=preset), VOCAB)
    shapes = sc.linear_shapes(model.config, VOCAB)
    matrices = sorted(tuple(p.shape) for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n)
    assert sorted(shapes) == matrices
    vectors = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 1)
    assert sum(o * i for o, i in shapes) + model.embed.weight.numel() + vectors == model.num_params()


def test_projection_ops_are_the_forward_and_both_gradients(sc):
    ops = sc.projection_ops([(6, 4)], tokens=5, backward=True)
    assert [(tuple(a.shape), tuple(b.shape), tuple(out.shape)) for _, a, b, out in ops] == [
        ((5, 4), (4, 6), (5, 6)),  # Y = X·Wᵀ
        ((5, 6), (6, 4), (5, 4)),  # dX = dY·W
        ((6, 5), (5, 4), (6, 4)),  # dW = dYᵀ·X
    ]
    sc.run_ops(ops)
    _, X, Wt, Y = ops[0]
    assert torch.equal(Y, X @ Wt)
    assert len(sc.projection_ops([(6, 4)], tokens=5, backward=False)) == 1


def test_train_attention_ops_are_six_batched_matmuls_per_layer(sc):
    c = ModelConfig(preset="nano").resolved(VOCAB)
    ops = sc.train_attention_ops(c, rows=2, T=7)
    assert len(ops) == 6 * c.n_layers
    BH = 2 * c.n_heads
    outs = {tuple(out.shape) for _, _, _, out in ops}
    assert outs == {(BH, 7, 7), (BH, 7, c.head_dim)}


def test_decode_seconds_times_both_parts(sc):
    c = ModelConfig(preset="nano").resolved(VOCAB)
    t = sc.decode_seconds(c, VOCAB, rows=4, spans=[3, 4, 5], repeats=1)
    assert set(t) == {"projections_s", "attention_s"} and all(v > 0 for v in t.values())


def test_train_result_fractions(sc):
    # 6·N·real = 6e9 FLOPs at a 1e11 FLOP/s peak: 0.06 s at the limit
    r = sc.train_result(0.1, 0.06, 0.015, 0.07, 6e9, 1e11, real=10)
    assert r["real_token_peak_frac"] == pytest.approx(0.6)
    assert r["ceiling_real_token_peak_frac"] == pytest.approx(0.8)  # 0.06 / (0.06 + 0.015)
    assert r["ceiling_packed_real_token_peak_frac"] == pytest.approx(0.06 / 0.07)
    assert r["real"] == 10


def test_rollout_row_ratios(sc):
    row = {"batch": 64, "tokens": 6400, "ours_tokens_per_s": 4000.0, "hf_tokens_per_s": 3200.0}
    row["ratio"] = 1.25
    r = sc.rollout_row(row, {"projections_s": 0.6, "attention_s": 0.2}, params=1_000_000, peak=1e11)
    assert r["ceiling_tokens_per_s"] == pytest.approx(8000.0)  # 6400 tokens in 0.8 s
    assert r["ceiling_ratio"] == pytest.approx(2.5)  # ÷ generate's 3200
    assert r["ceiling_flop_frac"] == pytest.approx(2 * 1e6 * 8000 / 1e11)
    assert r["ours_flop_frac"] == pytest.approx(2 * 1e6 * 4000 / 1e11)  # against the same peak
    assert r["ratio"] == 1.25 and r["ours_tokens_per_s"] == 4000.0


def test_ranges_span_the_runs(sc):
    def run(frac, ceiling):
        rows = [{"ratio": 1.1, "ceiling_ratio": ceiling}, {"ours_flop_frac": frac, "ceiling_flop_frac": 0.4}]
        return {
            "train": {
                "real_token_peak_frac": frac,
                "ceiling_real_token_peak_frac": ceiling,
                "ceiling_packed_real_token_peak_frac": 0.9,
            },
            "rollout": {"rows": rows},
            "grpo": {"measured_floor_frac": {"posttrain": 0.42}, "ceiling_floor_frac": 0.8},
            "pipeline_sampling": {"ours_tokens_per_s": 2.0e4, "ceiling_tokens_per_s": 4.0e4},
        }

    r = sc.ranges([run(0.4, 1.8), run(0.45, 2.2)])
    assert r["train real-token fraction of the peak (goal 75%)"] == [[0.4, 0.45], [1.8, 2.2], [0.9, 0.9]]
    assert r["rollout ÷ generate at batch 64 (goal 2x)"] == [[1.1, 1.1], [1.8, 2.2]]
    assert r["rollout FLOP-limit fraction at batch 256 (goal 50%)"] == [[0.4, 0.45], [0.4, 0.4]]
    assert r["GRPO 64x16 fraction of the FLOP floor (goal 85%)"] == [[0.42, 0.42], [0.8, 0.8]]
