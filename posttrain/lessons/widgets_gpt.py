"""Widgets of the gpt_mini lessons 01–03: the model's shapes, next-character distributions and the
SFT loss mask, from posttrain's model, sampler, collate and recorded runs. Lessons 04–06 (chain of
thought, DPO, GRPO) are widgets_gpt_train.py."""

from __future__ import annotations

import math

import torch

from posttrain.algorithms import core
from posttrain.framework.batch import collate
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
            ["train FLOPs/token 6N (N of the course layout, embeddings included)", f"{6 * n:,}"],
            ["Chinchilla tokens ≈ 20N (Hoffmann et al. 2022; same N)", f"{20 * n:,}"],
        ],
        "note": (
            f"In the course's layout the blocks hold {100 * (n - emb) / n:.1f}% of the {n:,} parameters "
            f"(attention 4d², MLP 8d² per block); with heads of {d // h} dimensions an unscaled q·k score of "
            f"unit-variance q and k would have std {math.sqrt(d // h):.1f}."
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
            "what": f"One 512-dimensional head: once q and k have unit-variance entries (where training takes the "
            f"weights; posttrain's N(0, 0.02) initialisation starts below), unscaled q·k scores would have std "
            f"√512 ≈ {math.sqrt(512):.0f}, a nearly one-hot softmax with vanishing attention gradients. That is why "
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
                bar(labels, [float(freq[i]) for i in top], f"sampled at τ = {temperature} (2000 draws)"),
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
            ["entropy H at τ = 1 (nats)", r(core.entropy_from_logits(logits), 3)],
            ["greedy (τ = 0) always picks", repr(tok.chars[int(logits.argmax())])],
            [
                "share of samples that are the right next char",
                "— (any digit can follow)" if RIGHT[context] is None else r(freq[tok.stoi[RIGHT[context]]], 3),
            ],
        ],
        "note": "The model was pretrained (1000 steps, recorded) on arithmetic traces; τ = 0 is truly greedy.",
    }


register(
    Widget(
        "next_char",
        "What a pretrained gpt_mini predicts next",
        next_char,
        [
            Knob("context", "context", runs.CONTEXTS, runs.CONTEXTS[0], "select"),
            Knob("temperature", "temperature τ", [0.0, 0.5, 1.0, 1.5, 2.0], 1.0),
        ],
        {
            "knobs": {"temperature": 2.0},
            "what": "At τ = 2 the distribution flattens: after '3+4=' about one sampled digit in nine is wrong "
            "(against 3 in 1000 at τ = 1), traces carry more errors, and an RL stage sampling there sees "
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
            "what": "Training on the prompt too: most of each example's loss tokens are prompt characters, the "
            "random digits among them cannot be predicted, the answer gets a small share of the gradient, "
            "and the model learns the answers more slowly: at step 200 it answers fewer held-out sums than "
            "the masked one (right plot).",
        },
        "Left: the loss mask of one example (collate). Right: held-out accuracy of recorded SFT runs, prompt "
        "masked vs trained on (3 seeds each).",
        ["posttrain.framework.batch:collate", "posttrain.lessons.runs:sft_run"],
    )
)
