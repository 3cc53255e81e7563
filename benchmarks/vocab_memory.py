"""Peak memory of GRPO steps at a real vocabulary on a CPU, before and after logits in token chunks
(issue 31), and the predicted peak against the measured one.

    python benchmarks/vocab_memory.py [--before DIR] [--out benchmarks/results/vocab_memory.json]

The model: a random Hugging Face Llama with a tiny body (hidden 256, 2 layers, 8 heads, MLP 688)
and Qwen2.5's vocabulary, 151,936 (models/hf.write_tiny: the character tokenizer, untied head;
79.4M parameters, nearly all of them the embedding and the head). The run: two GRPO steps of 4
prompts × 4 samples × 128 new tokens (`rollout.max_new_tokens`), reference on, fp32, one thread,
held-out evaluation of 4 problems at the start and the end.

Each run is a fresh process (`posttrain.recipes.rl.run` from the code under test) that reports its
peak resident set size (ru_maxrss: the interpreter, torch and transformers included). `--before`
names a checkout of the code to compare with, run the same way (e.g. main at 7de35f4:
`git -C REPO archive 7de35f4 | tar -x -C DIR`). The run of this checkout also wrote its predicted
peak at start (RUN_DIR/memory.json, sizing/run_memory.py) and logged `memory/peak_gib`: both go
in the JSON. A second run with the character vocabulary (the same body, 92 entries) checks the
prediction where the logits are small. Children run with MALLOC_MMAP_THRESHOLD_=65536 so RSS
follows live memory (benchmarks/lora_memory.py says why). One child at a time: the "before" run
peaks near 11 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from posttrain.bench import finish, run_header  # noqa: E402
from posttrain.models.hf import write_tiny  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BODY = dict(arch="llama", d_model=256, n_layers=2, n_heads=8, n_kv_heads=8, d_ff=688, max_len=256)
RUN = [
    "steps=2",
    "rollout.prompts_per_step=4",
    "rollout.samples_per_prompt=4",
    "rollout.max_new_tokens=128",
    "eval.problems=4",
    "eval.samples=1",
    "threads=1",
    "device=cpu",
    "overwrite=true",
]
CHILD = r"""
import json, resource, sys
from posttrain.config import RLConfig, load_config
from posttrain.recipes import rl
summary = rl.run(load_config(RLConfig, None, sys.argv[1:]))
print("RESULT " + json.dumps({"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
      "mismatch/logprob_abs": summary.get("mismatch/logprob_abs"), "entropy": summary.get("entropy"),
      "time/step_s": summary.get("time/step_s")}))
"""


def child(code: Path, args: list[str]) -> dict:
    """One run of `code`'s rl stage in a fresh process: its peak RSS and a few of its numbers."""
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=env, cwd=code)
    if out.returncode:
        raise RuntimeError(f"{code}: the run failed:\n{out.stderr[-3000:]}")
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    res = json.loads(line[len("RESULT ") :])
    res["peak_rss_gib"] = res["peak_rss_bytes"] / 2**30
    return res


def against_prediction(res: dict, run_dir: Path) -> dict:
    """The measured peak beside what the run predicted at its start (RUN_DIR/memory.json)."""
    est = json.loads((run_dir / "memory.json").read_text())
    peaks = [json.loads(x).get("memory/peak_gib", 0.0) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    res["predicted_gib"] = est["peak_gib"]
    res["predicted_phases_gib"] = {k: v / 2**30 for k, v in est["phases"].items()}
    res["memory/peak_gib"] = max(peaks)
    res["predicted_over_measured"] = est["peak_gib"] / res["peak_rss_gib"]
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="a checkout of the code to compare with (e.g. main at 7de35f4)")
    ap.add_argument("--out", default="benchmarks/results/vocab_memory.json")
    args = ap.parse_args(argv)
    res = run_header("vocab_memory", 1, body=BODY, run=RUN)
    with tempfile.TemporaryDirectory() as tmp:
        for name, vocab in (("vocab_151936", 151936), ("vocab_chars", 0)):
            model = write_tiny(Path(tmp, name), **BODY, vocab_size=vocab)
            row = res[name] = {"vocab": json.loads((model / "config.json").read_text())["vocab_size"]}
            if args.before and vocab:
                row["before"] = child(Path(args.before).resolve(), [f"init={model}", f"out={tmp}/b_{name}", *RUN])
                print(name, "before", row["before"], flush=True)
            after = child(ROOT, [f"init={model}", f"out={tmp}/a_{name}", *RUN])
            row["after"] = against_prediction(after, Path(tmp, f"a_{name}"))
            print(name, "after", row["after"], flush=True)
            if "before" in row:
                row["peak_rss_before_over_after"] = row["before"]["peak_rss_bytes"] / after["peak_rss_bytes"]
    return finish(res, args.out)


if __name__ == "__main__":
    main()
