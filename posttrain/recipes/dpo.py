"""Stage 3 (offline preferences), DPO and its family on verifier-labelled pairs.

    posttrain dpo [configs/dpo.yaml] [init=RUN_OR_CHECKPOINT] [loss_type=ipo] [key=value ...]

1. Pairs: sampled from the starting (SFT) policy on train-split prompts, chosen = a verified
   correct response, rejected = a wrong one (preference/data.py); or `pairs=FILE.jsonl` in
   TRL's format. They are written to `pairs.jsonl` in the run directory, with their counts
   (prompts with all-correct / all-wrong samples give no pair) in `pairs_stats.json`.
2. Reference log-probs are computed once for every pair before training (TRL's
   `precompute_ref_log_probs`): the reference is the starting policy, frozen.
3. Each step: a batch of pairs as interleaved rows (chosen, rejected), one forward, the
   per-pair loss of preference/dpo.py averaged over the batch's pairs. Micro-batches keep
   both rows of a pair together (`Trainer.step(unit=2)`).
4. Held-out greedy / pass@1 / pass@k at step 0 and every `eval_every` steps, so the change
   from the SFT start is in metrics.jsonl; `logps/chosen` and `logps/rejected` show the
   likelihood displacement (both can fall while the margin grows).
"""

from __future__ import annotations

import json
from dataclasses import asdict

import torch

from posttrain.config import DPOConfig
from posttrain.distributed.ranks import rank_trainer
from posttrain.errors import UsageError
from posttrain.eval import evaluate, response_budget
from posttrain.framework.batch import to_device
from posttrain.framework.card import phase
from posttrain.framework.logprobs import micro_logprobs
from posttrain.framework.loop import train_loop
from posttrain.framework.reference import Reference, score_logprobs
from posttrain.framework.trainer import Trainer
from posttrain.preference.data import (
    Pair,
    collate_pairs,
    encode_pairs,
    fits_context,
    load_jsonl,
    pairs_from_policy,
    seq_logps,
)
from posttrain.preference.dpo import (
    LOSSES,
    REFERENCE_FREE,
    DPOLossConfig,
    SeqLogps,
    kto_reference_point,
    preference_loss,
)
from posttrain.recipes.common import (
    EpochIndices,
    Run,
    batch_plan,
    init_model,
    make_task,
    predict_memory,
    print_plan,
    show_first_prompt,
    supervised_step,
)
from posttrain.recipes.warm_start import default_init, refuse_default_init


def loss_config(cfg: DPOConfig) -> DPOLossConfig:
    """The loss's own keys (preference/dpo.py) out of the stage's config."""
    return DPOLossConfig(cfg.loss_type, cfg.beta, cfg.label_smoothing, cfg.simpo_gamma, cfg.nll_alpha)


def build_pairs(cfg: DPOConfig, r: Run, model, tok, task) -> list:
    """The pairs of this run: from the run directory on resume, else from a file or the policy."""
    saved = r.dir / "pairs.jsonl"
    if r.resume_from is not None and saved.exists():
        return [Pair(**json.loads(line)) for line in saved.read_text().splitlines()]
    if cfg.pairs:
        pairs, skipped = load_jsonl(cfg.pairs, cfg.on_bad, fits_context(tok, model.config.max_seq_len))
        stats = {"source": cfg.pairs, "pairs": len(pairs), "skipped_rows": skipped}
    else:
        items = task.items(cfg.pair_prompts, "train", cfg.seed)
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
        )
        stats["source"] = "policy"
    if not pairs:
        raise UsageError(
            f"no preference pairs ({stats}); raise pair_prompts or samples_per_prompt, "
            "or start from a checkpoint that is right on some prompts and wrong on others"
        )
    if r.world.main:  # every rank built the same pairs (seeded): rank 0 writes them
        saved.write_text("".join(json.dumps({k: v for k, v in asdict(p).items() if k != "item"}) + "\n" for p in pairs))
        (r.dir / "pairs_stats.json").write_text(json.dumps(stats, indent=1))
    print(f"[dpo] pairs: {stats}")
    return pairs


@torch.no_grad()
@phase("reference")
def reference_logps(
    model, encoded, pad_id: int, batch_pairs: int = 64, runtime=None, packing: bool = False
) -> torch.Tensor:
    """[2·P] log π_ref sums of every row (chosen, rejected interleaved), computed once, on the
    model's device (the pairs are collated on the CPU and moved here: issue 31's crash on CUDA), in
    the runtime's compute dtype, as the RL reference (framework/reference.py)."""
    ref, out = Reference(model, runtime=runtime, packing=packing), []
    device = next(model.parameters()).device
    for a in range(0, len(encoded), batch_pairs):
        batch = to_device(collate_pairs(encoded, range(a, min(a + batch_pairs, len(encoded))), pad_id), device)
        out.append(ref.score(batch).sum(-1))
    return torch.cat(out)


def with_kto_reference_point(model, batch: dict) -> dict:
    """KTO's z0 of the WHOLE batch, scored once at this step's weights before the trainer splits
    the batch (each micro-batch's own mean would make the gradient depend on the micro-batch
    size): batch['kto_z0'] [2B], one value repeated so it survives the split."""
    with torch.no_grad():
        sums = score_logprobs(model, batch).sum(-1)  # [2B]
    return {**batch, "kto_z0": kto_reference_point(sums, batch["ref_logps"]).expand(len(sums))}


def dpo_loss_fn(loss_cfg: DPOLossConfig):
    def loss_fn(model, mb, norm):
        lp, _ = micro_logprobs(model, mb)  # packed when the trainer packed mb (optim.packing)
        sums, counts = seq_logps(lp, mb["loss_mask"])  # [2P], [2P]
        ref = mb.get("ref_logps")
        s = SeqLogps(
            sums[0::2],
            sums[1::2],
            None if ref is None else ref[0::2],
            None if ref is None else ref[1::2],
            counts[0::2],
            counts[1::2],
        )
        z0 = mb["kto_z0"][0] if "kto_z0" in mb else None  # the whole batch's (batch_fn)
        losses, metrics = preference_loss(loss_cfg, s, z0)  # [P]
        return losses.sum() / (norm["seqs"] / 2), metrics  # mean over the WHOLE batch's pairs

    return loss_fn


def run(cfg: DPOConfig, resume: bool = False, task=None) -> dict:
    if cfg.loss_type not in LOSSES:
        raise UsageError(f"loss_type={cfg.loss_type!r} is unknown; use one of {', '.join(LOSSES)}")
    if cfg.on_bad not in ("error", "skip"):
        raise UsageError(f"on_bad={cfg.on_bad!r} is unknown; use error or skip")
    if cfg.loss_type in ("cdpo", "robust") and not 0 <= cfg.label_smoothing < 0.5:
        raise UsageError(f"label_smoothing={cfg.label_smoothing} must be in [0, 0.5)")
    if cfg.pairs:
        load_jsonl(cfg.pairs, cfg.on_bad)  # validate before any work
    task = make_task(cfg, task)
    refuse_default_init(cfg)

    r = Run(cfg, "dpo", resume)  # a bad --resume or out= fails before the default init
    init = cfg.init or default_init()
    model, tok = init_model(cfg, init, r)
    with phase("rollout"):  # pairs sampled from the policy (or read from a file)
        pairs = build_pairs(cfg, r, model, tok, task)
    encoded = encode_pairs(tok, pairs)
    show_first_prompt(
        tok.chat_prompt(pairs[0].prompt) + tok.chat_continuation(pairs[0].prompt, pairs[0].chosen), r.dir, "dpo"
    )
    indices = EpochIndices(len(encoded), cfg.batch_size, cfg.seed)
    # before the reference pass, which reads the micro-batch budget it resolves (optim.micro_batch_tokens=auto)
    predict_memory(r, "dpo", model, collate_pairs(encoded, indices(1), tok.pad_id)["input_ids"].shape[1])
    ref = (
        None
        if cfg.loss_type in REFERENCE_FREE
        else reference_logps(model, encoded, tok.pad_id, runtime=r.rt, packing=cfg.optim.packing)
    )
    trainer = rank_trainer(
        Trainer(model, cfg.optim, cfg.steps, r.rt), model, r.world, "replicate"
    )  # N ranks: data parallel

    def batch_fn(step):  # on the model's device before KTO's reference point scores it
        idx = indices(step)
        batch = to_device(collate_pairs(encoded, idx, tok.pad_id), r.rt.device)
        if ref is not None:
            rows = torch.tensor([2 * i + j for i in idx for j in (0, 1)], device=ref.device)
            batch["ref_logps"] = ref[rows]  # [2B]
        return with_kto_reference_point(model, batch) if cfg.loss_type == "kto" else batch

    print_plan(
        "dpo",
        {
            "params": model.num_params(),
            "pairs": len(encoded),
            "prompts/step": cfg.batch_size,
            "samples/step": 2 * cfg.batch_size,
            **batch_plan(batch_fn(1), trainer.budgets.train, 2),
            "optimizer steps/step": 1,
            "steps": cfg.steps,
            "epochs": round(cfg.steps * cfg.batch_size / len(encoded), 2),
            "loss": cfg.loss_type,
            "beta": cfg.beta,
            "reference": ref is not None,
        },
    )

    heldout = task.items(cfg.eval_problems, "test", cfg.seed) if cfg.eval_problems else []
    k = cfg.eval_samples

    def evaluate_fn(m):
        if not cfg.eval_problems:
            return {}
        res = evaluate(m, tok, task, heldout, n=k, ks=(1, k), temperature=cfg.temperature, seed=cfg.seed)
        res.pop("per_k")
        return res

    step_fn = supervised_step(trainer, batch_fn, dpo_loss_fn(loss_config(cfg)), r.rt.device, unit=2)
    return train_loop(
        r,
        model,
        tok,
        trainer,
        step_fn,
        evaluate=evaluate_fn,
        eval_at_start=True,
        meta={"task": cfg.task.name, "loss_type": cfg.loss_type},
        show=("loss", "pref/accuracy", "pref/margin", "eval/pass@1"),
    )
