"""Stage 1, pretraining: next-token prediction on a generated corpus.

The corpus is the arithmetic task's chain-of-thought traces written as plain lines
(`3+4=7;7+5=12`), drawn from the train split only; the validation corpus is drawn from the
held-out split. Batches are random windows of `seq_len` tokens, a pure function of
(seed, step). The loss is cross-entropy on every position but the first.
"""

from __future__ import annotations

import torch

from posttrain.config import PretrainConfig
from posttrain.distributed.ranks import rank_trainer
from posttrain.framework.logprobs import sequence_logprobs
from posttrain.framework.loop import train_loop
from posttrain.framework.trainer import Trainer
from posttrain.recipes.common import (
    Run,
    batch_plan,
    init_model,
    lm_loss,
    make_task,
    predict_memory,
    print_plan,
    supervised_step,
)


class CorpusWindows:
    def __init__(self, ids: torch.Tensor, seq_len: int, batch_size: int, seed: int):
        if len(ids) <= seq_len + 1:
            raise ValueError(f"corpus of {len(ids)} tokens is shorter than seq_len={seq_len}")
        self.ids, self.T, self.B, self.seed = ids, seq_len, batch_size, seed

    def __call__(self, step: int) -> dict:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        start = torch.randint(0, len(self.ids) - self.T, (self.B,), generator=g)
        x = torch.stack([self.ids[s : s + self.T] for s in start.tolist()])  # [B, T]
        loss_mask = torch.ones_like(x, dtype=torch.float)
        loss_mask[:, 0] = 0  # nothing predicts token 0
        return {"input_ids": x, "attention_mask": torch.ones_like(loss_mask), "loss_mask": loss_mask}


def run(cfg: PretrainConfig, resume: bool = False, task=None) -> dict:
    task = make_task(cfg, task)
    r = Run(cfg, "pretrain", resume)
    model, tok = init_model(cfg, "", r, task)
    train_ids = torch.tensor(tok.encode(task.corpus(cfg.corpus_chars, cfg.seed)))
    val_text = task.validation_text(cfg.seed)
    val = CorpusWindows(torch.tensor(tok.encode(val_text)), min(cfg.seq_len, 64), 32, cfg.seed + 1)(0)
    trainer = rank_trainer(
        Trainer(model, cfg.optim, cfg.steps, r.rt), model, r.world, "replicate"
    )  # N ranks: data parallel
    windows = CorpusWindows(train_ids, cfg.seq_len, cfg.batch_size, cfg.seed)
    predict_memory(r, "pretrain", model, windows(1)["input_ids"].shape[1])
    print_plan(
        "pretrain",
        {
            "params": model.num_params(),
            "corpus tokens": len(train_ids),
            "prompts/step": 0,
            "samples/step": cfg.batch_size,
            **batch_plan(windows(1), trainer.budgets.train),
            "optimizer steps/step": 1,
            "steps": cfg.steps,
            "total tokens": cfg.batch_size * cfg.seq_len * cfg.steps,
        },
    )

    @torch.no_grad()
    def evaluate(m):
        m.eval()
        lp, _ = sequence_logprobs(m, val["input_ids"].to(r.rt.device))
        mask = val["loss_mask"].to(r.rt.device)
        return {"eval/val_loss": float(-(lp * mask).sum() / mask.sum())}

    step_fn = supervised_step(trainer, windows, lm_loss, r.rt.device)
    return train_loop(
        r, model, tok, trainer, step_fn, evaluate=evaluate, meta={"task": cfg.task.name}, show=("loss", "eval/val_loss")
    )
