"""On-policy distillation (preference/distill.py, recipes/distill.py): the GKD JSD worked values
of docs/algorithms.md §21 and TRL's β = 0 / 1 convention, the reverse-KL advantage by hand, the
policy-gradient loss's gradient, and the stage (teacher = student gives zero divergence; a
few steps towards another teacher lower it)."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from posttrain.cli import main
from posttrain.config import load_config
from posttrain.framework.batch import RolloutBatch
from posttrain.logging import read_metrics
from posttrain.preference.distill import distill_loss_fn, generalized_jsd, kl, reverse_kl_advantages
from posttrain.recipes import distill
from posttrain.recipes.distill import DistillConfig

from conftest import TINY_TASK

t = torch.tensor


def _logits(p):
    return torch.log(t(p, dtype=torch.float64))


@pytest.mark.parametrize("beta,expected", [(0.0, 1.757780), (0.5, 0.368064), (1.0, 1.757780)])
def test_jsd_worked_values(beta, expected):
    s, te = _logits([0.1, 0.9]), _logits([0.9, 0.1])
    assert float(generalized_jsd(s, te, beta)) == pytest.approx(expected, abs=1e-6)


def test_jsd_ends_are_forward_and_reverse_kl_special_cased():
    s, te = _logits([0.2, 0.5, 0.3]), _logits([0.6, 0.3, 0.1])
    fwd = 0.6 * math.log(0.6 / 0.2) + 0.3 * math.log(0.3 / 0.5) + 0.1 * math.log(0.1 / 0.3)  # KL(T‖S)
    rev = 0.2 * math.log(0.2 / 0.6) + 0.5 * math.log(0.5 / 0.3) + 0.3 * math.log(0.3 / 0.1)  # KL(S‖T)
    assert float(generalized_jsd(s, te, 0.0)) == pytest.approx(fwd, abs=1e-9)
    assert float(generalized_jsd(s, te, 1.0)) == pytest.approx(rev, abs=1e-9)
    assert fwd != pytest.approx(rev, abs=1e-3)  # the two ends really differ here
    # the formula itself vanishes at both ends; its slopes there are the two KLs
    eps = 1e-5
    assert float(generalized_jsd(s, te, eps)) / eps == pytest.approx(fwd, rel=1e-3)
    assert float(generalized_jsd(s, te, 1 - eps)) / eps == pytest.approx(rev, rel=1e-3)
    assert float(generalized_jsd(s, te, 0.5)) <= math.log(2) + 1e-9  # the symmetric JSD is bounded by log 2
    assert float(generalized_jsd(s, s, 0.3)) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="beta=1.5 must be in"):
        generalized_jsd(s, te, 1.5)


def test_temperature_scales_both_logits():
    s, te = t([[1.0, 2.0, 0.5]]), t([[0.0, 1.0, 3.0]])
    assert torch.allclose(generalized_jsd(s, te, 0.5, temperature=2.0), generalized_jsd(s / 2, te / 2, 0.5))


def test_reverse_kl_advantage_by_hand():
    s_lp = t([[0.0, -1.0, -2.0, 0.0]])
    t_lp = t([[0.0, -1.5, -1.0, -9.0]])
    mask = t([[0.0, 1.0, 1.0, 0.0]])
    adv = reverse_kl_advantages(s_lp.requires_grad_(), t_lp, mask, coef=2.0)
    assert adv.tolist() == [[0.0, -1.0, 2.0, 0.0]]  # −2·(−1 − −1.5), −2·(−2 − −1)
    assert not adv.requires_grad


class Fixed(torch.nn.Module):
    """A 'model' whose logits are a parameter [1, T, V]: gradients by hand."""

    def __init__(self, logits):
        super().__init__()
        self.logits = torch.nn.Parameter(logits.clone())

    def forward(self, ids):
        return self.logits


def _mb(T=4, V=3):
    ids = t([[0, 1, 2, 1]])
    mask = t([[0.0, 0.0, 1.0, 1.0]])
    return RolloutBatch(input_ids=ids, loss_mask=mask, attention_mask=torch.ones(1, T))


def test_rkl_loss_gradient_is_the_policy_gradient_of_the_advantage():
    torch.manual_seed(0)
    s_logits, t_logits = torch.randn(1, 4, 3), torch.randn(1, 4, 3)
    mb = _mb()
    ids, mask = mb.input_ids, mb.loss_mask
    lp = F.pad(torch.log_softmax(s_logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0], (1, 0))
    tlp = F.pad(torch.log_softmax(t_logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0], (1, 0))
    mb = dataclasses.replace(mb, old_logprobs=lp * mask)  # on-policy: ratio 1
    student, teacher = Fixed(s_logits), Fixed(t_logits)
    loss, m = distill_loss_fn(teacher, "rkl")(student, mb, {"tokens": 2.0, "seqs": 1.0})
    loss.backward()
    # by hand: −Σ A_t ∇log π(y_t) / N with A_t = −(lp_t − tlp_t), N = 2 tokens
    ref = Fixed(s_logits)
    lp_ref = F.pad(torch.log_softmax(ref.logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0], (1, 0))
    adv = -(lp - tlp) * mask
    (-(adv * lp_ref * mask).sum() / 2).backward()
    assert torch.allclose(student.logits.grad, ref.logits.grad, atol=1e-6)
    assert float(loss.detach()) == pytest.approx(float(-(adv * mask).sum() / 2), abs=1e-6)
    assert m["distill/reverse_kl_k1"] == pytest.approx(float(((lp - tlp) * mask).sum() / 2), abs=1e-6)
    exact = kl(torch.log_softmax(s_logits[:, :-1], -1), torch.log_softmax(t_logits[:, :-1], -1))[0, 1:]
    assert m["distill/reverse_kl"] == pytest.approx(float(exact.mean()), abs=1e-6)


def test_jsd_loss_is_the_token_mean_of_the_divergence_and_zero_for_the_teacher_itself():
    torch.manual_seed(1)
    s_logits, t_logits = torch.randn(1, 4, 3), torch.randn(1, 4, 3)
    mb = dataclasses.replace(_mb(), old_logprobs=torch.zeros(1, 4))
    loss, m = distill_loss_fn(Fixed(t_logits), "jsd", beta=0.3)(Fixed(s_logits), mb, {"tokens": 2.0, "seqs": 1.0})
    expected = generalized_jsd(s_logits[0, 1:3], t_logits[0, 1:3], 0.3).mean()  # columns 2, 3 ← logits 1, 2
    assert float(loss.detach()) == pytest.approx(float(expected), abs=1e-6)
    same, _ = distill_loss_fn(Fixed(s_logits), "jsd", beta=0.3)(Fixed(s_logits), mb, {"tokens": 2.0, "seqs": 1.0})
    assert float(same) == pytest.approx(0.0, abs=1e-7)


def _args(student, teacher, out, *more):
    return [
        f"init={student}",
        f"teacher={teacher}",
        f"out={out}",
        "prompts_per_step=4",
        "samples_per_prompt=2",
        "eval_problems=4",
        "eval_samples=2",
        "threads=1",
        "log_every=1",
        *TINY_TASK,
        *more,
    ]


def test_teacher_equal_to_student_gives_zero_divergence(sft_ckpt, tmp_path):
    out = tmp_path / "self"
    distill.run(load_config(DistillConfig, None, _args(sft_ckpt, sft_ckpt, out, "steps=2", "device=cpu")))  # 1e-6: fp32
    m = read_metrics(out)
    assert [x["step"] for x in m] == [0, 1, 2] and "eval/pass@1" in m[0] and "eval/pass@1" in m[-1]
    # Step 1 (no update yet): zero to fp32 rounding, its gradient too. Where the teacher's and the student's
    # passes round alike, that gradient is exactly 0, Adam moves nothing and every step stays at 0 (MKL's
    # AVX-512 path). Where a product's last bit depends on the batch's shape (MKL's AVX2 path: grad norm
    # 1.1e-7), Adam turns it into an lr-sized move, and step 2's KL read 1.7e-6 (its loss, a surrogate, 1e-4)
    assert abs(m[1]["distill/reverse_kl"]) < 1e-6 and abs(m[1]["loss"]) < 1e-6 and m[1]["grad/norm"] < 1e-6
    if m[1]["grad/norm"] == 0.0:
        assert all(abs(x["distill/reverse_kl"]) < 1e-6 and abs(x["loss"]) < 1e-6 for x in m[1:])
    assert all(abs(x["distill/reverse_kl"]) < 1e-5 for x in m[1:])
    assert all(x["mismatch/logprob_abs"] < 1e-4 for x in m[1:])  # the student samples its own batch
    assert (out / "teacher_eval.json").exists()


@pytest.mark.parametrize("loss", ["rkl", "jsd"])
def test_a_few_steps_move_the_student_towards_the_teacher(sft_ckpt, tmp_path, loss):
    student = sft_ckpt.parent / "pt"  # the pretrained model of the chain
    out = tmp_path / loss
    distill.run(
        load_config(
            DistillConfig,
            None,
            _args(
                student,
                sft_ckpt,
                out,
                "steps=12",
                "optim.lr=3e-3",
                f"loss={loss}",
                "eval_every=0",
                "prompts_per_step=8",
            ),
        )
    )
    kls = [x["distill/reverse_kl"] for x in read_metrics(out)[1:]]
    assert sum(kls[-3:]) / 3 < 0.8 * sum(kls[:3]) / 3


def test_bad_inputs_are_one_line_usage_errors(sft_ckpt, tmp_path, capsys):
    assert main(["distill", f"init={sft_ckpt}", f"out={tmp_path}/a"]) == 2
    assert "distill needs teacher=RUN_OR_CHECKPOINT" in capsys.readouterr().err
    assert main(["distill", f"teacher={sft_ckpt}", "loss=kl", f"out={tmp_path}/b"]) == 2
    assert "loss='kl' is unknown; use rkl or jsd" in capsys.readouterr().err
    assert main(["distill", f"teacher={sft_ckpt}", "beta=2", f"out={tmp_path}/c"]) == 2
    assert "beta=2.0 must be in [0, 1]" in capsys.readouterr().err
