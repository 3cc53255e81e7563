"""Stage 2, supervised fine-tuning with the chat template (and chain-of-thought data).

    <3+4+5>{3+4=7;7+5=12}12#        cot=true   (CoT: the course's lesson 04)
    <3+4+5>12#                      cot=false  (direct answer)

The loss is next-token cross-entropy on the response tokens only (`mask_prompt=true`): the
first learned position predicts the first response token from the full prompt. With
`mask_prompt=false` the model also spends capacity predicting the random prompt digits —
the course's lesson 03 ablation. CoT changes the data, not the loss.
"""

from __future__ import annotations

from posttrain.config import SFTConfig
from posttrain.distributed.ranks import rank_trainer
from posttrain.errors import UsageError
from posttrain.eval import evaluate, evaluate_episodes, response_budget
from posttrain.framework.backends import make_engine, make_sync
from posttrain.framework.batch import collate
from posttrain.framework.card import phase
from posttrain.framework.loop import train_loop
from posttrain.framework.trainer import Trainer
from posttrain.framework.world import current
from posttrain.preference.rejection import rejection_sample
from posttrain.recipes.common import (
    EpochIndices,
    Run,
    batch_plan,
    init_model,
    lm_loss,
    make_task,
    predict_memory,
    prepare_task,
    print_plan,
    supervised_step,
)


class SFTBatches:
    """Batch for step s: rows of an epoch-wise permutation of the examples (pure in (seed, s))."""

    def __init__(self, prompts, responses, batch_size, pad_id, seed, mask_prompt=True, response_masks=None):
        self.prompts, self.responses, self.pad_id, self.mask_prompt = prompts, responses, pad_id, mask_prompt
        self.response_masks = response_masks  # 0 on injected tool results in demonstrations (agent tasks)
        self.indices = EpochIndices(len(prompts), batch_size, seed)

    def __call__(self, step: int) -> dict:
        idx = self.indices(step)
        masks = None if self.response_masks is None else [self.response_masks[i] for i in idx]
        return collate(
            [self.prompts[i] for i in idx],
            [self.responses[i] for i in idx],
            self.pad_id,
            self.mask_prompt,
            response_masks=masks,
        )


def examples(task, tok, n: int, seed: int, cot: bool):
    """(prompt ids, response ids) of `n` train items (a dataset: each of its rows once, at most n)."""
    if hasattr(task, "num_rows"):
        n = min(n, task.num_rows("train"))
    items = task.items(n, "train", seed)
    prompts = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    responses = [tok.encode(tok.chat_response(it.target(cot))) for it in items]
    return prompts, responses


def rejection_examples(cfg: SFTConfig, model, tok, task, run_dir, engine=None):
    """RFT data (preference/rejection.py): the init model's own verified, distinct responses."""
    import json

    items = task.items(min(cfg.rejection_prompts, cfg.num_problems), "train", cfg.seed)
    with phase("rollout"):
        prompts, responses, stats = rejection_sample(
            model,
            tok,
            task,
            items,
            cfg.rejection_samples,
            max_new_tokens=response_budget(task, items),
            seed=cfg.seed,
            engine=engine,
        )
    if current().main:  # every rank sampled the same (seeded): rank 0 writes
        (run_dir / "rejection_stats.json").write_text(json.dumps(stats, indent=1))
    print(f"[sft] rejection sampling: {stats}")
    if not responses:
        raise UsageError(
            f"data=rejection: no sample of the init model was verified correct ({stats}); "
            "start from a better checkpoint or raise rejection_samples"
        )
    return prompts, responses


def run(cfg: SFTConfig, resume: bool = False, task=None) -> dict:
    if cfg.data not in ("gold", "rejection"):
        raise UsageError(f"data={cfg.data!r} is unknown; use gold or rejection")
    if cfg.data == "rejection" and not cfg.init:
        raise UsageError("data=rejection samples from the model being tuned: give init=RUN_OR_CHECKPOINT")
    task = make_task(cfg, task)
    r = Run(cfg, "sft", resume)
    model, tok = init_model(cfg, cfg.init, r, task)
    prepare_task(task, tok, model, response_budget(task, task.items(50, "train", cfg.seed)), r.dir, "sft")
    engine = make_engine(model, tok, cfg.rollout)  # rejection sampling and evaluations (rollout.backend)
    sync = make_sync(model, engine, cfg.rollout)  # vLLM: the trained weights, pushed before an evaluation
    if cfg.data == "rejection":
        prompts, responses = rejection_examples(cfg, model, tok, task, r.dir, engine)
    else:
        prompts, responses = examples(task, tok, cfg.num_problems, cfg.seed, cfg.cot)
    heldout = task.items(cfg.eval_problems, "test", cfg.seed)
    trainer = rank_trainer(
        Trainer(model, cfg.optim, cfg.steps, r.rt), model, r.world, "replicate"
    )  # N ranks: data parallel
    masks = [tok.policy_mask(r) for r in responses] if hasattr(tok, "policy_mask") else []
    masks = masks if any(0 in m for m in masks) else None  # demonstrations with tool results: mask them
    batches = SFTBatches(prompts, responses, cfg.batch_size, tok.pad_id, cfg.seed, cfg.mask_prompt, masks)
    predict_memory(r, "sft", model, batches(1)["input_ids"].shape[1])
    print_plan(
        "sft",
        {
            "params": model.num_params(),
            "examples": len(prompts),
            "prompts/step": cfg.batch_size,
            "samples/step": cfg.batch_size,
            **batch_plan(batches(1), trainer.budgets.train),
            "optimizer steps/step": 1,
            "steps": cfg.steps,
            "epochs": round(cfg.steps * cfg.batch_size / len(prompts), 2),
            "data": cfg.data,
            "cot": cfg.cot,
            "mask_prompt": cfg.mask_prompt,
        },
    )

    def evaluate_fn(m):
        sync.sync()
        if hasattr(task, "make_env"):  # agent tasks: greedy episodes with the tools
            res = evaluate_episodes(
                engine, tok, task, heldout, seed=cfg.seed, max_new_tokens=response_budget(task, heldout)
            )
        else:
            res = evaluate(m, tok, task, heldout, seed=cfg.seed, engine=engine)
        per_k = res.pop("per_k")
        return {**res, **{f"eval/greedy_acc_k{k}": row["greedy"] for k, row in per_k.items()}}

    step_fn = supervised_step(trainer, batches, lm_loss, r.rt.device)

    def reached(metrics) -> str:
        acc = metrics.get("eval/greedy_acc")
        return (
            f"held-out greedy accuracy {acc:.3f} ≥ target_acc {cfg.target_acc}"
            if acc is not None and cfg.target_acc and acc >= cfg.target_acc
            else ""
        )

    summary = train_loop(
        r,
        model,
        tok,
        trainer,
        step_fn,
        evaluate=evaluate_fn,
        until=reached,
        meta={"task": cfg.task.name, "cot": cfg.cot},
        show=("loss", "eval/greedy_acc"),
    )
    table = {k: v for k, v in summary.items() if k.startswith("eval/greedy_acc_k") and k != "eval/greedy_acc_k0"}
    if table:
        print(
            "held-out greedy accuracy by K: " + "  ".join(f"K={k.rsplit('k', 1)[1]}: {v:.3f}" for k, v in table.items())
        )
    return summary
