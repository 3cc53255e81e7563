"""A git ref against this checkout, side by side in ONE process: rollout and a GRPO trainer step.

    python benchmarks/ab_refs.py [--base main] [--threads 2] [--repeats 3] [--out benchmarks/results/ab_speed.json]

The base ref's `posttrain/` is extracted with `git archive` into a temporary directory and
renamed `posttrain_base` (its imports rewritten), so both versions load into this process
and every measurement alternates A B A B (B A B A on odd rounds): a burst of load from other
processes falls on both alike. Both sides get the same seeded weights (state-dict copy).

    rollout   the `posttrain bench rollout` setting (micro preset, one sample per prompt,
              exactly 64 new tokens, temperature 1) at each --batches size, plus the RL
              stage's shape (nano, 16 prompts × 8 samples, a 54-token cap): tokens/s, CPU
              seconds, and the number of samples whose tokens differ between the two sides
    train     one GRPO step (kl 0.01, the trainer's default micro-batch budget) on an RL-shaped
              batch: 128 rows, the task's prompts plus responses of 8-54 random tokens; step
              time, real and computed (padded) tokens, and 6·N·real tokens / time as a
              fraction of the matmul peak measured in the same run
    sft       one SFT step as the pipeline's (64 chain-of-thought examples, nano)

Times are the best of --repeats rounds; the load average before and after goes into the JSON.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def extract(ref: str, into: Path) -> None:
    """`ref`'s posttrain/ as into/posttrain_base, every `posttrain` import pointing at it."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "posttrain"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    (into / "posttrain").rename(into / "posttrain_base")
    for f in (into / "posttrain_base").rglob("*.py"):
        text = f.read_text()
        text = re.sub(r"\bposttrain\.(?=[a-z_])", "posttrain_base.", text)
        text = re.sub(r"from posttrain import", "from posttrain_base import", text)
        f.write_text(text)
    sys.path.insert(0, str(into))


def interleaved(fns: dict, repeats: int) -> dict:
    """{name: (best wall s, best CPU s, last result)} of fns run alternately."""
    best = {k: [float("inf"), float("inf"), None] for k in fns}
    names = list(fns)
    for r in range(repeats):
        for k in names if r % 2 == 0 else names[::-1]:
            t0, c0 = time.perf_counter(), time.process_time()
            out = fns[k]()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            best[k] = [min(best[k][0], wall), min(best[k][1], cpu), out]
    return best


def rollout(pkgs: dict, batches, repeats: int, peak: float) -> list[dict]:
    from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
    from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask

    tok = CharTokenizer(BASE_CHARS)
    rows = []
    shapes = [("micro", B, 1, 64, None) for B in batches] + [
        ("nano", 16, 8, 54, ArithmeticConfig(max_terms=6, max_value=19))
    ]
    for preset, G, n, new, task_cfg in shapes:
        task = ArithmeticTask(task_cfg) if task_cfg else ArithmeticTask()
        prompts = [tok.encode(tok.chat_prompt(task.prompt(i))) for i in task.items(G, seed=0)]
        fns, models = {}, {}
        for side, P in pkgs.items():
            torch.manual_seed(0)
            models[side] = model = P.gpt_mini.build_model(P.gpt_mini.ModelConfig(preset=preset), tok.vocab_size).eval()
            if side == "new":
                model.load_state_dict(models["base"].state_dict())
            params = model.num_params()
            engine = P.rollout.Engine(model, tok, max_slots=256)
            sp = P.rollout.SamplingParams(temperature=1.0, max_new_tokens=new, ignore_eos=n == 1)
            engine.generate(prompts[:2], n, sp)  # warm-up
            fns[side] = lambda e=engine, s=sp, p=prompts, k=n: e.generate(p, k, s, seed=0)
        res = interleaved(fns, repeats)
        row = {"preset": preset, "prompts": G, "samples_per_prompt": n, "max_new_tokens": new}
        for side, (wall, cpu, samples) in res.items():
            tokens = sum(len(s.response_ids) for s in samples)
            row[side] = {
                "tokens": tokens,
                "tokens_per_s": tokens / wall,
                "cpu_s": cpu,
                "wall_s": wall,
                "flop_frac": 2 * params * tokens / wall / (peak * 1e9),
            }
        a, b = res["base"][2], res["new"][2]
        row["differing_samples"] = sum(x.response_ids != y.response_ids for x, y in zip(a, b))
        row["speedup"] = row["base"]["wall_s"] / row["new"]["wall_s"]
        row["speedup_cpu"] = row["base"]["cpu_s"] / row["new"]["cpu_s"]
        rows.append(row)
        print(
            f"rollout {preset:5s} {G:>4}x{n}: base {row['base']['tokens_per_s']:8.0f} tok/s, new "
            f"{row['new']['tokens_per_s']:8.0f} tok/s ({row['speedup']:.2f}x wall, {row['speedup_cpu']:.2f}x CPU; "
            f"new at {row['new']['flop_frac']:.0%} of the FLOP limit); differing samples {row['differing_samples']}",
            flush=True,
        )
    return rows


def rl_batch(tok, seed: int = 0) -> dict:
    """128 rows shaped like the RL stage's: the task's prompts, responses of 8-54 random tokens."""
    from posttrain.framework.batch import collate
    from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask

    task = ArithmeticTask(ArithmeticConfig(max_terms=6, max_value=19))
    g = torch.Generator().manual_seed(seed)
    prompts = [tok.encode(tok.chat_prompt(task.prompt(i))) for i in task.items(16, seed=seed) for _ in range(8)]
    responses = [
        torch.randint(6, tok.vocab_size - 1, (int(torch.randint(8, 55, (1,), generator=g)),), generator=g).tolist()
        for _ in prompts
    ]
    b = collate(prompts, responses, tok.pad_id)
    b["old_logprobs"] = -torch.rand(b["loss_mask"].shape, generator=g) * b["loss_mask"]
    b["ref_logprobs"] = b["old_logprobs"] - 0.01 * b["loss_mask"]
    b["advantages"] = torch.randn(len(prompts), 1, generator=g).expand_as(b["loss_mask"]).contiguous()
    return b


def train(pkgs: dict, repeats: int, peak: float) -> dict:
    from posttrain.config import OptimConfig
    from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer

    tok = CharTokenizer(BASE_CHARS)
    batch = rl_batch(tok)
    fns, models = {}, {}
    for side, P in pkgs.items():
        torch.manual_seed(0)
        models[side] = model = P.gpt_mini.build_model(P.gpt_mini.ModelConfig(preset="nano"), tok.vocab_size)
        if side == "new":
            model.load_state_dict(models["base"].state_dict())
        params = model.num_params()
        algo = P.algorithms.get("grpo")
        loss_fn = P.trainer.policy_loss_fn(algo, algo.Config(kl_coef=0.01), 1.0)
        t = P.trainer.Trainer(model, OptimConfig(lr=0.0), 10)  # lr 0: every step the same
        typed = getattr(P.batch, "RolloutBatch", None)  # refs before the typed batch take the dict
        b = typed(**batch) if typed is not None else batch
        t.step(copy.copy(b), loss_fn)  # warm-up
        fns[side] = lambda t=t, f=loss_fn, b=b: t.step(copy.copy(b), f)
    res = interleaved(fns, repeats)
    real = float(batch["attention_mask"].sum())
    out = {"rows": batch["attention_mask"].shape[0], "real_tokens": real, "params": params}
    for side, (wall, cpu, m) in res.items():
        padded = m.get("train/padded_tokens", float(batch["attention_mask"].numel()))  # main pads the batch
        out[side] = {
            "step_s": wall,
            "cpu_s": cpu,
            "computed_tokens": padded,
            "micro_batches": m["train/micro_batches"],
            "loss": m["loss"],
            "real_token_peak_frac": 6 * params * real / wall / (peak * 1e9),
        }
    out["speedup"] = out["base"]["step_s"] / out["new"]["step_s"]
    out["speedup_cpu"] = out["base"]["cpu_s"] / out["new"]["cpu_s"]
    print(
        f"train GRPO step, {out['rows']} rows, {real:.0f} real tokens: base {out['base']['step_s']:.3f} s "
        f"({out['base']['computed_tokens']:.0f} computed), new {out['new']['step_s']:.3f} s "
        f"({out['new']['computed_tokens']:.0f}): {out['speedup']:.2f}x wall, {out['speedup_cpu']:.2f}x CPU; "
        f"real tokens at {out['new']['real_token_peak_frac']:.0%} of the matmul peak (base "
        f"{out['base']['real_token_peak_frac']:.0%})",
        flush=True,
    )
    return out


def sft(pkgs: dict, repeats: int, peak: float) -> dict:
    """One SFT step as the pipeline's: 64 chain-of-thought examples of the task, prompt masked."""
    from posttrain.config import OptimConfig
    from posttrain.framework.batch import collate
    from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
    from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask

    tok = CharTokenizer(BASE_CHARS)
    task = ArithmeticTask(ArithmeticConfig(max_terms=6, max_value=19))
    items = task.items(64, "train", 0)
    batch = collate(
        [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items],
        [tok.encode(tok.chat_response(it.target(True))) for it in items],
        tok.pad_id,
    )
    fns, models = {}, {}
    for side, P in pkgs.items():
        torch.manual_seed(0)
        models[side] = model = P.gpt_mini.build_model(P.gpt_mini.ModelConfig(preset="nano"), tok.vocab_size)
        if side == "new":
            model.load_state_dict(models["base"].state_dict())
        t = P.trainer.Trainer(model, OptimConfig(lr=0.0), 10)
        t.step(copy.copy(batch), P.common.lm_loss)
        fns[side] = lambda t=t, f=P.common.lm_loss: t.step(copy.copy(batch), f)
    res = interleaved(fns, repeats)
    real, params = float(batch["attention_mask"].sum()), models["new"].num_params()
    out = {"rows": 64, "real_tokens": real}
    for side, (wall, cpu, m) in res.items():
        out[side] = {
            "step_s": wall,
            "cpu_s": cpu,
            "micro_batches": m["train/micro_batches"],
            "computed_tokens": m.get("train/padded_tokens", float(batch["attention_mask"].numel())),
            "real_token_peak_frac": 6 * params * real / wall / (peak * 1e9),
        }
    out["speedup"], out["speedup_cpu"] = (
        out["base"]["step_s"] / out["new"]["step_s"],
        out["base"]["cpu_s"] / out["new"]["cpu_s"],
    )
    print(
        f"sft step, 64 CoT examples, {real:.0f} real tokens: base {out['base']['step_s']:.3f} s "
        f"({out['base']['computed_tokens']:.0f} computed), new {out['new']['step_s']:.3f} s "
        f"({out['new']['computed_tokens']:.0f}): {out['speedup']:.2f}x wall, {out['speedup_cpu']:.2f}x CPU",
        flush=True,
    )
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="main", help="git ref to compare this checkout against")
    ap.add_argument("--what", default="rollout,train,sft")
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/ab_speed.json")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from posttrain.bench import matmul_peak_gflops, write_json

    tmp = tempfile.TemporaryDirectory()
    extract(a.base, Path(tmp.name))
    import importlib

    pkgs = {}
    for side, name in (("base", "posttrain_base"), ("new", "posttrain")):
        pkgs[side] = argparse.Namespace(
            **{
                m.rsplit(".", 1)[-1]: importlib.import_module(f"{name}.{m}")
                for m in (
                    "models.gpt_mini",
                    "framework.batch",
                    "framework.rollout",
                    "framework.trainer",
                    "algorithms",
                    "recipes.common",
                )
            }
        )
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    result = {
        "base": a.base,
        "new": head,
        "threads": a.threads,
        "repeats": a.repeats,
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "load_avg_before": os.getloadavg(),
        "matmul_peak_gflops": matmul_peak_gflops(a.threads),
    }
    peak = result["matmul_peak_gflops"]
    if "rollout" in a.what:
        result["rollout"] = rollout(pkgs, [int(b) for b in a.batches.split(",")], a.repeats, peak)
    if "train" in a.what:
        result["train"] = train(pkgs, a.repeats, peak)
    if "sft" in a.what:
        result["sft"] = sft(pkgs, a.repeats, peak)
    result["load_avg_after"] = os.getloadavg()
    print(
        f"load average {result['load_avg_before'][0]:.1f} -> {result['load_avg_after'][0]:.1f} on "
        f"{os.cpu_count()} CPUs; matmul peak {peak:.1f} GFLOP/s on {a.threads} threads"
    )
    write_json(a.out, result)
    print(f"wrote {a.out}")
    return result


if __name__ == "__main__":
    main()
