"""One algorithm per file, each a patch on its predecessor (DESIGN.md §4).

Every module exposes `Config` (dataclass), `advantages(rewards, group_index, cfg, **kw)`,
`loss(logprobs, batch, cfg, norm, entropy=None) -> (loss, metrics)` and
`needs_reference(cfg)`. Shared math lives in `core`. The registry below is written out by
hand: importing a module never registers it as a side effect.
"""

from __future__ import annotations

import difflib

from posttrain import UsageError
from posttrain.algorithms import grpo

ALGORITHMS = {
    "grpo": grpo,
}


def get(name: str):
    """The algorithm module registered as `name`; a UsageError naming the valid ones otherwise."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(ALGORITHMS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UsageError(f"unknown algorithm {name!r}{hint} (valid: {', '.join(sorted(ALGORITHMS))})") from None
