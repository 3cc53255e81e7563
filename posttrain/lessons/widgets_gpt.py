"""Widgets of the gpt_mini lessons (01–06): the model's shapes, and the stages of the pipeline,
from posttrain's model, collate, sampler, preference loss, GRPO advantages and recorded runs."""

from __future__ import annotations

import math

import torch

from posttrain.algorithms import core, grpo
from posttrain.framework.batch import collate
from posttrain.framework.rollout import SamplingParams, draw_keys, sample_keys, sample_tokens
from posttrain.lessons import runs
from posttrain.lessons.registry import Knob, Widget, bar, figure, line, r, register
from posttrain.models.gpt_mini import ModelConfig, count_params
from posttrain.models.tokenizer import CharTokenizer
from posttrain.preference.dpo import DPOLossConfig, SeqLogps, preference_loss
from posttrain.tasks.arithmetic import Problem

# ---- G01 · shapes and parameter counts -------------------------------------------------------------


def course_gpt2_params(d: int, L: int, V: int, t_max: int) -> dict:
    """The course's GPT-2 layout: fused qkv and proj without bias, 4× GELU MLP with biases,
    two LayerNorms per block, learned positions, a final LayerNorm, tied head."""
    return {"token embedding": V * d, "positions": t_max * d, "attention": L * 4 * d * d,
            "MLP": L * (8 * d * d + 5 * d), "norms": L * 4 * d + 2 * d, "output head": 0}


def ours_params(d: int, h: int, L: int, V: int) -> tuple[dict, int]:
    """posttrain's gpt_mini at the same width: RMSNorm, RoPE (no position table), SwiGLU, untied head."""
    d_ff = 8 * round(8 * d / 3 / 8)
    c = ModelConfig(d_model=d, n_layers=L, n_heads=h, d_ff=d_ff, vocab_size=V).resolved(V)
    attn = 4 * d * d
    parts = {"token embedding": V * d, "positions": 0, "attention": L * attn, "MLP": L * 3 * d * d_ff,
             "norms": L * 2 * d + d, "output head": V * d}
    return parts, count_params(c)


def shapes(d: int, h: int, L: int, V: int) -> dict:
    course = course_gpt2_params(d, L, V, t_max=11)
    widget = sum(course_gpt2_params(d, L, V, t_max=64).values())
    ours, total = ours_params(d, h, L, V)
    names = list(course)
    emb = course["token embedding"] + course["positions"]
    n = sum(course.values())
    return {
        "figure": figure([bar(names, list(course.values()), "course's GPT-2 layout (T_max = 11, tied head)"),
                          bar(names, list(ours.values()), "posttrain gpt_mini (Llama-shaped)"),
                          bar(["head dim k", "std of unscaled q·k = √k"], [d // h, math.sqrt(d // h)], "per head",
                              xaxis="x2", yaxis="y2")],
                         f"d = {d}, h = {h}, L = {L}, V = {V}", "", "parameters", barmode="group",
                         grid={"rows": 1, "columns": 2, "pattern": "independent"}, yaxis={"type": "log"}),
        "kpis": [["head dim k = d/h", d // h], ["course layout, T_max 11", f"{n:,}"], ["course layout, T_max 64", f"{widget:,}"],
                 ["posttrain gpt_mini (count_params)", f"{total:,}"], ["blocks / embeddings (course)", r((n - emb) / emb, 1)],
                 ["unscaled q·k std √k", r(math.sqrt(d // h), 2)], ["train FLOPs/token 6N", f"{6 * n:,}"],
                 ["Chinchilla tokens ≈ 20N", f"{20 * n:,}"]],
        "note": "Blocks hold almost every parameter; attention is 4d² and the MLP 8d² per block in GPT-2.",
    }


register(Widget(
    "shapes", "Parameter counts of the model under every stage", shapes,
    [Knob("d", "width d", [32, 64, 128, 256, 512], 128), Knob("h", "heads h", [1, 2, 4, 8], 4),
     Knob("L", "layers L", [1, 2, 4, 8, 12], 4), Knob("V", "vocabulary V", [29, 53, 256], 29)],
    {"knobs": {"d": 512, "h": 1},
     "what": "One 512-dimensional head: unscaled q·k scores would have std √512 ≈ 23 at initialisation, "
             "a one-hot softmax from the first step with vanishing attention gradients. That is why "
             "every attention (posttrain's too) divides the scores by √k."},
    "Parameters by part, for the course's GPT-2 layout and for posttrain's gpt_mini at the same size.",
    ["posttrain.models.gpt_mini:count_params"]))


# ---- G02 · pretraining: next-character distributions -------------------------------------------

def next_char(context: str, temperature: float) -> dict:
    rec = runs.recorded()["pretrain"]
    tok = CharTokenizer()
    logits = torch.tensor(rec["logits"][context])                         # [V] recorded model output
    N = 2000
    keys = draw_keys(sample_keys(0, 0, torch.zeros(N, dtype=torch.long), torch.arange(N)), torch.zeros(N, dtype=torch.long))
    toks, _ = sample_tokens(logits.expand(N, -1), SamplingParams(temperature=temperature), keys)
    freq = torch.bincount(toks, minlength=tok.vocab_size).double() / N
    top = torch.softmax(logits, -1).topk(8).indices.tolist()
    if temperature > 0:                                                   # the distribution sampled from
        ent = float(core.entropy_from_logits(logits / temperature))
    else:                                                                 # greedy: one token, no uncertainty
        ent = 0.0
    labels = [repr(tok.chars[i]) for i in top]
    return {
        "figure": figure([bar(labels, [float(freq[i]) for i in top], f"sampled at T = {temperature} (2000 draws)"),
                          line(rec["step"], rec["loss"], "training loss (recorded run)", xaxis="x2", yaxis="y2")],
                         f"next character after {context!r}", "character", "frequency",
                         grid={"rows": 1, "columns": 2, "pattern": "independent"}, yaxis={"range": [0, 1.05]},
                         xaxis2={"title": {"text": "step"}}, yaxis2={"title": {"text": "nats / char"}}),
        "kpis": [["most likely next char", repr(tok.chars[top[0]])], ["entropy H of the sampled distribution (nats)", r(ent, 3)],
                 ["perplexity e^H", r(math.exp(ent), 2)], ["entropy H at T = 1 (nats)", r(core.entropy_from_logits(logits), 3)],
                 ["greedy (T = 0) always picks", repr(tok.chars[int(logits.argmax())])]],
        "note": "The model was pretrained (300 steps, recorded) on arithmetic traces; T = 0 is truly greedy.",
    }


register(Widget(
    "next_char", "What a pretrained gpt_mini predicts next", next_char,
    [Knob("context", "context", runs.CONTEXTS, runs.CONTEXTS[0], "select"),
     Knob("temperature", "temperature T", [0.0, 0.5, 1.0, 1.5, 2.0], 1.0)],
    {"knobs": {"temperature": 2.0},
     "what": "At T = 2 the distribution flattens (perplexity 7.7 instead of 4.7 at T = 1): wrong digits "
             "are sampled far more often, traces carry more errors, and an RL stage sampling there sees "
             "fewer rewards to learn from."},
    "Left: next-character frequencies from the sampler. Right: the recorded pretraining loss.",
    ["posttrain.framework.rollout:sample_tokens", "posttrain.lessons.runs:pretrain_run"]))


# ---- G03 · SFT: the loss mask ---------------------------------------------------------------------

EXAMPLES = ["<3+4+5>12#", "<hello>olleh#", "<abcd>dcba#"]


def sft_mask(mask_prompt: bool, example: str) -> dict:
    tok = CharTokenizer()
    cut = example.index(">") + 1
    prompt, response = tok.encode(example[:cut]), tok.encode(example[cut:])
    lm = collate([prompt], [response], tok.pad_id, mask_prompt)["loss_mask"][0, 1:]   # targets 1..T-1
    rec = runs.recorded()
    on, off = rec["sft cot=False mask=True"], rec["sft cot=False mask=False"]
    cur = on if mask_prompt else off
    return {
        "figure": figure([bar([f"{i + 1}:{example[i + 1]}" for i in range(len(lm))], lm.tolist(), "target is trained on",
                              marker={"color": ["#1f77b4" if i + 1 >= cut else "#ff7f0e" for i in range(len(lm))]}),
                          line(on["step"], on["acc"], "held-out accuracy, prompt masked", xaxis="x2", yaxis="y2",
                               line={"width": 4 if mask_prompt else 1}),
                          line(off["step"], off["acc"], "held-out accuracy, prompt trained on", xaxis="x2", yaxis="y2",
                               line={"width": 1 if mask_prompt else 4})],
                         f"{example}: orange = prompt position, blue = response", "predicted position", "in the loss",
                         grid={"rows": 1, "columns": 2, "pattern": "independent"}, yaxis={"range": [0, 1.1]},
                         xaxis2={"title": {"text": "SFT step (recorded runs)"}}, yaxis2={"range": [0, 1]}),
        "kpis": [["trained positions", f"{int(lm.sum())} of {len(lm)}"], ["ignored positions", int(len(lm) - lm.sum())],
                 ["final held-out accuracy (this setting)", cur["acc"][-1]],
                 ["final accuracy, masked vs not", f"{on['acc'][-1]} vs {off['acc'][-1]}"]],
        "note": "The first trained target is the first response token, predicted from the whole prompt.",
    }


register(Widget(
    "sft_mask", "SFT: which positions are trained", sft_mask,
    [Knob("mask_prompt", "mask the prompt", [False, True], True, "check"),
     Knob("example", "example", EXAMPLES, EXAMPLES[0], "select")],
    {"knobs": {"mask_prompt": False},
     "what": "Training on the prompt too spends the model's capacity on predicting random question "
             "digits, which cannot be learned; in the recorded runs the answers are learned more slowly "
             "for the first ~150 steps (right plot)."},
    "Left: the loss mask of one example. Right: held-out accuracy of two recorded SFT runs.",
    ["posttrain.framework.batch:collate", "posttrain.lessons.runs:sft_run"]))


# ---- G04 · chain of thought: serial compute ------------------------------------------------------

def cot_budget(L: int, K: int) -> dict:
    terms = tuple(range(1, K + 1))
    trace = Problem(terms).target(True)                                 # posttrain's own CoT target
    direct_ok = K - 1 <= L
    rec = runs.recorded()
    d, c = rec["sft cot=False mask=True"], rec["sft cot=True mask=True"]
    return {
        "figure": figure([bar(["additions needed (direct)", "layers available"], [K - 1, L], "serial steps",
                              marker={"color": ["#d62728" if not direct_ok else "#2ca02c", "#1f77b4"]}),
                          line(d["step"], d["acc"], "direct answers (recorded)", xaxis="x2", yaxis="y2"),
                          line(c["step"], c["acc"], "chain of thought (recorded)", xaxis="x2", yaxis="y2")],
                         f"K = {K} terms, L = {L} layers", "", "count", grid={"rows": 1, "columns": 2, "pattern": "independent"},
                         xaxis2={"title": {"text": "SFT step (2–3 term sums)"}}, yaxis2={"range": [0, 1]}),
        "kpis": [["direct answer within one forward?", "yes" if direct_ok else "no: K−1 > L"],
                 ["CoT target", trace], ["CoT tokens", len(trace)], ["layer-steps with CoT", len(trace) * L],
                 ["0.99 per token over the trace", r(0.99 ** len(trace), 3)]],
        "note": "Writing intermediate sums gives the model one forward pass per token to work with, "
                "instead of L layers for the whole sum.",
    }


register(Widget(
    "cot", "Direct answer vs. chain of thought", cot_budget,
    [Knob("L", "layers L", [1, 2, 3, 4, 6, 8, 12], 4), Knob("K", "terms K", [2, 3, 4, 5, 6, 8, 12], 6)],
    {"knobs": {"L": 1, "K": 12},
     "what": "One layer and twelve terms: a direct answer would need eleven serial additions inside one "
             "forward pass; trained without a trace, the model can only guess."},
    "Left: serial additions a direct answer needs vs. layers. Right: recorded SFT accuracy, direct vs. CoT.",
    ["posttrain.tasks.arithmetic:Problem.trace", "posttrain.lessons.runs:sft_run"]))


# ---- G05 · DPO on one pair -----------------------------------------------------------------------

def dpo_pair(beta: float, lr: float, loss_type: str) -> dict:
    lp = torch.zeros(2, dtype=torch.float64, requires_grad=True)        # log π/π_ref of chosen, rejected
    zero, one = torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    cfg = DPOLossConfig(loss_type=loss_type, beta=beta)
    margins, losses = [], []
    for _ in range(220):
        loss, m = preference_loss(cfg, SeqLogps(lp[:1], lp[1:], zero, zero, one, one))
        (g,) = torch.autograd.grad(loss.mean(), lp)
        losses.append(float(loss.detach()))
        margins.append(m["pref/margin"])
        with torch.no_grad():
            lp -= lr * g
    xs = list(range(220))
    return {
        "figure": figure([line(xs, margins, "margin β(log-ratio_w − log-ratio_l)"), line(xs, losses, "loss", yaxis="y2")],
                         f"{loss_type}, β = {beta}, η = {lr}", "step", "margin",
                         yaxis2={"overlaying": "y", "side": "right", "title": {"text": "loss"}}),
        "kpis": [["loss at step 0 (π_θ = π_ref)", r(losses[0], 4)], ["margin after 220 steps", r(margins[-1], 3)],
                 ["preference accuracy", 1.0 if margins[-1] > 0 else 0.0]],
        "note": "The gradient of −log σ(margin) is β·σ(−margin): the margin grows like β² per step at first.",
    }


register(Widget(
    "dpo_pair", "A DPO update on one pair", dpo_pair,
    [Knob("beta", "β", [0.05, 0.1, 0.2, 0.5, 1.0], 0.1), Knob("lr", "η", [0.05, 0.2, 0.5, 1.0], 0.2),
     Knob("loss_type", "loss", ["dpo", "ipo"], "dpo", "select")],
    {"knobs": {"beta": 0.05, "lr": 0.05},
     "what": "β = 0.05 with a small step: the margin barely leaves 0 in 220 steps (it grows like β²), "
             "so the run looks like it learns nothing."},
    "The implicit-reward margin and the loss over 220 updates.", ["posttrain.preference.dpo:preference_loss"]))


# ---- G06 · RLVR with GRPO: a one-number policy ----------------------------------------------------

def grpo_sim(K: int, beta: float) -> dict:
    """The policy is p = P(correct); 20 seeds × 200 steps. Advantages come from grpo.advantages
    (population std); a step moves p by 0.18·mean(A·correct) − 0.18·β·(p − 0.2), clamped to [0, 1]."""
    seeds = 20
    gen = torch.Generator().manual_seed(0)
    p = torch.full((seeds,), 0.2, dtype=torch.float64)
    groups = torch.arange(seeds).repeat_interleave(K)
    cfg = grpo.Config(std="population")
    mean_p, dead_rate, dead = [], [], 0
    for s in range(200):
        correct = (torch.rand(seeds * K, generator=gen, dtype=torch.float64) < p.repeat_interleave(K)).double()
        adv = grpo.advantages(correct, groups, cfg)                     # [seeds·K]
        live = adv.view(seeds, K).abs().sum(-1) > 0                     # non-degenerate groups
        signal = (adv * correct).view(seeds, K).mean(-1)
        step = 0.18 * signal - 0.18 * beta * (p - 0.2)
        p = torch.where(live, (p + step).clamp(0, 1), p)
        dead += int((~live).sum())
        mean_p.append(float(p.mean()))
        dead_rate.append(dead / ((s + 1) * seeds))
    xs = list(range(1, 201))
    return {
        "figure": figure([line(xs, mean_p, "mean p over 20 seeds"), line(xs, dead_rate, "cumulative dead-group rate")],
                         f"K = {K}, β = {beta}", "step", "", yaxis={"range": [0, 1.05]}),
        "kpis": [["final p (mean)", r(mean_p[-1], 3)], ["max p ever", r(max(mean_p), 3)],
                 ["dead-group rate", r(dead_rate[-1], 3)], ["KL-ish 10·(p − 0.2)²", r(10 * (mean_p[-1] - 0.2) ** 2, 3)]],
        "note": "p can reach 1 but never pass it; once it does every group is all-right and no step learns.",
    }


register(Widget(
    "grpo_sim", "GRPO on a one-number policy", grpo_sim,
    [Knob("K", "rollouts K", [2, 3, 4, 6, 8], 4), Knob("beta", "β", [0.0, 0.05, 0.1, 0.2, 0.5], 0.05)],
    {"knobs": {"K": 2},
     "what": "K = 2: a group has signal only when exactly one of two answers is right, so most steps "
             "are dead from the start and learning is slow and noisy."},
    "Mean policy p and the share of groups that gave no gradient.", ["posttrain.algorithms.grpo:advantages"]))
