"""Issue 33's measurements on a GPU, side by side in one run of ~7 minutes: what a session with a GPU runs once.

    PYTHONPATH=$PWD python benchmarks/gpu_part2.py --out $OUT          # GPU machine, repo root (run timeout_s=480)
    PYTHONPATH=$PWD python benchmarks/gpu_part2.py --tiny --device cpu --out /tmp/g2   # a check of the script

"before" is THIS code with issue 33's features turned off (optim.packing off, dense attention,
optim.compile off, rollout.cuda_graphs off), not the commit before the issue: the decode loop's
read-back window and row buckets (the graph-ready loop) stay on in both. Every part is
`posttrain bench step` at qwen2.5-0.5b's shape (Qwen2ForCausalLM, random init), 32 prompts × 8 samples
× 256 new tokens with `--length-spread` (stop ids that end answers at ~0.43 of the cap on average,
so the padding packing removes shows up), in its own subprocess with its own timeout; a crash or a
timeout loses that part only. DIR/gpu_part2.json is rewritten after every part, the logs are
DIR/gpu_part2_<part>.log and each bench's whole JSON is DIR/bench_step_<part>.json. Parts, most
important first (the budget cuts from the end):
  before      features off, 3 steps (the first a warm-up), the engine alone at 64 and 256 rows
              (`--no-generate`: transformers `generate` does not depend on these features, and its
              ~50 s are spent once, in `after`)
  after       packing on, attention auto (flex on CUDA), rollout.cuda_graphs on, optim.compile on;
              4 steps: the first absorbs torch.compile of the 24-layer trunk (~1-2 min on the GPU,
              inductor's cache in /tmp then serves the later parts); rollout vs `generate` at 64 and 256
  gpu_tests   `pytest -q -m gpu -p no:cacheprovider` on the decode loop, packing, flex, the CUDA path,
              bench step and compile test files (those that exist): counts and failures' names
  async       the after settings with `--async` (scale.async, staleness 1: step s+1's rollout beside
              step s's update on the one GPU), 3 steps, no rollout rows
  no_compile  the after settings with optim.compile off       } single toggles: what each feature
  no_packing  the after settings with optim.packing off       } is worth inside the after step
  varlen      the after settings with --attention varlen (torch's Flash Attention varlen kernel in
              place of flex), 4 steps (its own compile first), no rollout rows: `varlen_over_after`
              (> 1 = flex pays) and the reference and train seconds of both, which auto's default
              waits on
`acceptance` compares `after` with issue 33's goals (step ≤ 2.5 s; rollout ≥ 60,000 tokens/s and
≥ 10× `generate` at 256 rows) and gives the before → after speedups per role, the floor fractions,
peak memory, computed ÷ real tokens, the sampler/trainer mismatch and whether every GPU test passed.

Time on one H100, estimated here from part 1 (shared/gpu: a 0.5B step 11.2 s, rollout 15.4k tok/s
at 256 rows, `generate` 590 and 2,796 tok/s at 64 and 256 rows); the JSON records each part's real
wall time next to it. A part's timeout is the smaller of its own and the budget left (`--budget`,
420 s); a part with less than MIN_START_S left is skipped, said in the JSON. On the estimates
(ESTIMATE_S, ~735 s in all) before + after + gpu_tests (~400 s) fit the default budget and async,
the toggles and varlen are likely cut; `--budget 540` under a run of timeout_s=600 reaches further but
leaves no device time for a second try; `--parts after,varlen` (~360 s) sets the two packed-row kernels
side by side alone. If compile fails or outlasts its part, `no_compile` is after without it.
The varlen part is CUDA-only (refused on a CPU as any run refuses it: --tiny's varlen exits 2 at its run's start).

--tiny: tiny-qwen2 (2 prompts × 4 samples × 12 tokens, rows 2 and 4, threads 1), the same parts and
flags (compile on, on the CPU too): every part's plumbing in ~5 minutes on one CPU thread (311 s here at
7b9ef7f, 2 shared cores; the CPU compile is 2 minutes of it), no GPU numbers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from posttrain.bench import load_script

ROOT = Path(__file__).resolve().parents[1]
P1 = load_script(Path(__file__).resolve().parent / "gpu_part1.py", "posttrain_bench_gpu_part1")
PARTS = ("before", "after", "gpu_tests", "async", "no_compile", "no_packing", "varlen")
# H100 seconds, from part 1: each bench process starts (imports, a 0.5B random init written as fp32
# safetensors, a BPE trained, peaks measured) in ~25 s; a before step ~9-11 s (11.2 s at the cap, fewer
# trained tokens with the spread); the engine alone at 64 + 256 rows ~11 s (2,464 and 15,372 tok/s);
# torch.compile of the trunk 60-120 s cold, ~30 s from inductor's cache; `generate` at 64 + 256 rows
# ~55 s (590 and 2,796 tok/s); the GPU tests are tiny models (flex's compile the longest).
# varlen: a start, its trunk compiled again (a new kernel in the graph; ~30-120 s), 4 steps
ESTIMATE_S = {
    "before": 80,
    "after": 230,
    "gpu_tests": 90,
    "async": 80,
    "no_compile": 45,
    "no_packing": 80,
    "varlen": 130,
}
TIMEOUTS = {
    "before": 150,
    "after": 280,
    "gpu_tests": 150,
    "async": 150,
    "no_compile": 100,
    "no_packing": 130,
    "varlen": 200,
}
MIN_START_S = 40  # a part is not started with less budget left than this
GPU_TESTS = (
    "test_decode_loop",
    "test_decode_state",
    "test_packing",
    "test_packing_flex",
    "test_packing_varlen",
    "test_gpu",
    "test_bench_step",
    "test_compiled",
)
OFF = ["--attention", "dense", "--compile", "false", "--no-graphs"]  # optim.packing off: no --packing
ON = ["--packing", "--attention", "auto", "--compile", "true", "--graphs"]
GOALS = {"step_s_max": 2.5, "rollout_tokens_per_s_min": 60_000, "generate_ratio_min": 10.0}
BEFORE_IS = (
    "this code with issue 33's features off (optim.packing=false, optim.packing_attention=dense, "
    "optim.compile=false, rollout.cuda_graphs=false), not the pre-issue commit; the decode loop's "
    "read-back window and row buckets stay on in both"
)


def bench_cmd(name: str, a, json_path: Path) -> list[str]:
    """`posttrain bench step` for a bench part: the size, then the part's features."""
    if a.tiny:
        size = ["--shape", "tiny-qwen2", "--prompts", "2", "--samples", "4", "--new-tokens", "12"]
        size += ["--prompt-len", "16", "--threads", "1"]
        rows = "2,4"
    else:
        size = ["--shape", "qwen2.5-0.5b", "--prompts", "32", "--samples", "8", "--new-tokens", "256"]
        size += ["--prompt-len", "64"]
        rows = "64,256"
    knobs = {
        "before": [*OFF, "--steps", "3", "--rows", rows, "--no-generate"],
        "after": [*ON, "--steps", "4", "--rows", rows],
        "async": [*ON, "--async", "--steps", "3", "--rows", ""],
        "no_compile": [*ON[:3], "--compile", "false", "--graphs", "--steps", "3", "--rows", ""],
        "no_packing": [*ON[1:], "--steps", "3", "--rows", ""],
        "varlen": [*ON[:1], "--attention", "varlen", *ON[3:], "--steps", "4", "--rows", ""],
    }[name]
    cmd = [*P1.CLI, "bench", "step", *size, "--length-spread", *knobs, "--device", a.device]
    return [*cmd, "--out", str(json_path)]


def tests_cmd(root: Path = ROOT) -> tuple[list[str], list[str]]:
    """The GPU-marked tests of issue 33's files, and the names of those files that do not exist."""
    files = [f"tests/{n}.py" for n in GPU_TESTS if (root / "tests" / f"{n}.py").exists()]
    missing = [n for n in GPU_TESTS if not (root / "tests" / f"{n}.py").exists()]
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rfE", "--tb=line"]
    return [*cmd, *files], missing


def bench_part(path: Path) -> dict:
    """Part 1's headline numbers of a bench JSON, and what issue 33 reads beside them."""
    out = P1.bench_summary(path)
    if out["json"] is None:
        return out
    r = json.loads(path.read_text())
    out["run"] = r.get("run")
    if "grpo" in r:
        g = r["grpo"]
        out["steps_s"] = [s["time/step_s"] for s in g["steps"]]  # a compile in a timed step shows here
        keep = (
            "length/mean",
            "length/truncated_frac",
            "rollout/graph_replays",
            "rollout/graph_captures",
            "rollout/decode_steps",
        )
        out["timed"] = {k: g["timed"].get(k) for k in (*keep, "train/tokens", "train/padded_tokens")}
    return out


def main(argv=None) -> dict:
    a = P1.parse_parts(P1.script_parser(__doc__, PARTS, 420), argv, PARTS)
    res: dict = {"script": "benchmarks/gpu_part2.py", "tiny": a.tiny, "device": a.device, "before_is": BEFORE_IS}
    res.update(budget_s=a.budget, estimate_s=ESTIMATE_S, machine=P1.machine())

    def run_one(name: str, timeout: float) -> dict:
        if name == "gpu_tests":
            cmd, missing = tests_cmd()
            proc, info = P1.run_part(name, cmd, a, timeout, {"OMP_NUM_THREADS": "1"}, script="gpu_part2")
            part, text = P1.wait_part(proc, info)
            return {**part, **P1.pytest_summary(text), "missing_files": missing}
        path = Path(a.out, f"bench_step_{name}.json")
        proc, info = P1.run_part(name, bench_cmd(name, a, path), a, timeout, script="gpu_part2")
        part, _ = P1.wait_part(proc, info)
        return {**part, **bench_part(path)}

    return P1.drive(a, PARTS, res, acceptance, run_one, TIMEOUTS, MIN_START_S, "gpu_part2")


def _ratio(x, y):
    return x / y if x is not None and y else None


def _rows(part: dict) -> dict:
    return {r["rows"]: r for r in part.get("rollout_vs_generate", {}).get("rows", [])}


def acceptance(res: dict) -> dict:
    """Issue 33's GPU goals against what was measured (None where a part is missing). Rollout goals
    are read at the largest row count measured (256 on the GPU)."""
    b, a, v = res.get("before", {}), res.get("after", {}), res.get("varlen", {})
    roles = ("step", "rollout", "reference", "train")

    def secs(part, role):
        return part.get("step_s") if role == "step" else part.get("split_s", {}).get(f"time/{role}_s")

    rb, ra = _rows(b), _rows(a)
    top = max(ra, default=None)
    at_top = ra.get(top, {})
    tokens_per_s = {
        n: {k: r.get(n, {}).get("engine_tokens_per_s") for k, r in (("before", rb), ("after", ra))}
        for n in sorted({*rb, *ra})
    }
    step_after, rollout_top, gen_ratio = a.get("step_s"), at_top.get("engine_tokens_per_s"), at_top.get("ratio")
    tests = res.get("gpu_tests", {})
    counts = tests.get("counts")
    both = (("before", b), ("after", a))
    out = {
        "before_is": BEFORE_IS,
        "goals": GOALS,
        "step_s": {k: secs(p, "step") for k, p in both},
        "step_goal_met": step_after <= GOALS["step_s_max"] if step_after is not None else None,
        "split_s": {k: {r: secs(p, r) for r in roles[1:]} for k, p in both},
        "speedup": {r: _ratio(secs(b, r), secs(a, r)) for r in roles},
        "rollout_rows": top,
        "rollout_tokens_per_s": tokens_per_s,
        "rollout_goal_met": rollout_top >= GOALS["rollout_tokens_per_s_min"] if rollout_top is not None else None,
        "generate_ratio": gen_ratio,
        "generate_goal_met": gen_ratio >= GOALS["generate_ratio_min"] if gen_ratio is not None else None,
        "floor_fraction": {k: p.get("fraction", {}).get("step") for k, p in both},
        "peak_gib": {k: p.get("memory") for k, p in both},
        "computed_over_real": {k: p.get("computed_over_real") for k, p in both},
        "lengths": {
            k: {m: p.get("timed", {}).get(m) for m in ("length/mean", "length/truncated_frac")} for k, p in both
        },
        "mismatch_logprob_abs": {k: p.get("mismatch_logprob_abs") for k, p in both},
        "gpu_tests_all_passed": (
            not counts.get("failed") and not counts.get("errors") and counts.get("passed", 0) > 0 if counts else None
        ),
        "gpu_tests_counts": counts,
        "async_step_s": res.get("async", {}).get("step_s"),
        "async_speedup_over_after": _ratio(step_after, res.get("async", {}).get("step_s")),
        # a toggle's step over the after step: what turning that one feature off costs (> 1 = it pays)
        "toggle_over_after": {
            t: _ratio(res.get(t, {}).get("step_s"), step_after) for t in ("no_compile", "no_packing")
        },
        # the packed rows' kernels side by side: auto (flex) in `after`, varlen in `varlen`
        "varlen_over_after": _ratio(v.get("step_s"), step_after),
        "varlen_split_s": {
            k: {r: secs(p, r) for r in ("reference", "train")} for k, p in (("after", a), ("varlen", v))
        },
    }
    return out


if __name__ == "__main__":
    main()
