"""torch.compile of the trainer's and the reference's forward (`optim.compile`, issue 33 part 2).

    optim.compile = false | true | auto      false by default; auto: on with CUDA, off on the CPU
    optim.compile_scope = blocks | trunk     what is compiled when on; blocks by default (below)

What is compiled: the trunk that makes the final hidden states, `trunk.hidden(ids, positions=,
attn_mask=)` of a model that `models/heads.lm_parts` splits into trunk and head (gpt_mini, a
Hugging Face model, LoRA adapters and gradient checkpointing inside it), when it is called from
logprob scoring (framework/logprobs.py) inside `compiling(True)`: the Trainer's step and the
Reference's scores. `trunk` compiles that whole call as one function; `blocks` (regional
compilation: PyTorch's recipe, accelerate's `compile_regions`) compiles the trunk's repeated
decoder block (the children of its one-class nn.ModuleList: gpt_mini's `blocks`, a transformers
model's `layers`) and runs the embedding, the rotary tables, the mask and the final norm eager. The
head and the chunked logprobs stay eager either way: they are a few matmuls and a log-softmax per
chunk, already at the BLAS, and their chunks are checkpoints that backward remakes. Everything else
that calls `hidden` or the blocks (the rollout's prefill and decode with a KV cache, evaluation,
PPO's value forward `hidden_and_values`, a model read through its forward) runs eager.

Why blocks by default (`optim.compile=true` and `auto` compile blocks unless compile_scope=trunk): the
compile. Dynamo traces and inductor generates code per graph, and a trunk's graph holds every layer,
so its compile grows with depth (Qwen2.5-0.5B has 24 layers); the blocks' graph holds one layer that
every layer reuses, so theirs does not, while the step stays close to the whole trunk's (4-10% slower
here: no fusion across layers, and the embedding and the final norm run eager). Measured side by side on one CPU thread
(benchmarks/compile.py, cold inductor cache for each; 16 sequences; compile s, steady step vs eager,
break-even step): tiny-llama with 8 layers, trunk 164 s, 1.16×, step ~6,050; blocks 38 s, 1.12×,
step ~1,830. gpt_mini nano, 4 layers: trunk 69 s, 1.32×, ~1,000; blocks 35 s, 1.20×, ~730 (under a
load of ~3.5 on 2 cores: trunk 125 s, ~2,100; blocks 82 s, ~6,050, so at 4 layers the two are close,
and which breaks even first depends on the load). From 8 layers on, blocks break even 3× sooner, and
the gap grows with depth. JSON: benchmarks/results/compile_regions*.json; docs/architecture.md.

One compiled function per scope: the module is an argument, so its parameters are graph inputs
(dynamo's inlined nn.Modules) and another instance of the same class (another layer, a resumed
trainer, a fresh Trainer on the same policy) with the same dtype and requires_grad reuses the
graphs. `dynamic=True`: the micro-batch's rows and width are symbols from the first call, so widths
that change every step do not recompile. What makes a graph of its own (each compiled once, then
reused): the trainer's forward (gradient) and the reference's (no gradient, frozen weights: the
bf16 copy on CUDA), packed or padded rows (positions and a mask, or neither), a micro-batch of ONE
row (dynamo specialises sizes 0 and 1); with blocks also a block whose input needs no gradient
though its weights do (the first layer under LoRA's frozen embeddings). A run thus compiles at most
2 × 2 × 2 = 8 graphs of its trunk and, a block class with gradient and without kept apart (a function
each: dynamo counts its `recompile_limit`, 8, per function), at most 8 and 4 of each block class: under
the limit past which a call would run eager. `graphs()` counts them; tests/test_compiled.py counts 3 over 18
steps of 6 widths (trainer, reference, packed trainer), and as many for 4 layers as for 1.

The blocks' gradient checkpointing: transformers (5.x) checkpoints inside each layer's `forward`,
so the compiled block holds the checkpoint (dynamo traces it, as the trunk's does); gpt_mini
checkpoints around the block's call, so backward recomputes the block outside any `compiling`
context (on CUDA on autograd's own thread): a block input that went through the compiled block is
remembered (weakly, until it is freed) and its recompute runs the compiled block again, the same
graph, so the recomputed activations are the forward's own.

Exactness: inductor may fuse and reorder reductions (RMSNorm's mean, the attention's softmax, in
fp32), so compiled losses and gradients equal eager ones to ≤1e-5 in fp32 (tests/test_compiled.py;
on the CPU they often agree to ~1e-9), not always to the bit: with compile on, the trainer's
logprobs may differ from the sampler's by that much more. A 4-step RL run on the CPU measured
`mismatch/logprob_abs` 0.8-1.3e-7 with compile off and 0.8-1.0e-7 with it on. Off (the default)
nothing changes, and no module is touched: the blocks' dispatch (an instance `forward` that runs the
class's own unless compiling) is set on a trunk's blocks at its first compiled call.

Whether it pays is a question of the run's length: `python benchmarks/compile.py` measures, side by
side, the first step (the compile) and the steady step of eager, trunk and blocks, and the
break-even step.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import types

import torch
from torch.utils.weak import WeakIdKeyDictionary

from posttrain.errors import UsageError

SCOPES = ("blocks", "trunk")  # optim.compile_scope; the first is the default
_ON: contextvars.ContextVar[str] = contextvars.ContextVar("posttrain_compile", default="")  # "" = off
_IN_TRUNK: contextvars.ContextVar[bool] = contextvars.ContextVar("posttrain_compile_blocks", default=False)


def resolve(setting: bool | str, device, scope: str = SCOPES[0]) -> str:
    """optim.compile (and optim.compile_scope) → the scope to compile on this device, "" for none
    (auto: on with CUDA only)."""
    if setting not in (True, False, "auto"):
        raise UsageError(f"optim.compile={setting!r} is unknown; use auto, true or false")
    if scope not in SCOPES:
        raise UsageError(f"optim.compile_scope={scope!r} is unknown; use one of {list(SCOPES)}")
    on = setting is True or (setting == "auto" and torch.device(device).type == "cuda")
    return scope if on else ""


@contextlib.contextmanager
def compiling(scope: bool | str):
    """Inside: `trunk_hidden` compiles `scope` ("blocks" or "trunk"; True = the default, False or ""
    = none). A context variable, so a thread that does not enter it, such as an async producer's,
    keeps the eager trunk."""
    token = _ON.set(SCOPES[0] if scope is True else scope or "")
    try:
        yield
    finally:
        _ON.reset(token)


def active() -> bool:
    """Does `trunk_hidden` compile here (inside `compiling` with a scope)? optim.packing_attention=auto
    reads it: flex only inside a compiled trunk (models/attention.auto_kernel)."""
    return bool(_ON.get())


def trunk_hidden(trunk, input_ids: torch.Tensor, positions=None, attn_mask=None) -> torch.Tensor:
    """`trunk.hidden(input_ids, positions=, attn_mask=)` [B, T, d], compiled inside `compiling`."""
    scope = _ON.get()
    if scope == "blocks":
        for block in blocks_of(trunk):
            if "forward" not in vars(block):
                block.forward = _Block(block)  # once per module; a deepcopy carries its own
        token = _IN_TRUNK.set(True)
        try:
            return _hidden(trunk, input_ids, positions, attn_mask)
        finally:
            _IN_TRUNK.reset(token)
    if scope != "trunk":
        return _hidden(trunk, input_ids, positions, attn_mask)
    # fresh contiguous copies (a few kB of ids): a micro-batch's ids are a slice of the batch's, and
    # dynamo guards a view's strides and its base, so views and non-views would make graphs of their own
    # (a flex BlockMask or a Varlen, models/attention.py, is passed as it is: dynamo reads it as a pytree)
    tensors = (
        x.clone(memory_format=torch.contiguous_format) if isinstance(x, torch.Tensor) else x
        for x in (input_ids, positions, attn_mask)
    )
    return _compiled(_hidden, BACKEND)(trunk, *tensors)


def _hidden(trunk, input_ids, positions, attn_mask):
    packed = {} if positions is None else {"positions": positions, "attn_mask": attn_mask}
    return trunk.hidden(input_ids, **packed)


def blocks_of(trunk) -> torch.nn.ModuleList:
    """The trunk's repeated decoder blocks: its first nn.ModuleList whose children are all of one
    class (gpt_mini's `blocks`, a transformers model's `layers`)."""
    for m in trunk.modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) and len({type(b) for b in m}) == 1:
            return m
    raise UsageError(
        f"optim.compile_scope=blocks: {type(trunk).__name__} has no repeated blocks (an nn.ModuleList of "
        "one class) to compile; use optim.compile_scope=trunk"
    )


class _Block:
    """A block's instance `forward`: the class's own, compiled inside `trunk_hidden` (blocks scope)
    and in backward's recompute of a checkpointed call whose forward was compiled (module docstring)."""

    def __init__(self, block: torch.nn.Module):
        self.block = block

    def __call__(self, *args, **kwargs):
        if torch.compiler.is_compiling():  # traced by another compile (the trunk scope): the class's own
            return type(self.block).forward(self.block, *args, **kwargs)
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if not (_IN_TRUNK.get() or (first is not None and first in _RECOMPUTE)):
            return type(self.block).forward(self.block, *args, **kwargs)
        grad = torch.is_grad_enabled()
        if grad and first is not None:
            _RECOMPUTE[first] = True  # a checkpoint's recompute, in backward, runs it compiled too
        return _region(type(self.block), grad, BACKEND)(self.block, *args, **kwargs)


_RECOMPUTE = WeakIdKeyDictionary()  # block inputs that went through the compiled block


def _forward(block, *args, **kwargs):
    return type(block).forward(block, *args, **kwargs)


@functools.cache
def _region(cls: type, grad: bool, backend: str):
    """The compiled block of `cls`, with gradient or without: a function of its own (a copy of
    `_forward`'s code), since dynamo keeps a code object's graphs up to its recompile_limit (8): the
    trainer's graphs and the reference's, and another block class's, are counted apart."""
    name = f"{cls.__name__}_{'grad' if grad else 'no_grad'}"
    code = _forward.__code__.replace(co_name=name)
    return _compiled(types.FunctionType(code, _forward.__globals__, name), backend)


BACKEND = "inductor"  # torch.compile's backend; the tests of the tracing alone take "aot_eager" (no codegen)


@functools.cache
def _compiled(fn, backend: str):
    return torch.compile(fn, dynamic=True, backend=backend)


def graphs() -> int:
    """Graphs dynamo has compiled in this process so far (every compiled function's)."""
    from torch._dynamo.utils import counters  # the compiler stack loads only when asked

    return int(counters["stats"]["unique_graphs"])
