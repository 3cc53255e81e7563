"""Widgets of the gpt_mini lessons (01–06): the model's shapes, and the stages of the pipeline,
from posttrain's model, collate, sampler, preference loss, GRPO advantages and recorded runs."""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

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

G06_SEEDS, G06_STEPS, G06_P0, G06_LR = 50, 200, 0.1, 0.4


@functools.lru_cache(maxsize=64)
def _grpo_sim_run(K: int, beta: float) -> tuple[list[float], list[float]]:
    """A one-parameter policy per seed: P(correct) = σ(θ), starting at 0.1 (an SFT model that
    sometimes solves the task). Each step samples K answers per seed, takes grpo.advantages
    (population std) and grpo.loss with the KL anchor to the starting policy (β), and steps θ by
    η = 0.4 along the loss's gradient (autograd through grpo.loss). Returns the mean p over
    G06_SEEDS seeds after each step and the share of groups with no signal at each step."""
    gen = torch.Generator().manual_seed(0)
    S = G06_SEEDS
    theta = torch.full((S,), math.log(G06_P0 / (1 - G06_P0)), dtype=torch.float64)
    groups = torch.arange(S).repeat_interleave(K)
    cfg = grpo.Config(std="population", kl_coef=beta)
    ref = torch.tensor([math.log(1 - G06_P0), math.log(G06_P0)], dtype=torch.float64)   # log π_ref(wrong), (right)
    mask = torch.ones(S * K, 1, dtype=torch.float64)
    norm = core.batch_norm(mask)
    mean_p, dead = [], []
    for _ in range(G06_STEPS):
        th = theta.clone().requires_grad_(True)
        right = (torch.rand(S * K, generator=gen, dtype=torch.float64) < torch.sigmoid(theta).repeat_interleave(K)).double()
        lp = torch.where(right > 0, -F.softplus(-th).repeat_interleave(K), -F.softplus(th).repeat_interleave(K))  # log σ(±θ)
        lp = lp.unsqueeze(1)                                            # [S·K, 1] one answer token each
        adv = grpo.advantages(right, groups, cfg)                       # [S·K]
        batch = {"loss_mask": mask, "advantages": core.broadcast(adv, mask), "old_logprobs": lp.detach(),
                 "ref_logprobs": ref[right.long()].unsqueeze(1)}
        loss, _ = grpo.loss(lp, batch, cfg, norm)
        (g,) = torch.autograd.grad(loss, th)
        theta = theta - G06_LR * S * g                                  # the loss averages seeds: × S
        mean_p.append(float(torch.sigmoid(theta).mean()))
        dead.append(float((adv.view(S, K).abs().sum(-1) == 0).double().mean()))
    return mean_p, dead


def grpo_sim(K: int, beta: float) -> dict:
    mean_p, dead = _grpo_sim_run(K, beta)
    xs = list(range(1, G06_STEPS + 1))
    hit = next((i + 1 for i, p in enumerate(mean_p) if p >= 0.9), None)
    early = sum(dead[:40]) / 40
    return {
        "figure": figure([line(xs, mean_p, f"mean P(correct) over {G06_SEEDS} seeds"),
                          line(xs, dead, "groups with no signal (all right or all wrong)", line={"dash": "dot"}),
                          line([40, 40], [0, 1], "step 40", line={"dash": "dash", "color": "grey"})],
                         f"K = {K}, β = {beta}", "step", "probability", yaxis={"range": [0, 1.02]}),
        "kpis": [["P(correct) at step 40", r(mean_p[39], 3)], ["final P(correct)", r(mean_p[-1], 3)],
                 ["first step with P(correct) ≥ 0.9", hit if hit else "never (in 200 steps)"],
                 ["groups with no signal, steps 1–40", r(early, 3)], ["groups with no signal, last step", r(dead[-1], 3)]],
        "note": (f"K = {K}: {100 * early:.0f}% of the groups in the first 40 steps had all-equal rewards and taught "
                 f"nothing; P(correct) is {mean_p[39]:.2f} at step 40 and "
                 + (f"first reaches 0.9 at step {hit}." if hit else "never reaches 0.9.")
                 + " Near the top every group is all right, so learning stops by itself."),
    }


register(Widget(
    "grpo_sim", "GRPO on a one-parameter policy", grpo_sim,
    [Knob("K", "rollouts K", [2, 3, 4, 6, 8], 8), Knob("beta", "β", [0.0, 0.05, 0.1, 0.2, 0.5], 0.05)],
    {"knobs": {"K": 2},
     "what": "K = 2 from a 10% start: a group has signal only when exactly one of its two answers is right, "
             "so about 80% of the early groups teach nothing; at step 40 P(correct) is near 0.55 where "
             "K = 8 is above 0.9."},
    f"Mean P(correct) of {G06_SEEDS} seeds trained by grpo.advantages and grpo.loss (a one-parameter "
    "policy: a deliberate toy), and the share of groups whose rewards were all equal.",
    ["posttrain.algorithms.grpo:advantages", "posttrain.algorithms.grpo:loss"]))
