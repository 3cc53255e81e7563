"""What rollout.backend=vllm refuses before any work, and the sizes it sets (framework/backends/vllm_engine.py).

Each refusal is one `UsageError` line naming the fix, raised while the engine is built, so the
command exits 2 before the first step: a head size vLLM's CPU attention has no kernel for, an
architecture vLLM does not implement, `rollout.vllm.sleep=on` without CUDA. (A missing vLLM is
refused by the factory, framework/backends/__init__.py.)
"""

from __future__ import annotations

import torch
import vllm

from posttrain.errors import UsageError

SLEEP = ("auto", "on", "off")


def architecture(model) -> str:
    """The HF architecture vLLM will load: gpt_mini's export is a Llama; an HF policy says its own."""
    hf = getattr(model, "hf", None)
    if hf is None:
        return "LlamaForCausalLM"
    return (getattr(hf.config, "architectures", None) or [type(hf).__name__])[0]


def cpu_head_sizes() -> list[int]:
    """Head sizes vLLM's CPU attention backend has kernels for (asked of the installed vLLM)."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return sorted(CPUAttentionBackend.get_supported_head_sizes())


def check_policy(model) -> None:
    """Refuse a policy vLLM cannot run here, naming the fix."""
    arch = architecture(model)
    if arch not in vllm.ModelRegistry.get_supported_archs():
        raise UsageError(
            f"rollout.backend=vllm: vLLM {vllm.__version__} does not implement {arch}; "
            "use rollout.backend=posttrain (any causal LM), or a model vLLM supports"
        )
    hd = model.config.head_dim
    if not torch.cuda.is_available() and hd not in (sizes := cpu_head_sizes()):
        raise UsageError(
            f"rollout.backend=vllm: vLLM's CPU attention runs head sizes {', '.join(map(str, sizes))}, this "
            f"policy's is {hd}; use rollout.backend=posttrain, or a model with one of those (gpt_mini: "
            "d_model / n_heads = 32, as in every preset)"
        )


def sleep_wanted(opts) -> bool:
    """rollout.vllm.sleep: auto = on with CUDA (vLLM's sleep mode is a CUDA feature). YAML 1.1 reads
    `on`/`off` (and true/false) as booleans: they arrive as True/False."""
    sleep = {True: "on", False: "off"}[opts.sleep] if isinstance(opts.sleep, bool) else opts.sleep
    if sleep not in SLEEP:
        raise UsageError(f"rollout.vllm.sleep={sleep!r} is unknown; use {', '.join(SLEEP)}")
    if sleep == "on" and not torch.cuda.is_available():
        raise UsageError("rollout.vllm.sleep=on needs CUDA (vLLM's sleep mode frees GPU memory); use auto or off")
    return sleep == "on" or (sleep == "auto" and torch.cuda.is_available())


def kv_cache_bytes(config, opts, max_slots: int, max_len: int, cuda: bool) -> int | None:
    """rollout.vllm.kv_cache_mb, or room for `max_slots` sequences of `max_len` tokens in fp32 on
    CPU (vLLM's own CPU default reserves ~90% of the NUMA node); on CUDA None: vLLM sizes the
    cache from `gpu_memory_utilization`."""
    if opts.kv_cache_mb > 0:
        return opts.kv_cache_mb * 2**20
    if cuda:
        return None
    per_token = 2 * config.n_layers * config.n_kv_heads * config.head_dim * 4  # K and V, fp32
    return per_token * max_slots * max_len
