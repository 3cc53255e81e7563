"""A second torch device on a CPU-only machine, to catch a tensor left on the wrong device.

On a CPU-only machine every tensor is on the CPU, so code that forgets to move a batch to the
model's device runs fine there and crashes on the first GPU (issue 31: DPO's reference scored
pairs still on the CPU against a model on cuda:0). This module gives CI the missing second
device: `fakegpu:0`, PyTorch's PrivateUse1 backend registered from Python
(`torch.utils.backend_registration`). Its tensors are wrapper subclasses holding a CPU tensor:
every op runs the CPU kernel on the held tensors, so the numbers are exactly the CPU's, but an
op that meets a fakegpu tensor and a CPU tensor is refused with CUDA's error, by CUDA's rule:

    allowed with a fakegpu tensor    0-dim CPU tensors (scalars), CPU index tensors of
                                     aten.index / index_put, and the moves (copy_, _to_copy)
    refused                          any other CPU tensor (`Expected all tensors to be on the
                                     same device, but found at least two devices, fakegpu:0 and cpu`)

A tensor reaches fakegpu the ways it reaches cuda: `.to(device)`, a factory with `device=`,
an op on fakegpu tensors. `.numpy()` of one is refused as on cuda. `.tolist()`, `.item()`,
`float()`, formatting and `torch.save` read the held CPU tensor.

A stage runs on it with `device=fakegpu` (runtime.resolve takes any torch device); a process
registers the backend once (`install()`), and nothing changes for tensors on the CPU.

Several devices, as a machine with several GPUs has: `install(devices=N)` gives fakegpu:0 … fakegpu:N−1,
and an op that meets tensors of two of them is refused as CUDA refuses cuda:0 beside cuda:1 (a move,
`.to("fakegpu:1")` or `copy_`, crosses them as on CUDA). A run of N ranks puts rank r on fakegpu:r
(distributed/launch.join: `LOCAL_RANK`), so a tensor that reaches another rank's device fails the
2-rank test (tests/test_ranks.py) with CUDA's error. The
dtype stays float32 (autocast needs a real backend), so a fakegpu run's numbers equal the CPU
run's bit for bit: tests/test_device_placement.py asserts both.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

NAME = "fakegpu"
aten = torch.ops.aten
MOVES = {aten._to_copy.default, aten.copy_.default, aten._copy_from.default}
CPU_INDICES = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
_LIBS: list = []  # the registrations live as long as the process


class FakeGPUTensor(torch.Tensor):
    """A tensor on fakegpu:`index`: `elem` is the CPU tensor that holds its values."""

    elem: torch.Tensor
    index: int

    @staticmethod
    def __new__(cls, elem: torch.Tensor, index: int = 0):
        with torch.inference_mode(False):  # a view of a normal tensor must be normal (its version counter)
            r = torch.Tensor._make_wrapper_subclass(
                cls,
                elem.shape,
                strides=elem.stride(),
                storage_offset=elem.storage_offset(),
                dtype=elem.dtype,
                layout=elem.layout,
                device=torch.device(NAME, index),
                requires_grad=False,
            )
        r.elem, r.index = elem, index
        return r

    def __repr__(self, *, tensor_contents=None):
        return repr(self.elem)[:-1] + f", device='{NAME}:{self.index}')"

    def __format__(self, spec: str) -> str:
        return self.elem.__format__(spec)

    def __reduce_ex__(self, proto):  # torch.save: saved as its CPU values (a checkpoint loads on CPU first)
        return self.elem.__reduce_ex__(proto)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.tolist, torch.Tensor.untyped_storage, torch.Tensor.data_ptr):
            return func(args[0].elem)  # a CUDA tensor has a storage and a data pointer too
        if func is torch.Tensor.backward:  # on the calling thread: the engine's per-device threads were
            with torch.autograd.set_multithreading_enabled(False):  # sized before fakegpu existed
                with torch._C.DisableTorchFunctionSubclass():
                    return func(*args, **(kwargs or {}))
        if func is F.scaled_dot_product_attention:
            return _attention_as_on_cpu(func, *args, **(kwargs or {}))
        if func is torch.Tensor.numpy:
            raise TypeError(
                f"can't convert {NAME}:{args[0].index} device type tensor to numpy. Use Tensor.cpu() first."
            )
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return run_op(func, args, kwargs or {})


def _attention_as_on_cpu(func, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """SDPA picks its kernel by device type (flash on the CPU, the math path on a device it does
    not know): take the CPU's pick, so that fakegpu computes what the CPU computes."""
    elems = [t.elem if isinstance(t, FakeGPUTensor) else t for t in (q, k, v, attn_mask)]
    pick = torch._fused_sdp_choice(*elems, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    if pick != torch.nn.attention.SDPBackend.FLASH_ATTENTION.value:
        with torch._C.DisableTorchFunctionSubclass():
            return func(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # as scaled_dot_product_attention converts it
        attn_mask = torch.where(attn_mask, 0.0, torch.scalar_tensor(-math.inf, dtype=q.dtype, device=attn_mask.device))
    with torch._C.DisableTorchFunctionSubclass():
        out = aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
        )
    return out[0]


def _is_fake_device(device) -> bool:
    return device is not None and torch.device(device).type == NAME


def run_op(func, args: tuple, kwargs: dict):
    """One op on fakegpu: check devices as CUDA would, run the CPU kernel on the held tensors,
    put the results back on fakegpu (in-place results are the same wrapper objects)."""
    wrappers: dict[int, FakeGPUTensor] = {}
    found = {"fake": False, "cpu": False}
    devices: set[int] = set()  # the fakegpu indices the op meets
    index_args = func in CPU_INDICES

    def unwrap(v, is_index: bool = False):
        if isinstance(v, FakeGPUTensor):
            found["fake"] = True
            devices.add(v.index)
            wrappers[id(v.elem)] = v
            return v.elem
        if isinstance(v, torch.Tensor):
            if v.dim() > 0 and not is_index:
                found["cpu"] = True
            return v
        if isinstance(v, (list, tuple)):
            return type(v)(unwrap(x, is_index) for x in v)
        return v

    new_args = tuple(unwrap(a, index_args and i == 1) for i, a in enumerate(args))
    new_kwargs = {k: unwrap(v) for k, v in kwargs.items()}
    if found["fake"] and found["cpu"] and func not in MOVES:
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"{NAME}:{min(devices)} and cpu! (in {func})"
        )
    if len(devices) > 1 and func not in MOVES:
        a, b = sorted(devices)[:2]
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, {NAME}:{a} and "
            f"{NAME}:{b}! (in {func})"
        )
    target = kwargs.get("device")
    on_fake = _is_fake_device(target) if target is not None else found["fake"]
    index = (torch.device(target).index or 0) if on_fake and target is not None else min(devices, default=0)
    if func in MOVES and func is not aten._to_copy.default and args and isinstance(args[0], FakeGPUTensor):
        index = args[0].index  # copy_(dst, src): the result is dst, on dst's device
    if target is not None:
        new_kwargs["device"] = torch.device("cpu")
    out = func(*new_args, **new_kwargs)
    return _wrap(out, wrappers, on_fake, index)


def _wrap(v, wrappers: dict, on_fake: bool, index: int = 0):
    if isinstance(v, torch.Tensor):
        if id(v) in wrappers:
            return wrappers[id(v)]
        return FakeGPUTensor(v, index) if on_fake and not isinstance(v, FakeGPUTensor) else v
    if isinstance(v, (list, tuple)):
        return type(v)(_wrap(x, wrappers, on_fake, index) for x in v)
    return v


def _kernel(op, *args, **kwargs):
    return run_op(op, args, kwargs)


def _own_kernels() -> list[str]:
    """Ops that need a fakegpu kernel of their own rather than the fallback: copy_ (inside
    torch.tensor(..., device=) it runs with the Python key excluded, where the fallback is not
    reached), and every op with a CPU kernel and a decomposition (silu_backward), which a backend
    without its own kernel decomposes: given the CPU's, fakegpu computes the same floats."""
    names = ["copy_"]
    for name in torch._C._dispatch_get_all_op_names():
        if name.startswith("aten::") and all(
            torch._C._dispatch_has_kernel_for_dispatch_key(name, k) for k in ("CPU", "CompositeImplicitAutograd")
        ):
            names.append(name.removeprefix("aten::"))
    return names


class _Module(torch.utils.backend_registration._DummyBackendModule):
    """torch.fakegpu: the dummy backend module, plus what `torch.autocast` asks of a backend. No
    dtype is supported, so autocast on fakegpu is a no-op (a warning when enabled) and the dtype
    stays float32; `autocast(enabled=False)` (rotary tables, checkpointed recomputation) works."""

    devices = 1  # install(devices=N)

    def get_amp_supported_dtype(self) -> list:
        return []

    def device_count(self) -> int:
        return self.devices


def install(devices: int = 1) -> torch.device:
    """Register fakegpu once per process, with `devices` devices (fakegpu:0 … fakegpu:N−1); returns
    the first."""
    _Module.devices = max(_Module.devices, devices)
    if not _LIBS:
        torch.utils.backend_registration._setup_privateuseone_for_python_backend(NAME, _Module())
        fallback = torch.library.Library("_", "IMPL")  # factories and moves that name device=fakegpu
        fallback.fallback(_kernel, dispatch_key="PrivateUse1")
        impl = torch.library.Library("aten", "IMPL")
        for name in _own_kernels():
            base, _, overload = name.partition(".")
            impl.impl(
                name, functools.partial(_kernel, getattr(getattr(aten, base), overload or "default")), "PrivateUse1"
            )
        _LIBS.extend([fallback, impl])
    return torch.device(NAME, 0)
