"""Shared helpers of the algorithm-zoo tests (test_algorithms_zoo.py, test_algorithms_losses.py)."""

import dataclasses

import torch

from posttrain.algorithms import (
    cispo,
    core,
    dapo,
    dppo,
    dr_grpo,
    grpo,
    gspo,
    maxrl,
    mgpo,
    reinforce,
    reinforce_pp,
    rloo,
)
from posttrain.framework.batch import RolloutBatch

F64 = torch.float64
ZOO = {
    "reinforce": reinforce,
    "rloo": rloo,
    "reinforce_pp": reinforce_pp,
    "dr_grpo": dr_grpo,
    "dapo": dapo,
    "gspo": gspo,
    "cispo": cispo,
    "maxrl": maxrl,
    "mgpo": mgpo,
    "dppo": dppo,
}
# estimators whose baseline is the prompt's own group: a group of equal rewards gets exactly 0
GROUP_BASELINED = {
    "reinforce": {"baseline": "mean"},
    "rloo": {},
    "dr_grpo": {},
    "dapo": {},
    "gspo": {},
    "cispo": {},
    "maxrl": {},
    "mgpo": {},
    "dppo": {},
    "grpo": {},
}
ALL = {**ZOO, "grpo": grpo}


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def cfg_of(mod, **kw):
    fields = {f.name for f in dataclasses.fields(mod.Config)}
    return mod.Config(**{k: v for k, v in kw.items() if k in fields})


def adv(mod, rewards, groups=None, batch=None, **kw):
    r = t(rewards)
    gi = torch.zeros(len(rewards), dtype=torch.long) if groups is None else torch.tensor(groups)
    if batch is None:
        mask = torch.ones(len(rewards), 3, dtype=F64)
        batch = RolloutBatch(loss_mask=mask, old_logprobs=-mask, ref_logprobs=-mask)
    return mod.advantages(r, gi, mod.Config(**kw), batch=batch)


def _batch(old, A, mask, ref=None, **extra):
    return RolloutBatch(loss_mask=mask, old_logprobs=old, advantages=A, ref_logprobs=ref, **extra)


def _random_batch(seed, B=6, T=7):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, T, generator=g) < 0.7).to(F64)
    mask[:, 0] = 0.0  # prompt position
    mask[2] = 0.0  # a fully masked row
    old = -torch.rand(B, T, dtype=F64, generator=g) * 3 * mask - 0.05 * mask
    lp = (old + 0.3 * torch.randn(B, T, dtype=F64, generator=g)).clamp_max(-1e-3) * mask
    ref = (old + 0.2 * torch.randn(B, T, dtype=F64, generator=g)) * mask
    A = core.broadcast(torch.randn(B, dtype=F64, generator=g), mask)
    ent = torch.rand(B, T, dtype=F64, generator=g) * 2 * mask
    return lp, old, ref, A, ent, mask


def _grad(mod, cfg, lp, batch, norm, entropy=None):
    lp = lp.clone().requires_grad_(True)
    loss, m = mod.loss(lp, batch, cfg, norm, entropy)
    (g,) = torch.autograd.grad(loss, lp)
    return loss.detach(), m, g


# ============================================================================= registry and configs


def assert_masked_positions_inert(run, lp, old, ref, A, ent, mask):
    """`run(lp, old, ref, A, ent) -> (loss, metrics, grad)`: junk (huge, NaN) at masked positions
    changes neither the loss, nor a metric, nor a gradient, and masked positions get no gradient."""
    base = run(lp, old, ref, A, ent)
    off = mask == 0
    junk = lambda x, v: torch.where(off, torch.full_like(x, v), x)  # noqa: E731
    other = run(junk(lp, 30.0), junk(old, -40.0), junk(ref, 25.0), junk(A, 1e6), junk(ent, float("nan")))
    assert other[0].item() == base[0].item()
    assert other[1] == base[1]
    assert torch.equal(other[2], base[2]) and (base[2][off] == 0).all()
