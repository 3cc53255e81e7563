"""Small real gpt_mini training runs behind the training lessons, stored as JSON in the package.

    python -m posttrain.lessons.runs          # re-runs them all and rewrites data/runs.json
    python -m posttrain.lessons.runs dapo     # re-runs only the 16 DAPO ablation runs (~30 s)

Each run is seconds on a laptop CPU (a 2-layer, 64-wide gpt_mini on one-digit sums), so the
lesson pages read recorded curves instead of training while you move a knob; tests re-run a
short prefix of a recorded run and check it gives the recorded numbers.
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path

import torch

from posttrain.config import OptimConfig
from posttrain.eval import evaluate
from posttrain.framework.batch import collate
from posttrain.framework.trainer import Trainer
from posttrain.lessons import dapo_toy
from posttrain.models.gpt_mini import GPTMini, ModelConfig
from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
from posttrain.recipes.common import lm_loss
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask

DATA = Path(__file__).resolve().parent / "data" / "runs.json"
TASK = ArithmeticConfig(min_terms=2, max_terms=3, max_value=9)
EVAL_EVERY = 25
CONTEXTS = ["3+4=", "3+4=7;7+", "12+6=1", "9+9="]


def tiny_model(tok: CharTokenizer, seed: int, layers: int = 2) -> GPTMini:
    torch.manual_seed(seed)
    return GPTMini(ModelConfig(d_model=64, n_layers=layers, n_heads=4, d_ff=128, max_seq_len=64).resolved(tok.vocab_size))


def sft_run(mask_prompt: bool, cot: bool, steps: int = 300, seed: int = 0, layers: int = 2, terms: int | None = None,
            heldout_n: int = 100) -> dict:
    """SFT from scratch on sums of 2–3 digits (or of exactly `terms` digits); held-out greedy
    accuracy every EVAL_EVERY steps."""
    torch.set_num_threads(1)
    tok = CharTokenizer(BASE_CHARS)
    task = ArithmeticTask(TASK if terms is None else ArithmeticConfig(min_terms=terms, max_terms=terms, max_value=9))
    model = tiny_model(tok, seed, layers)
    items = task.items(2000, "train", seed, k=terms)
    prompts = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    responses = [tok.encode(tok.chat_response(it.target(cot))) for it in items]
    heldout = task.items(heldout_n, "test", seed, k=terms)
    trainer = Trainer(model, OptimConfig(lr=3e-3, schedule="constant", weight_decay=0.0), steps)
    gen = torch.Generator().manual_seed(seed)
    curve = {"step": [], "loss": [], "acc": []}
    for step in range(1, steps + 1):
        idx = torch.randint(0, len(items), (32,), generator=gen).tolist()
        batch = collate([prompts[i] for i in idx], [responses[i] for i in idx], tok.pad_id, mask_prompt)
        m = trainer.step(batch, lm_loss)
        if step % EVAL_EVERY == 0:
            acc = evaluate(model, tok, task, heldout, seed=seed)["eval/greedy_acc"]
            curve["step"].append(step)
            curve["loss"].append(round(float(m["train/nll"]), 4))
            curve["acc"].append(round(acc, 4))
            model.train()
    return curve


def pretrain_run(steps: int = 300, seed: int = 0) -> dict:
    """Next-character pretraining on the task's trace corpus; the final next-char logits for a
    few contexts (the widget samples from them at any temperature)."""
    torch.set_num_threads(1)
    tok, task = CharTokenizer(BASE_CHARS), ArithmeticTask(TASK)
    model = tiny_model(tok, seed)
    text = tok.encode(task.corpus(40_000, seed))
    data = torch.tensor(text)
    trainer = Trainer(model, OptimConfig(lr=3e-3, schedule="constant"), steps)
    gen = torch.Generator().manual_seed(seed)
    T, losses = 32, []
    for step in range(1, steps + 1):
        starts = torch.randint(0, len(text) - T - 1, (32,), generator=gen)
        ids = torch.stack([data[s:s + T] for s in starts.tolist()])          # [32, T]
        batch = {"input_ids": ids, "attention_mask": torch.ones(32, T), "loss_mask": torch.ones(32, T)}
        batch["loss_mask"][:, 0] = 0                                          # position 0 has no prediction
        m = trainer.step(batch, lm_loss)
        if step % EVAL_EVERY == 0:
            losses.append(round(float(m["train/nll"]), 4))
    model.eval()
    with torch.no_grad():
        logits = {c: model(torch.tensor([tok.encode(c)]))[0, -1].tolist() for c in CONTEXTS}
    return {"step": list(range(EVAL_EVERY, steps + 1, EVAL_EVERY)), "loss": losses,
            "logits": {c: [round(x, 4) for x in v] for c, v in logits.items()}}


def all_runs() -> dict:
    out = {"pretrain": pretrain_run()}
    for cot in (False, True):
        for mask in (True, False):
            out[f"sft cot={cot} mask={mask}"] = sft_run(mask, cot)
            print(f"[runs] sft cot={cot} mask={mask}: acc {out[f'sft cot={cot} mask={mask}']['acc']}", flush=True)
    out.update(dapo_toy.all_runs())
    return out


@lru_cache(maxsize=1)
def recorded() -> dict:
    if not DATA.exists():
        from posttrain import UsageError
        raise UsageError(f"{DATA} is missing; regenerate it with: python -m posttrain.lessons.runs")
    return json.loads(DATA.read_text())


if __name__ == "__main__":
    if sys.argv[1:] == ["dapo"]:                  # keep the other recorded runs as they are
        runs = {k: v for k, v in json.loads(DATA.read_text()).items() if not k.startswith("dapo ")}
        runs.update(dapo_toy.all_runs())
    else:
        runs = all_runs()
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps(runs))
    print(f"wrote {DATA}", file=sys.stderr)
