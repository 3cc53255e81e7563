"""PPO's critic on a nano GPTMini: the value head's alignment and zero init, a Trainer step with a
shared or separate critic, micro-batch accumulation with the critic, and a tiny `rl.run` that logs
the value metrics and resumes exactly. The math is in test_ppo.py."""

import copy
import dataclasses
import math

import pytest
import torch
from safetensors.torch import load_file
from test_ppo import cfg, t

from posttrain import UsageError, checkpoint
from posttrain.algorithms import ppo
from posttrain.config import OptimConfig, RLConfig, load_config
from posttrain.framework.batch import RolloutBatch, collate
from posttrain.framework.critic import critic_values
from posttrain.framework.logprobs import sequence_logprobs
from posttrain.framework.trainer import Trainer, policy_loss_fn
from posttrain.logging import read_metrics
from posttrain.models.heads import ActorCritic, ValueHead, align_values


def test_value_head_alignment_and_zero_init(nano):
    ids = torch.randint(6, 40, (2, 9))
    ac = ActorCritic(nano)
    assert torch.equal(ac(ids), nano(ids)) and ac.values(ids).abs().sum() == 0  # zero init: V ≡ 0
    torch.nn.init.normal_(ac.value_head.proj.weight)
    h, v = ac.hidden_and_values(ids)
    logits = nano.head(h)
    per_pos = h @ ac.value_head.proj.weight[0] + ac.value_head.proj.bias  # [B, T]
    assert torch.allclose(v[:, 1:], per_pos[:, :-1], atol=1e-5) and (v[:, 0] == 0).all()  # V(ids[:, :t]) at column t
    assert torch.equal(logits, nano(ids)) and torch.allclose(ac.values(ids), v)
    assert align_values(t([[1.0, 2.0, 3.0]])).tolist() == [[0.0, 1.0, 2.0]]
    assert ValueHead(8)(torch.ones(2, 3, 8)).shape == (2, 3)
    with pytest.raises(UsageError):
        ActorCritic(nano, "twin")


def _rl_batch(tok, model, ac, n=6, seed=0, c=None):
    """A rollout-shaped batch: on-policy old logprobs, V_old from the critic, PPO advantages."""
    g = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(6, 40, (int(torch.randint(3, 6, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]
    resp = [
        torch.randint(6, 40, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]
    b = RolloutBatch(**collate(prompts, resp, tok.pad_id))
    with torch.no_grad():
        old = sequence_logprobs(model, b.input_ids)[0] * b.loss_mask
    rewards = (torch.rand(n, generator=g) > 0.5).float()
    b = dataclasses.replace(b, old_logprobs=old, rewards=rewards, group_index=torch.arange(n) // 2)
    b = dataclasses.replace(b, values=critic_values(ac, b))
    c = c or cfg()
    adv = ppo.advantages(b.rewards, b.group_index, c, batch=b) * b.loss_mask
    return dataclasses.replace(b, advantages=adv, returns=ppo.value_targets(b.rewards, b, c))


def test_trainer_step_with_shared_critic_updates_policy_and_value_head(nano, tok):
    ac = ActorCritic(nano, "shared")
    batch = _rl_batch(tok, nano, ac)
    assert set(batch.tensors()) >= {"values", "returns"} and batch.values.abs().sum() == 0  # zero-init head
    before = {k: v.detach().clone() for k, v in ac.state_dict().items()}
    trainer = Trainer(ac, OptimConfig(lr=1e-3, micro_batch_tokens=30), 10)
    assert {id(p) for p in ac.value_head.parameters()} <= {
        id(p) for gr in trainer.optimizer.param_groups for p in gr["params"]
    }
    m = trainer.step(batch, policy_loss_fn(ppo, cfg(), 1.0))
    assert m["train/micro_batches"] > 1
    assert ac.value_head.proj.weight.grad.abs().sum() > 0 and ac.value_head.proj.bias.grad.abs().sum() > 0
    assert nano.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    after = ac.state_dict()
    assert not torch.equal(before["value_head.proj.weight"], after["value_head.proj.weight"])
    assert not torch.equal(before["policy.blocks.0.attn.qkv.weight"], after["policy.blocks.0.attn.qkv.weight"])
    assert m["ratio/mean"] == pytest.approx(1.0, abs=1e-5) and m["mismatch/logprob_abs"] < 1e-5  # on-policy
    assert m["value/mean"] == 0.0 and m["loss/value"] > 0
    for k in ("loss/value", "value/explained_variance", "value/clip_frac", "clip/frac"):
        assert k in m and math.isfinite(m[k])
    with pytest.raises(UsageError, match="ActorCritic"):  # the bare policy has no critic
        Trainer(nano, OptimConfig(), 10).step(batch, policy_loss_fn(ppo, cfg(), 1.0))


@pytest.mark.parametrize("critic", ["shared", "separate"])
def test_value_loss_reaches_the_policy_trunk_only_when_shared(nano, tok, critic):
    ac = ActorCritic(nano, critic)
    torch.manual_seed(1)
    torch.nn.init.normal_(ac.value_head.proj.weight, 0.0, 0.5)  # a head that already reads the trunk
    batch = _rl_batch(tok, nano, ac)
    batch = dataclasses.replace(
        batch, advantages=torch.zeros_like(batch.advantages)
    )  # no policy-gradient signal at all
    Trainer(ac, OptimConfig(lr=0.0, grad_clip=0.0), 10).step(batch, policy_loss_fn(ppo, cfg(), 1.0))
    policy_grad = sum(float(p.grad.abs().sum()) for p in nano.parameters() if p.grad is not None)
    if critic == "shared":
        assert policy_grad > 0
    else:
        assert policy_grad == 0.0
        assert ac.critic_trunk.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
        assert ac.critic_trunk is not nano
    assert ac.value_head.proj.weight.grad.abs().sum() > 0
    # the critic state round-trips without the policy
    state = ac.critic_state_dict()
    assert not any(k.startswith("policy.") for k in state)
    assert any(k.startswith("critic_trunk.") for k in state) == (critic == "separate")
    fresh = ActorCritic(nano, critic)
    fresh.load_critic_state_dict(state)
    assert torch.equal(fresh.value_head.proj.weight, ac.value_head.proj.weight)
    with pytest.raises(RuntimeError, match="critic"):
        ActorCritic(nano, "separate" if critic == "shared" else "shared").load_critic_state_dict(
            {**state, "critic_trunk.bogus": torch.zeros(1)}
        )


def test_accumulation_equals_one_big_batch_with_critic(nano, tok):
    ac0 = ActorCritic(nano, "separate")
    torch.nn.init.normal_(ac0.value_head.proj.weight, 0.0, 0.3)
    batch = _rl_batch(tok, nano, ac0)
    grads = []
    for budget in (10_000, 24):
        ac = copy.deepcopy(ac0)
        Trainer(ac, OptimConfig(lr=0.0, grad_clip=0.0, micro_batch_tokens=budget), 10).step(
            batch, policy_loss_fn(ppo, cfg(entropy_coef=0.01), 1.0)
        )
        assert all(p.grad is not None for p in ac.parameters())  # the critic trunk has no LM head
        grads.append(torch.cat([p.grad.flatten() for p in ac.parameters()]))
    assert torch.allclose(grads[1], grads[0], atol=1e-6, rtol=1e-4) and grads[0].abs().sum() > 0


# ============================================================================= end to end: rl.run with algorithm=ppo

from conftest import TINY_TASK


@pytest.mark.slow
def test_rl_run_ppo_logs_value_metrics_and_resumes_exactly(sft_ckpt, tmp_path):
    from posttrain.recipes import rl

    common = [
        f"init={sft_ckpt}",
        "algorithm=ppo",
        "prompts_per_step=2",
        "samples_per_prompt=2",
        "eval_problems=2",
        "eval_samples=2",
        "eval_every=0",
        "save_every=1",
        "epochs=2",
        "minibatches=2",
        "algo.critic=separate",
        "device=cpu",  # the same numbers after a resume: the CPU's fp32
        *TINY_TASK,
    ]
    rl.run(load_config(RLConfig, None, [f"out={tmp_path}/full", "steps=2", *common]))
    full = read_metrics(tmp_path / "full")[1:]  # [0] is the step-0 evaluation
    assert len(full) == 2
    for m in full:
        assert {"loss/value", "value/mean", "value/explained_variance", "value/clip_frac", "time/critic_s"} <= set(m)
        assert m["train/optimizer_steps"] == 4 and math.isfinite(m["loss/value"])
    # the policy checkpoint stays a plain GPTMini; the critic rides in trainer.pt
    ckpt = checkpoint.latest(tmp_path / "full")
    assert not any(k.startswith(("value_head", "critic")) for k in load_file(str(ckpt / "model.safetensors")))
    checkpoint.load_model(ckpt)
    extra = checkpoint.load_trainer_state(ckpt)["extra"]
    assert any(k.startswith("critic_trunk.") for k in extra["critic"])
    assert extra["critic"]["value_head.proj.weight"].abs().sum() > 0  # the zero-init head has learnt
    # a run stopped after step 1 and resumed reaches the same weights, critic and metrics
    rl.run(load_config(RLConfig, None, [f"out={tmp_path}/half", "steps=1", *common]))
    rl.run(load_config(RLConfig, None, [f"out={tmp_path}/half", "steps=2", *common]), resume=True)
    half_ckpt = checkpoint.latest(tmp_path / "half")
    wa, wb = load_file(str(ckpt / "model.safetensors")), load_file(str(half_ckpt / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    ca, cb = extra["critic"], checkpoint.load_trainer_state(half_ckpt)["extra"]["critic"]
    assert ca.keys() == cb.keys() and all(torch.equal(ca[k], cb[k]) for k in ca)
    strip = lambda ms: [
        {k: v for k, v in m.items() if not k.startswith(("time/", "rollout/", "train/tokens_per_s", "memory/"))}
        for m in ms
    ]  # noqa: E731
    assert strip(read_metrics(tmp_path / "half"))[-1] == strip(full)[-1]
