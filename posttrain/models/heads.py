"""Heads on the final hidden state: the value head (PPO's critic) and the actor–critic container.

A head reads `model.hidden(ids)` [B, T, d] (GPTMini's final normed hidden states). Values are
aligned with logprobs (docs/architecture.md §3): `values[:, t] = V(input_ids[:, :t])`, the value of the
state in which token t is chosen, read from the hidden state at position t − 1 (the same
position whose logits give logprobs[:, t]); column 0 holds 0. TRL's PPO reads the same shift.

The critic either shares the policy's trunk or is a separate copy of the starting model:

    critic="shared"    V = value_head(policy.hidden(ids))          one forward gives logits and V;
                                                                     the value loss also trains the trunk
    critic="separate"  V = value_head(critic_trunk.hidden(ids))    a deep copy of the starting policy,
                                                                     ~2× the memory; the losses stay apart

`ActorCritic` puts the policy and the critic in ONE module so that the Trainer, which
optimises `model.parameters()`, steps both with one optimizer, one backward (the loss sums the
policy and the value terms) and one gradient clip. Calling it gives the policy's logits, so
anything that treats it as a language model (`sequence_logprobs`) sees the policy. The
sampler, the reference and `model.safetensors` keep the bare policy: the critic is training
state, saved next to the optimizer (`critic_state_dict`, see recipes/rl.py), so a PPO
checkpoint stays a plain GPTMini that every stage and the Hugging Face export can load.
`ScalarHead` (the reward model's head) is a separate issue.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from posttrain.errors import UsageError

# Entries of [tokens × vocab] logits made at once when a model is scored from its hidden states
# (framework/logprobs.py) or a prefill reads its head (framework/decode_loop.py): 2**24 = 64 MiB in fp32,
# 110 tokens a chunk at Qwen's 151,936 vocabulary. sizing/run_memory.py predicts with the same number.
LOGIT_CHUNK_ELEMENTS = 2**24

CRITICS = ("shared", "separate")


class ValueHead(nn.Module):
    """V(s) = w·h + b per position: a Linear(d_model, 1) on the final hidden state [B, T, d] → [B, T].

    Zero-initialised (weight and bias): V ≡ 0 at the start, so the first advantages are those of
    no baseline (GAE of the rewards alone), and, with a shared trunk, the value loss sends no
    gradient into the trunk until the head has learnt something (∂V/∂h = w = 0), so a random
    head cannot disturb the SFT policy on step one. The head's own gradient, h·(V − G), is not 0.
    """

    def __init__(self, d_model: int):
        super().__init__()
        self.proj = nn.Linear(d_model, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden).squeeze(-1)  # [B, T, d] → [B, T]


def lm_parts(model):
    """(trunk, head) when `model(ids)` is exactly `head(trunk.hidden(ids))`, else None: then a
    reader of logits can make them from the hidden states a few rows at a time (framework/logprobs.py,
    the rollout's prefill). gpt_mini is; an ActorCritic answers for its policy; a Hugging Face model
    whose forward transforms the head's output (a logit cap or scale) says `head_exact = False`
    (models/hf.py); a model without `hidden` and `head` is read through its forward."""
    if _sharded(model):
        return None
    if isinstance(model, ActorCritic):
        model = model.policy
    head = getattr(model, "head", None)
    if not callable(getattr(model, "hidden", None)) or head is None or not getattr(model, "head_exact", True):
        return None
    return model, head


def _sharded(model) -> bool:
    """An FSDP2 module (`fully_shard`, distributed/fsdp.py): only its forward gathers the sharded
    parameters, so it is read through its forward (whole logits), never through `hidden`."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule  # only where torch has its distributed package

    return isinstance(model, FSDPModule)


def align_values(v: torch.Tensor) -> torch.Tensor:
    """Per-position values [B, T] (v[:, t] read at position t) → values[:, t] = v[:, t − 1],
    column 0 = 0: aligned with logprobs[:, t] = log π(ids[:, t] | ids[:, :t])."""
    return F.pad(v[:, :-1], (1, 0))  # [B, T]


class ActorCritic(nn.Module):
    """The policy plus its critic as one module for the Trainer (see the module docstring).

    policy: a model with `.hidden(ids)`, `.head` and `.config.d_model` (GPTMini). It is held by
    reference, not copied: the sampler and the reference keep seeing the same policy object.
    """

    def __init__(self, policy: nn.Module, critic: str = "shared"):
        super().__init__()
        if critic not in CRITICS:
            raise UsageError(f"critic={critic!r} is unknown; use {' or '.join(CRITICS)}")
        p = next(policy.parameters())
        self.policy = policy
        # separate: a copy of the STARTING policy (call this before any update), trained alongside
        self.critic_trunk = copy.deepcopy(policy) if critic == "separate" else None
        if self.critic_trunk is not None:
            self.critic_trunk.head = None  # the critic reads hidden states only: no unused LM head
        self.value_head = ValueHead(policy.config.d_model).to(device=p.device, dtype=p.dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The policy's logits [B, T, V]: the container is the policy to a logprob reader."""
        return self.policy(input_ids)

    def values(self, input_ids: torch.Tensor) -> torch.Tensor:
        """values [B, T] aligned with logprobs (column 0 = 0)."""
        trunk = self.policy if self.critic_trunk is None else self.critic_trunk
        return align_values(self.value_head(trunk.hidden(input_ids)))

    def hidden_and_values(self, input_ids: torch.Tensor, **packed):
        """(the policy's final hidden states [B, T, d], values [B, T]) in one trunk forward when the
        critic is shared. The logits are left to the reader: `self.policy.head` on the hidden states,
        a chunk of tokens at a time (framework/logprobs.py), never [B, T, V] whole. `packed`: the
        packed rows' `positions` and `attn_mask` (framework/packing.py), handed to both trunks."""
        h = self.policy.hidden(input_ids, **packed)  # [B, T, d]
        hc = h if self.critic_trunk is None else self.critic_trunk.hidden(input_ids, **packed)
        return h, align_values(self.value_head(hc))  # ← V(s_t) beside the state that gives log π(y_t | s_t)

    def critic_state_dict(self) -> dict:
        """Everything but the policy: the value head, and the critic trunk when separate."""
        return {k: v.detach().cpu() for k, v in self.state_dict().items() if not k.startswith("policy.")}

    def load_critic_state_dict(self, state: dict) -> None:
        missing, unexpected = self.load_state_dict(state, strict=False)
        bad = [k for k in missing if not k.startswith("policy.")] + list(unexpected)
        if bad:
            raise RuntimeError(
                f"critic state does not match this critic (keys {bad[:4]}); was it saved with another `critic` setting?"
            )
