"""Facts of the gpt_mini track's first half (G01–G03): the model's parameters, pretraining's loss
landmarks and the SFT mask, from posttrain's functions and recorded runs. G04–G06 (chain of thought,
DPO, GRPO) live in facts_c_gpt_post."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

from posttrain.config import PretrainConfig
from posttrain.framework.batch import collate
from posttrain.lessons import runs
from posttrain.lessons.facts_c_common import kpi, table
from posttrain.lessons.widgets_gpt import EXAMPLES, course_gpt2_params, ours_params
from posttrain.models.gpt_mini import PRESETS, GPTMini, ModelConfig, count_params
from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask

# ---- gpt_mini 01 · the model under every stage ----------------------------------------------


def _nano():

    return ModelConfig(preset="nano").resolved(len(BASE_CHARS))


def g01_parts_table() -> dict:
    """gpt_mini nano (the arithmetic task's 58-character vocabulary) by part, from its config."""

    c = _nano()
    d, L, V, hd = c.d_model, c.n_layers, c.vocab_size, c.head_dim
    parts = {
        "token embedding (V·d)": V * d,
        "attention, all blocks (q, k, v, o)": L * (d * (c.n_heads + 2 * c.n_kv_heads) * hd + c.n_heads * hd * d),
        "SwiGLU MLP, all blocks (3·d·d_ff)": L * 3 * d * c.d_ff,
        "RMSNorm weights (2 per block + final)": L * 2 * d + d,
        "output head (V·d, untied)": V * d,
    }
    total = count_params(c)
    return table(
        ["part", "parameters", "share"],
        [[k, f"{v:,}", f"{100 * v / total:.1f}%"] for k, v in parts.items()] + [["total", f"{total:,}", "100%"]],
    )


def g01_presets_table() -> dict:

    rows = []
    for name in PRESETS:
        c = ModelConfig(preset=name).resolved(len(BASE_CHARS))
        rows.append([name, c.d_model, c.n_layers, c.n_heads, c.d_ff, f"{count_params(c):,}"])
    return table(["preset", "d", "layers", "heads", "d_ff", "parameters (V = 58)"], rows)


def g01_block_over_d2() -> float:
    """One nano block's parameters (attention 4d², SwiGLU 3·d·d_ff, two norms) in units of d²."""
    c = _nano()
    return (4 * c.d_model**2 + 3 * c.d_model * c.d_ff + 2 * c.d_model) / c.d_model**2


def g01_module_count() -> int:
    """Parameters of an instantiated GPTMini nano, counted tensor by tensor."""

    return GPTMini(_nano()).num_params()


def g01_softmax_peak(d_head: int, scaled: bool) -> float:
    """Mean largest attention weight over 16 keys for random q, k with unit-variance entries."""
    import torch

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(256, 1, d_head, generator=g), torch.randn(256, 16, d_head, generator=g)
    scores = (q @ k.transpose(1, 2)).squeeze(1) / (math.sqrt(d_head) if scaled else 1.0)  # [256, 16]
    return float(torch.softmax(scores, -1).max(-1).values.mean())


def g01_init_score_std(d: int, h: int) -> float:
    """Std of the unscaled q·k scores of block 0 of a freshly initialised GPTMini (4 layers, width d,
    h heads; posttrain's N(0, 0.02) init) on random tokens, before the rotary rotation (which keeps
    each vector's length)."""
    import torch

    torch.manual_seed(0)
    c = ModelConfig(d_model=d, n_layers=4, n_heads=h, d_ff=8 * round(8 * d / 3 / 8), max_seq_len=64)
    model = GPTMini(c.resolved(len(BASE_CHARS)))
    ids = torch.randint(0, len(BASE_CHARS), (8, 16), generator=torch.Generator().manual_seed(0))
    block = model.blocks[0]
    with torch.no_grad():
        x = block.attn_norm(model.embed(ids))  # [8, 16, d]
        q, k, _ = block.attn.qkv(x).split([h * (d // h)] * 3, -1)
        q = q.view(8, 16, h, d // h).transpose(1, 2)  # [8, h, 16, d/h]
        k = k.view(8, 16, h, d // h).transpose(1, 2)
        return float((q @ k.transpose(-1, -2)).std())


def g01_layouts(V: int = 29) -> tuple[int, int]:
    """(course GPT-2 layout with T_max 11, gpt_mini) at the width, depth and vocabulary of the shapes widget."""
    return sum(course_gpt2_params(128, 4, V, t_max=11).values()), ours_params(128, 4, 4, V)[1]


# ---- gpt_mini 02 · pretraining ----------------------------------------------------------------

CONTEXT_NEXT = {
    "3+4=": "7, the sum",
    "3+4=7;7+": "any digit: the next term is random",
    "7+5=1": "2 (7 + 5 = 12)",
    "9+9=": "1 (9 + 9 = 18)",
}


@lru_cache(maxsize=1)
def g02_corpus_stats() -> dict:
    """The recorded run's corpus (runs.TASK: sums of 2–3 digits, lines as task.corpus writes them):
    character entropy, and the floor of any predictor: the terms and the number of terms are
    random, everything else follows from them."""
    import random
    from collections import Counter

    task = ArithmeticTask(runs.TASK)
    rng = random.Random(0)
    problems = [task.sample_problem(rng, "train") for _ in range(1500)]
    text = "".join(p.trace()[1:-1] + "\n" for p in problems)
    n = len(text)
    unigram = -sum(c / n * math.log(c / n) for c in Counter(text).values())
    info = sum(
        p.k * math.log(runs.TASK.max_value + 1) + math.log(runs.TASK.max_terms - runs.TASK.min_terms + 1)
        for p in problems
    )
    return {"unigram": unigram, "floor": info / n, "symbols": len(set(text))}


def g02_loss_table() -> dict:

    rec = runs.recorded()["pretrain"]
    c = g02_corpus_stats()
    return table(
        ["predictor", "nats per character"],
        [
            [f"uniform over the {len(BASE_CHARS)}-character vocabulary", f"{math.log(len(BASE_CHARS)):.2f}"],
            [f"uniform over the {c['symbols']} characters the corpus uses", f"{math.log(c['symbols']):.2f}"],
            ["character frequencies, no context", f"{c['unigram']:.2f}"],
            [f"gpt_mini, training loss at step {rec['step'][0]}", f"{rec['loss'][0]:.2f}"],
            [f"gpt_mini, training loss at step {rec['step'][-1]}", f"{rec['loss'][-1]:.2f}"],
            ["the floor: terms are random, the rest follows", f"{c['floor']:.2f}"],
        ],
    )


def g02_context_table() -> dict:
    import torch

    rec = runs.recorded()["pretrain"]
    rows = []
    for ctx, logits in rec["logits"].items():
        z = torch.tensor(logits, dtype=torch.float64)
        p = torch.softmax(z, -1)
        top = int(p.argmax())
        rows.append(
            [
                ctx,
                CONTEXT_NEXT[ctx],
                f"{BASE_CHARS[top]!r} ({float(p[top]):.2f})",
                *[f"{g02_entropy(ctx, t):.2f}" for t in (0.5, 1.0, 2.0)],
            ]
        )
    return table(
        [
            "context",
            "what follows in the corpus",
            "model's top choice (probability)",
            "entropy at τ = 0.5",
            "τ = 1",
            "τ = 2",
        ],
        rows,
    )


def g02_entropy(ctx: str, t: float) -> float:
    import torch

    z = torch.tensor(runs.recorded()["pretrain"]["logits"][ctx], dtype=torch.float64) / t
    return float(-(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum())


def g02_prob(ctx: str, char: str) -> float:
    import torch

    return float(torch.softmax(torch.tensor(runs.recorded()["pretrain"]["logits"][ctx]), -1)[BASE_CHARS.index(char)])


def g02_tokens() -> dict:

    c = PretrainConfig()
    n = __import__("posttrain.models.gpt_mini", fromlist=["x"]).count_params(_nano())
    seen = c.steps * c.batch_size * c.seq_len
    return {"targets": c.batch_size * (c.seq_len - 1), "seen": seen, "chinchilla": 20 * n, "frac": seen / (20 * n)}


# ---- gpt_mini 03 · SFT and the loss mask -------------------------------------------------------


def g03_mask_table() -> dict:
    """collate's loss mask for <3+4+5>12#, with the prompt masked and not: column t is trained
    when the loss predicts input_ids[t] from input_ids[:t]."""

    tok = CharTokenizer(BASE_CHARS)
    prompt, response = tok.encode(tok.chat_prompt("3+4+5")), tok.encode(tok.chat_response("12"))
    on = collate([prompt], [response], tok.pad_id, True)["loss_mask"][0].tolist()
    off = collate([prompt], [response], tok.pad_id, False)["loss_mask"][0].tolist()
    text = "".join(tok.chars[i] for i in prompt + response)
    return table(
        ["column t", "token", "predicted from", "trained, prompt masked", "trained, prompt not masked"],
        [[t, repr(text[t]), repr(text[:t]) if t else "—", int(a), int(b)] for t, (a, b) in enumerate(zip(on, off))],
    )


@lru_cache(maxsize=1)
def g03_prompt_share() -> dict:
    """Over 2,000 training problems of the default task (2–6 terms below 20): the share of trained
    positions that are prompt positions when the prompt is not masked, direct and with CoT."""

    tok, task = CharTokenizer(BASE_CHARS), ArithmeticTask()
    out = {}
    for cot in (False, True):
        pr = rs = 0
        for it in task.items(2000, "train", 0):
            pr += len(tok.chat_prompt(task.prompt(it))) - 1  # every prompt token but the first
            rs += len(tok.chat_response(it.target(cot)))
        out[cot] = pr / (pr + rs)
    return out


def g03_recorded_table() -> dict:
    """The recorded SFT runs of the widget (runs.mask_runs: a small gpt_mini from scratch on 4–5-term
    sums of digits, direct answers, 3 seeds averaged): held-out accuracy and training loss."""

    rec = runs.recorded()
    on, off = rec["sft mask=1 seeds"], rec["sft mask=0 seeds"]
    return table(
        [
            "SFT step",
            "held-out accuracy, prompt masked",
            "prompt trained on",
            "training loss, masked",
            "training loss, trained on",
        ],
        [
            [st, f"{a:.2f}", f"{b:.2f}", f"{la:.2f}", f"{lb:.2f}"]
            for st, a, b, la, lb in zip(on["step"], on["acc"], off["acc"], on["loss"], off["loss"])
        ],
    )


def _mask_run(masked: bool) -> dict:

    return runs.recorded()[f"sft mask={int(masked)} seeds"]


def g03_mask_share() -> float:
    """Share of the trained positions that are prompt characters, unmasked, on the recorded runs' task."""

    tok, task = CharTokenizer(BASE_CHARS), ArithmeticTask(runs.MASK_TASK)
    pr = rs = 0
    for it in task.items(1000, "train", 0):
        pr += len(tok.chat_prompt(task.prompt(it))) - 1
        rs += len(tok.chat_response(it.target(False)))
    return pr / (pr + rs)


FACTS: dict[str, Callable[[], object]] = {
    "g01_parts_table": g01_parts_table,
    "g01_presets_table": g01_presets_table,
    "g01_nano_params": lambda: __import__("posttrain.models.gpt_mini", fromlist=["x"]).count_params(_nano()),
    "g01_module_params": g01_module_count,
    "g01_course_params": lambda: __import__("posttrain.sizing.shapes", fromlist=["x"]).count_params(
        __import__("posttrain.sizing.shapes", fromlist=["x"]).resolve_model("course-minigpt")
    ),
    "g01_block_over_d2": g01_block_over_d2,
    "g01_peak_32_unscaled": lambda: g01_softmax_peak(32, False),
    "g01_peak_32_scaled": lambda: g01_softmax_peak(32, True),
    "g01_peak_512_unscaled": lambda: g01_softmax_peak(512, False),
    "g01_init_score_std_nano": lambda: g01_init_score_std(128, 4),
    "g01_init_score_std_512": lambda: g01_init_score_std(512, 1),
    "g01_sqrt512": lambda: math.sqrt(512),
    "g01_same_v_params": lambda: g01_layouts()[1],
    "g01_layout_gap_pct": lambda: 100 * (g01_layouts()[1] / g01_layouts()[0] - 1),
    "g01_flops_fwd": lambda: 2 * __import__("posttrain.models.gpt_mini", fromlist=["x"]).count_params(_nano()),
    "g02_loss_table": g02_loss_table,
    "g02_context_table": g02_context_table,
    "g02_floor": lambda: g02_corpus_stats()["floor"],
    "g02_final_loss_mean4": lambda: sum(runs.recorded()["pretrain"]["loss"][-4:]) / 4,
    "g02_window": lambda: runs.PRETRAIN_WINDOW,
    "g02_record_every": lambda: runs.EVAL_EVERY,
    "g02_p_7_after_34": lambda: g02_prob("3+4=", "7"),
    "g02_targets_per_step": lambda: g02_tokens()["targets"],
    "g02_tokens_seen": lambda: g02_tokens()["seen"],
    "g02_chinchilla": lambda: g02_tokens()["chinchilla"],
    "g02_chinchilla_pct": lambda: 100 * g02_tokens()["frac"],
    "g02_ln10": lambda: math.log(10),
    "g02_ent_34_t1": lambda: g02_entropy("3+4=", 1.0),
    "g02_ent_34_t2": lambda: g02_entropy("3+4=", 2.0),
    "g02_recorded_steps": lambda: __import__("posttrain.lessons.runs", fromlist=["x"]).recorded()["pretrain"]["step"][
        -1
    ],
    "g02_w_trace10": lambda: kpi("next_char", "share of samples that are the right next char", temperature=2.0) ** 10,
    "g02_w_right_t2": lambda: kpi("next_char", "share of samples that are the right next char", temperature=2.0),
    "g03_mask_table": g03_mask_table,
    "g03_widget_example": lambda: EXAMPLES[0],
    "g03_max_value": lambda: ArithmeticConfig().max_value,
    "g03_min_value": lambda: ArithmeticConfig().min_value,
    "g03_term_values": lambda: ArithmeticConfig().max_value - ArithmeticConfig().min_value + 1,
    "g03_term_floor": lambda: math.log(ArithmeticConfig().max_value - ArithmeticConfig().min_value + 1),  # nats
    "g03_gap_end": lambda: _mask_run(True)["acc"][-1] - _mask_run(False)["acc"][-1],
    "g03_prompt_share_direct": lambda: 100 * g03_prompt_share()[False],
    "g03_prompt_share_cot": lambda: 100 * g03_prompt_share()[True],
    "g03_recorded_table": g03_recorded_table,
    "g03_mask_task_share": lambda: 100 * g03_mask_share(),
    "g03_acc_masked_200": lambda: _mask_run(True)["acc"][_mask_run(True)["step"].index(200)],
    "g03_acc_open_200": lambda: _mask_run(False)["acc"][_mask_run(False)["step"].index(200)],
    "g03_acc_masked_end": lambda: _mask_run(True)["acc"][-1],
    "g03_acc_open_end": lambda: _mask_run(False)["acc"][-1],
    "g03_trained_masked": lambda: sum(r[3] for r in g03_mask_table()["rows"]),
    "g03_targets": lambda: sum(r[4] for r in g03_mask_table()["rows"]),
    "g03_prompt_targets": lambda: sum(r[4] - r[3] for r in g03_mask_table()["rows"]),
}
