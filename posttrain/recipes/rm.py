"""Stage 3 (rewards from preferences): a Bradley–Terry reward model on verifier-labelled pairs.

    posttrain rm [configs/rm.yaml] [init=RUN_OR_CHECKPOINT] [objective=orm] [key=value ...]

1. Pairs: sampled from the starting (SFT) policy on train-split prompts, chosen = a verified
   correct response, rejected = a wrong one (preference/data.py); or `pairs=FILE.jsonl` in
   TRL's format, with an optional `margin` column. Held-out pairs come the same way from
   `eval_prompts` test-split prompts, or from `eval_pairs=FILE.jsonl`. Both are written to the run directory (`pairs.jsonl`,
   `eval_pairs.jsonl`, counts in `pairs_stats.json`) and re-read on resume.
2. The model is the init checkpoint's trunk plus a fresh scalar head (reward_models/reward_model.py),
   all of it trained. Each step: a batch of pairs as interleaved rows (chosen, rejected), one
   forward, the per-pair BT loss (or per-response ORM loss) summed and divided by the WHOLE
   batch's pairs (rows), so micro-batches, which keep both rows of a pair together
   (`Trainer.step(unit=2)`), add up to the full-batch mean.
3. Held-out pairwise accuracy (`eval/rm_accuracy`) at step 0, every `eval_every` steps and at
   the end. The checkpoint is the trunk (`model.safetensors`) plus `reward_head.safetensors`;
   `reward_models.reward_model.load_reward_model(RUN_DIR)` reads it back.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import torch

from posttrain.config import RMConfig
from posttrain.distributed.ranks import rank_trainer
from posttrain.errors import UsageError
from posttrain.eval import response_budget
from posttrain.framework.card import phase
from posttrain.framework.loop import train_loop
from posttrain.framework.trainer import Trainer
from posttrain.preference.data import (
    Pair,
    collate_pairs,
    corrupted_pairs,
    encode_pairs,
    fits_context,
    load_jsonl,
    pairs_from_policy,
)
from posttrain.recipes.common import (
    EpochIndices,
    Run,
    batch_plan,
    init_model,
    make_task,
    predict_memory,
    print_plan,
    supervised_step,
)
from posttrain.recipes.warm_start import default_init, refuse_default_init
from posttrain.reward_models.reward_model import (
    RewardModel,
    bradley_terry_loss,
    head_state,
    orm_loss,
    pair_metrics,
    save_head,
    score_pairs,
)

OBJECTIVES = ("bt", "orm")


def check(cfg: RMConfig) -> None:
    """Every config mistake, before any sampling or training."""
    if cfg.objective not in OBJECTIVES:
        raise UsageError(f"objective={cfg.objective!r} is unknown; use bt or orm")
    if cfg.on_bad not in ("error", "skip"):
        raise UsageError(f"on_bad={cfg.on_bad!r} is unknown; use error or skip")
    if cfg.center_coef < 0:
        raise UsageError(f"center_coef={cfg.center_coef} must be >= 0 (0 = no centring)")
    if cfg.synthetic_pairs < 0:
        raise UsageError(f"synthetic_pairs={cfg.synthetic_pairs} must be >= 0")
    for key in ("batch_size", "pair_prompts", "samples_per_prompt", "pairs_per_prompt"):
        if getattr(cfg, key) < 1:
            raise UsageError(f"{key}={getattr(cfg, key)} must be >= 1")
    if cfg.samples_per_prompt < 2 and not cfg.pairs:
        raise UsageError("samples_per_prompt must be >= 2 to find a correct and a wrong response per prompt")
    for path in (cfg.pairs, cfg.eval_pairs):
        if path:
            load_jsonl(path, cfg.on_bad)  # a bad row fails before any work


def cached_pairs(r: Run, name: str, build) -> list[Pair]:
    """Pairs from `RUN_DIR/name` on resume, else `build() -> (pairs, stats)`, written there."""
    saved = r.dir / name
    if r.resume_from is not None and saved.exists():
        return [Pair(**json.loads(line)) for line in saved.read_text().splitlines()]
    pairs, stats = build()
    if r.world.main:  # every rank built the same pairs (seeded): rank 0 writes them
        saved.write_text("".join(json.dumps({k: v for k, v in asdict(p).items() if k != "item"}) + "\n" for p in pairs))
        stats_file = r.dir / "pairs_stats.json"
        all_stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
        stats_file.write_text(json.dumps({**all_stats, name: stats}, indent=1))
    print(f"[rm] {name}: {stats}")
    return pairs


def sample_pairs(cfg: RMConfig, model, tok, task, n: int, split: str):
    items = task.items(n, split, cfg.seed)
    pairs, stats = pairs_from_policy(
        model,
        tok,
        task,
        items,
        cfg.samples_per_prompt,
        cfg.temperature,
        response_budget(task, items),
        cfg.seed,
        cfg.same_length,
        pairs_per_prompt=cfg.pairs_per_prompt if split == "train" else 1,
    )
    return pairs, {"source": f"policy, {split} split", **stats}


def file_or_sampled(cfg: RMConfig, path: str, model, tok, task, n: int, split: str):
    """(pairs, stats) from a JSONL file when `path` is set, else sampled from the policy."""
    if path:
        pairs, skipped = load_jsonl(path, cfg.on_bad, fits_context(tok, model.config.max_seq_len))
        return pairs, {"source": path, "pairs": len(pairs), "skipped_rows": skipped}
    with phase("rollout"):
        return sample_pairs(cfg, model, tok, task, n, split)


def train_pairs(cfg: RMConfig, model, tok, task):
    """The training pairs: from the file or the policy, plus `synthetic_pairs` corrupted gold traces."""
    pairs, stats = file_or_sampled(cfg, cfg.pairs, model, tok, task, cfg.pair_prompts, "train")
    if cfg.synthetic_pairs:
        # problems drawn with another seed than the policy's prompts: more distinct problems
        extra = corrupted_pairs(task, task.items(cfg.synthetic_pairs, "train", f"{cfg.seed}/synthetic"), cfg.seed)
        pairs, stats = pairs + extra, {**stats, "synthetic_pairs": len(extra)}
    return pairs, stats


def rm_loss_fn(objective: str, margin_coef: float, center_coef: float):
    def loss_fn(model, mb, norm):
        r = model(mb["input_ids"], mb["attention_mask"])  # [2P] rows chosen, rejected, …
        r_w, r_l = r[0::2], r[1::2]  # [P]
        if objective == "bt":
            losses = bradley_terry_loss(r_w, r_l, margin_coef * mb["margin"][0::2], center_coef)  # [P]
            loss = losses.sum() / (norm["seqs"] / 2)  # ← mean over the WHOLE batch's pairs
        else:
            loss = orm_loss(r, mb["label"]).sum() / norm["seqs"]  # ← mean over the WHOLE batch's responses
        return loss, pair_metrics(r_w, r_l)

    return loss_fn


def run(cfg: RMConfig, resume: bool = False, task=None) -> dict:
    check(cfg)
    task = make_task(cfg, task)
    refuse_default_init(cfg)

    r = Run(cfg, "rm", resume)  # a bad --resume or out= fails before the default init
    init = cfg.init or default_init()
    trunk, tok = init_model(cfg, init, r)
    # Pairs are sampled from the init policy before any update (on resume: re-read from the run dir).
    pairs = cached_pairs(r, "pairs.jsonl", lambda: train_pairs(cfg, trunk, tok, task))
    if not pairs:
        raise UsageError(
            "no training pairs: every prompt's samples were all right or all wrong "
            "(see pairs_stats.json); raise pair_prompts or samples_per_prompt, or start from another init"
        )
    heldout = (
        cached_pairs(
            r,
            "eval_pairs.jsonl",
            lambda: file_or_sampled(cfg, cfg.eval_pairs, trunk, tok, task, cfg.eval_prompts, "test"),
        )
        if cfg.eval_prompts or cfg.eval_pairs
        else []
    )
    encoded, eval_encoded = encode_pairs(tok, pairs), encode_pairs(tok, heldout)
    margins = torch.tensor([p.margin for p in pairs])  # [N] (0 for sampled pairs)

    rm = RewardModel(trunk)
    trainer = rank_trainer(Trainer(rm, cfg.optim, cfg.steps, r.rt), rm, r.world, "replicate")  # N ranks: data parallel
    indices = EpochIndices(len(encoded), cfg.batch_size, cfg.seed)

    def batch_fn(step):
        idx = indices(step)
        batch = collate_pairs(encoded, idx, tok.pad_id)
        batch["margin"] = margins[idx].repeat_interleave(2)  # [2B] per row, read at the chosen rows
        batch["label"] = torch.tensor([1.0, 0.0]).repeat(len(idx))  # [2B] chosen 1, rejected 0 (orm)
        return batch

    predict_memory(r, "rm", trunk, batch_fn(1)["input_ids"].shape[1])
    print_plan(
        "rm",
        {
            "params": sum(p.numel() for p in rm.parameters()),
            "pairs": len(encoded),
            "prompts/step": cfg.batch_size,
            "samples/step": 2 * cfg.batch_size,
            **batch_plan(batch_fn(1), trainer.budgets.train, 2),
            "optimizer steps/step": 1,
            "steps": cfg.steps,
            "epochs": round(cfg.steps * cfg.batch_size / len(encoded), 2),
            "objective": cfg.objective,
            "held-out pairs": len(eval_encoded),
        },
    )

    def evaluate_fn(_trunk):
        if not eval_encoded:
            return {}
        r_w, r_l = score_pairs(rm, eval_encoded, tok.pad_id)  # [P], [P]
        m = pair_metrics(r_w, r_l, prefix="eval/rm_")
        history.append(m["eval/rm_accuracy"])
        return m

    history: list[float] = []
    step_fn = supervised_step(
        trainer, batch_fn, rm_loss_fn(cfg.objective, cfg.margin_coef, cfg.center_coef), r.rt.device, unit=2
    )  # both rows of a pair in one micro-batch
    # train_loop saves the trunk as the checkpoint's model; the head travels in trainer.pt (resume)
    # and, at the end, as reward_head.safetensors beside model.safetensors.
    summary = train_loop(
        r,
        trunk,
        tok,
        trainer,
        step_fn,
        evaluate=evaluate_fn,
        eval_at_start=True,
        meta={"task": cfg.task.name, "reward_model": True, "objective": cfg.objective},
        show=("loss", "rm/accuracy", "eval/rm_accuracy"),
        extra_state=(lambda: {"reward_head": head_state(rm)}, lambda s: rm.head.load_state_dict(s["reward_head"])),
    )
    save_head(rm, summary["checkpoint"])
    if history:
        start = f", {history[0]:.3f} at step 0" if r.resume_from is None else ""
        print(f"held-out pairwise accuracy: {history[-1]:.3f} ({len(eval_encoded)} pairs{start})")
    return summary
