"""CUDA graphs of the decode loop's in-window step (framework/decode_loop.py): one forward of one token
per row and the sampling after it, replayed as one launch instead of ~500 small ones from Python.

    graphs = StepGraphs(loop._step_eager)   # only on CUDA (decode_loop decides)
    graphs(R, span)                          # the same work as loop._step_eager(R, span)

A step's shapes are fixed by (rows R, attended span): the loop rounds R up to the engine's slot-count
bucket and the span up to SPAN_BUCKET positions, so one call meets few shapes. A shape runs eagerly
the first time it is met (its warm-up: cuBLAS picks its kernels, the caching allocator grows), is
captured the second time and replayed from then on. Every graph reads and writes the loop's own
preallocated tensors (the slot cache, the logits, the per-slot state), which the engine keeps from
one generate() call to the next (framework/decode_state.py): a replay copies nothing in or out, and
the graphs of one call replay in the next while what they read keeps its address (a shape met in an
earlier call is captured at once). Inside a capture autocast's cast cache is off (a cached bf16 copy of
a weight would be freed under the graph): the graph casts the weights itself. The loop captures only without `on_decode_step` (partial rollouts may load new
weight tensors between two steps, which a graph would not see) and only on the fast decode path.
"""

from __future__ import annotations

import contextlib

import torch

SPAN_BUCKET = 64  # attended positions round up to a multiple of this on CUDA (few shapes, few graphs)


class StepGraphs:
    """Captures `step(R, span)` once per shape and replays it; `replays` counts the steps it served."""

    def __init__(self, step):
        self.step = step
        self.seen: set[tuple[int, int]] = set()
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.pool = (
            torch.cuda.graph_pool_handle()
        )  # one memory pool for all these graphs (no tensor made in a step outlives it)
        self.replays = self.captures = 0

    def __call__(self, R: int, span: int) -> None:
        key = (R, span)
        g = self.graphs.get(key)
        if g is None and key not in self.seen:  # first time (in any call): eager, the warm-up
            self.seen.add(key)
            self.step(R, span)
            return
        if g is None:  # second time: capture (records, runs nothing), then replay below
            g = self.graphs[key] = torch.cuda.CUDAGraph()
            self.captures += 1
            torch.cuda.current_stream().synchronize()
            # thread_local: another thread's CUDA work (the trainer beside an async rollout) may go on
            with _uncached_autocast(), torch.cuda.graph(g, pool=self.pool, capture_error_mode="thread_local"):
                self.step(R, span)
        g.replay()
        self.replays += 1


def _uncached_autocast():
    """The enclosing autocast again, its weight-cast cache off (a capture must not keep cached casts)."""
    if not torch.is_autocast_enabled("cuda"):
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False)
