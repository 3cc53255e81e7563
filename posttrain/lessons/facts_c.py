"""Numbers quoted by the lesson pages of TEXT C (rl-22a … rl-28 and the gpt_mini track).

Each entry of FACTS is a function of no arguments that returns a number, a short string or a
table {"columns": [...], "rows": [[...], ...]}; a page quotes it as {{fact:NAME}} or
{{table:NAME}}. Every value is computed by posttrain's own functions (throughput, memory,
shapes, algorithms/core, the engine) or read from a committed JSON (benchmarks/results/,
lessons/data/runs.json), in well under a second on one core; nothing here trains.
Names start with the lesson they belong to (rl22a_…, g01_…).
"""

from __future__ import annotations

from collections.abc import Callable

from posttrain.lessons import (
    facts_c_async,
    facts_c_gpt,
    facts_c_gpt_post,
    facts_c_infra,
    facts_c_recipes,
    facts_c_throughput,
)

FACTS: dict[str, Callable[[], object]] = {
    **facts_c_throughput.FACTS,
    **facts_c_async.FACTS,
    **facts_c_infra.FACTS,
    **facts_c_recipes.FACTS,
    **facts_c_gpt.FACTS,
    **facts_c_gpt_post.FACTS,
}
