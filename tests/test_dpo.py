"""The DPO family (preference/dpo.py) and preference data (preference/data.py): the worked
values of docs/algorithms.md §21, log 2 at initialisation, gradients, row validation."""

import json
import math

import pytest
import torch

from posttrain import UsageError
from posttrain.preference.data import Pair, encode_pairs, load_jsonl, pairs_from_policy
from posttrain.preference.dpo import (
    LOSSES,
    DPOLossConfig,
    SeqLogps,
    kto_desirable,
    kto_undesirable,
    log1mexp,
    preference_loss,
)


def _worked(len_chosen=5.0, len_rejected=4.0):
    """β = 0.1, log π: chosen −10, rejected −12; reference −11 for both (h = 2)."""
    t = lambda x: torch.tensor([x])
    return SeqLogps(t(-10.0), t(-12.0), t(-11.0), t(-11.0), t(len_chosen), t(len_rejected))


@pytest.mark.parametrize(
    "kind,kwargs,expected",
    [
        ("dpo", {}, 0.598139),
        ("cdpo", {"label_smoothing": 0.1}, 0.618139),
        ("robust", {"label_smoothing": 0.1}, 0.573139),
        ("hinge", {}, 0.8),
        ("ipo", {}, 20.7025),  # TRL's length-normalised IPO, τ = β
        ("simpo", {"beta": 2.5, "simpo_gamma": 1.375}, 0.281150),
    ],
)
def test_worked_values(kind, kwargs, expected):
    loss, _ = preference_loss(DPOLossConfig(loss_type=kind, **kwargs), _worked())
    assert loss.item() == pytest.approx(expected, abs=1e-5)


def test_orpo_odds_term_and_nll():
    # avg log π: chosen −10/5 = −2, rejected −12/4 = −3; log-odds difference 1.094344
    lo = (-2 - log1mexp(torch.tensor(-2.0))) - (-3 - log1mexp(torch.tensor(-3.0)))
    assert lo.item() == pytest.approx(1.094344, abs=1e-6)
    loss, _ = preference_loss(DPOLossConfig(loss_type="orpo", beta=0.1), _worked())
    assert loss.item() == pytest.approx(2.0 + 0.028875, abs=1e-5)  # NLL(chosen) + λ·0.288751


def test_kto_terms_and_paired_loss():
    assert kto_desirable(torch.tensor(1.0), 0.5, 0.1).item() == pytest.approx(0.487503, abs=1e-6)
    assert kto_undesirable(torch.tensor(-1.0), 0.5, 0.1).item() == pytest.approx(0.462570, abs=1e-6)
    # worked pair: ρ_w = 1, ρ_l = −1, so z0 = clamp(mean(1, −1), 0) = 0
    loss, _ = preference_loss(DPOLossConfig(loss_type="kto"), _worked())
    expected = ((1 - 1 / (1 + math.exp(-0.1))) + (1 - 1 / (1 + math.exp(-0.1)))) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_dpo_nll_adds_the_chosen_token_mean():
    loss, _ = preference_loss(DPOLossConfig(loss_type="dpo_nll", nll_alpha=1.0), _worked())
    assert loss.item() == pytest.approx(0.598139 + 2.0, abs=1e-5)


def test_log1mexp_both_branches():
    x = torch.tensor([-1e-6, -0.1, -0.69, -0.7, -5.0, -40.0], dtype=torch.double)
    assert torch.allclose(log1mexp(x), torch.log(1 - torch.exp(x)), rtol=1e-9)


@pytest.mark.parametrize("kind", [k for k in LOSSES if k not in ("simpo", "orpo")])
def test_reference_losses_at_init(kind):
    """Policy = reference: h = 0. DPO is log 2 there; the implicit rewards are 0 and tie."""
    lp = torch.tensor([-7.0, -3.0], requires_grad=True)
    s = SeqLogps(lp[:1], lp[1:], lp[:1].detach(), lp[1:].detach(), torch.tensor([4.0]), torch.tensor([2.0]))
    loss, m = preference_loss(DPOLossConfig(loss_type=kind), s)
    if kind in ("dpo", "cdpo"):
        assert loss.item() == pytest.approx(math.log(2), abs=1e-7)
    assert m["pref/margin"] == 0.0 and m["pref/accuracy"] == 0.0
    loss.sum().backward()
    assert lp.grad[0] < 0 < lp.grad[1]  # every loss raises chosen and lowers rejected


def test_dpo_gradient_by_hand():
    """∂L/∂logπ(w) = −β·σ(−βh) and the opposite for l."""
    lp = torch.tensor([-10.0, -12.0], requires_grad=True)
    s = SeqLogps(lp[:1], lp[1:], torch.tensor([-11.0]), torch.tensor([-11.0]), torch.ones(1), torch.ones(1))
    preference_loss(DPOLossConfig(), s)[0].sum().backward()
    g = 0.1 / (1 + math.exp(0.2))
    assert lp.grad.tolist() == pytest.approx([-g, g], abs=1e-7)


def test_unknown_loss_type():
    with pytest.raises(ValueError, match="loss_type='dpop'"):
        preference_loss(DPOLossConfig(loss_type="dpop"), _worked())


# ---- preference data ----------------------------------------------------------------------


def _write(tmp_path, rows):
    p = tmp_path / "pairs.jsonl"
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return p


def test_load_jsonl_standard_and_conversational(tmp_path):
    p = _write(
        tmp_path,
        [
            {"prompt": "1+2", "chosen": "3", "rejected": "4", "margin": 1.5},
            {
                "prompt": [{"role": "user", "content": "2+2"}],
                "chosen": [{"role": "assistant", "content": "4"}],
                "rejected": [{"role": "assistant", "content": "5"}],
            },
        ],
    )
    pairs, skipped = load_jsonl(p)
    assert skipped == 0
    assert (pairs[0].prompt, pairs[0].chosen, pairs[0].rejected, pairs[0].margin) == ("1+2", "3", "4", 1.5)
    # conversational rows keep their messages (every turn goes through the chat template)
    assert (pairs[1].prompt, pairs[1].chosen, pairs[1].rejected) == (
        [{"role": "user", "content": "2+2"}],
        [{"role": "assistant", "content": "4"}],
        [{"role": "assistant", "content": "5"}],
    )


@pytest.mark.parametrize(
    "row,message",
    [
        ({"prompt": "1+2", "chosen": "3"}, "missing field 'rejected'"),
        ({"prompt": "1+2", "chosen": " ", "rejected": "4"}, "empty 'chosen'"),
        ({"prompt": "1+2", "chosen": "3", "rejected": "3"}, "identical"),
        ("{not json", "not valid JSON"),
        ({"prompt": "1+2", "chosen": "3", "rejected": "4", "margin": "big"}, "margin must be a number"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, row, message):
    p = _write(tmp_path, [{"prompt": "1+1", "chosen": "2", "rejected": "3"}, row])
    with pytest.raises(UsageError, match=f"pairs.jsonl:2: .*{message}"):
        load_jsonl(p)
    pairs, skipped = load_jsonl(p, on_bad="skip")  # or skipped and counted
    assert (len(pairs), skipped) == (1, 1)


@pytest.mark.parametrize(
    "row,reason",
    [
        ({"prompt": "1+2", "chosen": "3"}, "missing field 'rejected'"),
        ({"prompt": "", "chosen": "3", "rejected": "4"}, "empty 'prompt'"),
        ({"prompt": "1+2", "chosen": "3", "rejected": "3"}, "chosen and rejected are identical"),
    ],
)
def test_bad_row_messages_are_exact_one_liners(tmp_path, row, reason):
    p = _write(tmp_path, [{"prompt": "1+1", "chosen": "2", "rejected": "3"}] * 2 + [row])
    with pytest.raises(UsageError) as e:
        load_jsonl(p)
    assert str(e.value) == f"{p}:3: {reason} (fix the row, or pass on_bad=skip to skip and count it)"
    assert load_jsonl(p, on_bad="skip")[1] == 1


def test_missing_file_and_untokenizable_pair(tmp_path, tok):
    with pytest.raises(UsageError, match="not found"):
        load_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(UsageError, match="preference pair 0 .*'€'"):
        encode_pairs(tok, [Pair("1+1", "€", "3")])


def test_pairs_from_policy_are_verified(nano, tok):
    from posttrain.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask()
    items = task.items(12, "train", 0)
    pairs, stats = pairs_from_policy(nano.eval(), tok, task, items, samples_per_prompt=4, max_new_tokens=8)
    # an untrained model is always wrong: every prompt is all-wrong, no pair, all counted
    assert pairs == [] and stats["all_wrong"] == 12 and stats["pairs"] == 0


class _ScriptedEngine:
    """Returns fixed responses per prompt (an Engine's generate contract), no model."""

    def __init__(self, tok, responses):
        self.tok, self.responses = tok, responses

    def generate(self, prompts, n, sampling, seed=0, items=None):
        from posttrain.framework.sample import Sample

        out = []
        for g, p in enumerate(prompts):
            for j, text in enumerate(self.responses[g]):
                ids = self.tok.encode(text + "#")
                out.append(
                    Sample(
                        p,
                        ids,
                        [0.0] * len(ids),
                        [1] * len(ids),
                        "stop",
                        0,
                        g,
                        j,
                        item=items[g],
                        text=self.tok.decode(ids),
                    )
                )
        return out


def test_pairs_from_policy_chosen_correct_rejected_wrong(tok):
    from posttrain.tasks.arithmetic import ArithmeticTask, Problem

    task = ArithmeticTask()
    items = [Problem((1, 2)), Problem((2, 2)), Problem((3, 3)), Problem((4, 4))]
    responses = [
        ["3", "4", "33"],  # mixed: chosen "3", rejected "4" or "33"
        ["4", "4", "4"],  # all correct
        ["7", "8", "9"],  # all wrong
        ["8", "17", ""],
    ]  # mixed, but no equal-length pair; "" is never rejected
    engine = _ScriptedEngine(tok, responses)
    pairs, stats = pairs_from_policy(None, tok, task, items, samples_per_prompt=3, engine=engine)
    assert [(p.prompt, p.chosen) for p in pairs] == [("1+2", "3"), ("4+4", "8")]
    assert pairs[0].rejected in ("4", "33") and pairs[1].rejected == "17"
    assert (stats["all_correct"], stats["all_wrong"], stats["pairs"], stats["empty_responses"]) == (1, 1, 2, 1)
    pairs, stats = pairs_from_policy(None, tok, task, items, samples_per_prompt=3, engine=engine, same_length=True)
    assert [(p.chosen, p.rejected) for p in pairs] == [("3", "4")] and stats["no_equal_length"] == 1


def test_several_pairs_per_prompt_never_reuse_a_response(tok):
    from posttrain.tasks.arithmetic import ArithmeticTask, Problem

    items = [Problem((1, 2)), Problem((2, 2))]
    responses = [
        ["3", "{1+2=3}3", "4", "5", "6"],  # 2 correct, 3 wrong: at most 2 disjoint pairs
        ["4", "7", "4", "4"],
    ]  # 3 correct, 1 wrong: 1 pair
    engine = _ScriptedEngine(tok, responses)
    pairs, stats = pairs_from_policy(
        None, tok, ArithmeticTask(), items, samples_per_prompt=5, engine=engine, pairs_per_prompt=4
    )
    first = [p for p in pairs if p.prompt == "1+2"]
    assert len(first) == 2 and stats["pairs"] == 3
    assert sorted(p.chosen for p in first) == ["3", "{1+2=3}3"]
    assert len({p.rejected for p in first}) == 2 and {p.rejected for p in first} <= {"4", "5", "6"}
    assert [(p.chosen, p.rejected) for p in pairs if p.prompt == "2+2"] == [("4", "7")]


def test_rejection_sample_keeps_verified_distinct_finished(tok):
    from posttrain.preference.rejection import rejection_sample
    from posttrain.tasks.arithmetic import ArithmeticTask, Problem

    items = [Problem((1, 2)), Problem((5, 5))]
    engine = _ScriptedEngine(tok, [["3", "3", "{1+2=3}3", "4"], ["9", "8", "11", "12"]])
    prompts, responses, stats = rejection_sample(None, tok, ArithmeticTask(), items, n=4, engine=engine)
    assert [tok.decode(r) for r in responses] == ["3#", "{1+2=3}3#"]  # the duplicate "3" dropped
    assert prompts == [tok.encode(tok.chat_prompt("1+2"))] * 2
    assert stats | {"accept_rate": 0} == {
        "samples": 8,
        "accepted": 3,
        "duplicates": 1,
        "truncated": 0,
        "prompts_without_any": 1,
        "kept": 2,
        "accept_rate": 0,
    }
    assert stats["accept_rate"] == pytest.approx(3 / 8)


def test_sft_data_rejection_bad_inputs(sft_ckpt, tmp_path):
    from posttrain.config import SFTConfig, load_config
    from posttrain.recipes import sft

    with pytest.raises(UsageError, match="give init="):
        sft.run(load_config(SFTConfig, None, ["data=rejection", f"out={tmp_path}/a"]))
    with pytest.raises(UsageError, match="data='best' is unknown"):
        sft.run(load_config(SFTConfig, None, ["data=best", f"out={tmp_path}/b"]))
    with pytest.raises(UsageError, match="no sample of the init model was verified correct"):
        sft.run(
            load_config(
                SFTConfig,
                None,
                [
                    "data=rejection",
                    f"init={sft_ckpt}",
                    "rejection_prompts=4",
                    "rejection_samples=2",
                    f"out={tmp_path}/c",
                    "task.max_terms=3",
                ],
            )
        )
