"""The experiment drivers' own arithmetic: best-of-n order statistics (bench/overopt.py) and the
PRM's step-level accuracy (bench/prm.py)."""

import math

import numpy as np
import pytest
import torch

from posttrain.bench.overopt import best_of_n
from posttrain.bench.prm import step_accuracy


def test_best_of_n_is_exact_over_every_subset():
    proxy, true = np.array([[0.1, 0.5, 0.3]]), np.array([[1.0, 0.0, 1.0]])
    rows = best_of_n(proxy, true, [1, 2, 3])
    # n = 2: subsets {0,1} → 1 (wrong), {0,2} → 2 (right), {1,2} → 1 (wrong)
    assert [r["true"] for r in rows] == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert [r["proxy"] for r in rows] == pytest.approx([0.3, (0.5 + 0.3 + 0.5) / 3, 0.5])
    assert rows[1]["kl"] == pytest.approx(math.log(2) - 0.5) and rows[0]["sqrt_kl"] == 0.0


def test_best_of_n_averages_prompts_and_a_perfect_rm_reaches_pass_at_n():
    rng = np.random.default_rng(0)
    true = (rng.random((50, 8)) < 0.3).astype(float)
    rows = best_of_n(true + 0.01 * rng.random((50, 8)), true, [1, 8])  # the RM ranks right answers first
    assert rows[0]["true"] == pytest.approx(true.mean()) and rows[1]["true"] == pytest.approx(true.max(1).mean())


class _ConstPRM(torch.nn.Module):
    """A 'PRM' whose logit is +2 at even positions and −2 at odd ones."""

    def forward(self, ids):
        T = ids.shape[1]
        return torch.tensor([2.0 if t % 2 == 0 else -2.0 for t in range(T)]).expand(ids.shape[0], T)


def test_step_accuracy_compares_thresholded_scores_with_thresholded_labels(tok):
    rows = [
        {"prompt_ids": [1, 2], "response_ids": [5, 6, 7, 8, 9], "positions": [0, 1, 4], "labels": [0.75, 0.25, 1.0]},
        {"prompt_ids": [1, 2, 3], "response_ids": [5, 6, 7], "positions": [0, 2], "labels": [0.5, 0.0]},
    ]
    # row 0: positions 2, 3 (+prompt 2) → σ ≥ ½, < ½; labels good, bad: both agree; final at 6 → good = label 1
    # row 1: position 3 → σ < ½ vs label 0.5 (good): miss; final at 5 → σ < ½ vs 0: agree
    acc = step_accuracy(_ConstPRM(), tok, rows)
    assert acc["step_acc"] == pytest.approx(2 / 3) and acc["final_acc"] == 1.0 and acc["steps_scored"] == 3
    assert acc["step_majority"] == pytest.approx(2 / 3)
    s2, s_2 = 1 / (1 + math.exp(-2)), 1 / (1 + math.exp(2))
    assert acc["step_abs_err"] == pytest.approx((abs(s2 - 0.75) + abs(s_2 - 0.25) + abs(s_2 - 0.5)) / 3)


def _append(path, i):
    from posttrain.bench import update_json

    update_json(path, lambda res: {**res, "rows": res.get("rows", []) + [i]})


@pytest.mark.slow
def test_update_json_loses_no_row_when_processes_write_at_once(tmp_path):
    import multiprocessing as mp

    path = tmp_path / "res.json"
    procs = [mp.get_context("spawn").Process(target=_append, args=(path, i)) for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    import json

    assert sorted(json.loads(path.read_text())["rows"]) == list(range(6))


def test_prm_ranking_auc_by_hand():
    """Within: pairs of one problem only (an all-correct problem adds none); across: all pairs; ties ½."""
    from posttrain.bench.prm import auc

    scores = np.array([[0.9, 0.1, 0.5], [0.2, 0.2, 0.8], [0.3, 0.3, 0.3]])
    right = np.array([[1, 0, 0], [1, 0, 1], [1, 1, 1]])
    got = auc(scores, right)
    assert got["within_pairs"] == 4
    assert got["within_auc"] == pytest.approx(3.5 / 4)  # 2/2 in row 0, (½ + 1)/2 in row 1
    assert got["across_auc"] == pytest.approx(13.5 / 18)  # 7.5 of rows 0–1's 9 pairs, 6 of row 2's 9
    assert auc(np.array([[0.4, 0.6]]), np.array([[1, 1]]))["within_auc"] is None


def test_lessons_claims_data_is_what_the_results_give():
    """posttrain/lessons/data/claims.json is benchmarks/claims_lessons.py applied to the results JSON,
    not hand-edited (rerun the script after a result changes)."""
    import importlib.util
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("claims_lessons", root / "benchmarks" / "claims_lessons.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    parts = {
        "length_bias": mod.length_bias(),
        "overoptimization": mod.overoptimization(),
        "prm": mod.prm(),
        "precision": mod.precision(),
        "group_size": mod.group_size(),
    }
    expected = json.loads(json.dumps({k: v for k, v in parts.items() if v is not None}))
    shipped = json.loads((root / "posttrain" / "lessons" / "data" / "claims.json").read_text())
    assert shipped == expected
