"""The precision lab: a bf16 / fp16 sampler against an fp32 trainer (posttrain/precision.py).

    posttrain bench precision --init runs/pipeline/sft --part mismatch,invariance,learning --seeds 0,1,2
        [--steps 30] [--out benchmarks/results/precision.json]

mismatch    The sampler draws P prompts × n samples in each format; the fp32 trainer scores the
            same tokens. Per token δ = log π_trainer − log μ_sampler: its spread and tails (a
            log10|δ| histogram), the sequence log-ratio Σδ, and what the corrections would do
            with it on the first update of a batch: the PPO clip fraction (ε = 0.2, r = e^δ,
            GRPO advantages of the same samples), tokens TIS truncates (w > 2) and tokens the
            IcePop mask drops (w outside [½, 2]), sequences seq-TIS truncates.
invariance  The same prompts sampled with 256 decode slots and with 8: samples that differ and
            the largest |Δ logprob| between the two, with batch-invariant matmuls off and on.
learning    GRPO runs, fp32 sampler vs bf16 sampler with no correction, TIS and masking
            (scale.off_policy_correction, cap 2), same seed and budget: held-out pass@1 before
            and after, the measured mismatch, clip and capped fractions along the run.

Everything is written to one JSON with the machine's load average; learning numbers are
comparable under load, wall times are not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import numpy as np
import torch

from posttrain import checkpoint
from posttrain.algorithms import core
from posttrain.bench import update_json
from posttrain.bench.algorithms import one_run
from posttrain.eval import response_budget
from posttrain.framework.batch import collate_samples
from posttrain.framework.reference import score_logprobs
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.logging import read_metrics
from posttrain.precision import FORMATS, sampler_runtime
from posttrain.recipes.warm_start import default_init
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from posttrain.tasks.base import score_samples

PARTS = ("mismatch", "invariance", "learning")
LEARNING = (("fp32", "none"), ("bf16", "none"), ("bf16", "tis"), ("bf16", "mask"))
DECADES = list(range(-8, 1))  # log10|δ| bin edges: 1e-8 … 1


def _load(init: str):
    model, tok, _ = checkpoint.load_model(init)
    task = ArithmeticTask(ArithmeticConfig())
    return model.eval(), tok, task


def _sample(model, tok, task, items, n, fmt, seed, slots=256, batch_invariant=False):
    engine = Engine(model, tok, max_slots=slots, runtime=sampler_runtime(fmt, None, batch_invariant))
    prompts = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    sp = SamplingParams(temperature=1.0, max_new_tokens=response_budget(task, items))
    return engine.generate(prompts, n, sp, seed=seed, items=items)


def mismatch(model, tok, task, fmt: str, seed: int, prompts: int = 128, n: int = 8) -> dict:
    """Statistics of δ = log π_fp32 − log μ_fmt on one batch sampled in `fmt` (module doc)."""
    items = task.items(prompts, "train", seed)
    samples = _sample(model, tok, task, items, n, fmt, seed)
    score_samples(task, samples)
    batch = collate_samples(samples, tok.pad_id)
    mask, behaviour = batch.loss_mask, batch.old_logprobs  # [B, T] each
    trainer = score_logprobs(model, batch)  # [B, T] fp32, 0 off the mask
    delta = (trainer - behaviour) * mask  # [B, T]
    d = delta[mask != 0].double().numpy()
    rewards = torch.tensor([s.reward for s in samples])
    mean, std, _ = core.group_stats(rewards, torch.tensor([s.group for s in samples]))
    adv = core.broadcast((rewards - mean) / (std + 1e-6), mask)  # [B, T] GRPO advantages
    _, clipped = core.ppo_clip_loss(trainer, behaviour, adv, 0.2, 0.2)
    frac = lambda m: float(core.masked_mean(m.to(mask.dtype), mask))
    seq = delta.sum(-1).double().numpy()  # [B] Σ_t δ
    _, tis = core.off_policy_weights(trainer, behaviour, mask, "tis", 2.0)
    _, msk = core.off_policy_weights(trainer, behaviour, mask, "mask", 2.0)
    _, seq_tis = core.off_policy_weights(trainer, behaviour, mask, "seq_tis", 2.0)
    mag = np.log10(np.maximum(np.abs(d), 1e-12))
    hist = np.histogram(np.clip(mag, DECADES[0], DECADES[-1] - 1e-9), bins=DECADES)[0]
    q = lambda x, p: float(np.quantile(x, p))
    return {
        "format": fmt,
        "seed": seed,
        "tokens": int(d.size),
        "sequences": len(samples),
        "reward_mean": float(rewards.mean()),
        "delta_mean": float(d.mean()),
        "delta_std": float(d.std()),
        "delta_abs_mean": float(np.abs(d).mean()),
        "delta_abs_max": float(np.abs(d).max()),
        "exact_frac": float(np.mean(d == 0)),
        "delta_quantiles": {str(p): q(d, p) for p in (0.001, 0.01, 0.05, 0.5, 0.95, 0.99, 0.999)},
        "abs_delta_over": {str(t): float(np.mean(np.abs(d) > t)) for t in (1e-3, 1e-2, 0.1, float(np.log(1.2)))},
        "log10_abs_delta_hist": {"edges": DECADES, "counts": hist.tolist()},
        "seq_log_ratio_std": float(seq.std()),
        "seq_log_ratio_abs_max": float(np.abs(seq).max()),
        "clip_frac_eps0.2": frac(clipped),
        "tis_capped_frac": float(tis["offpolicy/capped_frac"]),
        "mask_dropped_frac": float(msk["offpolicy/capped_frac"]),
        "seq_tis_capped_frac": float(seq_tis["offpolicy/capped_frac"]),
    }


def invariance(model, tok, task, fmt: str, batch_invariant: bool, seed: int = 0, prompts: int = 64, n: int = 8) -> dict:
    """The same requests decoded with 256 slots and with 8: what changes with the batch."""
    items = task.items(prompts, "train", seed)
    big = _sample(model, tok, task, items, n, fmt, seed, 256, batch_invariant)
    small = _sample(model, tok, task, items, n, fmt, seed, 8, batch_invariant)
    differ = sum(a.response_ids != b.response_ids for a, b in zip(big, small))
    same = [(a, b) for a, b in zip(big, small) if a.response_ids == b.response_ids]
    lp = [abs(x - y) for a, b in same for x, y in zip(a.response_logprobs, b.response_logprobs)]
    return {
        "format": fmt,
        "batch_invariant": batch_invariant,
        "samples": len(big),
        "differing_samples_frac": differ / len(big),
        "max_logprob_abs_diff": max(lp) if lp else 0.0,
        "identical_logprob_frac": float(np.mean([x == 0 for x in lp])) if lp else 1.0,
    }


def learning(init: str, fmt: str, correction: str, seed: int, steps: int, runs: Path) -> dict:
    """One GRPO run (bench/algorithms.one_run budget, 8 prompts × 8 samples) with the sampler in `fmt`."""
    out = runs / f"{fmt}_{correction}_s{seed}"
    one_run(
        "grpo",
        init,
        steps,
        seed,
        out,
        [
            "rollout.prompts_per_step=8",
            "eval.problems=100",
            "threads=1",
            f"rollout.precision={fmt}",
            f"scale.off_policy_correction={correction}",
            "scale.off_policy_cap=2.0",
        ],
    )
    return learning_row(out, fmt, correction, seed) | {"load_average": [round(x, 2) for x in os.getloadavg()]}


def learning_row(run: Path, fmt: str, correction: str, seed: int) -> dict:
    """The table row of a finished learning run, from its metrics.jsonl alone."""
    ms = read_metrics(run)
    train = [m for m in ms[1:] if "reward/mean" in m]
    mean = lambda k, ms=train: statistics.fmean(m[k] for m in ms) if ms and all(k in m for m in ms) else None
    return {
        "format": fmt,
        "correction": correction,
        "seed": seed,
        "steps": len(train),
        "pass@1_start": ms[0]["eval/pass@1"],
        "pass@1_end": ms[-1]["eval/pass@1"],
        "pass@8_start": ms[0]["eval/pass@8"],
        "pass@8_end": ms[-1]["eval/pass@8"],
        "reward_first10": mean("reward/mean", train[:10]),
        "reward_last10": mean("reward/mean", train[-10:]),
        "kl_ref": mean("kl/ref"),
        "entropy": mean("entropy"),
        "mismatch_logprob_abs": mean("mismatch/logprob_abs"),
        "clip_frac": mean("clip/frac"),
        "ratio_max": max(m.get("ratio/max", 0.0) for m in train),
        "offpolicy_capped_frac": mean("offpolicy/capped_frac"),
        "offpolicy_weight_mean": mean("offpolicy/weight_mean"),
        "offpolicy_log_ratio_abs": mean("offpolicy/log_ratio_abs"),
        "reward_curve": [round(m["reward/mean"], 4) for m in train],
    }


def summarize(rows: list[dict], keys: tuple, by: tuple) -> list[dict]:
    """Mean and sample std over seeds of `keys`, one row per distinct value of `by`."""
    out = []
    for group in sorted({tuple(r[b] for b in by) for r in rows}, key=str):
        rs = [r for r in rows if tuple(r[b] for b in by) == group]
        row = {**dict(zip(by, group)), "seeds": sorted(r["seed"] for r in rs)}
        for k in keys:
            vals = [r[k] for r in rs if r.get(k) is not None]
            if vals:
                row[k] = statistics.fmean(vals)
                row[k + "_std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
        out.append(row)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="posttrain bench precision", description=__doc__.split("\n\n")[0])
    p.add_argument("--init", default="", help="SFT run directory or checkpoint (default: the cached SFT(CoT))")
    p.add_argument("--part", default=",".join(PARTS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument(
        "--settings", default=",".join(f"{f}:{c}" for f, c in LEARNING), help="learning runs, FORMAT:CORRECTION"
    )
    p.add_argument("--runs", default="runs/precision")
    p.add_argument("--rebuild", action="store_true", help="learning: re-read finished runs in --runs, train nothing")
    p.add_argument("--out", default="benchmarks/results/precision.json")
    a = p.parse_args(argv)

    torch.set_num_threads(1)
    init, out = a.init or default_init(), Path(a.out)
    seeds = [int(s) for s in a.seeds.split(",")]
    summary_keys = {
        "mismatch": (
            ("format",),
            (
                "delta_abs_mean",
                "delta_std",
                "delta_abs_max",
                "seq_log_ratio_std",
                "clip_frac_eps0.2",
                "tis_capped_frac",
                "mask_dropped_frac",
                "seq_tis_capped_frac",
            ),
        ),
        "learning": (
            ("format", "correction"),
            (
                "pass@1_start",
                "pass@1_end",
                "reward_first10",
                "reward_last10",
                "mismatch_logprob_abs",
                "clip_frac",
                "offpolicy_capped_frac",
            ),
        ),
    }

    def save(part, rows, replaced) -> dict:
        """Merge `rows` into the JSON as it is on disk now (seeds run in parallel processes)."""

        def update(res):
            merged = [r for r in res.get(part, {}).get("rows", []) if not replaced(r)] + rows
            load = [round(x, 2) for x in os.getloadavg()]
            if a.rebuild and part == "learning":  # trained earlier: keep that load
                load = res.get(part, {}).get("load_average", load)
            res[part] = {"rows": merged, "load_average": load, "init": init}
            if part in summary_keys:
                res[part]["summary"] = summarize(merged, summary_keys[part][1], summary_keys[part][0])
            return res

        return update_json(out, update)[part]

    for part in a.part.split(","):
        if part == "mismatch":
            model, tok, task = _load(init)
            rows = [mismatch(model, tok, task, fmt, s) for fmt in FORMATS for s in seeds]
            done = save(part, rows, lambda r: r["seed"] in seeds)
        elif part == "invariance":
            model, tok, task = _load(init)
            rows = [invariance(model, tok, task, fmt, bi) for fmt in ("fp32", "bf16") for bi in (False, True)]
            done = save(part, rows, lambda r: True)
        elif part == "learning":
            for fmt, corr in (tuple(s.split(":")) for s in a.settings.split(",")):
                for s in seeds:
                    run = Path(a.runs, f"{fmt}_{corr}_s{s}")
                    row = (
                        learning_row(run, fmt, corr, s)
                        if a.rebuild
                        else learning(init, fmt, corr, s, a.steps, Path(a.runs))
                    )
                    done = save(part, [row], lambda r, k=(fmt, corr, s): (r["format"], r["correction"], r["seed"]) == k)
        else:
            raise SystemExit(f"--part: unknown {part!r}; choose from {', '.join(PARTS)}")
        print(part, json.dumps(done.get("summary", done["rows"]), indent=1))


if __name__ == "__main__":
    main()
