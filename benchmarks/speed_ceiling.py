"""How fast issue #20's workloads could run on this machine at most: their unavoidable matmuls, timed alone.

    python benchmarks/speed_ceiling.py [--runs 3] [--repeats 5] [--threads 2] [--out benchmarks/results/speed_ceiling.json]

Each workload is reduced to the work no implementation can skip, run back to back on
preallocated operands (`torch.mm`/`torch.bmm` with `out=`): no norms, rotary, SwiGLU,
loss, optimizer, sampling, cache writes, allocation or Python between them. The time that
takes is a lower bound on the workload's time, so every rate derived from it is a ceiling:
a faster engine or trainer in eager PyTorch on this CPU cannot beat it. Each section is
compared with the matmul peak measured just before it, and the whole set runs `--runs` times:
this machine's speed drifts by ±10% within minutes, so the JSON keeps every run and the
range of each number over them.

- **train**: the RL stage's trainer step (train_profile.py's batch: nano, 128 rows, GRPO),
  cut into the trainer's own length-grouped micro-batches. Every projection and the head,
  forward (X·Wᵀ), input gradient (dY·W) and weight gradient (dYᵀ·X), plus attention as six
  batched matmuls per layer (Q·Kᵀ, P·V and their four gradients) counted at half, as a
  causal kernel that skips the masked blocks would. "packed" is the same with no padding:
  the projections on the real tokens only and attention scaled by real ÷ computed tokens.
  Ceiling = 6·N·real tokens ÷ that time ÷ the matmul peak (#20's goal: ≥ 75%).
- **rollout**: `posttrain bench rollout`'s setting (micro, one sample per distinct prompt,
  64 new tokens). Per decode step: every projection and the head at M = batch rows, and
  attention over the KV cache of that step's span (q·Kᵀ, softmax, ·V, the engine's layout;
  each layer its own cache). The engine and transformers `generate` are timed in the same
  run (`posttrain.bench.rollout.run`). Ceilings: tokens/s ÷ generate's (#20: ≥ 2× at 64)
  and the FLOP-limit fraction, 2·N·tokens/s ÷ peak (#20: ≥ 50% at 256).
- **grpo**: `posttrain bench trl`'s 64×16 step (its tiny Llama; tokens per step from the
  given bench trl result): training's projections and attention as above on 64 rows of the
  trained length, plus decoding 64 rows for the generated tokens as in rollout. Ceiling =
  the bench's FLOP floor ÷ that time (#20: ≥ 85%), and TRL's step time in that result ÷ it.
- **pipeline_sampling**: the pipeline's decoding (nano, 256 rows, 8 samples per prompt,
  the task's prompts, 40 new tokens, the mean of the pipeline's responses): the engine
  against the same per-step ceiling as rollout's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from posttrain.bench import best_of, finish, load_script, matmul_peak_gflops, run_header  # noqa: E402
from posttrain.bench import rollout as bench_rollout  # noqa: E402
from posttrain.bench.trl import MODEL  # noqa: E402
from posttrain.config import OptimConfig  # noqa: E402
from posttrain.framework.batch import RolloutBatch, budgets, split_micro_batches  # noqa: E402
from posttrain.framework.rollout import Engine, SamplingParams  # noqa: E402
from posttrain.models.gpt_mini import ModelConfig, build_model  # noqa: E402
from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer  # noqa: E402
from posttrain.tasks.arithmetic import ArithmeticTask  # noqa: E402

HERE = Path(__file__).resolve().parent


def linear_shapes(c, vocab: int) -> list[tuple[int, int]]:
    """(out, in) of every projection of a gpt_mini / plain Llama of config `c`, and the head."""
    hd = c.head_dim
    layer = [
        ((c.n_heads + 2 * c.n_kv_heads) * hd, c.d_model),
        (c.d_model, c.n_heads * hd),
        (2 * c.d_ff, c.d_model),
        (c.d_model, c.d_ff),
    ]
    return layer * c.n_layers + [(vocab, c.d_model)]


def projection_ops(shapes, tokens: int, backward: bool) -> list:
    """The matmuls of `tokens` rows through every projection: forward, and with `backward`
    the input and weight gradients, on preallocated operands."""
    ops = []
    for out_f, in_f in shapes:
        W, X = torch.randn(out_f, in_f), torch.randn(tokens, in_f)
        ops.append((torch.mm, X, W.t(), torch.empty(tokens, out_f)))
        if backward:
            dY = torch.randn(tokens, out_f)
            ops.append((torch.mm, dY, W, torch.empty(tokens, in_f)))
            ops.append((torch.mm, dY.t(), X, torch.empty(out_f, in_f)))
    return ops


def train_attention_ops(c, rows: int, T: int) -> list:
    """Attention of `rows` sequences of T tokens as batched matmuls, forward and backward, all layers."""
    BH, hd = rows * c.n_heads, c.head_dim
    ops = []
    for _ in range(c.n_layers):
        q, k, v, dO = (torch.randn(BH, T, hd) for _ in range(4))
        P, dS = torch.randn(BH, T, T), torch.randn(BH, T, T)
        ops += [
            (torch.bmm, q, k.transpose(1, 2), torch.empty(BH, T, T)),  # scores
            (torch.bmm, P, v, torch.empty(BH, T, hd)),  # output
            (torch.bmm, dO, v.transpose(1, 2), torch.empty(BH, T, T)),  # dP
            (torch.bmm, P.transpose(1, 2), dO, torch.empty(BH, T, hd)),  # dV
            (torch.bmm, dS, k, torch.empty(BH, T, hd)),  # dQ
            (torch.bmm, dS.transpose(1, 2), q, torch.empty(BH, T, hd)),  # dK
        ]
    return ops


def run_ops(ops) -> None:
    for fn, a, b, out in ops:
        fn(a, b, out=out)


def decode_seconds(c, vocab: int, rows: int, spans: list[int], repeats: int) -> dict:
    """Best time of decoding `rows` rows through `spans` (one step per span): the projections
    at M = rows every step, and attention over each layer's own KV cache of that span."""
    lin = projection_ops(linear_shapes(c, vocab), rows, backward=False)
    G, rep, hd, S_max = rows * c.n_kv_heads, c.n_heads // c.n_kv_heads, c.head_dim, max(spans)
    caches = [(torch.randn(G, S_max, hd), torch.randn(G, S_max, hd)) for _ in range(c.n_layers)]
    q, y = torch.randn(G, rep, hd), torch.empty(G, rep, hd)

    def attention():
        for S in spans:
            for K, V in caches:
                torch.bmm(torch.bmm(q, K[:, :S].transpose(1, 2)).softmax(-1), V[:, :S], out=y)

    return {
        "projections_s": best_of(lambda: [run_ops(lin) for _ in spans], repeats, warmup=True),
        "attention_s": best_of(attention, repeats, warmup=True),
    }


def _train_profile():
    """benchmarks/train_profile.py, loaded by path (this folder is not put on sys.path)."""
    return load_script(HERE / "train_profile.py", "posttrain_bench_train_profile")


def train_ceiling(peak: float, repeats: int) -> dict:
    tp = _train_profile()
    step, params, real = tp.setup()
    step_s = best_of(step, repeats, warmup=True)
    tok = CharTokenizer(BASE_CHARS)
    batch = RolloutBatch(**load_script(HERE / "ab_refs.py", "posttrain_bench_ab_refs").rl_batch(tok))
    shapes = [
        tuple(mb.attention_mask.shape)
        for mb in split_micro_batches(batch, budgets(OptimConfig().micro_batch_tokens).train)
    ]
    c = ModelConfig(preset="nano").resolved(tok.vocab_size)
    lin = linear_shapes(c, tok.vocab_size)
    computed = sum(b * T for b, T in shapes)
    proj = [projection_ops(lin, b * T, backward=True) for b, T in shapes]
    att = [train_attention_ops(c, b, T) for b, T in shapes]
    proj_s = best_of(lambda: [run_ops(o) for o in proj], repeats, warmup=True)
    att_s = best_of(lambda: [run_ops(o) for o in att], repeats, warmup=True) / 2  # causal: half the blocks
    packed = projection_ops(lin, int(real), backward=True)
    packed_s = best_of(lambda: run_ops(packed), repeats, warmup=True) + att_s * real / computed
    flops = 6 * params * real
    return train_result(step_s, proj_s, att_s, packed_s, flops, peak, real=real, computed=computed, shapes=shapes)


def train_result(step_s, proj_s, att_s, packed_s, flops, peak, **info) -> dict:
    """Real-token fractions of the matmul peak (`peak` in FLOP/s): the measured step's and the ceilings'."""
    return {
        **info,
        "step_s": step_s,
        "projections_s": proj_s,
        "attention_half_s": att_s,
        "packed_s": packed_s,
        "real_token_peak_frac": flops / step_s / peak,
        "ceiling_real_token_peak_frac": flops / (proj_s + att_s) / peak,
        "ceiling_packed_real_token_peak_frac": flops / packed_s / peak,
    }


def rollout_ceiling(peak: float, threads: int, repeats: int) -> dict:
    measured = bench_rollout.run(batches=(64, 256), repeats=repeats, threads=threads)
    tok, task = CharTokenizer(BASE_CHARS), ArithmeticTask()
    c = ModelConfig(preset=measured["preset"]).resolved(tok.vocab_size)
    new = measured["new_tokens"]
    rows = []
    for row in measured["rows"]:
        B = row["batch"]
        prompt = sum(len(tok.encode(tok.chat_prompt(task.prompt(i)))) for i in task.items(B, seed=0)) // B
        t = decode_seconds(c, tok.vocab_size, B, [prompt + i for i in range(1, new + 1)], repeats)
        rows.append(rollout_row(row, t, measured["params"], peak, prompt=prompt))
    return {"preset": measured["preset"], "new_tokens": new, "bench_rollout": measured, "rows": rows}


def rollout_row(row: dict, t: dict, params: int, peak: float, **info) -> dict:
    """One batch size: the engine's and generate's measured rates against the decode ceiling `t`."""
    tokens = row["tokens"]
    ceiling = tokens / (t["projections_s"] + t["attention_s"])
    out = {"batch": row["batch"], **info, **t, "ceiling_tokens_per_s": ceiling}
    out["ours_tokens_per_s"] = row["ours_tokens_per_s"]
    out["ours_flop_frac"] = 2 * params * row["ours_tokens_per_s"] / peak  # the same peak as the ceiling's
    out["ceiling_flop_frac"] = 2 * params * ceiling / peak
    if "hf_tokens_per_s" in row:
        out["hf_tokens_per_s"] = row["hf_tokens_per_s"]
        out["ratio"] = row["ratio"]
        out["ceiling_ratio"] = ceiling / row["hf_tokens_per_s"]
    return out


def grpo_ceiling(peak: float, repeats: int, trl_json: str) -> dict:
    doc = json.loads(Path(trl_json).read_text())
    res = doc["runs"]["trl"]["after"]["result"] if "runs" in doc else doc
    shape = res["shapes"]["64x16"]
    vocab = CharTokenizer(BASE_CHARS).vocab_size
    c = ModelConfig(**{k: v for k, v in MODEL.items() if k not in ("arch", "max_len")}).resolved(vocab)
    trained, generated = shape["tokens_trained_per_step"], shape["tokens_generated_per_step"]
    rows, new = 64, round(generated / 64)
    T = round(trained / rows)  # prompt + completion
    train = projection_ops(linear_shapes(c, vocab), round(trained), backward=True)
    att = train_attention_ops(c, rows, T)
    t_train = (
        best_of(lambda: run_ops(train), repeats, warmup=True) + best_of(lambda: run_ops(att), repeats, warmup=True) / 2
    )
    t_decode = decode_seconds(c, vocab, rows, [T - new + i for i in range(1, new + 1)], repeats)
    floor = (6 * trained + 2 * generated) * res["params"] / peak
    total = t_train + t_decode["projections_s"] + t_decode["attention_s"]
    return {
        "source": trl_json,
        "tokens_trained_per_step": trained,
        "tokens_generated_per_step": generated,
        "floor_s": floor,
        "train_matmuls_s": t_train,
        "decode_s": t_decode,
        "ceiling_s": total,
        "ceiling_floor_frac": floor / total,
        "measured_floor_frac": {side: shape[side]["floor_frac"] for side in ("trl", "posttrain")},
        "ceiling_vs_trl": shape["trl"]["step_s"] / total,
    }


def pipeline_sampling_ceiling(peak: float, repeats: int, rows: int = 256, n: int = 8, new: int = 40) -> dict:
    tok, task = CharTokenizer(BASE_CHARS), ArithmeticTask()
    torch.manual_seed(0)
    model = build_model(ModelConfig(preset="nano"), tok.vocab_size).eval()
    prompts = [tok.encode(tok.chat_prompt(task.prompt(i))) for i in task.items(rows // n, seed=0)]
    engine = Engine(model, tok, max_slots=rows)
    sp = SamplingParams(temperature=1.0, max_new_tokens=new, ignore_eos=True)
    engine_s = best_of(lambda: engine.generate(prompts, n, sp, seed=0), repeats, warmup=True)
    prompt = sum(map(len, prompts)) // len(prompts)
    t = decode_seconds(model.config, tok.vocab_size, rows, [prompt + i for i in range(1, new + 1)], repeats)
    row = {"batch": rows, "tokens": rows * new, "ours_tokens_per_s": rows * new / engine_s}
    return {
        "preset": "nano",
        "samples_per_prompt": n,
        "new_tokens": new,
        **rollout_row(row, t, model.num_params(), peak, prompt=prompt),
    }


KEYS = {  # what #20 asks, and where each run of this script puts the measured value and its ceiling
    "train real-token fraction of the peak (goal 75%)": (
        ("train", "real_token_peak_frac"),
        ("train", "ceiling_real_token_peak_frac"),
        ("train", "ceiling_packed_real_token_peak_frac"),
    ),
    "rollout ÷ generate at batch 64 (goal 2x)": (("rollout", 0, "ratio"), ("rollout", 0, "ceiling_ratio")),
    "rollout FLOP-limit fraction at batch 256 (goal 50%)": (
        ("rollout", 1, "ours_flop_frac"),
        ("rollout", 1, "ceiling_flop_frac"),
    ),
    "GRPO 64x16 fraction of the FLOP floor (goal 85%)": (
        ("grpo", "measured_floor_frac", "posttrain"),
        ("grpo", "ceiling_floor_frac"),
    ),
    "pipeline sampling tokens/s (nano, 256 rows)": (
        ("pipeline_sampling", "ours_tokens_per_s"),
        ("pipeline_sampling", "ceiling_tokens_per_s"),
    ),
}


def _get(run: dict, path: tuple):
    v = run[path[0]]
    v = v["rows"] if path[0] == "rollout" else v
    for k in path[1:]:
        v = v[k]
    return v


def ranges(runs: list[dict]) -> dict:
    """Per goal: [min, max] over the runs of the measured value, then of each ceiling."""
    return {
        goal: [[min(_get(r, p) for r in runs), max(_get(r, p) for r in runs)] for p in paths]
        for goal, paths in KEYS.items()
    }


def one_run(threads: int, repeats: int, trl: str) -> dict:
    """Every section once, each against the matmul peak measured (best of three) just before it:
    the machine's speed drifts by ±10% within minutes, and a fraction is only as good as the
    peak beside it."""

    def peak() -> float:
        return max(matmul_peak_gflops(threads) for _ in range(3)) * 1e9

    p = peak()
    run = {"train": {"matmul_peak_gflops": p / 1e9, **train_ceiling(p, repeats)}}
    tr = run["train"]
    print(
        f"train: step {tr['step_s'] * 1000:.0f} ms, real tokens at {tr['real_token_peak_frac']:.0%} of the peak; "
        f"its matmuls alone {1000 * (tr['projections_s'] + tr['attention_half_s']):.0f} ms → ceiling "
        f"{tr['ceiling_real_token_peak_frac']:.0%}, packed {tr['ceiling_packed_real_token_peak_frac']:.0%} (goal 75%)",
        flush=True,
    )
    p = peak()
    run["rollout"] = {"matmul_peak_gflops": p / 1e9, **rollout_ceiling(p, threads, repeats)}
    for r in run["rollout"]["rows"]:
        print(
            f"rollout batch {r['batch']}: ours {r['ratio']:.2f}x generate, ceiling {r['ceiling_ratio']:.2f}x; "
            f"FLOP limit ours {r['ours_flop_frac']:.0%}, ceiling {r['ceiling_flop_frac']:.0%}",
            flush=True,
        )
    p = peak()
    run["grpo"] = g = {"matmul_peak_gflops": p / 1e9, **grpo_ceiling(p, repeats, trl)}
    print(
        f"grpo 64x16: floor {g['floor_s']:.3f} s; its matmuls alone {g['ceiling_s']:.3f} s → ceiling "
        f"{g['ceiling_floor_frac']:.0%} of the floor (goal 85%), {g['ceiling_vs_trl']:.2f}x TRL's step in {trl}",
        flush=True,
    )
    p = peak()
    run["pipeline_sampling"] = s = {"matmul_peak_gflops": p / 1e9, **pipeline_sampling_ceiling(p, repeats)}
    print(
        f"pipeline sampling (nano, 256 rows): ours {s['ours_tokens_per_s']:.0f} tok/s, "
        f"ceiling {s['ceiling_tokens_per_s']:.0f} tok/s ({s['ceiling_tokens_per_s'] / s['ours_tokens_per_s']:.2f}x)",
        flush=True,
    )
    return run


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5, help="best of this many timings for every number")
    ap.add_argument("--runs", type=int, default=3, help="whole runs; the JSON keeps each and the ranges")
    ap.add_argument(
        "--trl", default="benchmarks/results/before_after.json", help="a bench trl result (or before_after.json)"
    )
    ap.add_argument("--out", default="benchmarks/results/speed_ceiling.json")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    result = run_header("speed_ceiling", a.threads, repeats=a.repeats)
    result["runs"] = []
    for i in range(a.runs):
        print(f"run {i + 1}/{a.runs}", flush=True)
        result["runs"].append(one_run(a.threads, a.repeats, a.trl))
    result["ranges"] = ranges(result["runs"])
    for goal, spans in result["ranges"].items():
        print(
            f"{goal}: measured {spans[0][0]:.3g}-{spans[0][1]:.3g}; ceiling "
            + ", ".join(f"{lo:.3g}-{hi:.3g}" for lo, hi in spans[1:])
        )
    return finish(result, a.out)


if __name__ == "__main__":
    main()
