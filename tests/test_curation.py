"""Data curation: hand-checkable Jaccard/MinHash values, dedup, decontamination, the band
filter, and the pass-rate probe through the rollout engine."""

from dataclasses import dataclass

import numpy as np
import pytest

from posttrain.data.curate import contaminated, curate, jaccard, minhash, near_duplicates, probe

A = "Compute the sum of the numbers twelve, thirty and seven, then report the result as an integer."
A_NEAR = "Compute the sum of the numbers twelve, thirty and seven, then report the result as an integers."
A_EXACT = "  compute the SUM of the numbers twelve, thirty and seven,   then report the result as an integer."
OTHER = "Write a Python function that returns the reversed string."


def test_jaccard_and_minhash_estimate():
    assert jaccard("abcdef", "abcdeg") == pytest.approx(1 / 3)  # {abcde, bcdef} vs {abcde, bcdeg}
    sigs = minhash([A, A_NEAR, OTHER, A], num_perm=128)
    assert (sigs[0] == sigs[3]).all()  # same text, same signature
    for i, j in ((0, 1), (0, 2), (1, 2)):
        assert abs(np.mean(sigs[i] == sigs[j]) - jaccard([A, A_NEAR, OTHER][i], [A, A_NEAR, OTHER][j])) < 0.1
    assert jaccard(A, A_NEAR) > 0.85 and jaccard(A, OTHER) < 0.1


def test_near_duplicates_catches_the_later_copy_only():
    assert near_duplicates([A, OTHER, A_NEAR]) == {2}
    assert near_duplicates([A_NEAR, A, OTHER]) == {1}
    assert near_duplicates([A, OTHER]) == set()


def test_decontamination_word_ngrams():
    evals = ["what is the sum of twelve and thirty plus seven", "3+4+5"]
    train = [
        "please tell me what is the sum of twelve and thirty plus seven today",  # shares an 8-gram
        "what is the sum of twelve and",  # 7 words: equality only
        "3+4+5",
        "3+4+6",
    ]  # short: equality only
    assert contaminated(train, evals, n=8) == {0, 2}


def test_curate_band_filter_and_metrics():
    prompts = [
        A,
        "p1 unique text one",
        "p2 another question here",
        "p3 yet another",
        "p4 the always solved",
        "p5 rarely solved",
        A_EXACT,
        A_NEAR,
        "what is the sum of twelve and thirty plus seven now",
    ]
    rates = [0.5, 0.0, 0.125, 0.875, 1.0, 0.05, 0.5, 0.5, 0.5]
    signal = [0.0 < r < 1.0 for r in rates]
    kept, m = curate(
        list(range(9)), prompts, rates, signal, ["what is the sum of twelve and thirty plus seven"], band=(0.1, 0.9)
    )
    assert kept == [0, 2, 3]
    assert m["keep_rate"] == pytest.approx(3 / 9) and m["frac_groups_with_signal"] == 1.0
    assert m["frac_groups_with_signal_before"] == pytest.approx(7 / 9)
    removed = [m[f"removed/{s}"] for s in ("exact_dup", "near_dup", "contaminated", "out_of_band")]
    assert removed == [1, 1, 1, 3]
    assert [m[f"bucket/{b}"] for b in ("never", "hard", "learnable", "easy", "always")] == [1, 1, 6, 0, 1]


@dataclass
class _S:
    group: int
    index: int
    text: str
    item: object
    finish_reason: str = "stop"


class _ScriptedEngine:
    """Returns fixed responses: prompt g's K samples are `script[g]`."""

    def __init__(self, script):
        self.script = script

    def generate(self, prompts, n, sampling, seed=0, items=None):
        return [_S(g, j, self.script[g][j], items[g]) for g in range(len(prompts)) for j in range(n)]


def test_probe_pass_rates_hand_values(tok):
    from posttrain.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask()
    items = task.items(3, "train", seed=0)
    a = [str(it.answer) for it in items]
    engine = _ScriptedEngine([[a[0]] * 4, [a[1], "x", a[1], "0"], ["wrong"] * 4])
    rates, signal = probe(engine, tok, task, items, k=4)
    assert rates.tolist() == [1.0, 0.5, 0.0] and signal.tolist() == [False, True, False]


def test_probe_runs_on_the_rollout_engine(sft_ckpt):
    from posttrain import checkpoint
    from posttrain.framework.rollout import Engine
    from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask

    model, tok, _ = checkpoint.load_model(str(sft_ckpt), "cpu")
    task = ArithmeticTask(ArithmeticConfig(max_terms=3))
    items = task.items(4, "train", seed=1)
    engine = Engine(model, tok, max_slots=64)
    rates, signal = probe(engine, tok, task, items, k=4, max_new_tokens=16, seed=5)
    again, _ = probe(engine, tok, task, items, k=4, max_new_tokens=16, seed=5)
    assert rates.shape == (4,) and ((rates * 4) % 1 == 0).all() and (rates == again).all()  # K=4: quarters
    assert (signal == ((rates > 0) & (rates < 1))).all()  # binary rewards
