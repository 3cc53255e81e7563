"""Widgets of the gpt_mini lessons (01–06): the model's shapes, and the stages of the pipeline,
from posttrain's model, collate, sampler, preference loss, GRPO advantages and recorded runs."""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from posttrain.algorithms import core, grpo
from posttrain.framework.batch import RolloutBatch, collate
from posttrain.framework.rollout import (
    SamplingParams,
    draw_keys,
    sample_keys,
    sample_tokens,
)
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
    return {
        "token embedding": V * d,
        "positions": t_max * d,
        "attention": L * 4 * d * d,
        "MLP": L * (8 * d * d + 5 * d),
        "norms": L * 4 * d + 2 * d,
        "output head": 0,
    }


def ours_params(d: int, h: int, L: int, V: int) -> tuple[dict, int]:
    """posttrain's gpt_mini at the same width: RMSNorm, RoPE (no position table), SwiGLU, untied head."""
    d_ff = 8 * round(8 * d / 3 / 8)
    c = ModelConfig(d_model=d, n_layers=L, n_heads=h, d_ff=d_ff, vocab_size=V).resolved(V)
    attn = 4 * d * d
    parts = {
        "token embedding": V * d,
        "positions": 0,
        "attention": L * attn,
        "MLP": L * 3 * d * d_ff,
        "norms": L * 2 * d + d,
        "output head": V * d,
    }
    return parts, count_params(c)


def shapes(d: int, h: int, L: int, V: int) -> dict:
    course = course_gpt2_params(d, L, V, t_max=11)
    widget = sum(course_gpt2_params(d, L, V, t_max=64).values())
    ours, total = ours_params(d, h, L, V)
    names = list(course)
    emb = course["token embedding"] + course["positions"]
    n = sum(course.values())
    return {
        "figure": figure(
            [
                bar(names, list(course.values()), "course's GPT-2 layout (T_max = 11, tied head)"),
                bar(names, list(ours.values()), "posttrain gpt_mini (Llama-shaped)"),
                bar(
                    ["head dim k", "std of unscaled q·k = √k"],
                    [d // h, math.sqrt(d // h)],
                    "per head",
                    xaxis="x2",
                    yaxis="y2",
                ),
            ],
            f"d = {d}, h = {h}, L = {L}, V = {V}",
            "",
            "parameters",
            barmode="group",
            grid={"rows": 1, "columns": 2, "pattern": "independent"},
            yaxis={"type": "log"},
            yaxis2={"title": {"text": "dims / std"}},
        ),
        "kpis": [
            ["head dim k = d/h", d // h],
            ["course layout, T_max 11", f"{n:,}"],
            ["course layout, T_max 64", f"{widget:,}"],
            ["posttrain gpt_mini (count_params)", f"{total:,}"],
            ["blocks / embeddings (course)", r((n - emb) / emb, 1)],
            ["unscaled q·k std √k", r(math.sqrt(d // h), 2)],
            ["train FLOPs/token 6N", f"{6 * n:,}"],
            ["Chinchilla tokens ≈ 20N", f"{20 * n:,}"],
        ],
        "note": (
            f"In the course's layout the blocks hold {100 * (n - emb) / n:.1f}% of the {n:,} parameters "
            f"(attention 4d², MLP 8d² per block); with heads of {d // h} dimensions an unscaled q·k score "
            f"would have std {math.sqrt(d // h):.1f} at initialisation."
        ),
    }


register(
    Widget(
        "shapes",
        "Parameter counts of the model under every stage",
        shapes,
        [
            Knob("d", "width d", [32, 64, 128, 256, 512], 128),
            Knob("h", "heads h", [1, 2, 4, 8], 4),
            Knob("L", "layers L", [1, 2, 4, 8, 12], 4),
            Knob("V", "vocabulary V", [29, 53, 256], 29),
        ],
        {
            "knobs": {"d": 512, "h": 1},
            "what": "One 512-dimensional head: unscaled q·k scores would have std √512 ≈ 23 at initialisation, "
            "a one-hot softmax from the first step with vanishing attention gradients. That is why "
            "every attention (posttrain's too) divides the scores by √k.",
        },
        "Parameters by part, for the course's GPT-2 layout and for posttrain's gpt_mini at the same size.",
        ["posttrain.models.gpt_mini:count_params"],
    )
)


# ---- G02 · pretraining: next-character distributions -------------------------------------------

RIGHT = {"3+4=": "7", "3+4=7;7+": None, "7+5=1": "2", "9+9=": "1"}  # the correct next character, if one is


def next_char(context: str, temperature: float) -> dict:
    rec = runs.recorded()["pretrain"]
    tok = CharTokenizer()
    logits = torch.tensor(rec["logits"][context])  # [V] recorded model output
    N = 2000
    keys = draw_keys(
        sample_keys(0, 0, torch.zeros(N, dtype=torch.long), torch.arange(N)), torch.zeros(N, dtype=torch.long)
    )
    toks, _ = sample_tokens(logits.expand(N, -1), SamplingParams(temperature=temperature), keys)
    freq = torch.bincount(toks, minlength=tok.vocab_size).double() / N
    top = torch.softmax(logits, -1).topk(8).indices.tolist()
    if temperature > 0:  # the distribution sampled from
        ent = float(core.entropy_from_logits(logits / temperature))
    else:  # greedy: one token, no uncertainty
        ent = 0.0
    labels = [repr(tok.chars[i]) for i in top]
    return {
        "figure": figure(
            [
                bar(labels, [float(freq[i]) for i in top], f"sampled at T = {temperature} (2000 draws)"),
                line(rec["step"], rec["loss"], "training loss (recorded run)", xaxis="x2", yaxis="y2"),
            ],
            f"next character after {context!r}",
            "character",
            "frequency",
            grid={"rows": 1, "columns": 2, "pattern": "independent"},
            yaxis={"range": [0, 1.05]},
            xaxis2={"title": {"text": "step"}},
            yaxis2={"title": {"text": "nats / char"}},
        ),
        "kpis": [
            ["most likely next char", repr(tok.chars[top[0]])],
            ["entropy H of the sampled distribution (nats)", r(ent, 3)],
            ["perplexity e^H", r(math.exp(ent), 2)],
            ["entropy H at T = 1 (nats)", r(core.entropy_from_logits(logits), 3)],
            ["greedy (T = 0) always picks", repr(tok.chars[int(logits.argmax())])],
            [
                "share of samples that are the right next char",
                "— (any digit can follow)" if RIGHT[context] is None else r(freq[tok.stoi[RIGHT[context]]], 3),
            ],
        ],
        "note": "The model was pretrained (1000 steps, recorded) on arithmetic traces; T = 0 is truly greedy.",
    }


register(
    Widget(
        "next_char",
        "What a pretrained gpt_mini predicts next",
        next_char,
        [
            Knob("context", "context", runs.CONTEXTS, runs.CONTEXTS[0], "select"),
            Knob("temperature", "temperature T", [0.0, 0.5, 1.0, 1.5, 2.0], 1.0),
        ],
        {
            "knobs": {"temperature": 2.0},
            "what": "At T = 2 the distribution flattens: after '3+4=' about one sampled digit in nine is wrong "
            "(against 3 in 1000 at T = 1), traces carry more errors, and an RL stage sampling there sees "
            "fewer rewards to learn from.",
        },
        "Left: next-character frequencies from the sampler. Right: the recorded pretraining loss.",
        ["posttrain.framework.rollout:sample_tokens", "posttrain.lessons.runs:pretrain_run"],
    )
)


# ---- G03 · SFT: the loss mask ---------------------------------------------------------------------

EXAMPLES = ["<3+4+5+6>18#", "<3+4+5>12#", "<hello>olleh#", "<abcd>dcba#"]


def sft_mask(mask_prompt: bool, example: str) -> dict:
    """The loss mask collate() builds for one example, and recorded SFT runs on 4–5-term sums with
    the prompt masked or trained on (runs.mask_runs: 3 seeds averaged, 200 held-out problems)."""
    tok = CharTokenizer()
    cut = example.index(">") + 1
    prompt, response = tok.encode(example[:cut]), tok.encode(example[cut:])
    lm = collate([prompt], [response], tok.pad_id, mask_prompt)["loss_mask"][0, 1:]  # targets 1..T-1
    rec = runs.recorded()
    on, off = rec["sft mask=1 seeds"], rec["sft mask=0 seeds"]
    cur = on if mask_prompt else off
    share = len(response) / int(lm.sum())  # the answer's share of the loss tokens
    mid = on["step"].index(200)
    return {
        "figure": figure(
            [
                bar(
                    [f"{i + 1}:{example[i + 1]}" for i in range(len(lm))],
                    lm.tolist(),
                    "target is trained on",
                    marker={"color": ["#1f77b4" if i + 1 >= cut else "#ff7f0e" for i in range(len(lm))]},
                ),
                line(
                    on["step"],
                    on["acc"],
                    "prompt masked",
                    xaxis="x2",
                    yaxis="y2",
                    line={"width": 4 if mask_prompt else 1.5},
                ),
                line(
                    off["step"],
                    off["acc"],
                    "prompt trained on",
                    xaxis="x2",
                    yaxis="y2",
                    line={"width": 1.5 if mask_prompt else 4},
                ),
            ],
            f"{example}: orange = prompt position, blue = response",
            "predicted position",
            "in the loss",
            grid={"rows": 1, "columns": 2, "pattern": "independent"},
            yaxis={"range": [0, 1.1]},
            xaxis2={"title": {"text": "SFT step (recorded, 3 seeds)"}},
            yaxis2={"range": [0, 1], "title": {"text": "held-out accuracy"}},
        ),
        "kpis": [
            ["trained positions", f"{int(lm.sum())} of {len(lm)}"],
            ["ignored positions", int(len(lm) - lm.sum())],
            ["answer's share of the loss tokens", r(share, 2)],
            ["held-out accuracy at step 200 (this setting)", cur["acc"][mid]],
            ["held-out accuracy at step 400 (this setting)", cur["acc"][-1]],
            ["masked / trained on, at step 200", f"{on['acc'][mid]:.2f} / {off['acc'][mid]:.2f}"],
            ["masked / trained on, at step 400", f"{on['acc'][-1]:.2f} / {off['acc'][-1]:.2f}"],
        ],
        "note": (
            f"{'Masked' if mask_prompt else 'Unmasked'}: the answer is {100 * share:.0f}% of this example's loss "
            f"tokens. In the recorded runs on 4–5-term sums the masked model answers {100 * on['acc'][mid]:.0f}% of "
            f"held-out problems after 200 steps, the unmasked one {100 * off['acc'][mid]:.0f}% "
            f"({100 * on['acc'][-1]:.0f}% and {100 * off['acc'][-1]:.0f}% after 400)."
        ),
    }


register(
    Widget(
        "sft_mask",
        "SFT: which positions are trained",
        sft_mask,
        [
            Knob("mask_prompt", "mask the prompt", [False, True], True, "check"),
            Knob("example", "example", EXAMPLES, EXAMPLES[0], "select"),
        ],
        {
            "knobs": {"mask_prompt": False},
            "what": "Training on the prompt too: three quarters of each example's loss tokens are random question "
            "digits that cannot be predicted, the answer gets a quarter of the gradient, and the model learns "
            "the answers about half as fast: at step 200 it answers about half as many held-out sums as the "
            "masked one (right plot).",
        },
        "Left: the loss mask of one example (collate). Right: held-out accuracy of recorded SFT runs, prompt "
        "masked vs trained on (3 seeds each).",
        ["posttrain.framework.batch:collate", "posttrain.lessons.runs:sft_run"],
    )
)


# ---- G04 · chain of thought: serial compute ------------------------------------------------------


def _final(acc: list[float]) -> float:
    """Accuracy at the end of a recorded run: the mean of its last two evaluations (one is noisy)."""
    return sum(acc[-2:]) / 2


def cot_budget(cot: bool, layers: int, K: int) -> dict:
    """Recorded SFT runs (runs.cot_runs: 1 or 2 layers, direct answers or chain of thought, on sums of
    2–6 terms of 0..19, 1200 steps) and their held-out accuracy for each number of terms."""
    rec = runs.recorded()
    this = rec[f"cot layers={layers} cot={int(cot)}"]
    ks = sorted(int(k) for k in this["acc_k"])
    by_k = {c: [_final(rec[f"cot layers={layers} cot={c}"]["acc_k"][str(k)]) for k in ks] for c in (0, 1)}
    acc = _final(this["acc_k"][str(K)])
    trace = Problem(tuple(range(11, 11 + K))).target(True)  # an example CoT target at this K
    return {
        "figure": figure(
            [
                line(
                    ks,
                    by_k[0],
                    f"direct answers, {layers} layer(s)",
                    mode="lines+markers",
                    line={"width": 4 if not cot else 1.5},
                ),
                line(
                    ks,
                    by_k[1],
                    f"chain of thought, {layers} layer(s)",
                    mode="lines+markers",
                    line={"width": 4 if cot else 1.5},
                ),
                line([K], [acc], "this setting", mode="markers", marker={"size": 14, "color": "#d62728"}),
                line(
                    this["step"],
                    this["acc_k"][str(K)],
                    f"this setting, K = {K}: during training",
                    xaxis="x2",
                    yaxis="y2",
                ),
            ],
            f"{'CoT' if cot else 'direct'}, {layers} layer(s), K = {K} terms",
            "terms K",
            "held-out accuracy",
            grid={"rows": 1, "columns": 2, "pattern": "independent"},
            yaxis={"range": [0, 1.02]},
            xaxis2={"title": {"text": "SFT step"}},
            yaxis2={"range": [0, 1.02], "title": {"text": "held-out accuracy"}},
        ),
        "kpis": [
            ["held-out accuracy (this setting)", r(acc, 3)],
            ["direct / CoT at this K", f"{by_k[0][ks.index(K)]:.2f} / {by_k[1][ks.index(K)]:.2f}"],
            ["direct answers, K = 2 → 6", " → ".join(f"{x:.2f}" for x in by_k[0])],
            ["chain of thought, K = 2 → 6", " → ".join(f"{x:.2f}" for x in by_k[1])],
            ["CoT target (example)", trace],
            ["CoT tokens", len(trace)],
            ["0.99 per token over the trace", r(0.99 ** len(trace), 3)],
        ],
        "note": (
            f"{'With the trace' if cot else 'Answering directly'}, the {layers}-layer model gets {100 * acc:.0f}% "
            f"of held-out {K}-term sums right. A direct answer has to fit {K - 1} additions into one forward "
            f"pass; each written partial sum gives the model another pass."
        ),
    }


register(
    Widget(
        "cot",
        "Direct answer vs. chain of thought",
        cot_budget,
        [
            Knob("cot", "write the chain of thought", [False, True], True, "check"),
            Knob("layers", "layers", [1, 2], 2),
            Knob("K", "terms K", [2, 3, 4, 5, 6], 4),
        ],
        {
            "knobs": {"cot": False, "K": 6},
            "what": "Six two-digit terms answered directly: five additions must fit inside one forward pass of a "
            "2-layer model, and after 1200 steps of SFT it gets about one sum in ten right; with the "
            "trace the same model gets most of them.",
        },
        "Held-out accuracy by number of terms for recorded SFT runs of a small gpt_mini (left; the final two "
        "evaluations averaged) and the chosen setting's accuracy during training (right).",
        ["posttrain.tasks.arithmetic:Problem.trace", "posttrain.lessons.runs:sft_run", "posttrain.eval:evaluate"],
    )
)


# ---- G05 · DPO on one pair -----------------------------------------------------------------------


def dpo_pair(beta: float, lr: float, loss_type: str) -> dict:
    lp = torch.zeros(2, dtype=torch.float64, requires_grad=True)  # log π/π_ref of chosen, rejected
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
        "figure": figure(
            [line(xs, margins, "margin β(log-ratio_w − log-ratio_l)"), line(xs, losses, "loss", yaxis="y2")],
            f"{loss_type}, β = {beta}, η = {lr}",
            "step",
            "margin",
            yaxis2={"overlaying": "y", "side": "right", "title": {"text": "loss"}},
        ),
        "kpis": [
            ["loss at step 0 (π_θ = π_ref)", r(losses[0], 4)],
            ["margin after 220 steps", r(margins[-1], 3)],
            ["preference accuracy", 1.0 if margins[-1] > 0 else 0.0],
        ],
        "note": (
            f"{loss_type.upper()} with β = {beta}: the loss starts at {losses[0]:.3f} (π = π_ref) and the margin "
            f"reaches {margins[-1]:.3f} after 220 steps"
            + (
                " — the DPO gradient is β·σ(−margin), so at first the margin grows like β² per step."
                if loss_type == "dpo"
                else "; IPO pulls the log-ratio gap towards 1/(2β) instead of pushing it forever."
            )
        ),
    }


register(
    Widget(
        "dpo_pair",
        "A DPO update on one pair",
        dpo_pair,
        [
            Knob("beta", "β", [0.05, 0.1, 0.2, 0.5, 1.0], 0.1),
            Knob("lr", "η", [0.05, 0.2, 0.5, 1.0], 0.2),
            Knob("loss_type", "loss", ["dpo", "ipo"], "dpo", "select"),
        ],
        {
            "knobs": {"beta": 0.05, "lr": 0.05},
            "what": "β = 0.05 with a small step: the margin barely leaves 0 in 220 steps (it grows like β²), "
            "so the run looks like it learns nothing.",
        },
        "The implicit-reward margin and the loss over 220 updates of preference_loss on one pair whose two "
        "log-ratios are free parameters (a deliberate toy).",
        ["posttrain.preference.dpo:preference_loss"],
    )
)


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
    ref = torch.tensor([math.log(1 - G06_P0), math.log(G06_P0)], dtype=torch.float64)  # log π_ref(wrong), (right)
    mask = torch.ones(S * K, 1, dtype=torch.float64)
    norm = core.batch_norm(mask)
    mean_p, dead = [], []
    for _ in range(G06_STEPS):
        th = theta.clone().requires_grad_(True)
        right = (
            torch.rand(S * K, generator=gen, dtype=torch.float64) < torch.sigmoid(theta).repeat_interleave(K)
        ).double()
        lp = torch.where(
            right > 0, -F.softplus(-th).repeat_interleave(K), -F.softplus(th).repeat_interleave(K)
        )  # log σ(±θ)
        lp = lp.unsqueeze(1)  # [S·K, 1] one answer token each
        adv = grpo.advantages(right, groups, cfg)  # [S·K]
        batch = RolloutBatch(
            loss_mask=mask,
            advantages=core.broadcast(adv, mask),
            old_logprobs=lp.detach(),
            ref_logprobs=ref[right.long()].unsqueeze(1),
        )
        loss, _ = grpo.loss(lp, batch, cfg, norm)
        (g,) = torch.autograd.grad(loss, th)
        theta = theta - G06_LR * S * g  # the loss averages seeds: × S
        mean_p.append(float(torch.sigmoid(theta).mean()))
        dead.append(float((adv.view(S, K).abs().sum(-1) == 0).double().mean()))
    return mean_p, dead


def grpo_sim(K: int, beta: float) -> dict:
    mean_p, dead = _grpo_sim_run(K, beta)
    xs = list(range(1, G06_STEPS + 1))
    hit = next((i + 1 for i, p in enumerate(mean_p) if p >= 0.9), None)
    early = sum(dead[:40]) / 40
    return {
        "figure": figure(
            [
                line(xs, mean_p, f"mean P(correct) over {G06_SEEDS} seeds"),
                line(xs, dead, "groups with no signal (all right or all wrong)", line={"dash": "dot"}),
                line([40, 40], [0, 1], "step 40", line={"dash": "dash", "color": "grey"}),
            ],
            f"K = {K}, β = {beta}",
            "step",
            "probability",
            yaxis={"range": [0, 1.02]},
        ),
        "kpis": [
            ["P(correct) at step 40", r(mean_p[39], 3)],
            ["final P(correct)", r(mean_p[-1], 3)],
            ["first step with P(correct) ≥ 0.9", hit if hit else "never (in 200 steps)"],
            ["groups with no signal, steps 1–40", r(early, 3)],
            ["groups with no signal, last step", r(dead[-1], 3)],
        ],
        "note": (
            f"K = {K}: {100 * early:.0f}% of the groups in the first 40 steps had all-equal rewards and taught "
            f"nothing; P(correct) is {mean_p[39]:.2f} at step 40 and "
            + (f"first reaches 0.9 at step {hit}." if hit else "never reaches 0.9.")
            + " Near the top every group is all right, so learning stops by itself."
        ),
    }


register(
    Widget(
        "grpo_sim",
        "GRPO on a one-parameter policy",
        grpo_sim,
        [Knob("K", "rollouts K", [2, 3, 4, 6, 8], 8), Knob("beta", "β", [0.0, 0.05, 0.1, 0.2, 0.5], 0.05)],
        {
            "knobs": {"K": 2},
            "what": "K = 2 from a 10% start: a group has signal only when exactly one of its two answers is right, "
            "so about 80% of the early groups teach nothing; at step 40 P(correct) is near 0.55 where "
            "K = 8 is above 0.9.",
        },
        f"Mean P(correct) of {G06_SEEDS} seeds trained by grpo.advantages and grpo.loss (a one-parameter "
        "policy: a deliberate toy), and the share of groups whose rewards were all equal.",
        ["posttrain.algorithms.grpo:advantages", "posttrain.algorithms.grpo:loss"],
    )
)
