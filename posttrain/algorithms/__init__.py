"""One algorithm per file, each a patch on its predecessor (docs/architecture.md §6).

Every module exposes `Config` (dataclass), `advantages(rewards, group_index, cfg, **kw)`,
`loss(logprobs, batch, cfg, norm, entropy=None) -> (loss, metrics)` and
`needs_reference(cfg)`. Shared math lives in `core`. The registry below is written out by
hand: importing a module never registers it as a side effect.
"""

from __future__ import annotations

import difflib

from posttrain.algorithms import cispo, dapo, dppo, dr_grpo, grpo, gspo, maxrl, mgpo, ppo, reinforce, reinforce_pp, rloo
from posttrain.errors import UsageError

ALGORITHMS = {
    "reinforce": reinforce,  # −A·log π, A = R or R − μ_G
    "rloo": rloo,  # leave-one-out baseline
    "ppo": ppo,  # learned critic V(s) + GAE + PPO clip + clipped value loss
    "reinforce_pp": reinforce_pp,  # KL-in-reward reward-to-go, batch whitening, PPO clip (baseline=True: -baseline)
    "grpo": grpo,  # group-normalised advantage, PPO clip, k3 KL in the loss
    "dr_grpo": dr_grpo,  # GRPO without /σ_G and /|y_i|
    "dapo": dapo,  # clip-higher, dynamic sampling, token-mean, overlong shaping
    "gspo": gspo,  # sequence-level ratio and clip (variant=token: GSPO-token)
    "cispo": cispo,  # clipped detached IS weight, gradient on every token
    "maxrl": maxrl,  # (R − p̂)/p̂
    "mgpo": mgpo,  # GRPO × exp(−λ·KL(p̂ ‖ ½))
    "dppo": dppo,  # TV / binary-KL trust-region mask instead of the clip
}


def get(name: str):
    """The algorithm module registered as `name`; a UsageError naming the valid ones otherwise."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        # a transposition ("gpro") first: difflib ranks 'grpo' and 'mgpo' equal for it
        close = [c for c in ALGORITHMS if sorted(c) == sorted(str(name))] or difflib.get_close_matches(
            str(name), list(ALGORITHMS), n=1
        )
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UsageError(f"unknown algorithm {name!r}{hint} (valid: {', '.join(sorted(ALGORITHMS))})") from None
