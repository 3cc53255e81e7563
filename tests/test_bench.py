"""posttrain bench train (posttrain/bench/train.py): FLOP accounting by hand, a tiny run,
the CLI as a subprocess, and the exactness of the CPU-tuned training path of gpt_mini it
measures. Nothing here asserts a speed: the machine is shared."""

import copy
import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from posttrain.bench.train import run, step_flops


def test_step_flops_by_hand():
    # 6 FLOPs per parameter per token: 2 forward (multiply-add), 4 backward (two products)
    assert step_flops(1_000, 64) == 6 * 1_000 * 64 == 384_000
    # + 12·L·T·d per token: L=2 layers, T=16, d=8 -> 3,072 per token
    assert step_flops(1_000, 64, n_layers=2, seq_len=16, d_model=8) == 64 * (6_000 + 3_072) == 580_608
    # the micro preset at the acceptance shape: 4,776,192 parameters, 32 × 96 tokens
    assert step_flops(4_776_192, 32 * 96) == 6 * 4_776_192 * 3_072 == 88_034_770_944


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "train.json"
    threads = torch.get_num_threads()
    result = run(str(out), preset="nano", batch=2, seq_len=16, steps=2, warmup=1, threads=1)
    assert torch.get_num_threads() == threads  # the run restores the thread count
    return result, out


def test_tiny_run_reports_positive_rates(tiny):
    r, _ = tiny
    assert r["params"] == 806_528 and r["tokens_per_step"] == 2 * 16
    assert r["flops_per_step"] == step_flops(806_528, 32)
    assert r["flops_per_step_with_attn"] == step_flops(806_528, 32, 4, 16, 128)
    assert r["matmul_peak_gflops"] > 0
    for k in ("ours", "hf"):
        s = r[k]
        assert 0 < s["step_s"] <= s["step_s_median"]
        assert s["tokens_per_s"] == pytest.approx(32 / s["step_s"])
        assert s["gflops"] == pytest.approx(r["flops_per_step"] / s["step_s"] / 1e9)
        assert s["peak_frac"] == pytest.approx(s["gflops"] / r["matmul_peak_gflops"])
        assert s["gflops_with_attn"] > s["gflops"] > 0
        assert len(s["losses"]) == 3  # warmup + timed steps
    assert r["speed_ratio"] == pytest.approx(r["hf"]["step_s"] / r["ours"]["step_s"])


def test_tiny_run_trains_the_same_as_hf(tiny):
    """Same weights, batch and optimizer: the Llama export must give the same losses, step
    after step, or the two sides did not do the same work."""
    r, _ = tiny
    ours, hf = r["ours"]["losses"], r["hf"]["losses"]
    assert ours[0] == pytest.approx(hf[0], abs=1e-6)
    assert ours == pytest.approx(hf, abs=1e-5)
    assert ours[-1] < ours[0]  # the steps did train


def test_tiny_run_writes_json(tiny):
    r, out = tiny
    assert json.loads(out.read_text()) == json.loads(json.dumps(r))


def test_without_transformers_it_names_the_extra_before_any_work(monkeypatch, tmp_path):
    import importlib.util

    from posttrain import UsageError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a)
    )
    with pytest.raises(UsageError, match=r"pip install 'posttrain\[hf\]', or pass --no-hf to time gpt_mini alone"):
        run(str(tmp_path / "t.json"), preset="nano", batch=2, seq_len=8, steps=1, warmup=0, threads=1)
    assert not (tmp_path / "t.json").exists()
    alone = run(None, preset="nano", batch=2, seq_len=8, steps=1, warmup=0, threads=1, hf=False)
    assert "hf" not in alone and alone["ours"]["step_s"] > 0


@pytest.mark.slow
def test_cli_bench_train_subprocess(tmp_path):
    out = tmp_path / "t.json"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "posttrain.cli",
            "bench",
            "train",
            "--preset",
            "nano",
            "--batch",
            "2",
            "--seq-len",
            "8",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--threads",
            "1",
            "--no-hf",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert r["bench"] == "train" and "hf" not in r and r["ours"]["tokens_per_s"] > 0
    assert "gpt_mini" in p.stdout and "%peak" in p.stdout


# ---- the training path the benchmark measures (models/gpt_mini.py) ------------------------


def test_training_path_gives_hf_loss_and_gradients(tok):
    """Fused q/k/v and gate/up, our rotary and RMSNorm: the loss and every parameter's
    gradient equal transformers' Llama with the same weights."""
    from posttrain.models.export import to_hf_model, to_hf_state_dict
    from posttrain.models.gpt_mini import ModelConfig, build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(preset="nano", n_kv_heads=2), tok.vocab_size).train()
    hf = to_hf_model(model, tok).train()
    # no padding tokens: HF's embedding has padding_idx = pad_id, whose row gets no gradient
    ids = torch.randint(1, tok.vocab_size, (3, 25), generator=torch.Generator().manual_seed(1))
    losses = []
    for logits in (model(ids[:, :-1]), hf(input_ids=ids[:, :-1], use_cache=False).logits):
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)
    grads = copy.deepcopy(model)  # a model whose weights are the gradients
    for g, p in zip(grads.parameters(), model.parameters()):
        g.data = p.grad
    expected = to_hf_state_dict(grads)  # ... renamed and split as HF's
    for name, p in hf.named_parameters():
        assert torch.allclose(p.grad, expected[name], rtol=1e-4, atol=1e-7), name


def test_algorithms_summary_over_seeds_by_hand():
    from posttrain.bench.algorithms import format_summary, summarize

    row = lambda name, seed, p1, p8: {
        "algorithm": name,
        "seed": seed,
        "pass@1_start": 0.5,
        "pass@1_end": p1,
        "pass@8_start": 0.8,
        "pass@8_end": p8,
        "entropy": 0.05,
        "wall_s": 10.0,
    }
    rows = [row("grpo", 0, 0.6, 0.7), row("grpo", 1, 0.4, 0.9), row("grpo", 2, 0.5, 0.8), row("rloo", 0, 0.7, 0.8)]
    r, g = summarize(rows)  # in ORDER: rloo before grpo
    assert (r["algorithm"], g["algorithm"]) == ("rloo", "grpo")
    assert g["pass@1_end_mean"] == pytest.approx(0.5) and g["pass@1_end_std"] == pytest.approx(0.1)
    assert g["pass@1_gain_mean"] == pytest.approx(0.0) and g["improved_seeds"] == 1
    assert g["pass@8_end_std"] == pytest.approx(0.1) and r["pass@1_end_std"] == 0.0
    assert "| grpo | 3 | 0.500 → 0.500 ± 0.100 | +0.000 | 1/3 |" in format_summary(rows)


@pytest.mark.slow
def test_cli_bench_trl_reports_the_flop_floor(tmp_path):
    """`posttrain bench trl` on a tiny shape: both sides run, and the floor is 6·N·trained +
    2·N·generated tokens at the measured peak, each side's fraction floor / its step time."""
    pytest.importorskip("trl")
    out = tmp_path / "trl.json"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "posttrain.cli",
            "bench",
            "trl",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--shapes",
            "8x4",
            "--threads",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(out.read_text())
    row = r["shapes"]["8x4"]
    work = 6 * row["tokens_trained_per_step"] + 2 * row["tokens_generated_per_step"]
    assert row["floor_s"] == pytest.approx(work * r["params"] / (r["matmul_peak_gflops"] * 1e9), rel=1e-2)
    assert row["tokens_trained_per_step"] > row["tokens_generated_per_step"] > 0
    for side in ("trl", "posttrain"):
        assert row[side]["floor_frac"] == pytest.approx(row["floor_s"] / row[side]["step_s"], rel=1e-2)
    assert "FLOP floor" in p.stdout
