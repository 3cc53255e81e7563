"""Where a step's time goes, and what a micro-batch costs in ops: torch.profiler by phase, and an
op counter that is the CPU's proxy for a GPU's launches and host syncs (issue 43).

    with profile_step(3, out):           # posttrain bench step --profile: the controller's step 3
        api.rl(...)                      # runs under torch.profiler; out["phases"] is then the table
    print(format_table(out))

    with OpCount() as c:                 # every aten op dispatched inside, and the host reads of a
        trainer.step(batch, loss_fn)     # device tensor (a sync on CUDA): c.ops, c.syncs

**Phases.** The controller times each role inside `torch.profiler.record_function("posttrain/NAME")`
(framework/controller.timed: rollout, reward, collate, reference, critic, algorithm, proximal, train,
sync). An op belongs to the phase whose range encloses it on its thread (its `cpu_parent` chain), or,
for an op of another thread (CUDA's autograd engine runs backward on its own thread), to the phase
whose range holds its start; else to "other". Per phase: the wall time of its ranges, the ops by
self CPU time and self device time (the kernels an op launched), the kernels by device time, the
top `top` of each, sorted by device time on CUDA and CPU time elsewhere.

**Op counts.** A TorchDispatchMode counts every aten op (on a GPU each is one or more kernel
launches with a fixed cost of its own) and, among them, the host reads of a tensor on a device other
than the CPU, each a sync on CUDA (the host waits for the queue to drain): `.item()`, `float()`,
`int()`, `bool()` (aten._local_scalar_dense), `.tolist()`, a copy to the CPU, `nonzero`,
`masked_select` and indexing by a bool mask (the result's size is on the device), and a blocking copy
from the host to the device (pageable memory: CUDA synchronizes the stream). Run on a test's
fakegpu device (tests/fakegpu.py) it counts on a CPU what CUDA would sync on.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

PREFIX = "posttrain/"  # the controller's phase ranges (framework/controller.timed)
aten = torch.ops.aten
_READS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default}
_MOVES = {aten._to_copy.default, aten.copy_.default}
_INDEX = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}


def _on_device(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type not in ("cpu", "meta")


def _flat(args) -> list:
    out = []
    for a in args:
        out.extend(_flat(a) if isinstance(a, (list, tuple)) else [a])
    return out


class OpCount:
    """Count aten ops and host reads of device tensors inside a `with` block (module docstring)."""

    def __init__(self):
        self.ops: Counter = Counter()
        self.syncs: Counter = Counter()
        self._modes = (_DispatchCounter(self), _FunctionCounter(self))

    def __enter__(self) -> OpCount:
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc):
        for m in reversed(self._modes):
            m.__exit__(*exc)

    def total(self) -> dict:
        return {"ops": sum(self.ops.values()), "syncs": sum(self.syncs.values())}


class _DispatchCounter(TorchDispatchMode):
    def __init__(self, count: OpCount):
        super().__init__()
        self.count = count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.count.ops[name] += 1
        flat = _flat(args) + list(kwargs.values())
        if func in _MOVES and _host_to_device(func, args, kwargs):
            self.count.syncs[name] += 1  # a copy from pageable host memory: CUDA waits for the stream
        elif any(_on_device(x) for x in flat):
            to_cpu = func in _MOVES and (
                str(kwargs.get("device", "")) == "cpu" or (func is aten.copy_.default and not _on_device(args[0]))
            )
            mask_index = func in _INDEX and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in _flat(args[1:2])
            )
            if func in _READS or to_cpu or mask_index:
                self.count.syncs[name] += 1
        return func(*args, **kwargs)


def _host_to_device(func, args, kwargs) -> bool:
    """A blocking copy of a CPU tensor to a device (`.to(device)`, `copy_` into a device tensor)."""
    if kwargs.get("non_blocking") or (func is aten.copy_.default and len(args) > 2 and args[2]):
        return False
    if func is aten._to_copy.default:
        dev = kwargs.get("device")
        return not _on_device(args[0]) and dev is not None and torch.device(dev).type not in ("cpu", "meta")
    return _on_device(args[0]) and isinstance(args[1], torch.Tensor) and not _on_device(args[1])


class _FunctionCounter(TorchFunctionMode):
    """`.tolist()` of a device tensor: a read the dispatcher does not see on every backend."""

    def __init__(self, count: OpCount):
        super().__init__()
        self.count = count

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.tolist and args and _on_device(args[0]):
            self.count.syncs["tolist"] += 1
        return func(*args, **(kwargs or {}))


# ----------------------------------------------------------------------------- the profiler by phase


def phase_table(events, top: int = 15, by_device: bool | None = None) -> dict:
    """{phase: {wall_ms, self_cpu_ms, self_device_ms, op_calls, ops: [...], kernels: [...]}} of a
    torch.profiler trace's events (`prof.events()`), phases from the controller's ranges (module
    docstring). Each op row: name, calls, self_cpu_ms, self_device_ms; each kernel row: name, calls,
    device_ms."""
    events = list(events)
    if by_device is None:
        by_device = any(_device_us(e) > 0 for e in events)
    spans = sorted(
        (e.time_range.start, e.time_range.end, e.name[len(PREFIX) :]) for e in events if e.name.startswith(PREFIX)
    )
    ops: dict = defaultdict(lambda: defaultdict(lambda: [0, 0.0, 0.0]))  # phase -> op -> calls, cpu, device
    kernels: dict = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))  # phase -> kernel -> calls, device
    wall: dict = defaultdict(float)
    for a, b, name in spans:
        wall[name] += (b - a) / 1e3
    for e in events:
        if e.name.startswith(PREFIX) or getattr(e, "device_type", None) not in (None, torch.autograd.DeviceType.CPU):
            continue
        phase = _phase_of(e, spans)
        row = ops[phase][e.name]
        row[0] += 1
        row[1] += e.self_cpu_time_total / 1e3
        row[2] += _device_us(e) / 1e3
        for k in getattr(e, "kernels", ()):
            kernels[phase][k.name][0] += 1
            kernels[phase][k.name][1] += k.duration / 1e3
    out = {}
    for phase in sorted(set(ops) | set(wall), key=lambda p: -wall.get(p, 0.0)):
        rows = [
            {"name": n, "calls": c, "self_cpu_ms": round(cpu, 4), "self_device_ms": round(dev, 4)}
            for n, (c, cpu, dev) in ops[phase].items()
        ]
        rows.sort(key=lambda r: -(r["self_device_ms"] if by_device else r["self_cpu_ms"]))
        krows = [{"name": n, "calls": c, "device_ms": round(d, 4)} for n, (c, d) in kernels[phase].items()]
        krows.sort(key=lambda r: -r["device_ms"])
        out[phase] = {
            "wall_ms": round(wall.get(phase, 0.0), 3),
            "self_cpu_ms": round(sum(r["self_cpu_ms"] for r in rows), 3),
            "self_device_ms": round(sum(r["self_device_ms"] for r in rows), 3),
            "op_calls": sum(r["calls"] for r in rows),
            "kernel_calls": sum(r["calls"] for r in krows),
            "ops": rows[:top],
            "kernels": krows[:top],
        }
    return out


def _phase_of(e, spans) -> str:
    p = e.cpu_parent
    while p is not None:
        if p.name.startswith(PREFIX):
            return p.name[len(PREFIX) :]
        p = p.cpu_parent
    t = e.time_range.start
    return next((name for a, b, name in spans if a <= t <= b), "other")


def _device_us(e) -> float:
    """An op's own device time, µs (torch before 2.4 calls it self_cuda_time_total)."""
    name = "self_device_time_total" if hasattr(e, "self_device_time_total") else "self_cuda_time_total"
    return float(getattr(e, name, 0.0) or 0.0)


@contextmanager
def profile_step(step: int, out: dict, top: int = 15):
    """Run the controller's step `step` (framework/controller.Controller.step, wrapped while inside)
    under torch.profiler (CPU, and CUDA when there is one); afterwards `out` holds {step,
    activities, sort_by, phases: phase_table(...)}. The other steps run as they are."""
    from posttrain.framework.controller import Controller  # entry: the bench wraps the run's own step

    plain = Controller.step
    cuda = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])

    def step_fn(self, s: int):
        if s != step:
            return plain(self, s)
        with torch.profiler.profile(activities=activities) as prof:
            metrics = plain(self, s)
            if cuda:
                torch.cuda.synchronize()
        table = phase_table(prof.events(), top, by_device=cuda)
        out.update(step=s, activities=[a.name for a in activities], sort_by="self_device_ms" if cuda else "self_cpu_ms")
        out["phases"] = table
        return metrics

    Controller.step = step_fn  # type: ignore[method-assign]
    try:
        yield out
    finally:
        Controller.step = plain  # type: ignore[method-assign]


def format_table(profile: dict, rows: int = 8) -> str:
    """The profile as text: per phase its wall time and its top ops (and kernels on CUDA)."""
    key = profile.get("sort_by", "self_cpu_ms")
    lines = [f"profile of step {profile.get('step')} (ops by {key}):"]
    for phase, p in profile.get("phases", {}).items():
        lines.append(
            f"  {phase:10s} wall {p['wall_ms']:9.1f} ms  self cpu {p['self_cpu_ms']:9.1f} ms  "
            f"device {p['self_device_ms']:9.1f} ms  ops {p['op_calls']:,}  kernels {p['kernel_calls']:,}"
        )
        for r in p["ops"][:rows]:
            lines.append(f"      {r[key]:9.2f} ms  {r['calls']:6d}×  {r['name']}")
        for r in p["kernels"][: rows // 2]:
            lines.append(f"      {r['device_ms']:9.2f} ms  {r['calls']:6d}×  kernel {r['name'][:90]}")
    return "\n".join(lines)
