"""optim.compile: what torch.compile of the trainer's and the reference's forward costs and buys
(issue 33 part 2), eager and each compile scope side by side in one run.

    python benchmarks/compile.py [--shape nano] [--layers 0] [--scopes trunk,blocks] [--device auto]
                                 [--threads 1] [--prompts 4] [--samples 4] [--max-answer 48] [--steps 6]
                                 [--out benchmarks/results/compile_regions.json]

`--shape`: a gpt_mini preset (nano, micro, mini) or a Hugging Face shape of `posttrain bench step`
(bench/hf_shapes.py: qwen2.5-0.5b, tiny-llama, …; random weights written to a temporary directory);
`--layers N` gives it N layers (0: the shape's own), since the scopes differ in how the compile grows
with depth. `--scopes`: the `optim.compile_scope` values to compile (framework/compiled.py: trunk,
the whole trunk as one graph; blocks, the repeated decoder block, every layer reusing its graph).
Each step is the RL step's two forwards: the reference's scores (`Reference.score`, no gradient)
and the trainer's GRPO step (`Trainer.step`: forward, backward, AdamW at lr 0, so every step
does the same work on the same weights), on a batch of `--prompts` × `--samples` sequences whose
prompt (20-40 tokens) and answer (4 to `--max-answer` tokens) lengths are drawn anew every step,
so the micro-batches' widths change from step to step as in a run. Eager and compiled models
are copies of one model and take the same batches; after each one's first step they alternate
step by step, so the load of the machine falls on all alike.

Reported, for eager and each scope: the first step (with the compile), the steady step (the
mean of the others) and its split (reference, train); for each scope the compile's cost, its
first step's excess over the eager first step; and the break-even step, that cost ÷ (eager steady
− compiled steady): the step after which a run with compile on has spent less time, or "never"
when the compiled step is not faster; the graphs dynamo compiled for it over the run (their
bound: framework/compiled.py) and the largest |Δ loss| from eager (exactness: ≤1e-5 in fp32).
JSON: the bench header (threads, torch, cpu_count, load before and after), shape, layers, device,
gpu, compute_dtype, run, inductor_cache, widths, eager, and per scope (trunk, blocks) its summary
with compile_s, speedup, break_even_step, graphs, max_loss_diff. Inductor's cache is a fresh
directory for each scope (and its in-memory caches cleared) unless `--cache-dir` names one: a cold
compile, what a run pays on a machine that has not compiled these graphs before (a rerun with a
warm cache compiles faster; on the CPU's C++ several times faster); blocks compile first, so what
the scopes could still share in-process favours the trunk.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_model(shape: str, vocab: int, work: Path, device, layers: int = 0):
    """A gpt_mini preset, or a random-weight Hugging Face model of a `bench step` shape, with
    `layers` layers (0: the shape's own)."""
    from posttrain.models.gpt_mini import PRESETS, ModelConfig, build_model

    if shape in PRESETS:
        torch.manual_seed(0)
        return build_model(ModelConfig(preset=shape, max_seq_len=512, n_layers=layers), vocab).to(device)
    from posttrain.bench.hf_shapes import shape_of, write_shape
    from posttrain.models.hf import load_hf

    s = shape_of(shape)
    if layers:
        s = dataclasses.replace(s, dims=dataclasses.replace(s.dims, layers=layers))
    return load_hf(write_shape(work / "model", s), device=device)[0]


def make_batch(prompts: int, samples: int, max_answer: int, vocab: int, seed: int):
    """A GRPO batch: `samples` answers of 4..max_answer tokens to each of `prompts` prompts of 20-40
    tokens, random behaviour logprobs and advantages (lengths drawn per step: widths vary)."""
    from posttrain.framework.batch import RolloutBatch, collate

    g = torch.Generator().manual_seed(seed)

    def draw(lo, hi):
        return torch.randint(3, vocab, (int(torch.randint(lo, hi + 1, (1,), generator=g)),), generator=g).tolist()

    ps = [draw(20, 40) for _ in range(prompts)]
    rows = collate([p for p in ps for _ in range(samples)], [draw(4, max_answer) for _ in ps * samples], 0)
    mask = rows["loss_mask"]  # [B, T]
    old = -torch.rand(mask.shape, generator=g) * 3 * mask
    adv = torch.randn(len(mask), 1, generator=g) * mask
    return RolloutBatch(**rows, old_logprobs=old, advantages=adv)


def one_step(side: dict, batch, device) -> dict:
    """The reference's scores and the trainer's step on `batch`: seconds of each, and the loss."""
    from posttrain.bench.step import sync
    from posttrain.framework.batch import to_device

    batch = to_device(batch, device)
    sync(device)
    t0 = time.perf_counter()
    ref = side["ref"].score(batch)  # [B, T]
    sync(device)
    t1 = time.perf_counter()
    m = side["trainer"].step(dataclasses.replace(batch, ref_logprobs=ref), side["loss_fn"])
    sync(device)
    t2 = time.perf_counter()
    return {"reference_s": t1 - t0, "train_s": t2 - t1, "step_s": t2 - t0, "loss": m["loss"]}


def summary(steps: list[dict]) -> dict:
    rest = steps[1:]
    mean = {k: sum(s[k] for s in rest) / len(rest) for k in ("reference_s", "train_s", "step_s")}
    return {"first_step_s": steps[0]["step_s"], "steady": mean, "steps": steps}


def run(a) -> dict:
    from posttrain import algorithms, runtime
    from posttrain.bench import finish, run_header
    from posttrain.config import OptimConfig
    from posttrain.framework.compiled import SCOPES, blocks_of, graphs
    from posttrain.framework.reference import Reference
    from posttrain.framework.trainer import Trainer, policy_loss_fn

    if a.steps < 2:
        raise SystemExit("--steps must be at least 2 (a first step and a steady one)")
    scopes = [s for s in a.scopes.split(",") if s]
    if not scopes or any(s not in SCOPES for s in scopes):
        raise SystemExit(f"--scopes {a.scopes!r}: a comma list of {', '.join(SCOPES)}")
    rt = runtime.resolve(a.device, "auto", a.threads)
    dev = str(rt.device)
    result = run_header(
        "compile",
        torch.get_num_threads(),
        shape=a.shape,
        layers=a.layers,
        device=dev,
        gpu=torch.cuda.get_device_name(rt.device) if dev.startswith("cuda") else None,
        compute_dtype=str(rt.compute_dtype).removeprefix("torch."),
        run={k: getattr(a, k) for k in ("prompts", "samples", "max_answer", "steps", "micro_batch_tokens")},
        inductor_cache="cold, fresh for each scope" if not a.cache_dir else a.cache_dir,
    )
    algo = algorithms.get("grpo")
    with tempfile.TemporaryDirectory(prefix="posttrain-bench-compile-") as tmp:
        model = make_model(a.shape, a.vocab, Path(tmp), rt.device, a.layers)
        result["layers"] = len(blocks_of(model))
        vocab = int(model.head.weight.shape[0])
        sides = {}
        for name in ("eager", *sorted(scopes)):  # blocks before trunk: see the docstring
            policy = copy.deepcopy(model).train()
            on, scope = name != "eager", name if name != "eager" else "blocks"
            cfg = OptimConfig(lr=0.0, micro_batch_tokens=a.micro_batch_tokens, compile=on, compile_scope=scope)
            sides[name] = {
                "trainer": Trainer(policy, cfg, a.steps, rt),
                "ref": Reference(policy, 1.0, rt, compile=scope if on else ""),
                "loss_fn": policy_loss_fn(algo, algo.Config(kl_coef=0.04), 1.0),
                "steps": [],
                "graphs": 0,
            }
        batches = [make_batch(a.prompts, a.samples, a.max_answer, min(vocab, 1000), s) for s in range(a.steps)]
        result["widths"] = [int(b.input_ids.shape[1]) for b in batches]
        for i, batch in enumerate(batches):
            for name, side in sides.items():
                if i == 0 and name != "eager" and not a.cache_dir:
                    cold_cache(Path(tmp) / f"inductor-{name}")
                g0 = graphs()
                side["steps"].append(one_step(side, batch, rt.device))
                side["graphs"] += graphs() - g0
            print(
                f"step {i}: " + ", ".join(f"{n} {s['steps'][-1]['step_s']:.3f} s" for n, s in sides.items()), flush=True
            )
    result["eager"] = e = summary(sides["eager"]["steps"])
    for name in scopes:
        result[name] = c = summary(sides[name]["steps"])
        c["compile_s"] = compile_s = c["first_step_s"] - e["first_step_s"]
        gain = e["steady"]["step_s"] - c["steady"]["step_s"]
        c["speedup"] = e["steady"]["step_s"] / c["steady"]["step_s"]
        c["break_even_step"] = be = compile_s / gain if gain > 0 else "never"
        c["graphs"] = sides[name]["graphs"]
        c["max_loss_diff"] = max(abs(x["loss"] - y["loss"]) for x, y in zip(e["steps"], c["steps"]))
        print(
            f"[bench compile] {a.shape} ({result['layers']} layers) on {dev}, {name}: compile {compile_s:.1f} s "
            f"({c['graphs']} graphs); steady step eager {e['steady']['step_s'] * 1000:.0f} ms, {name} "
            f"{c['steady']['step_s'] * 1000:.0f} ms ({c['speedup']:.2f}x); break-even step: "
            f"{be if isinstance(be, str) else f'{be:.0f}'}",
            flush=True,
        )
    return finish(result, a.out)


def cold_cache(directory: Path) -> None:
    """A fresh inductor cache (read when inductor next compiles) and its in-memory caches cleared:
    each scope compiles cold, whatever the one before it compiled."""
    from torch._inductor.utils import clear_caches

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
    clear_caches()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="nano", help="gpt_mini preset or bench/hf_shapes.py name")
    ap.add_argument("--layers", type=int, default=0, help="the shape's layers (0: its own)")
    ap.add_argument("--scopes", default="trunk,blocks", help="optim.compile_scope values, comma-separated")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-answer", type=int, default=48)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--micro-batch-tokens", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=64, help="gpt_mini's vocabulary (HF shapes bring their own)")
    ap.add_argument("--cache-dir", default="", help="inductor's cache; default: a fresh one (a cold compile)")
    ap.add_argument("--out", default="benchmarks/results/compile_regions.json")
    a = ap.parse_args(argv)
    if a.cache_dir:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = a.cache_dir  # read when inductor first compiles
    return run(a)


if __name__ == "__main__":
    main()
