"""`posttrain memory`: the memory planner (memory.py) on the command line, its plan as a table.

    posttrain memory llama-7b --algo grpo --gpu h100 [--gpus 8 --shard fsdp --lora 16 ...] [--json]

`format_plan` turns the dict of `memory.plan` into one row per component in GB per GPU, the
peak of each pool and the verdict; `main` parses the flags into a `PlanConfig`. A run directory, a
Hugging Face directory or `--stage` asks about one posttrain run instead: run_memory_cli.py.
"""

from __future__ import annotations

import json

from posttrain.sizing import run_memory_cli
from posttrain.sizing.memory import GB, GPUS, PRECISION, ROLES, PlanConfig, plan


def format_plan(r: dict) -> str:
    """The plan as a table: one row per component, GB per GPU, then the verdict."""
    m, c = r["model"], r["config"]
    roles = ["policy"] + [k.replace("_", " ") for k, v in r["roles"].items() if v and k != "rollout"]
    lines = [
        f"{m['name']}: {_count(r['params'])} params ({m['layers']} layers, d={m['hidden']}, "
        f"{m['heads']}/{m['kv_heads']} q/kv heads, vocab {m['vocab']})"
        + (f", LoRA r={c['lora']}: {_count(r['trainable_params'])} trainable" if c["lora"] else ""),
        f"{c['algo']}: {', '.join(roles)}{'' if r['roles']['rollout'] else ' (offline: no rollout)'} · "
        f"{c['precision']} precision, {r['notes']['train_bytes_per_param']} B/trainable param · "
        f"micro-batch {c['micro_batch']} × {c['seq_len']} tokens, checkpointing "
        f"{'on' if c['checkpointing'] else 'off'}"
        + (
            f" · rollout {c['rollout_seqs']} seqs × {c['rollout_len'] or c['seq_len']} tokens"
            if r["roles"]["rollout"]
            else ""
        ),
    ]
    for name, pool in r["pools"].items():
        lines += [
            "",
            f"{name} pool: {pool['gpus']} × {r['gpu']} ({_layout(name, c, pool['gpus'])})",
            f"  {'component':30s} {'GB/GPU':>8s}",
        ]
        lines += [f"  {k:30s} {v / GB:8.2f}" for k, v in pool["components"].items() if v]
        ph = {k: v / GB for k, v in pool["phases"].items()}
        lines += [
            f"  {'peak':30s} {pool['peak_bytes'] / GB:8.2f}   = persistent {ph['persistent']:.1f} + "
            f"max(train {ph['train']:.1f}, rollout {ph['rollout']:.1f})"
        ]
    n = r["notes"]
    lines += [
        "",
        f"activations: {n['activations_without_checkpointing'] / GB:.2f} GB without checkpointing, "
        f"{n['activations_with_checkpointing'] / GB:.2f} GB with; KV {n['kv_bytes_per_token'] / 1e3:.0f} KB/token"
        + (f", {n['kv_cache_total'] / GB:.1f} GB for the rollout batch" if n["kv_cache_total"] else ""),
        f"fits on {r['gpu']} (≤ {r['capacity_bytes'] / GB:.0f} GB per GPU): "
        + ("yes" if r["fits"] else f"NO (peak {r['peak_bytes'] / GB:.1f} GB)")
        + "  ["
        + ", ".join(f"{g}: {'yes' if ok else 'no'}" for g, ok in r["fits_on"].items())
        + "]",
    ]
    if not r["fits"]:
        lines += ["to fit, change one of:" if r["suggestions"] else "no change tried here makes it fit"]
        lines += [f"  - {s['change']}  → {s['peak_gb']:.1f} GB" for s in r["suggestions"]]
    return "\n".join(lines)


def _count(n: float) -> str:
    return next(f"{n / u:.2f}{s}" for u, s in [(1e9, "B"), (1e6, "M"), (1e3, "K"), (1, "")] if n >= u or u == 1)


def _layout(pool: str, c: dict, gpus: int) -> str:
    if pool == "reference":
        return "one GPU" if gpus == 1 else f"sharded over {gpus}"
    if pool == "rollout":
        return f"TP={c['rollout_tp'] or c['tp']}"
    dp = gpus // c["tp"]
    shard = "one GPU" if gpus == 1 else f"FSDP over {dp}" if c["shard"] == "fsdp" and dp > 1 else f"{dp} replicas"
    return shard + (f", TP={c['tp']}" if c["tp"] > 1 else "")


def main(argv=None) -> None:
    import argparse
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if run_memory_cli.wants_run(argv):  # one posttrain run: a run/model directory, or --stage
        run_memory_cli.main(argv)
        return
    d = PlanConfig()
    p = argparse.ArgumentParser(prog="posttrain memory", description="What fits on which GPU, per algorithm.")
    p.add_argument(
        "model",
        help="preset (llama-7b, qwen2.5-7b, nano, ...), a size like 7b, config.json or YAML; a run directory, "
        "a Hugging Face directory or a stage's YAML with --stage: that posttrain run's peak (run_memory_cli.py)",
    )
    p.add_argument("--algo", default=d.algo, help=f"one of {', '.join(ROLES)}")
    p.add_argument("--gpu", default=d.gpu, help=", ".join(GPUS))
    p.add_argument("--gpus", type=int, default=d.gpus, help="GPUs in the pool (the trainer pool with --split)")
    p.add_argument("--shard", default=d.shard, choices=["fsdp", "dp"])
    p.add_argument("--tp", type=int, default=d.tp)
    p.add_argument("--rollout-tp", type=int, default=d.rollout_tp)
    p.add_argument("--micro-batch", type=int, default=d.micro_batch, help="sequences per GPU per forward/backward")
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--rollout-seqs", type=int, default=d.rollout_seqs, help="sequences decoding at once (prompts × K)")
    p.add_argument("--rollout-len", type=int, default=d.rollout_len, help="KV tokens a sequence (0 = seq-len)")
    p.add_argument("--checkpointing", action="store_true", help="gradient checkpointing on")
    p.add_argument("--lora", type=int, default=0, metavar="RANK")
    p.add_argument("--precision", default=d.precision, choices=list(PRECISION))
    p.add_argument("--reference", default=d.reference, choices=["auto", "gpu", "cpu", "none"])
    p.add_argument("--reward-model", default="", metavar="MODEL")
    p.add_argument("--critic", default=d.critic, choices=["separate", "shared"])
    p.add_argument("--activations", default=d.activations, choices=["llama", "course"])
    p.add_argument(
        "--split",
        nargs=2,
        type=int,
        metavar=("REF_GPUS", "ROLLOUT_GPUS"),
        help="disaggregated placement: the reference and rollout pools' GPUs (--gpus = trainer pool)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    a = p.parse_args(argv)
    cfg = PlanConfig(
        a.algo,
        a.gpu,
        a.gpus,
        a.shard,
        a.tp,
        a.rollout_tp,
        a.micro_batch,
        a.seq_len,
        a.rollout_seqs,
        a.rollout_len,
        a.checkpointing,
        a.lora,
        a.precision,
        a.reference,
        a.reward_model,
        a.critic,
        a.activations,
        "split" if a.split else "colocated",
        *(a.split or (1, 1)),
    )
    r = plan(a.model, cfg)
    print(json.dumps(r, indent=1) if a.json else format_plan(r))
