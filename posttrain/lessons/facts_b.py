"""Numbers quoted in the text of the lessons owned by text engineer B, each computed by posttrain's
own functions or read from a committed JSON (see posttrain/lessons/facts.py for the contract)."""

from __future__ import annotations

from typing import Callable

FACTS: dict[str, Callable[[], object]] = {}
