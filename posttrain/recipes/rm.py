"""Stage 3 (rewards from preferences): a Bradley–Terry reward model on verifier-labelled pairs.

    posttrain rm [configs/rm.yaml] [init=RUN_OR_CHECKPOINT] [objective=orm] [key=value ...]

1. Pairs: sampled from the starting (SFT) policy on train-split prompts, chosen = a verified
   correct response, rejected = a wrong one (preference/data.py); or `pairs=FILE.jsonl` in
   TRL's format, with an optional `margin` column. Held-out pairs come the same way from
   `eval_prompts` test-split prompts, or from `eval_pairs=FILE.jsonl`. Both are written to the run directory (`pairs.jsonl`,
   `eval_pairs.jsonl`, counts in `pairs_stats.json`) and re-read on resume.
2. The model is the init checkpoint's trunk plus a fresh scalar head (preference/reward_model.py),
   all of it trained. Each step: a batch of pairs as interleaved rows (chosen, rejected), one
   forward, the per-pair BT loss (or per-response ORM loss) summed and divided by the WHOLE
   batch's pairs (rows), so micro-batches, which keep both rows of a pair together
   (`Trainer.step(unit=2)`), add up to the full-batch mean.
3. Held-out pairwise accuracy (`eval/rm_accuracy`) at step 0, every `eval_every` steps and at
   the end. The checkpoint is the trunk (`model.safetensors`) plus `reward_head.safetensors`;
   `preference.reward_model.load_reward_model(RUN_DIR)` reads it back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import torch

from posttrain import UsageError, tasks
from posttrain.config import OptimConfig, RunConfig
from posttrain.eval import response_budget
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
from posttrain.preference.reward_model import (
    RewardModel,
    bradley_terry_loss,
    head_state,
    orm_loss,
    pair_metrics,
    save_head,
    score_pairs,
)
from posttrain.recipes.common import (
    EpochIndices,
    Run,
    batch_plan,
    init_model,
    predict_memory,
    print_plan,
    supervised_step,
)
from posttrain.recipes.rl import default_init, refuse_default_init
from posttrain.sizing.card import phase
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.tasks.base import TaskConfig

OBJECTIVES = ("bt", "orm")


@dataclass
class RMConfig(RunConfig):
    steps: int = 600
    eval_every: int = 100
    init: str = ""  # SFT checkpoint or run dir for the trunk; "" = the default SFT(CoT) checkpoint (cached)
    task: TaskConfig = field(default_factory=ArithmeticConfig)  # prompts for sampled pairs and evaluation
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=3e-4, weight_decay=0.0, warmup_steps=10, schedule="cosine")
    )  # whole trunk trained; 1e-4 barely moves, 1e-3 stalls at ~0.63
    objective: str = "bt"  # bt: Bradley–Terry on pairs | orm: BCE on each response's verifier label
    margin_coef: float = 1.0  # bt: subtract margin_coef × the pair's `margin` (JSONL column; 0 for sampled pairs)
    center_coef: float = 0.01  # bt: η of η·(r_w + r_l)², keeps scores near 0 for use as an RL reward (0 = off)
    batch_size: int = 64  # pairs per step (2× rows)
    pairs: str = ""  # JSONL file of prompt/chosen/rejected[/margin]; "" = sample pairs from the init policy
    on_bad: str = "error"  # a bad JSONL row: error (one line, file:line) | skip (counted)
    pair_prompts: int = 8000  # train-split prompts sampled for pairs; a prompt with mixed rewards gives one pair.
    # The RM needs thousands of pairs: with ~1.3k it memorises them (held-out ≈ chance)
    samples_per_prompt: int = 8  # samples per prompt; more finds pairs on easy/hard prompts too, at sampling cost
    pairs_per_prompt: int = 1  # train pairs per mixed prompt, no response reused (8 samples: at most 4);
    # more pairs from the same samples, free; held-out pairs stay one per prompt
    same_length: bool = False  # only pairs whose two responses have equal token counts (no length shortcut)
    temperature: float = 1.0  # sampling temperature for the pairs
    eval_prompts: int = 500  # test-split prompts sampled for held-out pairs (one per mixed prompt; 0 = no eval)
    eval_pairs: str = ""  # JSONL file of held-out pairs instead (for `pairs=FILE` data); "" = sample as above
    synthetic_pairs: int = 0  # extra train pairs: a train problem's gold CoT vs the same trace with one mistake
    # (preference/data.corrupted_pairs); free to build, they teach the RM to check steps


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
    task = task if task is not None else tasks.make(cfg.task)
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
    trainer = Trainer(rm, cfg.optim, cfg.steps, r.rt)
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
