"""GRPO steps at a real model's shape, against the hardware's floor; the rollout against `generate`.

    posttrain bench step [--shape qwen2.5-0.5b] [--arch native|llama] [--prompts 32] [--samples 8]
                         [--new-tokens 256] [--steps 3] [--rows 64,256] [--device auto] [--packing]
                         [--attention auto|dense|flex|varlen] [--compile false|true|auto] [--no-graphs] [--async]
                         [--length-spread] [--no-generate] [--profile] [--out FILE.json]

A randomly initialised model of a named shape (bench/hf_shapes.py: qwen2.5-0.5b, qwen3-0.6b,
llama-3.2-1b and tiny-* for tests; `--arch llama` = the same dimensions as a LlamaForCausalLM)
is written to a temporary directory. Then:

1. **GRPO steps through the library** (`posttrain.rl`, as a user runs it): rows of made-up words
   about `--prompt-len` tokens long with the chat template, a reward that varies inside a group
   (so the loss has signal), the default GRPO (reference on), `--steps` steps (0 = skip this
   part and the floor), no evaluation. Issue 33's knobs, as config keys of that run: `--packing`
   (optim.packing) with `--attention` (optim.packing_attention), `--compile` (optim.compile; its
   compile lands in the warm-up step), `--no-graphs` (rollout.cuda_graphs=false: eager decode
   steps), `--async` (scale.async, default staleness 1: the rollout of step s+1 beside the update
   of s, on the same device). `--length-spread` adds stop ids (rollout.stop_token_ids,
   hf_shapes.spread_stops) so that the random model's answers end at ~0.43 of the cap on average
   instead of all at the cap: the padding that packing removes then shows in the trainer's
   computed ÷ real tokens (`train/padded_tokens` ÷ `train/tokens`).
   The first step warms up (kernels, allocator) and is left out of the timed mean when there
   are more. `--profile` runs one step more, under torch.profiler, left out of the mean too: its
   top ops and kernels by time for each phase (rollout, reference, train, …: bench/profile.py),
   printed and in the JSON. Peak memory over the run: CUDA's allocator counters (allocated and reserved); on
   CPU the process's peak resident set, reset just before the run (bench/__init__.py).
2. **The floor** of the mean timed step (bench/floor.py): FLOP (train 6·N, reference and prefill
   2·N per token, decode 2·N per generated token) and decode bytes (the weights in the compute
   dtype and the KV cache, every decode step), their seconds at `--peak-tflops` / `--peak-gbs`
   and the fraction of each the step reached. Peaks: on CUDA 800 TFLOP/s and 3,000 GB/s, what a
   large bf16 matmul and a stream of reads reach on an H100 (issue 33's floor; the datasheet says
   989 and 3,350), with the card's own measured matmul (bf16, n = 8192) and copy rates recorded
   beside them; on CPU the measured fp32 matmul peak and copy bandwidth on the run's threads.
3. **Rollout against transformers `generate`** on the same weights (HF's copy in the compute
   dtype) at each `--rows` count: random prompts of `--prompt-len` tokens, one sample each,
   exactly `--new-tokens` tokens (ours `ignore_eos`, HF `min_new_tokens`), one timed run after
   a warm-up; tokens/s, the ratio, and each one's fraction of the FLOP peak (2·N per token). The
   engine's timed call follows a first call of the same shape (other prompts), timed apart: the
   first captures the CUDA graphs that every later call replays, as a run's rollouts do from the
   second on (framework/decode_state.py).
   `--no-generate` times the engine alone (its decode steps captured unless `--no-graphs`).

JSON (`--out`, rewritten after each part, so a crash keeps what ran): the header of every bench
(threads, torch, cpu_count, load), then
  shape, arch, device, gpu, compute_dtype, transformers
  model        {class, hidden, layers, heads, kv_heads, head_dim, intermediate, vocab, tied, params,
                weight_bytes (a parameter in the compute dtype), kv_bytes (a cached position, K and V)}
  run          {prompts, samples, new_tokens, prompt_len, steps, packing, attention, compile, graphs,
                async_, generate, length_spread: null | {count, p_stop, expected_mean_tokens,
                expected_truncated_frac, rule}}
  peak         {tflops, gbs, source ("default" | "measured" | "given"), measured: {matmul_tflops, copy_gbs}}
  grpo         {wall_s, steps: [{step, time/*, rollout/*, train/*, ...}], timed_steps,
                timed (mean of those steps' metrics), throughput {step_tokens_per_s, samples_per_s,
                rollout_tokens_per_s, train_tokens_per_s}, computed_over_real, memory {peak_allocated_gib,
                peak_reserved_gib | peak_rss_gib}, predicted_peak_gib, predicted_note, profile (--profile:
                {step, activities, sort_by, phases: {phase: {wall_ms, self_cpu_ms, self_device_ms, op_calls,
                kernel_calls, ops: [{name, calls, self_cpu_ms, self_device_ms}], kernels: [{name, calls,
                device_ms}]}}})}
  floor        step_floor(params, grpo.timed, ...): {tokens, flop, bytes, floor_s, fraction}
  rollout_vs_generate  {rows: [{rows, new_tokens, prompt_len, tokens, engine_first_s, engine_first_captures,
                engine_captures, engine_replays (CUDA graphs of the first and the timed call), engine_s, engine_tokens_per_s,
                engine_flop_frac, hf_s, hf_tokens_per_s, hf_flop_frac, ratio (hf_* and ratio: not with
                --no-generate)}], fast_decode, graphs, generate, memory (the peak of this part: both
                models, their caches)}
Numbers only, no claims: speed lives in these JSON files, never in the tests, which check the
structure and the arithmetic on tiny shapes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from posttrain import api, runtime
from posttrain.bench import (
    finish,
    peak_memory,
    reset_peak_memory,
    run_header,
    transformers_version,
    write_json,
)
from posttrain.bench.floor import peaks, step_floor
from posttrain.bench.hf_shapes import ARCHS, SHAPES, shape_of, spread_stops, words, write_shape
from posttrain.bench.profile import format_table, profile_step
from posttrain.bench.rollout import hf_generate
from posttrain.errors import UsageError
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.models import attention
from posttrain.models.hf import HFTokenizer, load_hf
from posttrain.sizing.shapes import kv_bytes_per_token, resolve_model

KEEP = ("time/", "rollout/", "train/", "mismatch/", "memory/", "reward/mean", "kl/ref", "length/", "staleness/")
COMPILE = {"false": False, "true": True, "auto": "auto"}  # --compile: optim.compile's values


def vowel_spread(prompts, completions, **kw) -> list[float]:
    """The benchmark's reward: varies inside a group (vowels mod 11, in tenths), so the loss has signal."""
    return [(sum(ch in "aeiou" for ch in c) % 11) / 10 for c in completions]


def prompt_rows(tok, n: int, prompt_len: int, seed: int) -> list[dict]:
    """`n` dataset rows whose prompt, as the model sees it (chat template applied), is at least
    `prompt_len` tokens: words are added until it is."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        text = words(rng, 1)
        while len(tok.encode(tok.chat_prompt(text))) < prompt_len:
            text += " " + words(rng, 1)
        rows.append({"prompt": text, "answer": "0"})
    return rows


RUN_KEYS = ("prompts", "samples", "new_tokens", "prompt_len", "steps", "packing", "attention", "compile", "graphs")
RUN_KEYS += ("async_", "generate", "profile", "micro_batch_tokens")


def sync(device) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def model_record(init: Path, compute_dtype: torch.dtype) -> dict:
    """The shape as written (config.json), its counted parameters and the bytes the floor reads."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(init, local_files_only=True)
    with torch.device("meta"):  # counted without allocating
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
    weight_bytes = torch.empty((), dtype=compute_dtype).element_size()
    heads = cfg.num_attention_heads
    return {
        "class": cfg.architectures[0] if cfg.architectures else type(cfg).__name__,
        "hidden": cfg.hidden_size,
        "layers": cfg.num_hidden_layers,
        "heads": heads,
        "kv_heads": cfg.num_key_value_heads,
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        "intermediate": cfg.intermediate_size,
        "vocab": cfg.vocab_size,
        "tied": bool(cfg.tie_word_embeddings),
        "params": params,
        "weight_bytes": weight_bytes,
        "kv_bytes": kv_bytes_per_token(resolve_model(str(init / "config.json")), weight_bytes),
    }


def predicted_peak(run_dir: Path) -> tuple[float | None, str]:
    """The run's own predicted peak, GiB (RUN_DIR/memory.json, written at start by every stage:
    sizing/run_memory.predict_run_peak from the run's config and model shape), and what it counts."""
    path = run_dir / "memory.json"
    if not path.exists():
        return None, "the run wrote no memory.json"
    est = json.loads(path.read_text())
    what = "tensors allocated" if est["device"] == "cuda" else "resident set, the process included"
    return est["peak_gib"], f"sizing/run_memory.predict_run_peak ({what}; RUN_DIR/memory.json)"


def grpo_steps(init: Path, rt, work: Path, a) -> dict:
    """`a.steps` GRPO steps through posttrain.rl; per-step metrics, their timed mean, peak memory."""
    from transformers import AutoTokenizer

    tok = HFTokenizer(AutoTokenizer.from_pretrained(init, local_files_only=True))
    rows = prompt_rows(tok, max(64, 2 * a.prompts * a.steps) + 8, a.prompt_len, a.seed)
    profiled = a.steps + 1 if a.profile else 0  # the step under torch.profiler, after the timed ones
    keys = {
        "init": str(init),
        "out": str(work / "run"),
        "steps": max(a.steps, profiled),
        "seed": a.seed,
        "device": str(rt.device),
        "threads": a.threads,
        "eval_every": 0,
        "log_every": 1,
        "tensorboard": False,
        "overwrite": True,
        "eval.problems": 0,
        "eval.save_samples": 0,
        "rollout.prompts_per_step": a.prompts,
        "rollout.samples_per_prompt": a.samples,
        "rollout.max_new_tokens": a.new_tokens,
        "optim.packing": a.packing,
        "optim.packing_attention": a.attention,
        "optim.compile": COMPILE[a.compile],
        "optim.micro_batch_tokens": a.micro_batch_tokens,
        "rollout.cuda_graphs": a.graphs,
        "scale.async": a.async_,
    }
    if a.length_spread:
        keys["rollout.stop_token_ids"] = a.stops["ids"]
    reset_peak_memory(str(rt.device))
    t0 = time.perf_counter()
    profile: dict = {}
    with profile_step(profiled, profile, a.profile_top) if profiled else contextlib.nullcontext():
        run = api.rl(dataset=rows[8:], test_dataset=rows[:8], reward_funcs=[vowel_spread], **keys)
    sync(rt.device)
    wall = time.perf_counter() - t0
    memory = peak_memory(str(rt.device))
    predicted, note = predicted_peak(work / "run")
    steps = [
        {"step": m["step"], **{k: v for k, v in m.items() if k.startswith(KEEP) and isinstance(v, (int, float))}}
        for m in run.metrics
        if 1 <= m.get("step", 0) != profiled and "time/step_s" in m
    ]
    timed = steps[1:] if len(steps) > 1 else steps
    mean = {k: sum(s[k] for s in timed) / len(timed) for k in timed[0] if k != "step" and all(k in s for s in timed)}
    batch_tokens = mean["rollout/prompt_tokens"] + mean["rollout/generated_tokens"]
    trained = mean["train/tokens"] * mean.get("train/optimizer_steps", 1.0)
    computed = mean.get("train/padded_tokens")  # the trainer's computed ÷ real tokens (padding, rows' tails)
    return {
        "wall_s": wall,
        "steps": steps,
        "timed_steps": [s["step"] for s in timed],
        "timed": mean,
        "throughput": {
            "step_tokens_per_s": batch_tokens / mean["time/step_s"],
            "samples_per_s": mean["rollout/samples"] / mean["time/step_s"],
            "rollout_tokens_per_s": mean["rollout/generated_tokens"] / mean["time/rollout_s"],
            "train_tokens_per_s": trained / mean["time/train_s"],
        },
        "computed_over_real": computed / mean["train/tokens"] if computed is not None else None,
        "memory": memory,
        "predicted_peak_gib": predicted,
        "predicted_note": note,
        **({"profile": profile} if profiled else {}),
    }


def rollout_vs_generate(init: Path, rt, rows: list[int], a, params: int, peak_tflops: float) -> dict:
    """Our engine and transformers `generate` on the same weights, one timed run per row count."""
    from transformers import AutoModelForCausalLM

    dev = rt.device
    reset_peak_memory(str(dev))
    model, tok = load_hf(init, dev)
    engine = Engine(model, tok, max_slots=max(rows), runtime=rt)
    engine.capture_decode = a.graphs  # as rollout.cuda_graphs sets it in a run
    hf = None
    if a.generate:
        hf = AutoModelForCausalLM.from_pretrained(
            init, dtype=rt.compute_dtype, attn_implementation="sdpa", local_files_only=True
        ).to(dev)
        hf.eval()
    vocab = model.config.vocab_size
    sampling = SamplingParams(temperature=1.0, max_new_tokens=a.new_tokens, ignore_eos=True)
    rng = random.Random(a.seed)
    warm = [[rng.randrange(2, vocab) for _ in range(a.prompt_len)] for _ in range(min(rows[0], 8))]
    engine.generate(warm, 1, SamplingParams(temperature=1.0, max_new_tokens=8, ignore_eos=True), seed=a.seed)
    if hf is not None:
        hf_generate(hf, warm, 8, tok.pad_id, tok.eot_id)
    out = []
    for n in rows:
        first, prompts = ([[rng.randrange(2, vocab) for _ in range(a.prompt_len)] for _ in range(n)] for _ in "ab")
        tokens = n * a.new_tokens
        # the first call of a shape captures its CUDA graphs, which later calls replay (framework/decode_state.py):
        # timed apart, then the steady call a run makes from its second rollout on
        sync(dev)
        t0 = time.perf_counter()
        engine.generate(first, 1, sampling, seed=a.seed + 1)
        sync(dev)
        t_first, first_captures = time.perf_counter() - t0, engine.stats["rollout/graph_captures"]
        t0 = time.perf_counter()
        samples = engine.generate(prompts, 1, sampling, seed=a.seed)
        sync(dev)
        t_ours = time.perf_counter() - t0
        assert all(len(s.response_ids) == a.new_tokens for s in samples)
        row = {"rows": n, "new_tokens": a.new_tokens, "prompt_len": a.prompt_len, "tokens": tokens}
        st = engine.stats
        row.update(engine_first_s=t_first, engine_first_captures=first_captures, engine_s=t_ours)
        row.update(engine_captures=st["rollout/graph_captures"], engine_replays=st["rollout/graph_replays"])
        row.update(engine_tokens_per_s=tokens / t_ours)
        row["engine_flop_frac"] = 2 * params * tokens / t_ours / (peak_tflops * 1e12)
        said = ""
        if hf is not None:
            t0 = time.perf_counter()
            hf_generate(hf, prompts, a.new_tokens, tok.pad_id, tok.eot_id)
            sync(dev)
            t_hf = time.perf_counter() - t0
            row.update(hf_s=t_hf, hf_tokens_per_s=tokens / t_hf)
            row["ratio"] = row["engine_tokens_per_s"] / row["hf_tokens_per_s"]
            row["hf_flop_frac"] = 2 * params * tokens / t_hf / (peak_tflops * 1e12)
            said = f", transformers generate {row['hf_tokens_per_s']:,.0f} tok/s ({row['ratio']:.2f}×)"
        out.append(row)
        print(
            f"rollout {n} rows × {a.new_tokens} tokens: engine {row['engine_tokens_per_s']:,.0f} tok/s{said}",
            flush=True,
        )
    return {
        "rows": out,
        "fast_decode": engine.decoder() is not None,
        "graphs": a.graphs,
        "generate": a.generate,
        "memory": peak_memory(str(dev)),
    }


def run(a) -> dict:
    rt = runtime.resolve(a.device, "auto", a.threads)  # a device that is not there: UsageError, before any work
    shape = shape_of(a.shape)
    if a.arch not in ARCHS:
        raise UsageError(f"--arch {a.arch!r} is unknown; use {' or '.join(ARCHS)}")
    dev = str(rt.device)
    rows = [int(r) for r in a.rows.split(",") if r.strip()]
    result = run_header(
        "step",
        torch.get_num_threads(),
        shape=shape.name,
        arch=a.arch,
        device=dev,
        gpu=torch.cuda.get_device_name(rt.device) if dev.startswith("cuda") else None,
        compute_dtype=str(rt.compute_dtype).removeprefix("torch."),
        transformers=transformers_version(),
    )
    out = Path(a.out) if a.out else None
    save = (lambda: write_json(out, result)) if out else (lambda: None)
    with tempfile.TemporaryDirectory(prefix="posttrain-bench-step-", dir=a.work or None) as tmp:
        t0 = time.perf_counter()
        init = write_shape(Path(tmp, "model"), shape, a.arch, a.seed)
        result["model"] = model = model_record(init, rt.compute_dtype)
        result["model_write_s"] = time.perf_counter() - t0
        result["run"] = {k.rstrip("_"): getattr(a, k) for k in RUN_KEYS}
        vocab = shape.dims.vocab
        a.stops = spread_stops(vocab, a.new_tokens, a.seed) if a.length_spread else None
        result["run"]["length_spread"] = {k: v for k, v in a.stops.items() if k != "ids"} if a.stops else None
        result["peak"] = peak = peaks(dev, torch.get_num_threads(), a.peak_tflops, a.peak_gbs)
        print(
            f"[bench step] {shape.name} as {model['class']}: {model['params']:,} params on {dev} "
            f"({result['compute_dtype']}); floor at {peak['tflops']:.3g} TFLOP/s, {peak['gbs']:.4g} GB/s ({peak['source']})",
            flush=True,
        )
        save()
        if a.steps:
            result["grpo"] = g = grpo_steps(init, rt, Path(tmp), a)
            result["floor"] = f = step_floor(
                model["params"], g["timed"], model["weight_bytes"], model["kv_bytes"], peak["tflops"], peak["gbs"]
            )
            save()
            _print_step(g, f)
            if "profile" in g:
                print(format_table(g["profile"]), flush=True)
        if rows:
            result["rollout_vs_generate"] = rollout_vs_generate(init, rt, rows, a, model["params"], peak["tflops"])
    return finish(result, out) if out else result


def _print_step(g: dict, f: dict) -> None:
    t, mem = g["timed"], g["memory"]
    split = "  ".join(f"{k[5:-2]} {v:.3f}" for k, v in t.items() if k.startswith("time/") and k != "time/step_s")
    peak = ", ".join(f"{k} {v:.2f}" for k, v in mem.items())
    print(
        f"GRPO step (mean of steps {g['timed_steps']}): {t['time/step_s']:.3f} s  [{split}]\n"
        f"  floor {f['floor_s']['step']:.4f} s = {100 * f['fraction']['step']:.2f}% reached "
        f"(FLOP {f['flop']['total']:.3e}, decode bytes {f['bytes']['total']:.3e}); memory: {peak}",
        flush=True,
    )


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="posttrain bench step", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen2.5-0.5b", help=f"one of {', '.join(SHAPES)}")
    p.add_argument("--arch", default="native", help="native (the shape's family) or llama (its dimensions as a Llama)")
    p.add_argument("--prompts", type=int, default=32, help="prompts per step")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt")
    p.add_argument("--new-tokens", type=int, default=256, help="response cap (and the rollout comparison's length)")
    p.add_argument("--steps", type=int, default=3, help="GRPO steps; the first warms up when there are more (0 = none)")
    p.add_argument("--rows", default="64,256", help="row counts of the rollout vs generate part ('' = skip it)")
    p.add_argument("--prompt-len", type=int, default=64, help="prompt tokens, chat template included")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument(
        "--peak-tflops", type=float, help="the FLOP peak of the floor (default: H100 on CUDA, measured on CPU)"
    )
    p.add_argument("--peak-gbs", type=float, help="the memory bandwidth of the floor, GB/s (same defaults)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--packing", action="store_true", help="packed micro-batches for the trainer and the reference")
    p.add_argument(
        "--attention", default="auto", help="optim.packing_attention: auto | dense | flex | varlen (with --packing)"
    )
    p.add_argument("--compile", default="false", help="optim.compile: false | true | auto (the trunk's torch.compile)")
    p.add_argument(
        "--micro-batch-tokens", default="auto", help="optim.micro_batch_tokens: auto (sized for the device) or a number"
    )
    p.add_argument(
        "--graphs", action=argparse.BooleanOptionalAction, default=True, help="rollout.cuda_graphs (CUDA's decode)"
    )
    p.add_argument("--async", dest="async_", action="store_true", help="scale.async: rollouts one version ahead")
    p.add_argument(
        "--length-spread",
        action="store_true",
        help="stop ids that end answers at ~0.43 of the cap on average (hf_shapes.spread_stops; JSON run.length_spread)",
    )
    p.add_argument(
        "--generate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time transformers generate beside the rollout (--no-generate: the engine alone)",
    )
    p.add_argument(
        "--profile", action="store_true", help="one more step under torch.profiler: top ops and kernels per phase"
    )
    p.add_argument("--profile-top", type=int, default=15, help="ops and kernels kept per phase (--profile)")
    p.add_argument("--work", default="", help="where the temporary model and run go (default: the system's temp)")
    p.add_argument("--out", help="write the results as JSON")
    a = p.parse_args(argv)
    for name in ("prompts", "samples", "new_tokens", "steps", "prompt_len"):
        least = 0 if name == "steps" else 1
        if getattr(a, name) < least:
            raise UsageError(f"--{name.replace('_', '-')} must be at least {least}, got {getattr(a, name)}")
    if a.micro_batch_tokens != "auto":
        if not a.micro_batch_tokens.isdigit() or int(a.micro_batch_tokens) < 1:
            raise UsageError(f"--micro-batch-tokens {a.micro_batch_tokens!r}: auto or a number ≥ 1")
        a.micro_batch_tokens = int(a.micro_batch_tokens)
    if a.compile not in COMPILE:
        raise UsageError(f"--compile {a.compile!r} is unknown; use false, true or auto")
    if a.attention not in attention.KERNELS:
        raise UsageError(f"--attention {a.attention!r} is unknown; use one of {', '.join(attention.KERNELS)}")
    if not a.steps and not a.rows.strip():
        raise UsageError("--steps 0 and --rows '' leave nothing to measure; give steps or row counts")
    return run(a)


if __name__ == "__main__":
    main()
