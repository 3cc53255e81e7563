"""The roles' interfaces: what each role offers the controller, as `typing.Protocol`s.

The controller (framework/controller.py) and the placement (distributed/placement.py) speak
to these, never to a concrete class, so a role can be swapped for another that has the same
methods: an in-process `Engine` or Ray actors behind `RayRollout`, a frozen `Reference` or a
`RayReference` actor, a `WeightSync` or a `PushSync`. A capability a role may or may not have
(a sampler that loads weights itself, a model that also gives values) is a protocol of its
own, checked with `isinstance`, not a `hasattr` on a method name.

    role            protocol           implementations
    1 rollout       RolloutEngine      framework/rollout.Engine, framework/backends/vllm_engine.VllmEngine,
                                       distributed/ray_rollout.RayRollout; built by framework/backends.make_engine
                    RemoteSampler      RayRollout (loads a published version itself)
                    RolloutSource      distributed/async_rollout.AsyncRollout (samples made ahead)
    2 reference     ReferenceScorer    framework/reference.Reference, distributed/ray_rollout.RayReference
    3 algorithm     (a module)         algorithms/base.py: `advantages` and `loss` functions
    4 trainer       PolicyTrainer      framework/trainer.Trainer
                    CriticModel        models/heads.ActorCritic (PPO's policy with a value head)
    5 weight sync   WeightSyncer       framework/weight_sync/: WeightSync, LoraSync, PushSync, AsyncRollout
    6 controller    (the loop)         framework/controller.Controller
    environment     Task, MultiTurnTask, Env   tasks/base.py

Protocols here are structural: nothing inherits from them, and mypy checks that what is
handed to the controller has the methods the controller calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from posttrain.framework.batch import Batch
    from posttrain.framework.rollout import SamplingParams
    from posttrain.framework.sample import Sample

LossFn = Callable[[torch.nn.Module, Any, dict], tuple[torch.Tensor, dict]]
"""loss_fn(model, micro_batch, norm) -> (loss, metrics): the only thing the trainer knows of an
algorithm. The micro-batch is a RolloutBatch in RL, a dict of tensors in the other stages."""


@runtime_checkable
class RolloutEngine(Protocol):
    """Role 1: samples n responses per prompt with their behaviour logprobs (docs/architecture.md §4).

    Everything a caller may use is declared here; an engine's model stays inside its backend
    (framework/backends/: the built-in engine or vLLM), built by `make_engine` only."""

    policy_version: int  # the weights' version, stamped on every Sample; weight sync bumps it
    stats: dict  # rollout/* metrics of the last call (tokens/s, cache occupancy, …)
    max_len: int  # longest prompt + response the engine accepts
    tokenizer: Any  # what decodes `Sample.text`

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        sampling: SamplingParams,
        seed: int = 0,
        step: int = 0,
        items: list | None = None,
        group_offset: int = 0,
        keep: int | None = None,
    ) -> list[Sample]:
        """n samples of every prompt, group-major; sample j of prompt g keyed by (seed, step, group_offset + g, j)."""
        ...

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load new weights, named as in the policy module (posttrain's names), into the sampler;
        returns the bytes moved. The caller bumps `policy_version` (framework/weight_sync/)."""
        ...

    def close(self) -> None:
        """Release what the engine holds (vLLM's engine and memory; nothing for the built-in one)."""
        ...


@runtime_checkable
class CopyingSampler(Protocol):
    """A sampler that can switch to a private copy of the module it was built on (the built-in
    engine), so that a `separate` weight sync has somewhere to copy into."""

    def own_copy(self) -> None: ...


@runtime_checkable
class RemoteSampler(Protocol):
    """A sampler whose weights live in other processes: it loads a published version itself
    (every worker switches between two requests) and returns the sync metrics."""

    def load_weights(self, version: int, buckets: list[dict]) -> dict: ...


@runtime_checkable
class RolloutSource(Protocol):
    """Samples made ahead of the trainer (async mode): the controller takes step s's batch from it."""

    def get(self, step: int) -> tuple[list, dict]: ...


@runtime_checkable
class ReferenceScorer(Protocol):
    """Role 2: logprobs of the frozen starting policy for the KL term."""

    def score(self, batch: Batch) -> torch.Tensor:
        """ref_logprobs [B, T], zero where loss_mask is 0."""
        ...


@runtime_checkable
class PolicyTrainer(Protocol):
    """Role 4: optimizer steps on a batch with a loss function; knows no algorithm."""

    model: torch.nn.Module
    device: torch.device

    def train(
        self, batch: Batch, loss_fn: LossFn, epochs: int = 1, minibatches: int = 1, max_len: float | None = None
    ) -> dict: ...


@runtime_checkable
class CriticModel(Protocol):
    """A policy that also predicts values V(s_t) (PPO): one trunk forward gives both."""

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor: ...  # the policy's logits [B, T, V]

    def values(self, input_ids: torch.Tensor) -> torch.Tensor: ...

    def hidden_and_values(self, input_ids: torch.Tensor, **packed) -> tuple[torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class WeightSyncer(Protocol):
    """Role 5: one explicit call after each update; the sampler then samples the new weights."""

    def sync(self) -> dict:
        """time/sync_s, sync/bytes, sync/policy_version, …"""
        ...


@runtime_checkable
class Closeable(Protocol):
    """A role holding threads, processes or actors, released at the end of a run."""

    def close(self) -> None: ...


def close_all(*roles: Any) -> None:
    """Release every role that holds something, in the order given."""
    for role in roles:
        if isinstance(role, Closeable):
            role.close()
