"""posttrain: RL post-training for language models, readable end to end.

The six roles around the loss live in `posttrain.framework`, one algorithm per file in
`posttrain.algorithms`, the built-in model in `posttrain.models.gpt_mini`, and one entry
point per stage in `posttrain.recipes`. See docs/architecture.md for the map.
"""

from posttrain.errors import TrainingHalted, UsageError

__version__ = "0.1.0"

__all__ = ["TrainingHalted", "UsageError", "__version__"]

_API = ("pretrain", "sft", "rl", "dpo", "rm", "Run")


def __getattr__(name):
    """`posttrain.rl(...)` and friends (posttrain/api.py), imported on first use: `import posttrain`
    stays light (no torch) for the CLI's usage errors."""
    if name in _API:
        from posttrain import api  # upward: the Python API (posttrain.rl(...)) loads on first use

        return getattr(api, name)
    raise AttributeError(f"module 'posttrain' has no attribute {name!r}")
