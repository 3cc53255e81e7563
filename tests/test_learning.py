"""Learning tests: a tiny model must actually learn on CPU. Slow (minutes), still run in CI.

The default chain (pretrain → SFT with chain-of-thought), then GRPO from it with the
`grpo_arith` preset: held-out pass@1 must rise over the SFT start. Everything is seeded,
so on one machine the numbers are the same run after run.
"""

import pytest

from posttrain.config import RLConfig, load_config
from posttrain.logging import read_metrics
from posttrain.recipes import pretrain, rl, sft
from posttrain.recipes.chain import PipelineConfig, train_chain

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("learn")
    # The preset's SFT stops at held-out greedy accuracy 0.7 (target_acc): on the machine of earlier stops
    # that is never reached in 500 steps (pass@1 0.567); on an AMD EPYC box SFT jumps earlier and stops at
    # step 375 (pass@1 ≈ 0.58) where 500 steps would give 0.85, above the band.
    train_chain(
        load_config(PipelineConfig, "pipeline", [f"out={root}/pipe"]), {"pretrain": pretrain, "sft": sft}, upto="sft"
    )
    return root


def test_sft_cot_checkpoint_is_in_the_learnable_band(sft_run):
    """RL needs signal: pass@1 inside 0.2–0.8 and pass@8 clearly above it (issue acceptance)."""
    cfg = load_config(RLConfig, "grpo_arith", [f"out={sft_run}/rl", f"init={sft_run}/pipe/sft", "steps=1"])
    rl.run(cfg)  # steps=0 is refused (validate.py); step 0 is the start
    start = read_metrics(sft_run / "rl")[0]
    assert start["step"] == 0
    assert 0.2 <= start["eval/pass@1"] <= 0.8
    assert start["eval/pass@8"] >= start["eval/pass@1"] + 0.15


def test_grpo_raises_heldout_pass_at_1(sft_run):
    cfg = load_config(
        RLConfig, "grpo_arith", [f"out={sft_run}/rl_grpo", f"init={sft_run}/pipe/sft", "steps=100", "device=cpu"]
    )  # the threshold and the 1e-4 agreement are the CPU's fp32
    rl.run(cfg)
    metrics = read_metrics(sft_run / "rl_grpo")
    before, after = metrics[0]["eval/pass@1"], metrics[-1]["eval/pass@1"]
    print(f"held-out pass@1 before {before:.3f} after {after:.3f}")
    assert after >= before + 0.05  # measured here: 0.567 → 0.669 at step 100
    assert all(m["mismatch/logprob_abs"] < 1e-4 for m in metrics[1:])  # sampler and trainer agree


@pytest.mark.parametrize("algorithm", ["rloo", "dr_grpo", "dapo", "ppo"])
def test_zoo_raises_heldout_pass_at_1(sft_run, algorithm):
    """Each of these improves on the SFT start within 50 steps of the grpo_arith budget
    (benchmarks/algorithms.py runs all of them and writes the table)."""
    from posttrain.bench.algorithms import one_run

    row = one_run(algorithm, f"{sft_run}/pipe/sft", 50, 0, sft_run / f"rl_{algorithm}")
    print(f"{algorithm}: held-out pass@1 {row['pass@1_start']:.3f} → {row['pass@1_end']:.3f}")
    assert row["pass@1_end"] >= row["pass@1_start"] + 0.02
