"""Helpers of the facts of lessons 00–12 (facts_a.py, facts_a_loop.py, facts_a_algos.py): reading a
widget's KPI at any setting, tables, the committed benchmark JSON, and the small real objects the
facts compute on (a tiny gpt_mini, one rollout batch, a toy batch of responses, the bandit's gradient)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from posttrain.algorithms import core, grpo, reinforce
from posttrain.framework.batch import RolloutBatch, collate_samples
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.lessons.registry import kpi  # noqa: F401 — the facts modules' one kpi
from posttrain.models.gpt_mini import ModelConfig, build_model
from posttrain.models.tokenizer import CharTokenizer

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
BANDIT = [0.1, 0.3, 0.9, 0.4, 0.2]  # the course's 5-armed bandit (lesson 01), arms A–E
ARMS = "ABCDE"


def at(widget: str, label: str, **knobs):
    """A fact that is one KPI of a widget at a setting other than its defaults."""
    return functools.partial(kpi, widget, label, **knobs)


def table(columns: list[str], rows: list[list]) -> dict:
    return {"columns": columns, "rows": rows}


def signed(xs) -> str:
    return ", ".join(f"{float(x):+.2f}" for x in xs)


@functools.cache
def load_json(name: str):
    return json.loads((RESULTS / name).read_text())


def tiny_model(seed: int = 0):
    """A randomly initialised 2-layer gpt_mini (d = 32) and the built-in tokenizer: big enough to
    sample and score real sequences, small enough for a fact."""

    torch.manual_seed(seed)
    tok = CharTokenizer()
    model = build_model(ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=64), tok.vocab_size)
    return model, tok


def bandit_grad(theta: torch.Tensor, arm: int, reward: float) -> torch.Tensor:
    """∂/∂θ of REINFORCE's loss for one sampled arm (reinforce.loss, A = R, no baseline)."""
    theta = theta.clone().requires_grad_(True)
    lp = torch.log_softmax(theta, -1)[arm].view(1, 1)  # [1, 1] log π(arm)
    cfg = reinforce.Config()
    adv = reinforce.advantages(torch.tensor([reward], dtype=torch.float64), torch.zeros(1, dtype=torch.long), cfg)
    mask = torch.ones(1, 1, dtype=torch.float64)
    loss, _ = reinforce.loss(
        lp, RolloutBatch(loss_mask=mask, advantages=adv, old_logprobs=lp.detach()), cfg, core.batch_norm(mask)
    )
    (g,) = torch.autograd.grad(loss, theta)
    return g


@functools.cache
def rollout_batch(temperature: float = 0.7):
    """8 samples (2 prompts × 4) from the tiny model through Engine.generate, collated."""

    model, tok = tiny_model()
    prompts = [tok.encode(tok.chat_prompt(q)) for q in ("3+4+5", "7+8")]
    samples = Engine(model, tok, max_slots=16).generate(
        prompts, 4, SamplingParams(temperature=temperature, max_new_tokens=12), seed=0
    )
    return model, collate_samples(samples, tok.pad_id)


def toy_batch(
    lengths=(7, 2, 3, 1, 2, 2),
    width: int = 8,
    drift: float = 0.0,
    rewards=(1, 0, 1, 0, 0, 1),
    groups=(0, 0, 0, 1, 1, 1),
) -> dict:
    """Responses of the given lengths (column 0 stands in for the prompt), random behaviour
    logprobs, GRPO advantages of `rewards` within `groups`; the trainer's logprobs are the
    sampler's + U(−drift, drift) (drift 0: ratio 1). Returns (RolloutBatch, trainer logprobs [B, T])."""
    g = torch.Generator().manual_seed(0)
    B = len(lengths)
    mask = torch.zeros(B, width, dtype=torch.float64)
    for i, n in enumerate(lengths):
        mask[i, 1 : 1 + n] = 1
    attn = mask.clone()
    attn[:, 0] = 1
    old = -torch.rand(B, width, generator=g, dtype=torch.float64) * 2 * mask
    lp = old + (torch.rand(B, width, generator=g, dtype=torch.float64) * 2 - 1) * drift * mask
    rw, gi = torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups)
    return RolloutBatch(
        input_ids=torch.zeros(B, width, dtype=torch.long),
        attention_mask=attn,
        loss_mask=mask,
        old_logprobs=old,
        rewards=rw,
        group_index=gi,
        advantages=core.broadcast(grpo.advantages(rw, gi, grpo.Config()), mask),
    ), lp


def algo_runs() -> list[dict]:
    return load_json("algorithms.json")
