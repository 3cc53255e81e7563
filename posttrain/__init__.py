"""posttrain: RL post-training for language models, readable end to end.

The six roles around the loss live in `posttrain.framework`, one algorithm per file in
`posttrain.algorithms`, the built-in model in `posttrain.models.gpt_mini`, and one entry
point per stage in `posttrain.recipes`. See docs/architecture.md for the map.
"""

__version__ = "0.1.0"


class UsageError(Exception):
    """A mistake the user can fix (config key, file, dataset row): printed as one line, exit 2."""


class TrainingHalted(RuntimeError):
    """The run cannot go on (e.g. only non-finite steps): a checkpoint was saved and the message
    says why and how to continue. Printed as one line, exit 1."""


_API = ("pretrain", "sft", "rl", "dpo", "rm", "Run")


def __getattr__(name):
    """`posttrain.rl(...)` and friends (posttrain/api.py), imported on first use: `import posttrain`
    stays light (no torch) for the CLI's usage errors."""
    if name in _API:
        from posttrain import api

        return getattr(api, name)
    raise AttributeError(f"module 'posttrain' has no attribute {name!r}")
