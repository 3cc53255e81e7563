"""The one sampler and its randomness: temperature semantics the trainer reuses, and draws keyed
by (seed, step, prompt, sample, t) so a sample never depends on what shares its batch.

    tokens, logprobs = sample_tokens(logits, SamplingParams(temperature=1.0), draw_keys(base, t))
    trainer_logprobs = token_logprobs(logits, tokens, temperature)   # the same math, in the trainer

See framework/rollout.py (points 3 and 4 of its docstring) for why it is built this way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplingParams:
    temperature: float = 1.0  # softmax temperature; 0 = greedy (argmax, logprob recorded at T=1)
    top_k: int = 0  # keep the k most likely tokens; 0 = off (RL: off, see module doc)
    top_p: float = 1.0  # nucleus: smallest set with mass >= top_p; 1 = off (RL: off)
    max_new_tokens: int = 64  # length cap of a response, stop token included
    stop_ids: tuple[int, ...] = ()  # extra stop tokens; the engine always adds the tokenizer's (stop_ids below)
    ignore_eos: bool = False  # never stop on a stop id: every response is max_new_tokens long (benchmarks; vLLM's name)


def stop_ids(tokenizer, extra=()) -> tuple[int, ...]:
    """Every id that ends a response: the tokenizer's end of turn, the model's other end-of-sequence
    ids (HFTokenizer.stop_ids: generation_config.json's eos_token_id list) and the request's own."""
    return tuple(sorted({tokenizer.eot_id, *getattr(tokenizer, "stop_ids", ()), *extra}))


def check_request(prompts, n: int, sampling: SamplingParams, items, max_len: int) -> None:
    """What every engine refuses (a ValueError naming the request): bad sizes, an empty or too long prompt."""
    if n < 1:
        raise ValueError(f"n (samples per prompt) must be >= 1, got {n}")
    if sampling.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {sampling.max_new_tokens}")
    if sampling.temperature < 0 or sampling.top_k < 0 or not 0 < sampling.top_p <= 1:
        raise ValueError(f"need temperature >= 0, top_k >= 0 and 0 < top_p <= 1; got {sampling}")
    if items is not None and len(items) != len(prompts):
        raise ValueError(f"items has {len(items)} entries for {len(prompts)} prompts")
    for g, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {g} is empty; a prompt needs at least one token")
        if len(p) > max_len:
            raise ValueError(f"prompt {g} has {len(p)} tokens, more than max_len={max_len}")
        if len(p) + sampling.max_new_tokens > max_len:
            raise ValueError(
                f"prompt {g} ({len(p)} tokens) + max_new_tokens ({sampling.max_new_tokens}) = "
                f"{len(p) + sampling.max_new_tokens} exceeds max_len={max_len}; "
                f"lower max_new_tokens or raise max_len"
            )


# ---- temperature and sampling: the one place their semantics live --------------------------


def _log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) in fp32, T = 0 read as 1 (greedy is scored at T = 1)."""
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / T)[token]: logits [..., V], tokens [...] → [...] (fp32).

    The sampler records exactly this at sampling time and the trainer recomputes it, so
    the two can only differ by float noise of the forward passes. T = 0 is treated as 1.
    """
    return _log_probs(logits, temperature).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


log_probs = _log_probs  # the whole log-softmax [..., V] that token_logprobs gathers from (framework/logprobs.py
# reads a chunk's logprob and entropy from one)


# splitmix64 (Steele et al. 2014) on int64 tensors. torch's >> is arithmetic, so logical
# shifts mask the sign-extended bits; multiplication wraps modulo 2**64 as in C.
def _i64(x: int) -> int:
    return (x + 2**63) % 2**64 - 2**63


_GOLDEN, _MUL1, _MUL2 = _i64(0x9E3779B97F4A7C15), _i64(0xBF58476D1CE4E5B9), _i64(0x94D049BB133111EB)


def _srl(x: torch.Tensor, s: int) -> torch.Tensor:
    return (x >> s) & ((1 << (64 - s)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """One splitmix64 output per int64 element (a bijective, well-mixed hash)."""
    z = x + _GOLDEN
    z = (z ^ _srl(z, 30)) * _MUL1
    z = (z ^ _srl(z, 27)) * _MUL2
    return z ^ _srl(z, 31)


def sample_keys(seed: int, step: int, prompt: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
    """[B] int64 base keys, one per (seed, step, prompt, sample); draw t uses draw_keys(base, t)."""
    h = splitmix64(torch.full_like(prompt, _i64(seed)))
    h = splitmix64(h ^ _i64(step))
    h = splitmix64(h ^ prompt)
    return splitmix64(h ^ sample)


def draw_keys(base: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """[B] int64 key of draw number t (the t-th response token) of each sample."""
    return splitmix64(base ^ t)


def _uniform(keys: torch.Tensor) -> torch.Tensor:
    """[B] float64 uniforms in (0, 1]: the top 52 bits of splitmix64(key), offset by half a step."""
    return (_srl(splitmix64(keys), 12).double() + 0.5) * 2.0**-52


def draw_uniforms(base: torch.Tensor, draws: int) -> torch.Tensor:
    """[B, draws] float64: the uniform of every draw t < draws of each sample (base [B] from
    sample_keys), computed at once. The engine takes them when a sample is admitted instead of
    hashing ~20 small int64 ops per decode step; sample_tokens(..., u=u[:, t]) draws exactly
    what sample_tokens(..., keys=draw_keys(base, t)) draws."""
    return _uniform(draw_keys(base[:, None], torch.arange(draws, device=base.device)))


def sample_tokens(
    logits: torch.Tensor, sampling: SamplingParams, keys: torch.Tensor | None, u: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The one sampler. logits [B, V], keys [B] int64 (draw_keys) → tokens [B], logprobs [B].

    Inverse-CDF sampling on the (top-k/top-p filtered) probabilities with one uniform per
    row from its key, so a row's draw depends on its logits and key only. The logprob is
    token_logprobs of the full, untruncated distribution at the sampling temperature.
    `u` [B] float64 passes the uniforms of `keys` already drawn (draw_uniforms); keys is then unused.
    """
    logp = _log_probs(logits, sampling.temperature)  # [B, V] fp32
    if sampling.temperature <= 0:
        tokens = logp.argmax(-1)  # greedy; first index on ties
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(1)
    probs = logp.exp()  # sample from exp(logp) itself
    V = probs.shape[-1]
    if 0 < sampling.top_k < V:
        kth = probs.topk(sampling.top_k, dim=-1).values[:, -1:]  # [B, 1]
        probs = probs.masked_fill(probs < kth, 0.0)  # ties at the k-th value are kept
    if sampling.top_p < 1.0:
        p_sorted, order = probs.sort(dim=-1, descending=True, stable=True)
        before = p_sorted.cumsum(-1) - p_sorted  # mass of the more likely tokens
        p_sorted = p_sorted.masked_fill(before >= sampling.top_p * p_sorted.sum(-1, keepdim=True), 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, p_sorted)
    cdf = probs.double().cumsum(-1)  # [B, V] unnormalised
    if u is None:
        assert keys is not None, "sample_tokens draws from keys or from given uniforms u"
        u = _uniform(keys)
    x = u * cdf[:, -1]  # [B] in (0, total]
    # first index with cdf >= x: zero-probability tokens (flat cdf) can never be chosen
    tokens = torch.searchsorted(cdf, x[:, None]).squeeze(1).clamp_(max=V - 1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(1)
