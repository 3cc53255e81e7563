"""Role 2, the reference: a frozen copy of the starting policy that scores tokens for the KL term.

Frozen by construction: a deep copy with `requires_grad_(False)`, in eval mode, never handed
to an optimizer. It is built only when an algorithm needs it (a KL coefficient > 0, or a
metric such as `kl/ref` that was asked for); otherwise the controller passes None.

`score_logprobs` is how a model that is not being trained scores a batch: no gradient,
micro-batched by computed tokens as the trainer splits its batches (packed with `packed`:
framework/packing.py), zero off the loss mask. The
reference scores with it; so do the off-policy correction (framework/off_policy.py, with the
trainer's current weights) and DPO (its reference's sequence sums).
"""

from __future__ import annotations

import contextlib
import copy

import torch

from posttrain.framework.batch import Batch, budgets, split_micro_batches, view
from posttrain.framework.compiled import compiling
from posttrain.framework.logprobs import micro_logprobs


@torch.no_grad()
def score_logprobs(
    model,
    batch: Batch,
    temperature: float = 1.0,
    micro_batch_tokens: int = 16384,
    packed: bool = False,
    pack_width: int = 0,
) -> torch.Tensor:
    """logprobs [B, T] of a batch under `model` (no gradient), zero where loss_mask is 0 (the
    convention of old_logprobs), micro-batched by computed tokens (sequences end to end in rows
    when `packed`): the reference's scores and the proximal logprobs of the off-policy correction."""
    out = torch.zeros_like(view(batch)["loss_mask"])
    for mb in split_micro_batches(batch, micro_batch_tokens, 1, packed, pack_width):
        m = view(mb)
        lp, _ = micro_logprobs(model, mb, temperature)  # [b, w] fp32, logits in token chunks
        out[m["row_index"], : lp.shape[1]] = lp * m["loss_mask"]
    return out


class Reference:
    """The frozen copy. With a runtime whose compute dtype is not the weights' (bf16 autocast, the
    default on CUDA), the copy is held in the compute dtype: half the bytes of fp32 master weights,
    and it scores under the same autocast as the trainer and the sampler, so every matmul sees the
    bf16 weights it would have seen anyway (the norms' weights are rounded too: bf16 noise). On the
    CPU's fp32 runtime, or without a runtime, the copy stays in fp32 and scores as before.
    `packing`, `packing_width`: score packed micro-batches (optim.packing, as the trainer); `compile`:
    through the compiled trunk or blocks (optim.compile resolved to its scope: framework/compiled.py)."""

    def __init__(
        self,
        policy: torch.nn.Module,
        temperature: float = 1.0,
        runtime=None,
        packing=False,
        packing_width=0,
        compile=False,
    ):
        self.model = copy.deepcopy(policy).eval().requires_grad_(False)
        self.temperature, self.runtime = temperature, runtime
        self.packing, self.packing_width, self.compile = packing, packing_width, compile
        if runtime is not None and runtime.autocast_on:
            self.model.to(runtime.compute_dtype)

    def score(self, batch: Batch, micro_batch_tokens: int | None = None) -> torch.Tensor:
        """ref_logprobs [B, T], zero where loss_mask is 0 (the same convention as old_logprobs), in
        micro-batches of `micro_batch_tokens` computed tokens (None: the run's reference budget,
        runtime.MicroBatches.reference: 16,384 unless optim.micro_batch_tokens=auto resolved more)."""
        if micro_batch_tokens is None:
            micro_batch_tokens = budgets("auto", self.runtime).reference
        autocast = self.runtime.autocast() if self.runtime is not None else contextlib.nullcontext()
        with autocast, compiling(self.compile):
            return score_logprobs(
                self.model, batch, self.temperature, micro_batch_tokens, self.packing, self.packing_width
            )
