"""The process reward model and test-time search (reward_models/prm.py, preference/search.py, bench/search.py):
step boundaries, the BCE on soft labels by hand, Monte-Carlo labels from scripted completions,
the score table by hand, beam search 1×1 at temperature 0 = greedy decoding, and the
`posttrain bench search` smoke run."""

import json
import math

import pytest
import torch

from posttrain.cli import main
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.framework.sample import Sample
from posttrain.preference.search import beam_search, sample_table
from posttrain.reward_models.prm import PRM, aggregate, boundaries, collate_rows, mc_labels, prm_loss, step_scores
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask, Problem

t = torch.tensor


def test_boundaries_are_semicolons_brace_and_end_of_turn(tok):
    ids = tok.encode("{3+4=7;7+5=12}12#")
    assert boundaries(tok, ids) == [6, 13, 16]
    assert boundaries(tok, tok.encode("12")) == []


def test_prm_loss_by_hand():
    logits = t([[0.0, 9.0, math.log(3.0)]])
    labels = t([[0.5, 0.0, 1.0]])
    mask = t([[1.0, 0.0, 1.0]])
    # BCE(σ(0) = ½, ½) = log 2 ; BCE(σ(log 3) = ¾, 1) = −log ¾ ; over the batch's 2 boundaries
    assert float(prm_loss(logits, labels, mask, 2.0)) == pytest.approx((math.log(2) - math.log(0.75)) / 2, abs=1e-6)
    assert float(prm_loss(logits, labels, mask, 4.0)) == pytest.approx((math.log(2) - math.log(0.75)) / 4, abs=1e-6)


def test_aggregations():
    assert (aggregate([0.9, 0.2, 0.7], "min"), aggregate([0.9, 0.2, 0.7], "last")) == (0.2, 0.7)
    assert aggregate([0.9, 0.2, 0.7], "mean") == pytest.approx(0.6)
    with pytest.raises(Exception, match="aggregation 'max' is unknown"):
        aggregate([1.0], "max")


class ScriptedEngine:
    """Policy samples and prefix completions from a script, keyed by the text they continue."""

    def __init__(self, tok, responses, completions):
        self.tok, self.responses, self.completions = tok, responses, completions
        self.calls = []

    def generate(self, prompts, n, sampling, seed=0, step=0, items=None):
        self.calls.append((len(prompts), n))
        out = []
        for g, p in enumerate(prompts):
            text = self.tok.decode(p)
            script = self.responses if text.endswith(">") else self.completions[text.split(">", 1)[1]]
            for j in range(n):
                ids = self.tok.encode(script[j])
                out.append(
                    Sample(
                        list(p),
                        ids,
                        [0.0] * len(ids),
                        [1] * len(ids),
                        "stop" if ids[-1] == self.tok.eot_id else "length",
                        0,
                        g,
                        j,
                        item=None if items is None else items[g],
                        text=script[j],
                    )
                )
        return out


def test_mc_labels_are_success_rates_of_the_prefix_completions(tok):
    task = ArithmeticTask()
    item = Problem((3, 4, 5))
    engine = ScriptedEngine(
        tok,
        responses=["{3+4=7;7+5=12}12#", "{3+4=8;8+5=13}13#"],
        completions={
            "{3+4=7;": ["7+5=12}12#", "7+5=13}13#", "7+5=12}12#", "7+5=12}12#"],  # 3/4 right
            "{3+4=7;7+5=12}": ["12#", "12#", "12#", "11#"],  # 3/4
            "{3+4=8;": ["8+5=13}13#"] * 4,  # 0/4
            "{3+4=8;8+5=13}": ["13#", "12#", "13#", "13#"],
        },
    )  # 1/4
    rows, stats = mc_labels(None, tok, task, [item], responses=2, completions=4, engine=engine)
    assert [r["labels"] for r in rows] == [[0.75, 0.75, 1.0], [0.0, 0.25, 0.0]]  # last = the response's reward
    assert [r["positions"] for r in rows] == [[6, 13, 16], [6, 13, 16]]
    assert stats["boundaries"] == 6 and stats["completions"] == 16
    assert engine.calls == [(1, 2), (4, 4)]  # one batched call for all prefixes
    batch = collate_rows(rows, tok.pad_id)
    P = len(rows[0]["prompt_ids"])
    assert batch["step_mask"][0].nonzero().flatten().tolist() == [P + 6, P + 13, P + 16]
    assert batch["step_labels"][1, P + 13] == 0.25


def test_sample_table_by_hand():
    task = ArithmeticTask()
    items = [Problem((1, 2)), Problem((2, 2))]
    texts = [
        "3#",
        "4#",
        "4#",
        "9#",  # item 0 (gold 3): 1 right of 4; majority 4 → wrong
        "4#",
        "4#",
        "5#",
        "4#",
    ]  # item 1 (gold 4): 3 right; majority 4 → right
    samples = [Sample([], [], [], [], "stop", 0, i // 4, i % 4, text=x) for i, x in enumerate(texts)]
    orm = [0.9, 0.1, 0.2, 0.3, 0.0, 0.1, 0.8, 0.2]  # picks "3#" then "5#"
    prm = [0.1, 0.9, 0.2, 0.3, 0.0, 0.9, 0.8, 0.2]  # picks "4#" then "4#"
    res = sample_table(task, items, samples, 4, orm, prm, last=[0.0, 0.0, 0.0, 0.9, 0.9, 0.0, 0.0, 0.0])
    assert res == {
        "pass@1": pytest.approx((0.25 + 0.75) / 2),
        "maj@4": 0.5,
        "orm best@4": 0.5,
        "prm best@4": 0.5,
        "last best@4": 0.5,
    }


def test_step_scores_read_the_head_at_each_boundary(nano, tok):
    torch.manual_seed(0)
    prm = PRM(nano)
    torch.nn.init.normal_(prm.head.proj.weight, 0, 1.0)
    p, r = tok.encode(tok.chat_prompt("3+4+5")), tok.encode("{3+4=7;7+5=12}12#")
    scores = step_scores(prm, tok, [p, p], [r, r[:7]])
    with torch.no_grad():
        full = torch.sigmoid(prm(t([p + r])))[0]
    assert scores[0] == pytest.approx([float(full[len(p) + j]) for j in (6, 13, 16)], abs=1e-5)
    assert scores[1] == pytest.approx(scores[0][:1], abs=1e-5)  # a prefix scores like the full row


def test_beam_one_by_one_at_temperature_zero_is_greedy_decoding(nano, tok):
    task = ArithmeticTask(ArithmeticConfig(max_terms=3))
    items = task.items(3, "test", 0)
    texts, tokens = beam_search(nano, PRM(nano), tok, task, items, beam=1, expand=1, temperature=0.0, max_len=16)
    prompts = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    greedy = Engine(nano, tok).generate(prompts, 1, SamplingParams(temperature=0.0, max_new_tokens=16))
    assert texts == [s.text for s in greedy]
    assert tokens >= sum(len(s.response_ids) for s in greedy)  # a step may overshoot the cap: counted


def test_bench_search_writes_the_table(sft_ckpt, tmp_path, capsys):
    out = tmp_path / "search.json"
    assert (
        main(
            [
                "bench",
                "search",
                "--init",
                str(sft_ckpt),
                "--problems",
                "3",
                "--label-problems",
                "3",
                "--responses",
                "1",
                "--completions",
                "2",
                "--prm-steps",
                "2",
                "--n",
                "4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    assert set(res["accuracy"]) == {"pass@1", "maj@4", "prm best@4", "prm-last best@4", "prm beam 2x2"}
    assert all(0.0 <= v <= 1.0 for v in res["accuracy"].values())
    assert res["tokens_per_problem"]["beam"] > 0 and "prm beam 2x2" in capsys.readouterr().out
