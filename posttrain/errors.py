"""The two exceptions every room may raise; `posttrain` re-exports them (`from posttrain import UsageError`).

They live in a room of their own, below everything, so that raising one never imports the package's
public face (posttrain/__init__.py), which reaches the Python API (posttrain/api.py) on first use.
"""


class UsageError(Exception):
    """A mistake the user can fix (config key, file, dataset row): printed as one line, exit 2."""


class TrainingHalted(RuntimeError):
    """The run cannot go on (e.g. only non-finite steps): a checkpoint was saved and the message
    says why and how to continue. Printed as one line, exit 1."""
