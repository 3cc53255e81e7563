"""The roles' Protocols (framework/roles.py): each implementation satisfies its role's interface,
and a capability check tells apart the classes that have it from those that do not."""

import pytest
import torch

from posttrain import UsageError
from posttrain.algorithms import ppo
from posttrain.config import OptimConfig
from posttrain.distributed.async_rollout import AsyncRollout
from posttrain.framework.batch import RolloutBatch
from posttrain.framework.reference import Reference
from posttrain.framework.roles import (
    Closeable,
    CriticModel,
    PolicyTrainer,
    ReferenceScorer,
    RemoteSampler,
    RolloutEngine,
    RolloutSource,
    WeightSyncer,
    close_all,
)
from posttrain.framework.rollout import Engine
from posttrain.framework.trainer import Trainer, policy_loss_fn
from posttrain.framework.weight_sync import PushSync, WeightPublisher, WeightSync
from posttrain.models.heads import ActorCritic
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from posttrain.tasks.base import MultiTurnTask
from posttrain.tasks.tools import ToolArithmeticConfig, ToolArithmeticTask


def test_every_in_process_role_satisfies_its_protocol(nano, tok):
    engine = Engine(nano, tok)
    assert isinstance(engine, RolloutEngine) and not isinstance(engine, RemoteSampler)
    assert isinstance(Reference(nano), ReferenceScorer)
    assert isinstance(Trainer(nano, OptimConfig(), total_steps=1), PolicyTrainer)
    assert isinstance(WeightSync(nano, engine), WeightSyncer)
    publisher = WeightPublisher(nano)
    assert isinstance(PushSync(publisher, engine), WeightSyncer)
    producer = AsyncRollout(lambda step: ([], {}), engine, publisher, max_staleness=1)
    assert isinstance(producer, RolloutSource) and isinstance(producer, WeightSyncer)  # async: it is the sync too
    assert isinstance(producer, Closeable) and isinstance(engine, Closeable)  # close() is part of RolloutEngine
    producer.close()


def test_the_critic_is_a_capability_the_bare_policy_lacks(nano):
    assert isinstance(ActorCritic(nano), CriticModel) and not isinstance(nano, CriticModel)
    ac = ActorCritic(nano)
    h, values = ac.hidden_and_values(torch.tensor([[1, 5, 6]]))
    assert h.shape[:2] == values.shape == (1, 3)


def test_tasks_with_environments_run_as_episodes():
    assert isinstance(ToolArithmeticTask(ToolArithmeticConfig()), MultiTurnTask)
    assert not isinstance(ArithmeticTask(ArithmeticConfig()), MultiTurnTask)


def test_close_all_closes_what_holds_something_in_the_order_given():
    closed = []

    class Holder:
        def __init__(self, name):
            self.name = name

        def close(self):
            closed.append(self.name)

    close_all(Holder("producer"), object(), None, Holder("engine"), Holder("reference"))
    assert closed == ["producer", "engine", "reference"]


def test_a_critic_algorithm_refuses_the_bare_policy(nano):
    loss_fn = policy_loss_fn(ppo, ppo.Config(), 1.0)
    with pytest.raises(UsageError, match="learns a critic: train a models.heads.ActorCritic"):
        loss_fn(nano, RolloutBatch(input_ids=torch.tensor([[1, 5, 6]]), loss_mask=torch.ones(1, 3)), {})


def test_the_reference_is_frozen_and_outside_every_optimizer(nano):
    """A real trainer step moves the policy; the reference's parameters are in no optimizer,
    need no gradient, share no storage with the policy, and its scores do not move."""
    ref = Reference(nano)
    trainer = Trainer(nano, OptimConfig(lr=1e-2), total_steps=1)
    in_optimizer = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    ref_params = list(ref.model.parameters())
    assert ref_params and not any(p.requires_grad for p in ref_params) and not ref.model.training
    assert not {id(p) for p in ref_params} & in_optimizer
    assert not {p.data_ptr() for p in ref_params} & {p.data_ptr() for p in nano.parameters()}
    ids = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 9, 2, 0]])
    batch = RolloutBatch(input_ids=ids, loss_mask=(ids > 0).float(), attention_mask=(ids > 0).float())
    before_ref, before_pol = ref.score(batch), [p.detach().clone() for p in nano.parameters()]

    def nll(model, mb, norm):  # any loss: the trainer does not care which
        logits = model(mb.input_ids)[:, :-1]
        lp = torch.log_softmax(logits, -1).gather(-1, mb.input_ids[:, 1:, None]).squeeze(-1)
        return -(lp * mb.loss_mask[:, 1:]).sum() / norm["tokens"], {}

    trainer.step(batch, nll)
    assert any(not torch.equal(a, b) for a, b in zip(before_pol, nano.parameters()))  # the policy moved
    assert all(p.grad is None for p in ref_params)
    assert torch.equal(ref.score(batch), before_ref)  # the reference did not
