"""torch.compile of the trainer's and the reference's forward (`optim.compile`, issue 33 part 2).

    optim.compile = false | true | auto      false by default; auto: on with CUDA, off on the CPU

What is compiled: the trunk that makes the final hidden states, `trunk.hidden(ids, positions=,
attn_mask=)` of a model that `models/heads.lm_parts` splits into trunk and head (gpt_mini, a
Hugging Face model, LoRA adapters and gradient checkpointing inside it), when it is called from
logprob scoring (framework/logprobs.py) inside `compiling(True)`: the Trainer's step and the
Reference's scores. The head and the chunked logprobs stay eager: they are a few matmuls and a
log-softmax per chunk, already at the BLAS, and their chunks are checkpoints that backward remakes.
Everything else that calls `hidden` (the rollout's prefill and decode with a KV cache, evaluation,
PPO's value forward `hidden_and_values`, a model read through its forward) is not touched.

One compiled function for every trunk: the module is an argument, so its parameters are graph
inputs (dynamo's inlined nn.Modules) and another instance of the same class, with the same dtype and
requires_grad (a resumed trainer, a fresh Trainer on the same policy), reuses the graphs.
`dynamic=True`: the micro-batch's rows and width are symbols from the first call, so widths that
change every step do not recompile. What makes a graph of its own (each compiled once, then reused):
the trainer's forward (gradient) and the reference's (no gradient, frozen weights: the bf16 copy on
CUDA), packed or padded rows (positions and a mask, or neither), a micro-batch of ONE row (dynamo
specialises sizes 0 and 1). A run thus compiles at most 2 × 2 × 2 = 8 graphs of its trunk, dynamo's
`recompile_limit` (past it a call would run eager); `graphs()` counts them, and tests/test_compiled.py
counts 3 over 18 steps of 6 widths (trainer, reference, packed trainer).

Exactness: inductor may fuse and reorder reductions (RMSNorm's mean, the attention's softmax, in
fp32), so compiled losses and gradients equal eager ones to ≤1e-5 in fp32 (tests/test_compiled.py;
on the CPU they often agree to ~1e-9), not always to the bit: with compile on, the trainer's
logprobs may differ from the sampler's by that much more. A 4-step RL run on the CPU measured
`mismatch/logprob_abs` 0.8-1.3e-7 with compile off and 0.8-1.0e-7 with it on. Off (the default)
nothing changes.

Whether it pays is a question of the run's length: `python benchmarks/compile.py` measures, side by
side, the first step (the compile) and the steady step of both, and the break-even step.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import torch

from posttrain import UsageError

_ON: contextvars.ContextVar[bool] = contextvars.ContextVar("posttrain_compile", default=False)


def resolve(setting: bool | str, device) -> bool:
    """optim.compile → compile or not on this device (auto: on with CUDA only)."""
    if setting not in (True, False, "auto"):
        raise UsageError(f"optim.compile={setting!r} is unknown; use auto, true or false")
    return setting is True or (setting == "auto" and torch.device(device).type == "cuda")


@contextlib.contextmanager
def compiling(on: bool):
    """Inside: `trunk_hidden` runs the compiled trunk when `on` (a context variable, so a thread
    that does not enter it, such as an async producer's, keeps the eager one)."""
    token = _ON.set(on)
    try:
        yield
    finally:
        _ON.reset(token)


def trunk_hidden(trunk, input_ids: torch.Tensor, positions=None, attn_mask=None) -> torch.Tensor:
    """`trunk.hidden(input_ids, positions=, attn_mask=)` [B, T, d], compiled inside `compiling(True)`."""
    if not _ON.get():
        return _hidden(trunk, input_ids, positions, attn_mask)
    # fresh contiguous copies (a few kB of ids): a micro-batch's ids are a slice of the batch's, and
    # dynamo guards a view's strides and its base, so views and non-views would make graphs of their own
    # (a flex BlockMask, models/attention.py, is passed as it is: dynamo reads it as a pytree of tensors)
    tensors = (
        x.clone(memory_format=torch.contiguous_format) if isinstance(x, torch.Tensor) else x
        for x in (input_ids, positions, attn_mask)
    )
    return _compiled(BACKEND)(trunk, *tensors)


def _hidden(trunk, input_ids, positions, attn_mask):
    packed = {} if positions is None else {"positions": positions, "attn_mask": attn_mask}
    return trunk.hidden(input_ids, **packed)


BACKEND = "inductor"  # torch.compile's backend; the tests of the tracing alone take "aot_eager" (no codegen)


@functools.cache
def _compiled(backend: str):
    return torch.compile(_hidden, dynamic=True, backend=backend)


def graphs() -> int:
    """Graphs dynamo has compiled in this process so far (every compiled function's)."""
    from torch._dynamo.utils import counters  # the compiler stack loads only when asked

    return int(counters["stats"]["unique_graphs"])
