"""RLHF (reward_models/rlhf.py): a reward model as the reward of an RL run, scored in one batch,
the verifier logged beside it, the over-optimisation curve and its turn, best@n in eval, and
the corrupted-trace pairs (preference/data.corrupted_pairs)."""

import json
import random

import pytest
import torch

from posttrain import checkpoint
from posttrain.cli import main
from posttrain.config import RLConfig, load_config
from posttrain.eval import evaluate
from posttrain.framework.sample import Sample
from posttrain.logging import read_metrics
from posttrain.preference.data import CORRUPTIONS, corrupt_trace, corrupted_pairs
from posttrain.recipes import rl
from posttrain.reward_models.reward_model import EnsembleScorer, RewardModel, RewardModelScorer, load_scorer, save_head
from posttrain.reward_models.rlhf import RewardModelTask, curve, turn, write_curve
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask, verify
from posttrain.tasks.base import score_samples

from conftest import TINY_TASK


class LengthScorer:
    """A stand-in RM: the score is the response length (without its EOT); counts its calls."""

    def __init__(self):
        self.calls = 0

    def score(self, prompts, responses):
        self.calls += 1
        assert len(prompts) == len(responses)
        return [float(len(r.removesuffix("#"))) for r in responses]


def _sample(item, text, finish="stop"):
    return Sample([1], [2], [0.0], [1], finish, 0, 0, 0, item=item, text=text)


def test_reward_model_task_scores_the_batch_once_and_logs_proxy_and_true():
    task = ArithmeticTask()
    it = task.items(1, "train", 0)[0]
    scorer = LengthScorer()
    samples = [_sample(it, it.target(True) + "#"), _sample(it, "7#"), _sample(it, "x", "error")]
    metrics = score_samples(RewardModelTask(task, scorer), samples)
    assert scorer.calls == 1  # one batched RM pass
    right = len(it.target(True))
    assert [s.reward for s in samples] == [right, 1.0, 0.0]  # the proxy is what the algorithm sees
    assert samples[0].reward_components == {"proxy": right, "true": 1.0}
    assert samples[1].reward_components == {"proxy": 1.0, "true": 0.0}
    assert samples[2].reward_error == "generation failed"
    assert metrics["reward/proxy"] == pytest.approx((right + 1.0) / 3)
    assert metrics["reward/true"] == pytest.approx(1.0 / 3)


def test_a_failing_batch_scorer_falls_back_to_per_sample_and_counts_errors():
    class Broken:
        def score(self, prompts, responses):
            raise RuntimeError("rm down")

    task = ArithmeticTask()
    it = task.items(1, "train", 0)[0]
    samples = [_sample(it, "1#"), _sample(it, "2#")]
    metrics = score_samples(RewardModelTask(task, Broken()), samples)
    assert metrics["reward/errors"] == 2.0 and all(s.reward == 0.0 for s in samples)
    assert samples[0].reward_error == "RuntimeError: rm down"


def test_scorer_accepts_responses_with_or_without_eot(nano, tok):
    scorer = RewardModelScorer(RewardModel(nano), tok)
    a, b = scorer.score(["1+2", "1+2"], ["{1+2=3}3", "{1+2=3}3#"])
    assert a == pytest.approx(b, abs=1e-6)


def test_an_ensemble_scores_the_mean_of_its_members(nano, tok, tmp_path):
    prompts, responses = ["1+2", "3+4", "5+6"], ["{1+2=3}3", "{3+4=8}8", "{5+6=11}11"]
    runs, members = [], []
    for seed in (0, 1):  # two heads on one trunk: different scores
        torch.manual_seed(seed)
        rm = RewardModel(nano)
        torch.nn.init.normal_(rm.head.weight, std=1.0)
        members.append(RewardModelScorer(rm, tok))
        runs.append(tmp_path / f"rm{seed}")
        save_head(rm, checkpoint.save(runs[-1], 1, rm.trunk, tok))
    a, b = (m.score(prompts, responses) for m in members)
    assert a != pytest.approx(b)
    want = [(x + y) / 2 for x, y in zip(a, b)]
    assert EnsembleScorer(members).score(prompts, responses) == pytest.approx(want, abs=1e-6)
    loaded = load_scorer(f"{runs[0]},{runs[1]}")  # the spelling of reward_model= and --rm
    assert isinstance(loaded, EnsembleScorer) and loaded.score(prompts, responses) == pytest.approx(want, abs=1e-5)
    assert isinstance(load_scorer(runs[0]), RewardModelScorer)


def test_turn_finds_the_peak_of_the_smoothed_true_reward():
    rows = [
        {"step": s, "kl": 0.01 * s, "proxy": 0.1 * s, "true": t}
        for s, t in zip(range(1, 9), [0.5, 0.6, 0.7, 0.8, 0.7, 0.5, 0.4, 0.3])
    ]
    t = turn(rows, window=3)
    # running means of 3: .5 .55 .6 .7 .733 .667 .533 .4 → peak at step 5 (mean of .7 .8 .7)
    assert (t["peak_step"], t["peak_kl"]) == (5, pytest.approx(0.05))
    assert t["peak_true_smoothed"] == pytest.approx(2.2 / 3)
    assert t["final_true_smoothed"] == pytest.approx(0.4)
    assert t["final_proxy"] == pytest.approx((0.6 + 0.7 + 0.8) / 3)
    assert turn([]) == {}


def test_curve_keeps_training_steps_with_all_three_keys(tmp_path):
    lines = [
        {"step": 0, "eval/pass@1": 0.5},
        {"step": 1, "kl/ref": 0.0, "reward/proxy": 1.0, "reward/true": 0.5},
        {"step": 2, "reward/proxy": 1.0, "reward/true": 0.5},  # no kl (no reference): left out
        {"step": 3, "kl/ref": 0.2, "reward/proxy": 2.0, "reward/true": 0.25, "length/mean": 10.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    rows = curve(lines)
    assert [r["step"] for r in rows] == [1, 3]
    summary = write_curve(tmp_path)
    assert (tmp_path / "overoptimization.csv").read_text().splitlines() == [
        "step,kl,proxy,true,seq_kl",
        "1,0.0,1.0,0.5,0.0",
        "3,0.2,2.0,0.25,2.0",
    ]  # seq_kl = 0.2/token × 10 tokens
    saved = json.loads((tmp_path / "overoptimization.json").read_text())
    assert saved["rows"] == rows and saved["turn"] == summary and summary["peak_step"] == 1


def test_best_of_n_picks_the_samples_the_rm_scores_highest(nano, tok):
    class AnswerScorer:  # prefers the response whose last integer is the sum
        def score(self, prompts, responses):
            return [float(verify(r, sum(map(int, p.split("+"))))) for p, r in zip(prompts, responses)]

    task = ArithmeticTask(ArithmeticConfig(max_terms=3))
    items = task.items(4, "test", 0)
    res = evaluate(nano, tok, task, items, n=4, ks=(1, 4), scorer=AnswerScorer(), greedy=False)
    # an oracle reranker is right exactly when some sample is: best@n = pass@n
    assert res["eval/best@4"] == pytest.approx(res["eval/pass@4"])
    assert "best@4" in res["per_k"][next(iter(res["per_k"]))]
    assert "eval/best@4" not in evaluate(nano, tok, task, items, n=4, ks=(1,), greedy=False)


def test_corrupted_traces_are_wrong_with_one_mistake():
    rng = random.Random(0)
    task = ArithmeticTask()
    seen = set()
    for it in task.items(200, "train", 0):
        bad = corrupt_trace(it.terms, rng)
        assert verify(bad, it.answer) == 0.0 and bad != it.target(True)
        steps = bad[1 : bad.index("}")].split(";")
        for s in steps:  # every step is "a+b=c" and chains from the previous c
            assert s.count("+") == 1 and s.count("=") == 1
        chained = all(steps[i].split("+")[0] == steps[i - 1].split("=")[1] for i in range(1, len(steps)))
        arith = [int(s.split("=")[1]) == sum(map(int, s.split("=")[0].split("+"))) for s in steps]
        trace = bad[: bad.index("}") + 1]
        if len(steps) < it.k - 1:
            seen.add("skip")  # a term left out
        elif trace == it.trace():
            seen.add("answer")  # the gold trace, a wrong final answer
        elif sum(not a for a in arith) == 1:
            seen.add("slip")  # exactly one wrong partial sum, the rest consistent
        else:
            assert all(arith)
            seen.add("term")  # right arithmetic on a wrong term
        assert chained
    assert seen == set(CORRUPTIONS)
    pairs = corrupted_pairs(task, task.items(10, "train", 1))
    assert len(pairs) == 10 and all(verify(p.chosen, p.item.answer) == 1.0 for p in pairs)


def test_rl_with_a_reward_model_logs_proxy_true_and_writes_the_curve(sft_ckpt, tmp_path, tok):
    trunk, _, _ = checkpoint.load_model(sft_ckpt)
    torch.manual_seed(0)
    rm = RewardModel(trunk)
    save_head(rm, checkpoint.save(tmp_path / "rm", 1, rm.trunk, tok))
    out = tmp_path / "rlhf"
    rl.run(
        load_config(
            RLConfig,
            None,
            [
                f"init={sft_ckpt}",
                f"reward_model={tmp_path / 'rm'}",
                f"out={out}",
                "prompts_per_step=2",
                "samples_per_prompt=4",
                "eval_problems=4",
                "eval_samples=2",
                "steps=2",
                "algo.kl_coef=0",
                *TINY_TASK,
            ],
        )
    )
    metrics = read_metrics(out)
    # no KL term, yet the KL from the start is measured: it is the curve's x-axis
    assert all({"reward/proxy", "reward/true", "kl/ref"} <= set(m) for m in metrics[1:])
    assert metrics[1]["reward/mean"] == pytest.approx(metrics[1]["reward/proxy"])
    assert 0.0 <= metrics[-1]["eval/pass@1"] <= 1.0  # evaluation keeps the verifier
    rows = json.loads((out / "overoptimization.json").read_text())["rows"]
    assert [r["step"] for r in rows] == [1, 2] and (out / "overoptimization.csv").exists()
    assert main(["rl", f"init={sft_ckpt}", f"reward_model={sft_ckpt}", f"out={tmp_path}/bad"]) == 2
    # the same RM reranks samples at test time: posttrain eval --rm
    res = tmp_path / "eval.json"
    assert (
        main(["eval", str(out), "--rm", str(tmp_path / "rm"), "--problems", "3", "--k", "1,2", "--out", str(res)]) == 0
    )
    assert 0.0 <= json.loads(res.read_text())["eval/best@2"] <= 1.0
