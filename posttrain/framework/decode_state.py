"""The decode loop's per-slot state, kept by the engine from one generate() call to the next, and
the CUDA graphs captured over it (framework/decode_graphs.py).

    state = engine.slot_state(S, M, V, device)      # reused while (slots, cap, vocab, device) stay
    state.reset(stop_ids, policy_version)           # zeroed in place: a fresh call's state
    graphs = state.step_graphs(loop._step_eager, key)   # the graphs of earlier calls, while `key` holds

Why keep it: a captured graph reads and writes fixed addresses. A decode loop that allocates its
buffers per call can only replay graphs captured in that call, so every call pays one eager warm-up
step and one capture per (rows, span) shape it meets (about 20 at 256 rows with answers of mixed
length), each as long as an uncaptured step. With the buffers kept, a graph captured in one call is
replayed in every later one, and a steady run captures nothing after its first rollout.

What a graph reads besides these buffers is named by the `key` the loop passes: the sampling
parameters (Python numbers baked into the captured kernels), the addresses, shapes and dtypes of the
decoder's weights and rotary tables and of the slot cache's tensors, and autocast's state. A key that
changes (a parameter replaced by a new tensor, a bigger slot cache, another temperature) drops the
graphs, and the call captures anew. The weights are read where they are: the optimizer's in-place
steps and `update_weights` keep the addresses (models/decode_weights re-fuses q/k/v and gate/up into
the same copies), so a replay computes with the current weights. The policy version stamped on each
token is a device scalar (`version`) for the same reason: a Python int would be baked in at capture.

What it costs: the kept state holds the slots' fp32 logits (S × vocabulary × 4 B: 155 MB at 256
slots and Qwen's 151,936) between rollouts, and on CUDA the graphs' private memory pool stays
reserved with them: one decode step's temporaries, mostly the sampler's on those logits (~24 B an
entry: ~0.9 GB at that size). sizing/run_memory counts both as persistent; `rollout.cuda_graphs=false`
captures nothing, and `Engine.close()` gives both back.

On the CPU there is no capture; the same buffers are reused, zeroed, and the samples are the same
bit for bit as with fresh ones (tests/test_decode_state.py).
"""

from __future__ import annotations

import torch

from posttrain.framework.decode_graphs import StepGraphs


class SlotState:
    """Rows [0, S) of the decode loop's state: logits, per-draw buffers, per-slot scalars."""

    def __init__(self, S: int, M: int, V: int, dev: torch.device):
        self.key = (S, M, V, dev)
        z = torch.zeros
        self.logits = z(S, V, device=dev)  # next-token logits per slot
        # a slot's draw t goes to column t; column M takes the draws of a row frozen at the cap
        self.tok_buf = z(S, M + 1, dtype=torch.long, device=dev)
        self.lp_buf = z(S, M + 1, device=dev)
        self.ver_buf = z(S, M + 1, dtype=torch.long, device=dev)  # version behind each token
        self.lver = z(S, dtype=torch.long, device=dev)  # version behind each slot's logits
        self.t = z(S, dtype=torch.long, device=dev)  # tokens generated so far
        self.u = z(S, M + 1, dtype=torch.float64, device=dev)  # the uniform of each draw of the slot's sample
        self.sid = z(S, dtype=torch.long, device=dev)  # sample id = group * n + index
        self.last = z(S, dtype=torch.long, device=dev)  # last token: next forward's input
        self.live = z(S, dtype=torch.bool, device=dev)  # the row's sequence is still running
        self.ar = torch.arange(S, device=dev)
        self.version = z((), dtype=torch.long, device=dev)  # the policy version a forward stamps
        self.stops: tuple[int, ...] = ()
        self.stop_ids = z(0, dtype=torch.long, device=dev)
        self.graphs: StepGraphs | None = None
        self.graph_key: tuple | None = None

    def slot_buffers(self) -> list[torch.Tensor]:
        """What moves with a slot when holes are filled (DecodeLoop._retire)."""
        return [self.tok_buf, self.lp_buf, self.ver_buf, self.lver, self.t, self.u, self.sid, self.last, self.live]

    def reset(self, stops: tuple[int, ...], version: int) -> None:
        """A fresh call's state, in place (the addresses a graph holds stay)."""
        for buf in (self.logits, *self.slot_buffers()):
            buf.zero_()
        self.version.fill_(version)
        if stops != self.stops:  # same stops: the same tensor, which a graph may hold
            self.stops, self.stop_ids = stops, torch.tensor(stops, dtype=torch.long, device=self.ar.device)

    def step_graphs(self, step, key: tuple) -> StepGraphs:
        """The graphs captured over this state while `key` (what else they read) is unchanged; new
        ones otherwise. `step` is the calling loop's eager step, which captures the shapes still unmet."""
        if self.graphs is None or key != self.graph_key:
            self.graphs, self.graph_key = StepGraphs(step), key
        self.graphs.step = step
        return self.graphs
