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
    assert isinstance(producer, Closeable) and not isinstance(engine, Closeable)
    producer.close()


def test_the_critic_is_a_capability_the_bare_policy_lacks(nano):
    assert isinstance(ActorCritic(nano), CriticModel) and not isinstance(nano, CriticModel)
    ac = ActorCritic(nano)
    logits, values = ac.logits_and_values(torch.tensor([[1, 5, 6]]))
    assert logits.shape[:2] == values.shape == (1, 3)


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
