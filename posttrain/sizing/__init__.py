"""Sizing: the back-of-envelope calculators of an RL post-training run, on paper, before any run.

    shapes.py       model shapes (published presets, the course's round sizes, gpt_mini's):
                    parameter counts, activation bytes per token
    memory.py       what a run holds on each GPU, per algorithm and placement, and whether it
                    fits; memory_cli.py prints it (`posttrain memory MODEL --algo grpo --gpu h100`)
    throughput.py   where an RL step's wall clock goes and which role bounds it; a run's
                    measured step times read back into the same terms (distributed/run_summary.py)
    run_memory.py   one posttrain run's predicted peak, from its config and model shape, before it
                    starts (printed as `[stage memory]`; run_memory_cli.py: `posttrain memory RUN_DIR`)

They are plain arithmetic with no torch at import (gpt_mini's own shapes read `posttrain.models`
when asked for), so `posttrain memory` and the lessons' widgets answer without building a model. What
watches a real card while a run is on it (its memory, its out-of-memory line) is framework/card.py.
"""
