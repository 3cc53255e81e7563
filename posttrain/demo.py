"""`posttrain demo ALGO [key=value ...]` (or `python -m posttrain.demo ALGO`): one algorithm, trained briefly.

A short RL run of the named algorithm on the shared task (grpo_arith) from the default SFT(CoT) checkpoint,
printing reward and held-out accuracy at the end. The algorithm files are math only (docs/architecture.md
§6); this is the one place that turns a name from their registry into a run.
"""

from __future__ import annotations

import sys

from posttrain import algorithms
from posttrain.config import RLConfig, load_config
from posttrain.errors import UsageError
from posttrain.recipes import rl

USAGE = "posttrain demo ALGO [key=value ...]"


def demo(name: str, steps: int = 30, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Train `name` for `steps` steps into runs/demo_<name> (overrides after the defaults: `steps=5`
    wins); returns the run's summary."""
    algorithms.get(name)  # an unknown name: one line with the known ones, before any work
    keys = [f"algo.name={name}", f"steps={steps}", f"out=runs/demo_{name}", "overwrite=true"]
    keys.append(f"eval_every={max(steps // 3, 1)}")
    cfg = load_config(RLConfig, "grpo_arith", [*keys, *overrides])
    summary = rl.run(cfg)
    k = cfg.eval.samples
    print(
        f"{name}: reward/mean {summary.get('reward/mean', 0):.3f}  "
        f"held-out pass@1 {summary.get('eval/pass@1', 0):.3f}  pass@{k} {summary.get(f'eval/pass@{k}', 0):.3f}"
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-") or "=" in argv[0]:
        raise UsageError(f"name the algorithm: {USAGE}, ALGO one of {', '.join(algorithms.ALGORITHMS)}")
    demo(argv[0], overrides=argv[1:])
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UsageError as e:
        print(f"posttrain demo: error: {e}", file=sys.stderr)
        sys.exit(2)
