"""Progress for the long phases outside the step loop: sampling preference pairs, evaluations.

    samples = generate_with_progress(engine, prompts, 8, sampling, "dpo pairs", seed=0, items=items)

On a terminal a rich bar shows the count, the rate and an ETA; in a log (no terminal) one line
when the phase starts and one when it ends, with its time. The prompts go to the engine in chunks
so the bar moves; a sample's randomness is keyed by its prompt's index across the whole call
(`group_offset`), so chunking never changes what is sampled (tests/test_console.py).
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager

CHUNK = 64  # prompts per engine call: a bar update every few seconds on a CPU


@contextmanager
def progress(label: str, total: int, unit: str = "prompts"):
    """Yields `advance(k)`. A bar with count and ETA on a terminal; start/end lines otherwise."""
    t0 = time.perf_counter()
    if sys.stdout.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(
            TextColumn(f"[bold]{label}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(unit),
            TimeRemainingColumn(),
            transient=True,
        ) as bar:
            task = bar.add_task(label, total=total)
            yield lambda k=1: bar.advance(task, k)
    else:
        print(f"{label}: {total:,} {unit} ...", flush=True)
        yield lambda k=1: None
    print(f"{label}: {total:,} {unit} in {time.perf_counter() - t0:.1f}s", flush=True)


def generate_with_progress(engine, prompts: list, n: int, sampling, label: str, chunk: int = CHUNK, **kw) -> list:
    """`engine.generate(prompts, n, sampling, **kw)` in chunks of prompts under a progress bar; the
    same samples as one call (randomness keyed by the global prompt index), groups numbered globally."""
    if len(prompts) <= chunk:
        return engine.generate(prompts, n, sampling, **kw)
    items, offset = kw.pop("items", None), kw.pop("group_offset", 0)
    out, tokens, seconds = [], 0.0, 0.0
    with progress(label, len(prompts)) as advance:
        for a in range(0, len(prompts), chunk):
            part = engine.generate(
                prompts[a : a + chunk],
                n,
                sampling,
                group_offset=offset + a,
                items=None if items is None else items[a : a + chunk],
                **kw,
            )
            for s in part:
                s.group += a
            out += part
            stats = getattr(engine, "stats", {})
            tokens += stats.get("rollout/generated_tokens", 0.0)
            seconds += stats.get("rollout/time_s", 0.0)
            advance(len(prompts[a : a + chunk]))
    if seconds > 0:  # the whole call's rate, not the last chunk's
        engine.stats = {
            **engine.stats,
            "rollout/generated_tokens": tokens,
            "rollout/time_s": seconds,
            "rollout/tokens_per_s": tokens / seconds,
        }
    return out
