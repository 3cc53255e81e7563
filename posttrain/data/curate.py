"""Data curation for RL prompts: keep what the current policy can learn from.

    rates, signal = probe(engine, tok, task, items, k=8)       # K samples per prompt
    kept, metrics = curate(items, prompts, rates, signal, eval_prompts, band=(0.1, 0.9))

GRPO learns only from groups whose rewards differ: a prompt the policy always solves or
never solves yields zero advantage for every sample. So:

  1. probe          K samples of each prompt from the current checkpoint (our rollout
                    Engine); pass rate = share of samples with reward >= `success`, and
                    `signal` = the K rewards are not all equal
  2. exact dedup    same text after lower-casing and collapsing whitespace
  3. near dedup     MinHash (numpy, `num_perm` permutations of hashed character shingles)
                    with LSH banding; a pair is a duplicate when its estimated Jaccard
                    similarity >= `near_threshold`; the later item goes
  4. decontaminate  drop a training prompt that shares any word n-gram (default n = 8)
                    with an eval prompt, or equals one when it has fewer than n words
  5. band filter    keep pass rates in [lo, hi]: the learnable band

`metrics`: `keep_rate` (kept / all), `frac_groups_with_signal` among the kept prompts
(and `_before` over all), the count each stage removed, and the difficulty buckets.
"""

from __future__ import annotations

import re
import zlib

import numpy as np

from posttrain.errors import UsageError
from posttrain.framework.rollout import SamplingParams
from posttrain.tasks.base import safe_reward, verifier_args

PRIME = 4_294_967_291  # largest prime < 2**32: (a*x + b) of 32-bit values fits in uint64
BUCKETS = ("never", "hard", "learnable", "easy", "always")


def probe(
    engine,
    tokenizer,
    task,
    items: list,
    k: int = 8,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    seed: int = 0,
    success: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """(pass rate [N], has-signal [N]) from K samples per item on the engine's current weights."""
    prompts = [tokenizer.encode(tokenizer.chat_prompt(task.prompt(it))) for it in items]
    samples = engine.generate(
        prompts, k, SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens), seed=seed, items=items
    )
    rewards = np.zeros((len(items), k))  # [N, K]
    for s in samples:
        rewards[s.group, s.index] = (
            0.0 if s.finish_reason == "error" else safe_reward(task, *verifier_args(task, s)).reward
        )
    return (rewards >= success).mean(axis=1), rewards.max(axis=1) - rewards.min(axis=1) > 1e-8


def bucket(rate: float, band: tuple[float, float]) -> str:
    lo, hi = band
    if rate <= 0.0:
        return "never"
    if rate >= 1.0:
        return "always"
    return "hard" if rate < lo else "easy" if rate > hi else "learnable"


def normalize(text: str) -> str:
    return " ".join(text.lower().split())


def shingles(text: str, n: int = 5) -> set[str]:
    t = normalize(text)
    return {t[i : i + n] for i in range(max(len(t) - n + 1, 1))}


def jaccard(a: str, b: str, n: int = 5) -> float:
    sa, sb = shingles(a, n), shingles(b, n)
    return len(sa & sb) / len(sa | sb)


def minhash(texts: list[str], num_perm: int = 128, n: int = 5, seed: int = 0) -> np.ndarray:
    """Signatures [len(texts), num_perm]: per permutation h(x) = (a*x + b) mod p, the minimum
    over the text's shingles; P(equal entry) = Jaccard similarity of the shingle sets."""
    rng = np.random.default_rng(seed)
    a = rng.integers(1, PRIME, num_perm, dtype=np.uint64)  # [P]
    b = rng.integers(0, PRIME, num_perm, dtype=np.uint64)  # [P]
    sigs = np.empty((len(texts), num_perm), dtype=np.uint64)
    for i, t in enumerate(texts):
        x = np.array([zlib.crc32(s.encode()) % PRIME for s in shingles(t, n)], dtype=np.uint64)  # [S]
        sigs[i] = ((x[:, None] * a[None, :] + b[None, :]) % np.uint64(PRIME)).min(axis=0)  # [S, P] -> [P]
    return sigs


def near_duplicates(
    texts: list[str], threshold: float = 0.8, num_perm: int = 128, bands: int = 32, n: int = 5, seed: int = 0
) -> set[int]:
    """Indices to drop: each text whose estimated Jaccard with an earlier kept text >= threshold."""
    if num_perm % bands:
        raise UsageError(f"near dedup: num_perm={num_perm} must be a multiple of bands={bands}")
    sigs, rows = minhash(texts, num_perm, n, seed), num_perm // bands
    drop, buckets = set(), {}
    for i in range(len(texts)):
        candidates = set()
        for band in range(bands):  # LSH: texts that agree on a whole band
            key = (band, sigs[i, band * rows : (band + 1) * rows].tobytes())
            candidates.update(buckets.get(key, ()))
        if any(np.mean(sigs[i] == sigs[j]) >= threshold for j in candidates):
            drop.add(i)
            continue
        for band in range(bands):
            buckets.setdefault((band, sigs[i, band * rows : (band + 1) * rows].tobytes()), []).append(i)
    return drop


def words(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text.lower())


def ngrams(text: str, n: int) -> set[tuple]:
    w = words(text)
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)} if len(w) >= n else {tuple(w)}


def contaminated(train: list[str], evals: list[str], n: int = 8) -> set[int]:
    """Indices of training prompts sharing a word n-gram with an eval prompt (or equal to one,
    when shorter than n words)."""
    bad = set().union(*(ngrams(e, n) for e in evals)) if evals else set()
    return {i for i, t in enumerate(train) if ngrams(t, n) & bad}


def curate(
    items: list,
    prompts: list[str],
    rates,
    signal,
    eval_prompts: list[str] = (),
    band: tuple[float, float] = (0.1, 0.9),
    near_threshold: float = 0.8,
    ngram: int = 8,
    seed: int = 0,
) -> tuple[list, dict]:
    """The items that survive every stage (in order), and the curation metrics."""
    lo, hi = band
    if not 0.0 <= lo <= hi <= 1.0 or len({len(items), len(prompts), len(rates), len(signal)}) != 1:
        raise UsageError("curate: need 0 <= band lo <= hi <= 1 and one prompt, rate and signal per item")
    rates, signal = np.asarray(rates, dtype=float), np.asarray(signal, dtype=bool)
    keep, seen, removed = [], set(), {}
    exact = set()
    for i, p in enumerate(prompts):  # exact duplicates: the first copy stays
        key = normalize(p)
        (exact.add(i) if key in seen else seen.add(key))
    near = near_duplicates(prompts, near_threshold, seed=seed) - exact
    dirty = contaminated(prompts, list(eval_prompts), ngram)
    for i in range(len(items)):
        stage = (
            "exact_dup"
            if i in exact
            else "near_dup"
            if i in near
            else "contaminated"
            if i in dirty
            else None
            if lo <= rates[i] <= hi
            else "out_of_band"
        )
        if stage:
            removed[stage] = removed.get(stage, 0) + 1
        else:
            keep.append(i)
    n = max(len(items), 1)
    metrics = {
        "keep_rate": len(keep) / n,
        "frac_groups_with_signal": float(signal[keep].mean()) if keep else 0.0,
        "frac_groups_with_signal_before": float(signal.mean()) if len(items) else 0.0,
        **{f"removed/{s}": removed.get(s, 0) for s in ("exact_dup", "near_dup", "contaminated", "out_of_band")},
        **{f"bucket/{b}": 0 for b in BUCKETS},
    }
    for r in rates:
        metrics[f"bucket/{bucket(r, band)}"] += 1
    return [items[i] for i in keep], metrics
