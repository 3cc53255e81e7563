"""The README's shell blocks run as written, in order, in a copy of the repo (CI runs it in its fresh venv):
only the step counts and evaluation sizes are made small (a `posttrain` shell function appends
overrides to each stage; the README's own arguments come first, the small ones win). A command
a newcomer copies must work after the main command; this test is how that stays true.

Skipped by design: the install commands (this test makes its own venv), `posttrain bench` and
`posttrain lessons` (long-running; each has its own tests). Hub ids resolve offline from a test
HF_HOME (tests/hub_util.py: `Qwen/Qwen2.5-0.5B-Instruct` is a reduced random Qwen2.5 there). Servers a block starts in the background
(`posttrain serve ... &`, an OpenEnv server) are stopped when the block ends.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hub_util import hub_home  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

SMALL = {  # appended to every `posttrain STAGE` the README runs
    "pipeline": (
        "eval_problems=4 eval_samples=2 pretrain.steps=2 pretrain.batch_size=4 pretrain.seq_len=32 "
        "pretrain.corpus_chars=4000 sft.steps=2 sft.batch_size=8 sft.num_problems=100 sft.eval_problems=4 "
        "dpo.steps=2 dpo.pair_prompts=16 dpo.batch_size=4 dpo.eval_problems=4 dpo.eval_samples=2 "
        "rl.steps=2 rl.rollout.prompts_per_step=2 rl.rollout.samples_per_prompt=4 rl.eval.problems=4 "
        "rl.eval.samples=2"
    ),
    "pretrain": "steps=2 batch_size=4 seq_len=32 corpus_chars=4000",
    "sft": "steps=2 batch_size=8 num_problems=100 eval_problems=4 rejection_prompts=32 rejection_samples=16",
    "rl": "steps=2 eval_every=2 rollout.prompts_per_step=2 rollout.samples_per_prompt=4 eval.problems=4 eval.samples=2",
    "dpo": "steps=2 batch_size=4 pair_prompts=16 eval_problems=4 eval_samples=2",
    "rm": "steps=2 batch_size=4 pair_prompts=16 eval_prompts=8",
    "distill": "steps=2 prompts_per_step=2 samples_per_prompt=2 eval_problems=4 eval_samples=2",
    "eval": "--problems 4",
}
# rejection sampling keeps only verified samples: a 2-step model gets some right only on sums of two 0s and
# 1s (the built-in arithmetic task's keys, so only for `sft data=rejection`, never for a user's dataset)
REJECTION = "task.min_terms=2 task.max_terms=2 task.max_value=1"
SKIP = re.compile(r"^(pip |python -c|command -v|ray |.*pytest|posttrain (bench|lessons)\b)")


def shell_blocks(text: str) -> list[str]:
    """The ```bash blocks of the README, continuation lines joined, skipped commands dropped."""
    blocks = []
    for body in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        lines = body.replace("\\\n", " ").splitlines()
        # an install line that goes on to run something (`pip install ... && posttrain pipeline`): the run part
        lines = [ln.rsplit("&&", 1)[1].strip() if "pip install" in ln and "&&" in ln else ln for ln in lines]
        keep = [
            ln
            for ln in lines
            if ln.strip() and not ln.strip().startswith("#") and not SKIP.match(ln.strip()) and "pip install" not in ln
        ]
        if keep:
            blocks.append("\n".join(keep))
    return blocks


def smoke_command(python: str) -> str:
    """A `posttrain` command on PATH: the real CLI with the small overrides after the README's. A script
    that execs, not a shell function, so `posttrain serve ... &` then `kill %1` stops the server itself."""
    cases = "\n".join(
        f'  {stage}) set -- "$@" {args}{"" if stage == "eval" else " threads=1"};;' for stage, args in SMALL.items()
    )
    return f"""#!/usr/bin/env bash
case " $* " in *" data=rejection "*) set -- "$@" {REJECTION};; esac
case "$1" in
{cases}
esac
exec "{python}" -m posttrain.cli "$@"
"""


PY_PRELUDE = """
import posttrain.api as _api
_run = _api.run_stage
def _small(stage, config=None, **keys):     # the README's keys, then small steps and evaluations
    small = {"steps": 2, "threads": 1, "eval": {"problems": 4, "samples": 2},
             "rollout": {"prompts_per_step": 2, "samples_per_prompt": 4}} if stage == "rl" else {"steps": 2, "threads": 1}
    return _run(stage, config, **{**keys, **small})
_api.run_stage = _small
"""


def python_blocks(text: str) -> list[str]:
    return [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S)]


def test_every_readme_shell_block_runs(tmp_path, hub_home):
    repo = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, repo / f)
    bin_dir = tmp_path / "bin"  # `python` in a README line is this interpreter (CI's fresh venv)
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    py = str(bin_dir / "python")  # run from the copy's root: `-m posttrain.cli` is the copy's package
    (bin_dir / "posttrain").write_text(smoke_command(py))
    (bin_dir / "posttrain").chmod(0o755)
    env = {
        **os.environ,
        "POSTTRAIN_CACHE": str(tmp_path / "cache"),
        "OMP_NUM_THREADS": "1",
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HF_HOME": str(hub_home),  # the GPU quickstart's hub ids: a reduced Qwen2.5 and GSM8K-shaped rows
        "HF_HUB_OFFLINE": "1",  # (tests/hub_util.py), read from the cache as after a first fetch
    }
    env.pop("HF_HUB_CACHE", None)
    readme = (repo / "README.md").read_text()
    blocks = shell_blocks(readme)
    assert len(blocks) >= 4
    for i, block in enumerate(blocks):
        script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + block + "\n"
        p = subprocess.run(["bash", "-c", script], cwd=repo, env=env, capture_output=True, text=True, timeout=1800)
        assert p.returncode == 0, f"README block {i} failed:\n{block}\n--- stderr ---\n{p.stderr[-3000:]}"
    for i, block in enumerate(python_blocks(readme)):  # after the shell blocks: their runs exist
        p = subprocess.run(
            [py, "-c", PY_PRELUDE + block], cwd=repo, env=env, capture_output=True, text=True, timeout=1800
        )
        assert p.returncode == 0, f"README python block {i} failed:\n{block}\n--- stderr ---\n{p.stderr[-3000:]}"
