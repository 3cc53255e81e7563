"""The reward model (reward_models/reward_model.py) and its stage (recipes/rm.py): the BT worked
values of docs/algorithms.md §21, the margin and ORM terms by hand, the head reading the last real
token, micro-batches adding up to the full batch, save/load and resume, bad input, and a slow
learning test on the default SFT(CoT) chain."""

import json
import math
import shutil

import pytest
import torch
import torch.nn.functional as F

from posttrain import UsageError, checkpoint
from posttrain.algorithms.core import batch_norm
from posttrain.cli import main
from posttrain.config import load_config
from posttrain.framework.batch import collate, split_micro_batches
from posttrain.logging import read_metrics
from posttrain.preference.data import Pair, collate_pairs, encode_pairs
from posttrain.recipes import rm as rm_recipe
from posttrain.recipes.rm import RMConfig, rm_loss_fn
from posttrain.reward_models.reward_model import (
    HEAD_FILE,
    RewardModel,
    RewardModelScorer,
    bradley_terry_loss,
    last_token_index,
    load_reward_model,
    orm_loss,
    pairwise_accuracy,
    save_head,
)

from conftest import TINY_TASK

t = torch.tensor


# ---- pure functions -------------------------------------------------------------------------


@pytest.mark.parametrize("center_coef,expected", [(0.0, 0.371101), (0.01, 0.385501)])
def test_bradley_terry_worked_values(center_coef, expected):
    loss = bradley_terry_loss(t([1.0]), t([0.2]), center_coef=center_coef).mean()
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_margin_shifts_the_difference():
    r_w, r_l, m = t([1.0, 0.5, -2.0]), t([0.2, 0.9, -1.0]), t([0.5, 0.0, 2.0])
    loss = bradley_terry_loss(r_w, r_l, m)
    assert torch.allclose(loss, -F.logsigmoid(r_w - r_l - m))
    assert loss[0].item() == pytest.approx(math.log1p(math.exp(-0.3)), abs=1e-6)  # Δ − m = 0.8 − 0.5
    assert torch.allclose(bradley_terry_loss(r_w, r_l, torch.zeros(3)), bradley_terry_loss(r_w, r_l))


def test_orm_loss_and_accuracy_by_hand():
    loss = orm_loss(t([0.0, 2.0, -1.0]), t([1.0, 0.0, 0.0]))
    expected = [math.log(2), math.log1p(math.exp(2.0)), math.log1p(math.exp(-1.0))]  # 0.693147, 2.126928, 0.313262
    assert loss.tolist() == pytest.approx(expected, abs=1e-6)
    assert pairwise_accuracy(t([1.0, 0.0, 2.0, 3.0]), t([0.0, 1.0, 2.0, 1.0])) == 0.625  # the tie counts half


# ---- the model ------------------------------------------------------------------------------


@pytest.fixture
def reward_model(nano):
    torch.manual_seed(1)
    return RewardModel(nano).eval()


def test_last_token_index_right_and_left_padding():
    mask = t([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 1, 1, 0]])
    assert last_token_index(mask).tolist() == [2, 4, 3]


@torch.no_grad()
def test_score_reads_the_last_real_token(reward_model, tok):
    short = tok.encode("<1+2>{1+2=3}3#")
    long = tok.encode("<10+12+5>{10+12=22;22+5=27}27#")
    alone = reward_model(t([short]), torch.ones(1, len(short)))  # [1]
    b = collate([short], [[]], tok.pad_id)
    padded = {k: F.pad(v, (0, 7), value=tok.pad_id if k == "input_ids" else 0) for k, v in b.items()}
    with_pads = reward_model(padded["input_ids"], padded["attention_mask"])
    pair = collate([short, long], [[], []], tok.pad_id)
    batched = reward_model(pair["input_ids"], pair["attention_mask"])  # [2]
    assert torch.allclose(with_pads, alone, atol=1e-5)
    assert torch.allclose(batched[0], alone[0], atol=1e-5)
    h = reward_model.trunk.hidden(t([short]))[0, -1]  # the EOT position
    assert alone.item() == pytest.approx((reward_model.head.weight[0] @ h + reward_model.head.bias).item(), abs=1e-5)


def test_micro_batches_add_up_to_the_full_batch(reward_model, tok):
    """loss_fn divides by the WHOLE batch's pairs: per-pair micro-batch grads sum to the big-batch grad."""
    pairs = [
        Pair("1+2", "{1+2=3}3", "{1+2=4}4", margin=0.3),
        Pair("10+5+3", "{10+5=15;15+3=18}18", "{10+5=15}15"),
        Pair("7+7", "{7+7=14}14", "{7+7=15}15", margin=1.0),
    ]
    batch = collate_pairs(encode_pairs(tok, pairs), range(3), tok.pad_id)
    batch["margin"] = t([p.margin for p in pairs]).repeat_interleave(2)
    batch["label"] = t([1.0, 0.0]).repeat(3)
    norm = batch_norm(batch["loss_mask"])
    for objective in ("bt", "orm"):
        loss_fn = rm_loss_fn(objective, margin_coef=1.0, center_coef=0.01)
        grads = []
        for max_tokens in (10_000, 1):  # one micro-batch; one pair each
            reward_model.zero_grad()
            micro = split_micro_batches(batch, max_tokens, unit=2)
            for mb in micro:
                loss_fn(reward_model, mb, norm)[0].backward()
            grads.append(reward_model.head.weight.grad.clone())
        assert len(micro) == 3
        assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_save_load_round_trip_and_scorer(reward_model, tok, tmp_path):
    with torch.no_grad():
        reward_model.head.bias.fill_(0.25)
    ckpt = checkpoint.save(tmp_path / "run", 1, reward_model.trunk, tok)
    save_head(reward_model, ckpt)
    loaded, tok2, path = load_reward_model(tmp_path / "run")
    assert path == ckpt and not any(p.name.endswith(".tmp") for p in ckpt.iterdir())
    prompts, responses = ["1+2", "10+5+3"], ["{1+2=3}3", "{10+5=15;15+3=18}18"]
    scorer = RewardModelScorer(loaded, tok2, batch_size=1)
    encoded = collate(
        [tok.encode(tok.chat_prompt(p)) for p in prompts],
        [tok.encode(tok.chat_response(r)) for r in responses],
        tok.pad_id,
    )
    with torch.no_grad():
        expected = reward_model(encoded["input_ids"], encoded["attention_mask"]).tolist()
    assert scorer.score(prompts, responses) == pytest.approx(expected, abs=1e-6)
    assert not any(p.requires_grad for p in scorer.rm.parameters())  # frozen by construction
    with pytest.raises(UsageError, match="1 prompts but 2 responses"):
        scorer.score(prompts[:1], responses)


def test_loading_a_checkpoint_without_a_head(nano, tok, tmp_path):
    checkpoint.save(tmp_path / "sft", 1, nano, tok)
    with pytest.raises(UsageError, match=f"holds no reward head \\({HEAD_FILE}\\); point to a run of `posttrain rm`"):
        load_reward_model(tmp_path / "sft")


# ---- the stage ------------------------------------------------------------------------------


def _pairs_file(path, n=12, extra=()):
    rows = [
        {
            "prompt": f"{i}+{i + 1}",
            "chosen": f"{{{i}+{i + 1}={2 * i + 1}}}{2 * i + 1}",
            "rejected": f"{{{i}+{i + 1}={2 * i + 2}}}{2 * i + 2}",
            "margin": 0.5 * (i % 2),
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "".join(extra))
    return path


def _args(tmp_path, sft_ckpt, *more):
    train = _pairs_file(tmp_path / "train.jsonl")
    held = _pairs_file(tmp_path / "held.jsonl", n=6)
    return [
        "rm",
        f"init={sft_ckpt}",
        f"pairs={train}",
        f"eval_pairs={held}",
        "batch_size=4",
        "threads=1",
        "log_every=1",
        *TINY_TASK,
        *more,
    ]


def test_rm_stage_end_to_end(sft_ckpt, tmp_path, capsys):
    out = tmp_path / "rm"
    assert main(_args(tmp_path, sft_ckpt, f"out={out}", "steps=3")) == 0
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    assert 0.0 <= metrics[0]["eval/rm_accuracy"] <= 1.0 and "eval/rm_accuracy" in metrics[-1]
    assert {"rm/accuracy", "rm/margin", "rm/chosen", "rm/rejected", "loss"} <= set(metrics[1])
    final = checkpoint.latest(out)
    assert (final / HEAD_FILE).exists() and (final / "model.safetensors").exists()
    rm, tok, _ = load_reward_model(out)
    assert len(RewardModelScorer(rm, tok).score(["1+2"], ["{1+2=3}3"])) == 1
    assert "held-out pairwise accuracy:" in capsys.readouterr().out
    # a checkpoint saved mid-run has no head file: the head comes from trainer.pt's extra state
    (final / HEAD_FILE).unlink()
    again, _, _ = load_reward_model(out)
    assert torch.equal(again.head.weight, rm.head.weight)


def test_synthetic_pairs_join_the_training_pairs_and_are_counted(sft_ckpt, tmp_path, capsys):
    out = tmp_path / "syn"
    assert main(_args(tmp_path, sft_ckpt, f"out={out}", "steps=1", "synthetic_pairs=5")) == 0
    rows = [json.loads(x) for x in (out / "pairs.jsonl").read_text().splitlines()]
    assert len(rows) == 12 + 5
    assert json.loads((out / "pairs_stats.json").read_text())["pairs.jsonl"]["synthetic_pairs"] == 5
    assert main(_args(tmp_path, sft_ckpt, f"out={tmp_path}/neg", "synthetic_pairs=-1")) == 2
    assert "synthetic_pairs=-1 must be >= 0" in capsys.readouterr().err


def test_rm_resume_is_exact(sft_ckpt, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    exact = "device=cpu"  # the resumed weights to 1e-6: the CPU's fp32
    assert main(_args(tmp_path, sft_ckpt, f"out={full}", "steps=4", exact)) == 0
    assert main(_args(tmp_path, sft_ckpt, f"out={part}", "steps=4", "save_every=2", exact)) == 0
    for ckpt in checkpoint.step_dirs(part)[1:]:  # keep step 2 only, as after a crash
        shutil.rmtree(ckpt)
    assert main(["rm", "--resume", str(part)]) == 0
    a, b = load_reward_model(full)[0], load_reward_model(part)[0]
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_bad_inputs_are_one_line_usage_errors(sft_ckpt, tmp_path, capsys):
    bad = _pairs_file(tmp_path / "bad.jsonl", n=2, extra=['{"prompt": "1+1", "chosen": "2"}\n'])
    assert main(["rm", f"init={sft_ckpt}", f"pairs={bad}", f"out={tmp_path}/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"posttrain rm: error: {bad}:3: missing field 'rejected' (fix the row, or pass on_bad=skip")
    assert main(["rm", "objective=pairwise", f"out={tmp_path}/y"]) == 2
    assert "objective='pairwise' is unknown; use bt or orm" in capsys.readouterr().err
    # sampled pairs from a model that is never right: no pair, said so
    with pytest.raises(UsageError, match="no training pairs: every prompt's samples were all right or all wrong"):
        rm_recipe.run(
            load_config(
                RMConfig,
                None,
                [
                    f"init={sft_ckpt}",
                    f"out={tmp_path}/z",
                    "pair_prompts=4",
                    "samples_per_prompt=2",
                    "eval_prompts=0",
                    *TINY_TASK,
                ],
            )
        )
