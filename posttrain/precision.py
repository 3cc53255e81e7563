"""A sampler in bf16 or fp16 against an fp32 trainer, emulated on any device (the precision lab).

Inference engines run their matmuls in bf16 (or fp16) while the trainer recomputes the same
tokens' logprobs in fp32: the per-token log-ratio log π_trainer − log μ_sampler is then not 0,
the PPO ratio leaves 1 before any update, and the clip, truncated IS (TIS) and masking act on
precision noise (docs/algorithms.md §6). A CPU without bf16 units runs torch's bf16 autocast ~170×
slower than fp32 (runtime.py), so the lab emulates the format instead:

    with LowPrecision("bf16"):          # every F.linear / bmm / baddbmm / attention / embedding
        logits = model(ids)             # inside rounds its inputs, weights and outputs to bf16

What is rounded (round-to-nearest-even, `x.to(bf16).to(fp32)`, exactly the format's rounding):
the inputs and weights of every matmul (linear layers, attention's q·Kᵀ and P·V, the fused
attention's q, k, v), and the outputs of linear layers and embeddings (activations leave each
GEMM in the format, as a bf16 GEMM writes them). Accumulation stays fp32 (tensor cores
accumulate in fp32), and so do norms, softmax, residual adds and the final log-softmax: a
mixed-precision engine's usual split. Deviation: inside fused attention (prefill) the softmax
probabilities stay fp32; the one-token decode path rounds them before P·V, as flash kernels do.

`batch_invariant=True` accumulates every matmul in float64 instead: the products of rounded
inputs are exact there and the sums are ~1e-16 off, so a token's logits no longer depend on
how many rows shared its matmul (the kernel-level fix of "batch-invariant inference"; here
at the cost of fp64 matmuls, not a fixed-order kernel).

`sampler_runtime(precision, runtime)` gives the rollout engine (framework/rollout.py, which
wraps sampling in `runtime.autocast()`) this mode; recipes/rl.py hands it over for
`rollout.precision`. Only the sampler is affected: the trainer, the reference and the audit
trace stay in the run's `dtype`.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from posttrain.errors import UsageError

FORMATS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def round_to(x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """x rounded to `dtype` (nearest even) and held in x's dtype; None = unchanged."""
    if dtype is None or not torch.is_tensor(x) or not x.is_floating_point():
        return x
    return x.to(dtype).to(x.dtype)


class LowPrecision(TorchFunctionMode):
    """While active, matmul-like torch functions compute as a `fmt` GEMM with fp32 (or, batch
    invariant, fp64) accumulation. Thread-local, like every TorchFunctionMode."""

    def __init__(self, fmt: str, batch_invariant: bool = False):
        super().__init__()
        if fmt not in FORMATS:
            raise UsageError(f"precision {fmt!r} is unknown; use {', '.join(FORMATS)}")
        self.dtype, self.batch_invariant = FORMATS[fmt], batch_invariant

    def _acc(self, fn, *tensors, **kw):
        """fn on the rounded tensors, accumulated in fp32 or, batch-invariant, in fp64."""
        xs = [round_to(t, self.dtype) for t in tensors]
        if not self.batch_invariant:
            return fn(*xs, **kw)
        out_dtype = xs[0].dtype
        return fn(*[x.double() if torch.is_tensor(x) else x for x in xs], **kw).to(out_dtype)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:  # y = round(round(x) · round(W)ᵀ + b)
            x, w, *rest = args
            b = rest[0] if rest else kwargs.get("bias")
            return round_to(self._acc(F.linear, x, w, b), self.dtype)
        if func in (torch.bmm, torch.matmul, torch.Tensor.matmul, torch.Tensor.bmm):  # `a @ b` is Tensor.matmul
            return self._acc(func, *args, **kwargs)  # scores/attention output stay fp32
        if func is torch.baddbmm:  # the decode path's bias + α·q·Kᵀ
            bias, a, b = args
            return self._acc(lambda c, x, y, **kw: torch.baddbmm(c, x, y, **kw), bias, a, b, **kwargs)
        if func is F.scaled_dot_product_attention:
            q, k, v, *rest = args
            return self._acc(lambda *t, **kw: F.scaled_dot_product_attention(*t, *rest, **kw), q, k, v, **kwargs)
        if func is F.embedding:
            return round_to(func(*args, **kwargs), self.dtype)
        return func(*args, **kwargs)


class SamplerRuntime:
    """What the rollout engine reads of a runtime (`autocast()`): the run's own autocast, with
    the emulated format on top."""

    def __init__(self, fmt: str, base=None, batch_invariant: bool = False):
        self.fmt, self.base, self.batch_invariant = fmt, base, batch_invariant

    @contextlib.contextmanager
    def autocast(self):
        with (
            self.base.autocast() if self.base is not None else contextlib.nullcontext(),
            LowPrecision(self.fmt, self.batch_invariant),
        ):
            yield


def sampler_runtime(precision: str, runtime=None, batch_invariant: bool = False):
    """The runtime the rollout engine gets for `rollout.precision`: `runtime` itself for fp32,
    else a SamplerRuntime that emulates the format over it."""
    if precision not in FORMATS:
        raise UsageError(f"rollout.precision={precision!r} is unknown; use {', '.join(FORMATS)}")
    if precision == "fp32" and not batch_invariant:
        return runtime
    return SamplerRuntime(precision, runtime, batch_invariant)
