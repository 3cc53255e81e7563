"""Small real gpt_mini training runs behind the training lessons, stored as JSON in the package.

    python -m posttrain.lessons.runs          # re-runs them all and rewrites data/runs.json
    python -m posttrain.lessons.runs dapo     # re-runs only the 16 DAPO ablation runs (~30 s)
    python -m posttrain.lessons.runs stale mask cot   # or other parts (see PARTS), keeping the rest

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
from posttrain.errors import UsageError
from posttrain.eval import evaluate
from posttrain.framework.batch import collate
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.framework.trainer import Trainer
from posttrain.lessons import dapo_toy
from posttrain.models.gpt_mini import GPTMini, ModelConfig
from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
from posttrain.recipes.common import lm_loss
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask

DATA = Path(__file__).resolve().parent / "data" / "runs.json"
TASK = ArithmeticConfig(min_terms=2, max_terms=3, max_value=9)
EVAL_EVERY = 25
PRETRAIN_WINDOW = 32  # characters per window of the recorded pretraining run
CONTEXTS = ["3+4=", "3+4=7;7+", "7+5=1", "9+9="]  # each read at the start of a line of the corpus


def tiny_model(tok: CharTokenizer, seed: int, layers: int = 2, max_seq_len: int = 64) -> GPTMini:
    torch.manual_seed(seed)
    return GPTMini(
        ModelConfig(d_model=64, n_layers=layers, n_heads=4, d_ff=128, max_seq_len=max_seq_len).resolved(tok.vocab_size)
    )


def sft_run(
    mask_prompt: bool,
    cot: bool,
    steps: int = 300,
    seed: int = 0,
    layers: int = 2,
    task_cfg: ArithmeticConfig = TASK,
    heldout_n: int = 100,
    eval_every: int = EVAL_EVERY,
) -> dict:
    """SFT from scratch on the task's sums (default: 2–3 single digits); held-out greedy accuracy
    every `eval_every` steps, overall ("acc") and per number of terms ("acc_k": {K: [...]})."""
    torch.set_num_threads(1)
    tok, task = CharTokenizer(BASE_CHARS), ArithmeticTask(task_cfg)
    model = tiny_model(tok, seed, layers, max_seq_len=64 if task_cfg.max_terms <= 3 else 128)
    items = task.items(2000, "train", seed)
    prompts = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    responses = [tok.encode(tok.chat_response(it.target(cot))) for it in items]
    heldout = task.items(heldout_n, "test", seed)
    trainer = Trainer(model, OptimConfig(lr=3e-3, schedule="constant", weight_decay=0.0), steps)
    gen = torch.Generator().manual_seed(seed)
    curve = {"step": [], "loss": [], "acc": [], "acc_k": {}}
    for step in range(1, steps + 1):
        idx = torch.randint(0, len(items), (32,), generator=gen).tolist()
        batch = collate([prompts[i] for i in idx], [responses[i] for i in idx], tok.pad_id, mask_prompt)
        m = trainer.step(batch, lm_loss)
        if step % eval_every == 0:
            ev = evaluate(model, tok, task, heldout, seed=seed)
            curve["step"].append(step)
            curve["loss"].append(round(float(m["train/nll"]), 4))
            curve["acc"].append(round(ev["eval/greedy_acc"], 4))
            for k, row in ev["per_k"].items():
                curve["acc_k"].setdefault(str(k), []).append(round(row["greedy"], 4))
            model.train()
    return curve


def seeds_mean(curves: list[dict]) -> dict:
    """Curves of several seeds averaged point by point (per-K accuracies too)."""
    out = {"step": curves[0]["step"], "seeds": len(curves)}
    for key in ("loss", "acc"):
        out[key] = [round(sum(c[key][i] for c in curves) / len(curves), 4) for i in range(len(out["step"]))]
    out["acc_k"] = {
        k: [round(sum(c["acc_k"][k][i] for c in curves) / len(curves), 4) for i in range(len(out["step"]))]
        for k in curves[0]["acc_k"]
    }
    return out


MASK_SEEDS, MASK_STEPS = 3, 400
MASK_TASK = ArithmeticConfig(min_terms=4, max_terms=5, max_value=9)  # prompts 3× longer than the answers
COT_TASK = ArithmeticConfig(min_terms=2, max_terms=6, max_value=19)  # the default task: two-digit terms
COT_LAYERS, COT_STEPS = (1, 2), 1200


def mask_runs() -> dict:
    """G03: SFT on 4–5-term sums with the prompt masked or trained on, MASK_SEEDS seeds each, averaged
    (held-out accuracy every 50 steps on 200 problems)."""
    return {
        f"sft mask={int(m)} seeds": seeds_mean(
            [
                sft_run(m, False, steps=MASK_STEPS, seed=s, task_cfg=MASK_TASK, heldout_n=200, eval_every=50)
                for s in range(MASK_SEEDS)
            ]
        )
        for m in (True, False)
    }


def cot_runs() -> dict:
    """G04: SFT on 2–6-term sums of 0..19, direct answers vs chain of thought, 1 and 2 layers;
    held-out accuracy per number of terms every 200 steps."""
    return {
        f"cot layers={L} cot={int(c)}": sft_run(
            True, c, steps=COT_STEPS, layers=L, task_cfg=COT_TASK, heldout_n=500, eval_every=200
        )
        for L in COT_LAYERS
        for c in (False, True)
    }


def pretrain_run(steps: int = 1000, seed: int = 0) -> dict:
    """Next-character pretraining on the task's trace corpus; the final next-char logits for a
    few contexts (the widget samples from them at any temperature)."""
    torch.set_num_threads(1)
    tok, task = CharTokenizer(BASE_CHARS), ArithmeticTask(TASK)
    model = tiny_model(tok, seed)
    text = tok.encode(task.corpus(40_000, seed))
    data = torch.tensor(text)
    trainer = Trainer(model, OptimConfig(lr=3e-3, schedule="constant"), steps)
    gen = torch.Generator().manual_seed(seed)
    T, losses = PRETRAIN_WINDOW, []
    for step in range(1, steps + 1):
        starts = torch.randint(0, len(text) - T - 1, (32,), generator=gen)
        ids = torch.stack([data[s : s + T] for s in starts.tolist()])  # [32, T]
        batch = {"input_ids": ids, "attention_mask": torch.ones(32, T), "loss_mask": torch.ones(32, T)}
        batch["loss_mask"][:, 0] = 0  # position 0 has no prediction
        m = trainer.step(batch, lm_loss)
        if step % EVAL_EVERY == 0:
            losses.append(round(float(m["train/nll"]), 4))
    model.eval()
    with torch.no_grad():
        logits = {c: model(torch.tensor([tok.encode("\n" + c)]))[0, -1].tolist() for c in CONTEXTS}
    return {
        "step": list(range(EVAL_EVERY, steps + 1, EVAL_EVERY)),
        "loss": losses,
        "logits": {c: [round(x, 4) for x in v] for c, v in logits.items()},
    }


def all_runs() -> dict:
    out = {"pretrain": pretrain_run()}
    for cot in (False, True):
        for mask in (True, False):
            out[f"sft cot={cot} mask={mask}"] = sft_run(mask, cot)
            print(f"[runs] sft cot={cot} mask={mask}: acc {out[f'sft cot={cot} mask={mask}']['acc']}", flush=True)
    for part in ("dapo", "stale", "mask", "cot", "engine"):
        out.update(PARTS[part]())
    return out


@lru_cache(maxsize=1)
def recorded() -> dict:
    if not DATA.exists():
        raise UsageError(f"{DATA} is missing; regenerate it with: python -m posttrain.lessons.runs")
    return json.loads(DATA.read_text())


SPEC_TEMPERATURES = (0.0, 0.5, 1.0)


def train_sft_model(layers: int, d_model: int, steps: int, seed: int = 0) -> GPTMini:
    """A gpt_mini trained by SFT on chain-of-thought traces of 2–6-term sums (COT_TASK)."""
    torch.set_num_threads(1)
    tok, task = CharTokenizer(BASE_CHARS), ArithmeticTask(COT_TASK)
    torch.manual_seed(seed)
    model = GPTMini(
        ModelConfig(d_model=d_model, n_layers=layers, n_heads=4, d_ff=2 * d_model, max_seq_len=128).resolved(
            tok.vocab_size
        )
    )
    items = task.items(4000, "train", seed)
    prompts = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    responses = [tok.encode(tok.chat_response(it.target(True))) for it in items]
    trainer = Trainer(model, OptimConfig(lr=3e-3, schedule="constant", weight_decay=0.0), steps)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(items), (32,), generator=gen).tolist()
        trainer.step(collate([prompts[i] for i in idx], [responses[i] for i in idx], tok.pad_id, True), lm_loss)
    return model.eval()


def pack_model(model: GPTMini) -> dict:
    """A small model as JSON: its config and its weights in float16, base64."""
    import base64
    from dataclasses import asdict

    return {
        "config": asdict(model.config),
        "weights": {
            k: [list(v.shape), base64.b64encode(v.detach().half().numpy().tobytes()).decode()]
            for k, v in model.state_dict().items()
        },
    }


def unpack_model(d: dict) -> GPTMini:
    import base64

    import numpy as np

    model = GPTMini(ModelConfig(**d["config"]))
    state = {
        k: torch.from_numpy(np.frombuffer(base64.b64decode(b), dtype=np.float16).reshape(shape).astype(np.float32))
        for k, (shape, b) in d["weights"].items()
    }
    model.load_state_dict(state)
    return model.eval()


@torch.no_grad()
def spec_acceptance(target: GPTMini, draft: GPTMini, contexts: list[list[int]]) -> dict:
    """Speculative decoding's per-token acceptance rate α(T) = E_context Σ_v min(p_T(v), q_T(v))
    (Leviathan et al. 2023) of the draft q for the target p, over every position of the given
    sequences; at T = 0 (greedy) α is the rate at which the two argmaxes agree."""
    out = {}
    for T in SPEC_TEMPERATURES:
        acc = []
        for ids in contexts:
            x = torch.tensor([ids])
            lp, lq = target(x)[0], draft(x)[0]  # [L, V]
            if T == 0:
                acc.append((lp.argmax(-1) == lq.argmax(-1)).double())
            else:
                acc.append(torch.minimum(torch.softmax(lp / T, -1), torch.softmax(lq / T, -1)).sum(-1).double())
        out[str(T)] = round(float(torch.cat(acc).mean()), 4)
    return out


def engine_runs() -> dict:
    """The lesson-21 scheduler's model: a 2-layer gpt_mini SFT'd on CoT traces (its response
    lengths vary with the number of terms), and the acceptance rate of a 1-layer draft for it."""

    target = train_sft_model(2, 64, 1500)
    draft = train_sft_model(1, 32, 600)
    tok, task = CharTokenizer(BASE_CHARS), ArithmeticTask(COT_TASK)
    items = task.items(100, "test", 0)
    prompts = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
    samples = Engine(target, tok).generate(prompts, 1, SamplingParams(temperature=1.0, max_new_tokens=64), seed=0)
    contexts = [s.prompt_ids + s.response_ids for s in samples]
    return {"engine model": pack_model(target), "spec acceptance": spec_acceptance(target, draft, contexts)}


PARTS = {
    "dapo": lambda: dapo_toy.all_runs(),
    "stale": lambda: dapo_toy.stale_runs(),
    "mask": mask_runs,
    "cot": cot_runs,
    "pretrain": lambda: {"pretrain": pretrain_run()},
    "engine": engine_runs,
}


if __name__ == "__main__":  # python -m posttrain.lessons.runs [PART ...]
    runs = json.loads(DATA.read_text()) if DATA.exists() else {}
    if sys.argv[1:]:  # re-run only the named parts, keep the rest
        for part in sys.argv[1:]:
            if part not in PARTS:
                sys.exit(f"unknown part {part!r}; parts: {', '.join(PARTS)}")
            runs.update(PARTS[part]())
            DATA.write_text(json.dumps(runs))
            print(f"[runs] {part} done", file=sys.stderr, flush=True)
    else:
        runs = all_runs()
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps(runs))
    print(f"wrote {DATA}", file=sys.stderr)
