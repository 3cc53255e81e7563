"""Numbers quoted by the lesson pages of TEXT C (rl-22a … rl-28 and the gpt_mini track).

Each entry of FACTS is a function of no arguments that returns a number, a short string or a
table {"columns": [...], "rows": [[...], ...]}; a page quotes it as {{fact:NAME}} or
{{table:NAME}}. Every value is computed by posttrain's own functions (throughput, memory,
shapes, algorithms/core, the engine) or read from a committed JSON (benchmarks/results/,
lessons/data/runs.json), in well under a second on one core; nothing here trains.
Names start with the lesson they belong to (rl22a_…, g01_…).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Callable

from posttrain import throughput as tp

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def table(columns: list[str], rows: list[list]) -> dict:
    return {"columns": columns, "rows": rows}


@lru_cache(maxsize=None)
def result(name: str):
    """A committed benchmark result, benchmarks/results/<name>.json."""
    return json.loads((RESULTS / f"{name}.json").read_text())


def kpi(widget: str, label: str, **knobs):
    """A widget's KPI at a setting other than its defaults (the page's {{kpi:…}} reads defaults
    only), computed by the widget itself so the text and the plot cannot disagree."""
    from posttrain.lessons import registry
    out = dict(registry.compute(widget, {k: registry.fmt(v) for k, v in knobs.items()})["kpis"])
    return out[label]


# ---- 22a · the throughput equation -------------------------------------------------------------

WORKED = {"rollout_s": 30, "reward_s": 1, "reference_s": 3, "train_s": 8, "sync_s": 1}   # the lesson's example
WORKED_TOKENS = 64 * 16 * 1024                                                          # B·K·L̄


def rl22a_worked(topology: str = "disaggregated") -> dict:
    return tp.step_time(**WORKED, topology=topology)


def rl22a_worked_table() -> dict:
    rows = []
    for t in tp.TOPOLOGIES:
        r = rl22a_worked(t)
        rows.append([t, f"{r['step_s']:g} s", r["bottleneck"], f"{r['idle_s']['trainer']:g} s",
                     f"{tp.useful_tokens_per_s(64, 16, 1024, r['step_s']) / 1000:.1f}k"])
    return table(["topology", "τ_step", "bottleneck", "trainer idle per step", "useful tokens/s"], rows)


SIDE = {"rollout": "rollout side", "reward": "rollout side", "reference": "trainer side", "train": "trainer side",
        "sync": "between the two"}


def rl22a_role_table() -> dict:
    """The role model at its defaults (7B, K = 16, L = 1024, disaggregated)."""
    m = tp.role_model()
    return table(["role", "runs on", "seconds"],
                 [[k, SIDE[k], f"{v:.1f}"] for k, v in m["terms"].items()]
                 + [["τ_step = max(rollout side, trainer side) + sync", "", f"{m['step_s']:.1f}"]])


def rl22a_length_table() -> dict:
    rows = []
    for L in (256, 1024, 4096, 8192):
        m = tp.role_model(response_len=L)
        rows.append([L, f"{1 + 1.8 * math.tanh(L / 2048):.2f}", f"{m['terms']['rollout']:.1f} s", f"{m['step_s']:.1f} s",
                     f"{100 * m['terms']['rollout'] / m['step_s']:.0f}%", f"{m['idle_s']['trainer']:.1f} s"])
    return table(["response length L", "tail factor", "τ_R", "τ_step", "rollout share", "trainer idle"], rows)


def rl22a_colo_drop() -> float:
    """How much useful tokens/s colocation costs at the role model's defaults, in %."""
    colo, dis = tp.role_model(topology="colocated"), tp.role_model()
    return 100 * (1 - colo["useful_tokens_per_s"] / dis["useful_tokens_per_s"])


def rl22a_k_doubling() -> dict:
    a, b = tp.role_model(k=16), tp.role_model(k=32)
    return {"rollout_ratio": b["terms"]["rollout"] / a["terms"]["rollout"], "step_ratio": b["step_s"] / a["step_s"]}


def rl22a_cpu_roles() -> dict:
    """Mean role times of a real posttrain run (benchmarks/async_vs_sync.json, sync, seed 0:
    GRPO on gpt_mini nano, 128 samples a step, one CPU thread), read through step_time."""
    run = next(r for r in result("async_vs_sync")["runs"] if r["run"] == "sync" and r["seed"] == 0)
    return tp.step_time(**run["roles_s"], topology="colocated")


def rl22a_cpu_measured_s() -> float:
    run = next(r for r in result("async_vs_sync")["runs"] if r["run"] == "sync" and r["seed"] == 0)
    return run["mean time/step_s"]


def rl22a_cpu_table() -> dict:
    r = rl22a_cpu_roles()
    return table(["role", "seconds per step", "share"],
                 [[k, f"{v:.3f}", f"{100 * r['shares'][k]:.1f}%"] for k, v in r["terms"].items()])


# ---- 22b · long-tail rollouts -------------------------------------------------------------------

CVS = (0.5, 1.0, 2.0)


def rl22b_maxk_table() -> dict:
    return table(["K", *[f"cv = {c}" for c in CVS]],
                 [[k, *[f"{tp.max_of_k(k, c):.2f}" for c in CVS]] for k in (4, 16, 64, 256)])


def rl22b_k32_pct(cv: float) -> float:
    return 100 * (tp.max_of_k(32, cv) / tp.max_of_k(16, cv) - 1)


def rl22b_tail_table() -> dict:
    """Log-normal lengths of mean μ and CV c: σ = √ln(1 + c²); the 95th percentile is
    μ·exp(1.645σ − σ²/2), and the longest 5% hold a share Φ(σ − 1.645) of all decoded tokens."""
    from statistics import NormalDist
    z = NormalDist().inv_cdf(0.95)
    rows = []
    for c in CVS:
        s = math.sqrt(math.log1p(c * c))
        rows.append([c, f"{s:.2f}", f"{math.exp(z * s - s * s / 2):.2f} μ", f"{100 * NormalDist().cdf(s - z):.0f}%"])
    return table(["cv", "σ of ln L", "95th percentile", "tokens in the longest 5%"], rows)


@lru_cache(maxsize=1)
def rl22b_cutoff() -> dict:
    """posttrain's engine on a random tiny gpt_mini (its lengths are long-tailed): 8 prompts,
    8 samples each, against 12 started and the first 8 of each group to finish kept
    (Engine.generate(keep=8), the `overprovision` straggler cut-off), cap 128 tokens."""
    import torch
    from posttrain.framework.rollout import Engine, SamplingParams
    from posttrain.models.gpt_mini import GPTMini, ModelConfig
    from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
    tok = CharTokenizer(BASE_CHARS)
    torch.manual_seed(0)
    model = GPTMini(ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=160).resolved(tok.vocab_size)).eval()
    prompts = [tok.encode(f"<{i}+{2 * i + 1}>") for i in range(8)]
    out = {}
    for name, n, keep in (("all", 8, None), ("cut", 12, 8)):
        eng = Engine(model, tok, max_slots=256)
        samples = eng.generate(prompts, n, SamplingParams(max_new_tokens=128), seed=0, keep=keep)
        lengths = [len(s.response_ids) for s in samples]
        out[name] = {"steps": eng.stats["rollout/decode_steps"], "tokens": eng.stats["rollout/generated_tokens"],
                     "kept": len(samples), "mean": sum(lengths) / len(lengths), "longest": max(lengths),
                     "capped": sum(s.finish_reason == "length" for s in samples),
                     "cancelled": eng.stats["rollout/cancelled"]}
    return out


def rl22b_cutoff_table() -> dict:
    c = rl22b_cutoff()
    label = {"all": "start 8 per prompt, keep all", "cut": "start 12 per prompt, keep the first 8"}
    return table(["rollout", "decode steps (wall)", "tokens decoded", "samples kept", "mean kept length",
                  "kept samples cut by the cap"],
                 [[label[k], v["steps"], v["tokens"], v["kept"], f"{v['mean']:.1f}", v["capped"]] for k, v in c.items()])


def rl22b_overlong_table() -> dict:
    import torch
    from posttrain.algorithms.dapo import overlong_penalty
    lengths = torch.tensor([50.0, 80.0, 90.0, 100.0, 110.0])
    pen = overlong_penalty(lengths, max_len=100, buffer=20)
    return table(["response length", "penalty (L_max = 100, buffer 20)"],
                 [[int(a), f"{float(b) + 0.0:+.2f}"] for a, b in zip(lengths, pen)])


# ---- 22c · async pipelining and staleness ---------------------------------------------------

def rl22c_topologies() -> dict:
    """The lesson's example: τ_R = 20 s, τ_T = 8 s, τ_S = 3 s."""
    return tp.compare_topologies(rollout_s=20, train_s=8, sync_s=3)


def rl22c_topology_table() -> dict:
    runs = rl22c_topologies()
    return table(["placement", "τ_step", "speed-up over colocated", "trainer idle per step"],
                 [[n, f"{r['step_s']:g} s", f"{r['speedup_vs_colocated']:.2f}×", f"{r['idle_s']['trainer']:g} s"]
                  for n, r in runs.items()])


def _async_runs(seed: int = 0) -> dict:
    return {r["run"]: r for r in result("async_vs_sync")["runs"] if r["seed"] == seed}


def rl22c_measured_table() -> dict:
    """benchmarks/async_vs_sync.py, seed 0: GRPO on gpt_mini nano from the SFT(CoT) checkpoint,
    60 steps of 128 samples, lr 3e-5, the same prompts in every run."""
    label = {"sync": "sync (on-policy)", "async_tis": "async, ≤ 1 version behind, TIS",
             "fixed4_none": "every batch 4 versions old, no correction",
             "fixed4_tis": "every batch 4 versions old, TIS"}
    rows = []
    for name, r in _async_runs().items():
        lr = r.get("mean offpolicy/log_ratio_abs")
        rows.append([label[name], f"{r.get('mean staleness/mean', 0.0):.2f}", f"{100 * r['mean clip/frac']:.2f}%",
                     f"{r['mean ratio/max']:.2f}", "—" if lr is None else f"{lr:.4f}",
                     f"{r['pass@1_before']:.3f} → {r['pass@1_after']:.3f}"])
    return table(["run", "mean staleness (versions)", "clip/frac", "largest ratio r", "mean |log π_prox − log μ|",
                  "held-out pass@1"], rows)


def rl22c_gain(run: str, key: str) -> float:
    return result("async_vs_sync")["summary"][run][key]


def rl22c_stale_curves(correction: str) -> dict:
    """The recorded staleness runs behind the async_pipe widget (dapo_toy.stale_runs: the lesson-13
    DAPO toy with all switches on and the sampler Δ versions behind, 3 seeds averaged)."""
    from posttrain.lessons import dapo_toy, runs
    rec = runs.recorded()
    return {d: rec[dapo_toy.stale_key(d, correction)] for d in dapo_toy.STALENESS}


def rl22c_stale_table() -> dict:
    """Per staleness: mean clip fraction and steps to accuracy 0.7, without and with TIS; and the
    wall clock to 0.7 at the widget's default role times (τ_R 20, τ_T 8, τ_S 3 s; Δ = 0 is the
    synchronous disaggregated loop, Δ ≥ 1 async)."""
    none, tis = rl22c_stale_curves("none"), rl22c_stale_curves("tis")
    first = lambda c: next((st for st, a in zip(c["step"], c["acc"]) if a >= 0.7), None)     # noqa: E731
    rows = []
    for d in none:
        step_s = tp.step_time(rollout_s=20, train_s=8, sync_s=3, topology="async" if d else "disaggregated")["step_s"]
        wall = lambda c: f"{first(c) * step_s / 60:.0f} min" if first(c) else "not reached"    # noqa: E731
        rows.append([d, f"{100 * sum(none[d]['clip']) / len(none[d]['clip']):.1f}%",
                     f"{100 * sum(tis[d]['clip']) / len(tis[d]['clip']):.1f}%",
                     first(none[d]) or "—", first(tis[d]) or "—", wall(none[d]), wall(tis[d])])
    return table(["staleness Δ", "clip fraction, no correction", "with TIS", "steps to accuracy 0.7, no correction",
                  "with TIS", "wall clock to 0.7, no correction", "with TIS"], rows)


def rl22c_cpu_async_speedup() -> float:
    """What the throughput equation predicts async would buy for the sync run's measured role times."""
    run = _async_runs()["sync"]
    t = tp.compare_topologies(**run["roles_s"])
    return t["async"]["speedup_vs_colocated"]


# ---- 23 · recipes and how runs fail -----------------------------------------------------------

def _default(fn, arg: str):
    import inspect
    return inspect.signature(fn).parameters[arg].default


def rl23_alarm_table() -> dict:
    """posttrain.report's alarms with their thresholds, read from the functions themselves."""
    from posttrain import report as rp
    return table(["alarm", "reads", "fires when (the last quarter of the run)"], [
        ["reward up, held-out flat", "reward/mean, eval/pass@1",
         f"train reward rose ≥ {_default(rp.reward_up_heldout_flat, 'rise')} while held-out pass@1 moved "
         f"< {_default(rp.reward_up_heldout_flat, 'flat')}"],
        ["entropy collapse", "entropy", f"entropy < {_default(rp.entropy_collapse, 'frac'):.0%} of its start"],
        ["clip fraction high", "clip/frac", f"clip/frac > {_default(rp.clip_fraction_high, 'limit')}"],
        ["length blow-up", "length/mean, length/truncated_frac",
         f"mean length ×{_default(rp.length_blowup, 'growth'):g} or > {_default(rp.length_blowup, 'truncated_limit'):.0%} "
         "of responses hit the cap"],
        ["sampler/trainer mismatch", "mismatch/logprob_abs",
         f"> {_default(rp.mismatch_high, 'limit')} nats per token at any step"],
        ["many degenerate groups", "group/degenerate_frac", f"> {_default(rp.degenerate_groups, 'limit'):.0%} of groups"],
    ])


def rl23_real_runs_table() -> dict:
    """report.alarms on posttrain's own 100-step GRPO runs (benchmarks/results/claims.json), each
    summarised by the means of its first and last 10 steps and its held-out pass@1 at both ends."""
    from posttrain import report as rp
    label = {"length_grpo": "GRPO", "length_dr_grpo": "Dr. GRPO", "clip_0.2": "GRPO, 4 updates per batch",
             "clip_0.28": "the same, ε_high = 0.28", "group_2": "GRPO, K = 2, strong start",
             "group_8": "GRPO, K = 8, strong start"}
    rows = []
    for kind in ("length", "clip", "group"):
        for run in result("claims")[kind]:
            series = [{"step": 0, "eval/pass@1": run["pass@1_start"]}]
            for i, when in enumerate(("first10", "last10")):
                series.append({"step": i + 1, "eval/pass@1": run["pass@1_start" if i == 0 else "pass@1_end"],
                               **{k: run[f"{k}_{when}"] for k in ("reward/mean", "entropy", "clip/frac",
                                                                   "group/degenerate_frac")}})
            fired = rp.alarms(series)
            rows.append([label[run["run"]], f"{run['reward/mean_first10']:.2f} → {run['reward/mean_last10']:.2f}",
                         f"{run['pass@1_start']:.3f} → {run['pass@1_end']:.3f}",
                         f"{run['group/degenerate_frac_first10']:.2f} → {run['group/degenerate_frac_last10']:.2f}",
                         ", ".join(a.name for a in fired) or "none"])
    return table(["run (100 steps)", "train reward", "held-out pass@1", "degenerate groups", "alarms fired"], rows)


def rl23_modes_table() -> dict:
    """The failures widget at severity 1 for each mode: which alarms its metrics fire."""
    from posttrain.lessons.widgets_practice import MODES
    return table(["what goes wrong (severity 1)", "alarms fired"],
                 [[m, kpi("failures", "alarms fired", mode=m, severity=1.0)] for m in MODES])


PAPERS = [  # (recipe, reward, data, baseline, turns): the classify widget's four questions
    ("InstructGPT's RL stage", "reward model", "on-policy (samples its own answers)", "learned critic", "single turn"),
    ("DeepSeek-R1-Zero", "verifier", "on-policy (samples its own answers)", "group mean", "single turn"),
    ("Tülu 3's DPO stage", "preference pairs", "off-policy (a fixed dataset)", "none", "single turn"),
    ("RLOO on a reward model", "reward model", "on-policy (samples its own answers)", "leave-one-out", "single turn"),
    ("a tool-using agent with a verifier", "verifier", "on-policy (samples its own answers)", "group mean",
     "multi-turn with tools")]


def rl23_classify_table() -> dict:
    """The classify widget's answers for a few known recipes."""
    rows = []
    for name, reward, data, baseline, turns in PAPERS:
        k = {lab: kpi("classify", lab, reward=reward, data=data, baseline=baseline, turns=turns)
             for lab in ("algorithm family", "reward label", "roles it needs")}
        rows.append([name, k["algorithm family"], k["reward label"], k["roles it needs"]])
    return table(["recipe", "algorithm family", "reward label", "roles it needs (memory.ROLES)"], rows)


# ---- 24 · the RL infra engineer -------------------------------------------------------------

GIB = 2 ** 30
SIZING = [  # (model, GPUs, LoRA rank, rollout TP): the whiteboard question and the planner's ways out
    ("llama3-8b", 8, 0, 1), ("llama-70b", 8, 0, 1), ("llama-70b", 8, 0, 8), ("llama-70b", 8, 16, 4),
    ("llama-70b", 32, 0, 8)]


def rl24_plan(model: str, gpus: int, lora: int, rollout_tp: int) -> dict:
    from posttrain import memory
    return memory.plan(model, algo="grpo", gpus=gpus, lora=lora, checkpointing=True, rollout_tp=rollout_tp)


def rl24_sizing_table() -> dict:
    rows = []
    for model, gpus, lora, rtp in SIZING:
        p = rl24_plan(model, gpus, lora, rtp)
        ph = p["pools"]["colocated"]["phases"]
        rows.append([model, gpus, lora or "full", rtp, f"{ph['persistent'] / GIB:.1f}",
                     f"{p['peak_bytes'] / GIB:.1f}", "yes" if p["fits"] else "no"])
    return table(["model", "H100s", "LoRA rank", "rollout TP", "persistent state, GiB/GPU", "peak, GiB/GPU",
                  "fits in 74.5 GiB?"], rows)


def rl24_state_tib() -> float:
    """18 B per parameter for the 70B's full training state, in TiB."""
    from posttrain import memory, shapes
    return memory.train_bytes_per_param() * shapes.count_params(shapes.resolve_model("llama-70b")) / 2 ** 40


@lru_cache(maxsize=1)
def rl24_traps() -> dict:
    """Three correctness traps checked on a real engine + trainer pair (random tiny gpt_mini, fp32):
    sampler vs trainer log-probs on the same tokens, a reference that cannot be trained, and the
    stop token in the loss of every response that stopped."""
    import torch
    from posttrain.framework.batch import collate_samples
    from posttrain.framework.reference import Reference
    from posttrain.framework.rollout import Engine, SamplingParams
    from posttrain.framework.trainer import sequence_logprobs
    from posttrain.models.gpt_mini import GPTMini, ModelConfig
    from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
    tok = CharTokenizer(BASE_CHARS)
    torch.manual_seed(0)
    model = GPTMini(ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=64).resolved(tok.vocab_size))
    prompts = [tok.encode(tok.chat_prompt(f"{i}+{i + 3}")) for i in range(6)]
    T = 0.8
    samples = Engine(model, tok, max_slots=64).generate(prompts, 4, SamplingParams(temperature=T, max_new_tokens=24), seed=0)
    for s in samples:
        s.reward = 0.0
    batch = collate_samples(samples, tok.pad_id)
    with torch.no_grad():
        lp, _ = sequence_logprobs(model.eval(), batch["input_ids"], T)                   # [B, T]
    mask = batch["loss_mask"]
    gap = float(((lp - batch["old_logprobs"]) * mask).abs().max())
    with torch.no_grad():
        lp_t1, _ = sequence_logprobs(model, batch["input_ids"], 1.0)                   # the trainer forgot T
    wrong_t = float(((lp_t1 - batch["old_logprobs"]).abs() * mask).sum() / mask.sum())
    ref = Reference(model)
    stopped = [i for i, s in enumerate(samples) if s.finish_reason == "stop"]
    eos_in_loss = sum(int(mask[i, len(samples[i].prompt_ids) + len(samples[i].response_ids) - 1]) for i in stopped)
    return {"gap": gap, "tokens": int(mask.sum()), "ref_trainable": sum(p.requires_grad for p in ref.model.parameters()),
            "ref_params": sum(1 for _ in ref.model.parameters()), "stopped": len(stopped), "eos_in_loss": eos_in_loss,
            "samples": len(samples), "wrong_t": wrong_t, "T": T}


# ---- 25 · kernels for RL ---------------------------------------------------------------------

MIB = 2 ** 20


def rl25_chunk_table() -> dict:
    """Logits held at once for 32,768 tokens × a 131,072-token vocabulary in bf16 (shapes.logits_bytes)."""
    from posttrain.shapes import logits_bytes
    full = logits_bytes(32768, 131072)
    rows = [["none (full logits)", f"{full / GIB:.2f} GiB", "1×"]]
    for c in (16384, 4096, 1024):
        b = logits_bytes(32768, 131072, vocab_chunk=c)
        rows.append([f"{c:,} columns", f"{b / MIB:,.0f} MiB", f"{full / b:.0f}×"])
    return table(["vocabulary chunk", "logits held at once", "smaller by"], rows)


def rl25_prefix_table() -> dict:
    """K samples share one prefill of a prompt of P tokens; each writes G response tokens (G/P = 0.1)."""
    g = 0.1
    return table(["K", "prompt tokens computed, unshared / shared", "course's ratio K/(1 + K·G/P)",
                  "all tokens, K(1 + G/P)/(1 + K·G/P)"],
                 [[k, f"{k}×", f"{k / (1 + k * g):.2f}×", f"{k * (1 + g) / (1 + k * g):.2f}×"] for k in (4, 16, 64)])


@lru_cache(maxsize=1)
def rl25_engine_prefix() -> dict:
    """posttrain's engine: 4 prompts × 16 samples; prompt tokens prefilled vs. as if unshared."""
    import torch
    from posttrain.framework.rollout import Engine, SamplingParams
    from posttrain.models.gpt_mini import GPTMini, ModelConfig
    from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
    tok = CharTokenizer(BASE_CHARS)
    torch.manual_seed(0)
    model = GPTMini(ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=64).resolved(tok.vocab_size)).eval()
    prompts = [tok.encode(tok.chat_prompt(q)) for q in ("3+4+5", "12+7+9+1", "6+6", "18+2+11")]
    eng = Engine(model, tok, max_slots=16)
    eng.generate(prompts, 16, SamplingParams(max_new_tokens=8), seed=0)
    return {k.split("/")[1]: eng.stats[k] for k in ("rollout/prompt_tokens", "rollout/prefill_tokens", "rollout/prefills")}


def rl25_chunked_exact() -> float:
    """A vocabulary-chunked log-softmax (a running logsumexp over 8 chunks) against posttrain's
    token_logprobs on the same logits: the largest difference, in nats (fp32)."""
    import torch
    from posttrain.framework.sampler import token_logprobs
    g = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(64, 4096, generator=g)                                      # [N, V]
    y = torch.randint(0, 4096, (64,), generator=g)
    lse = torch.full((64,), -float("inf"))
    for chunk in logits.split(512, dim=-1):                                              # [N, 512] at a time
        lse = torch.logaddexp(lse, torch.logsumexp(chunk, -1))
    chunked = logits.gather(-1, y[:, None]).squeeze(1) - lse
    return float((chunked - token_logprobs(logits, y, 1.0)).abs().max())


# ---- 26 · why recipes look the way they do ----------------------------------------------------

def rl26_cost_table() -> dict:
    """The cost force in numbers (memory.py, shapes.py): training vs serving the course's round sizes."""
    from posttrain import memory, shapes
    rows = []
    for b in (7, 70, 405):
        s = shapes.course_shape(b)
        p = shapes.count_params(s)
        train = memory.train_bytes_per_param() * p
        rows.append([f"{b}B", f"{train / GIB:,.0f} GiB", memory.min_gpus(train), f"{2 * p / GIB:,.0f} GiB",
                     f"{shapes.kv_bytes_per_token(s) / 1024:.0f} KiB"])
    return table(["model", "training state (18 B/param)", "H100s just to hold it", "bf16 weights to serve",
                  "KV cache per token"], rows)


FORCE_SETTINGS = [(100, 0, 32), (100, 50, 8), (100, 100, 512), (60, 50, 64), (20, 50, 8), (20, 50, 1)]


def memory_ratio() -> float:
    """Training state over serving weights, per parameter: 18 B / 2 B."""
    from posttrain import memory
    return memory.train_bytes_per_param() / 2


def rl26_extremes_table() -> dict:
    """The forces widget's rules (widgets_signal.recipe and .leak, the course's decision table) at a
    few corners of its map; the widget's training run behind them is not repeated here."""
    from posttrain.lessons.widgets_signal import leak, recipe
    rows = []
    for sig, bias, cost in FORCE_SETTINGS:
        reward, algo, topo, named = recipe(sig, bias, cost)
        rows.append([f"{sig}%", f"{bias}%", cost, reward, algo, topo, named, f"{leak(sig):g}"])
    return table(["verifiable signal", "bias tolerance", "GPUs", "reward", "algorithm", "topology", "closest recipe",
                  "reward leak ρ"], rows)


# ---- 27 · concepts the course leaves out -----------------------------------------------------

def rl27_kl_table() -> dict:
    """k1, k2, k3 (core.kl) on 4,096 tokens sampled from π_θ, against the exact KL(π_θ ‖ π_ref)
    of two 16-token categoricals (π_ref's logits shifted by 0.5 × a ramp)."""
    import torch
    from posttrain.algorithms import core
    base = torch.linspace(-1.5, 1.5, 16, dtype=torch.float64)
    lp, lr = torch.log_softmax(base, -1), torch.log_softmax(base + 0.5 * torch.linspace(-1, 1, 16, dtype=torch.float64), -1)
    exact = float((lp.exp() * (lp - lr)).sum())
    y = torch.multinomial(lp.exp(), 4096, replacement=True, generator=torch.Generator().manual_seed(0))
    rows = []
    for k in core.KL_ESTIMATORS:
        est = core.kl(lp[y], lr[y], k)                                                   # [4096]
        rows.append([k, f"{float(est.mean()):.4f}", f"{float(est.std()):.4f}", f"{float((est < 0).double().mean()):.0%}"])
    return table(["estimator", f"mean (exact KL = {exact:.4f})", "std per token", "tokens < 0"], rows)


def rl27_gae_table() -> dict:
    """ppo.gae on one 5-token response with an outcome reward of 1 on its last token and a critic's
    values V = (0.2, 0.4, 0.5, 0.7, 0.9), γ = 1, for three λ."""
    import torch
    from posttrain.algorithms.ppo import gae
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.2, 0.4, 0.5, 0.7, 0.9]], dtype=torch.float64)
    mask = torch.ones_like(rewards)
    rows = []
    for lam in (0.0, 0.95, 1.0):
        adv, _ = gae(rewards, values, mask, gamma=1.0, lam=lam)
        rows.append([lam, *[f"{float(a):+.3f}" for a in adv[0]]])
    return table(["λ", *[f"A at token {t + 1}" for t in range(5)]], rows)


def rl27_gaps_table() -> dict:
    """The gaps widget, fix on and off, for four of the gaps posttrain closed (the cheap ones)."""
    rows = []
    for g in ("kl", "whiten", "offpolicy", "lora"):
        k = {lab: kpi("gaps", lab, gap=g) for lab in ("gap", "measured", "with the fix", "without the fix")}
        rows.append([k["gap"], k["measured"], k["with the fix"], k["without the fix"]])
    return table(["gap", "what is measured", "posttrain's fix on", "fix off"], rows)


def rl27_lora() -> dict:
    from posttrain import shapes
    s = shapes.resolve_model("llama-7b")
    run = result("lora_memory")
    return {"params": shapes.lora_params(s, 16), "frac": shapes.lora_params(s, 16) / shapes.count_params(s),
            "opt_ratio": run["full"]["optimizer_state_bytes"] / run["lora"]["optimizer_state_bytes"],
            "measured_frac": run["lora"]["trainable"] / run["lora"]["total"]}


# ---- 28 · bottlenecks and where to optimise --------------------------------------------------

def amdahl(share: float, speedup: float) -> float:
    """Whole-step speed-up when a slice holding `share` of the step gets `speedup`× faster."""
    return 1 / (1 - share + share / speedup)


def rl28_amdahl_table() -> dict:
    cols = [2, 10, math.inf]
    return table(["slice's share of the step", *[("∞" if c == math.inf else f"{c}×") + " on that slice" for c in cols]],
                 [[f"{int(100 * f)}%", *[f"{amdahl(f, c):.2f}×" for c in cols]] for f in (0.1, 0.2, 0.6, 0.8)])


def rl28_cpu_table() -> dict:
    """Per-role shares of the three synchronous seeds of benchmarks/async_vs_sync.py (one CPU thread)."""
    rows = []
    for r in result("async_vs_sync")["runs"]:
        if r["run"] == "sync":
            t = tp.step_time(**r["roles_s"], topology="colocated")
            rows.append([r["seed"], f"{t['step_s']:.2f} s", *[f"{100 * t['shares'][k]:.0f}%" for k in ("rollout", "reference", "train")],
                         t["bottleneck"]])
    return table(["seed", "step", "rollout", "reference", "train", "bottleneck"], rows)


# ---- gpt_mini 01 · the model under every stage ----------------------------------------------

def _nano():
    from posttrain.models.gpt_mini import ModelConfig
    from posttrain.models.tokenizer import BASE_CHARS
    return ModelConfig(preset="nano").resolved(len(BASE_CHARS))


def g01_parts_table() -> dict:
    """gpt_mini nano (the arithmetic task's 58-character vocabulary) by part, from its config."""
    from posttrain.models.gpt_mini import count_params
    c = _nano()
    d, L, V, hd = c.d_model, c.n_layers, c.vocab_size, c.head_dim
    parts = {"token embedding (V·d)": V * d,
             "attention, all blocks (q, k, v, o)": L * (d * (c.n_heads + 2 * c.n_kv_heads) * hd + c.n_heads * hd * d),
             "SwiGLU MLP, all blocks (3·d·d_ff)": L * 3 * d * c.d_ff,
             "RMSNorm weights (2 per block + final)": L * 2 * d + d, "output head (V·d, untied)": V * d}
    total = count_params(c)
    return table(["part", "parameters", "share"],
                 [[k, f"{v:,}", f"{100 * v / total:.1f}%"] for k, v in parts.items()] + [["total", f"{total:,}", "100%"]])


def g01_presets_table() -> dict:
    from posttrain.models.gpt_mini import PRESETS, ModelConfig, count_params
    from posttrain.models.tokenizer import BASE_CHARS
    rows = []
    for name in PRESETS:
        c = ModelConfig(preset=name).resolved(len(BASE_CHARS))
        rows.append([name, c.d_model, c.n_layers, c.n_heads, c.d_ff, f"{count_params(c):,}"])
    return table(["preset", "d", "layers", "heads", "d_ff", "parameters (V = 58)"], rows)


def g01_module_count() -> int:
    """Parameters of an instantiated GPTMini nano, counted tensor by tensor."""
    from posttrain.models.gpt_mini import GPTMini
    return GPTMini(_nano()).num_params()


def g01_softmax_peak(d_head: int, scaled: bool) -> float:
    """Mean largest attention weight over 16 keys for random q, k with unit-variance entries."""
    import torch
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(256, 1, d_head, generator=g), torch.randn(256, 16, d_head, generator=g)
    scores = (q @ k.transpose(1, 2)).squeeze(1) / (math.sqrt(d_head) if scaled else 1.0)    # [256, 16]
    return float(torch.softmax(scores, -1).max(-1).values.mean())


# ---- gpt_mini 02 · pretraining ----------------------------------------------------------------

CONTEXT_NEXT = {"3+4=": "7, the sum", "3+4=7;7+": "any digit: the next term is random",
                "12+6=1": "8 (12 + 6 = 18)", "9+9=": "1 (9 + 9 = 18)"}


@lru_cache(maxsize=1)
def g02_corpus_stats() -> dict:
    """The recorded run's corpus (runs.TASK: sums of 2–3 digits, lines as task.corpus writes them):
    character entropy, and the floor of any predictor: the terms and the number of terms are
    random, everything else follows from them."""
    import random
    from collections import Counter
    from posttrain.lessons import runs
    from posttrain.tasks.arithmetic import ArithmeticTask
    task = ArithmeticTask(runs.TASK)
    rng = random.Random(0)
    problems = [task.sample_problem(rng, "train") for _ in range(1500)]
    text = "".join(p.trace()[1:-1] + "\n" for p in problems)
    n = len(text)
    unigram = -sum(c / n * math.log(c / n) for c in Counter(text).values())
    info = sum(p.k * math.log(runs.TASK.max_value + 1) + math.log(runs.TASK.max_terms - runs.TASK.min_terms + 1)
               for p in problems)
    return {"unigram": unigram, "floor": info / n, "symbols": len(set(text))}


def g02_loss_table() -> dict:
    from posttrain.lessons import runs
    from posttrain.models.tokenizer import BASE_CHARS
    rec = runs.recorded()["pretrain"]
    c = g02_corpus_stats()
    return table(["predictor", "nats per character"], [
        [f"uniform over the {len(BASE_CHARS)}-character vocabulary", f"{math.log(len(BASE_CHARS)):.2f}"],
        [f"uniform over the {c['symbols']} characters the corpus uses", f"{math.log(c['symbols']):.2f}"],
        ["character frequencies, no context", f"{c['unigram']:.2f}"],
        [f"gpt_mini, training loss at step {rec['step'][0]}", f"{rec['loss'][0]:.2f}"],
        [f"gpt_mini, training loss at step {rec['step'][-1]}", f"{rec['loss'][-1]:.2f}"],
        ["the floor: terms are random, the rest follows", f"{c['floor']:.2f}"]])


def g02_context_table() -> dict:
    import torch
    from posttrain.lessons import runs
    from posttrain.models.tokenizer import BASE_CHARS
    rec = runs.recorded()["pretrain"]
    rows = []
    for ctx, logits in rec["logits"].items():
        z = torch.tensor(logits, dtype=torch.float64)
        p = torch.softmax(z, -1)
        top = int(p.argmax())
        ent = lambda t: float(-(torch.softmax(z / t, -1) * torch.log_softmax(z / t, -1)).sum())   # noqa: E731
        rows.append([ctx, CONTEXT_NEXT[ctx], f"{BASE_CHARS[top]!r} ({float(p[top]):.2f})", f"{ent(0.5):.2f}",
                     f"{ent(1.0):.2f}", f"{ent(2.0):.2f}"])
    return table(["context", "what follows in the corpus", "model's top choice (probability)", "entropy at T = 0.5",
                  "T = 1", "T = 2"], rows)


def g02_entropy(ctx: str, t: float) -> float:
    import torch
    from posttrain.lessons import runs
    z = torch.tensor(runs.recorded()["pretrain"]["logits"][ctx], dtype=torch.float64) / t
    return float(-(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum())


def g02_prob(ctx: str, char: str) -> float:
    import torch
    from posttrain.lessons import runs
    from posttrain.models.tokenizer import BASE_CHARS
    return float(torch.softmax(torch.tensor(runs.recorded()["pretrain"]["logits"][ctx]), -1)[BASE_CHARS.index(char)])


def g02_tokens() -> dict:
    from posttrain.config import PretrainConfig
    c = PretrainConfig()
    n = __import__("posttrain.models.gpt_mini", fromlist=["x"]).count_params(_nano())
    seen = c.steps * c.batch_size * c.seq_len
    return {"targets": c.batch_size * (c.seq_len - 1), "seen": seen, "chinchilla": 20 * n, "frac": seen / (20 * n)}


# ---- gpt_mini 03 · SFT and the loss mask -------------------------------------------------------

def g03_mask_table() -> dict:
    """collate's loss mask for <3+4+5>12#, with the prompt masked and not: column t is trained
    when the loss predicts input_ids[t] from input_ids[:t]."""
    from posttrain.framework.batch import collate
    from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
    tok = CharTokenizer(BASE_CHARS)
    prompt, response = tok.encode(tok.chat_prompt("3+4+5")), tok.encode(tok.chat_response("12"))
    on = collate([prompt], [response], tok.pad_id, True)["loss_mask"][0].tolist()
    off = collate([prompt], [response], tok.pad_id, False)["loss_mask"][0].tolist()
    text = "".join(tok.chars[i] for i in prompt + response)
    return table(["column t", "token", "predicted from", "trained, prompt masked", "trained, prompt not masked"],
                 [[t, repr(text[t]), repr(text[:t]) if t else "—", int(a), int(b)] for t, (a, b) in enumerate(zip(on, off))])


@lru_cache(maxsize=1)
def g03_prompt_share() -> dict:
    """Over 2,000 training problems of the default task (2–6 terms below 20): the share of trained
    positions that are prompt positions when the prompt is not masked, direct and with CoT."""
    from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
    from posttrain.tasks.arithmetic import ArithmeticTask
    tok, task = CharTokenizer(BASE_CHARS), ArithmeticTask()
    out = {}
    for cot in (False, True):
        pr = rs = 0
        for it in task.items(2000, "train", 0):
            pr += len(tok.chat_prompt(task.prompt(it))) - 1                    # every prompt token but the first
            rs += len(tok.chat_response(it.target(cot)))
        out[cot] = pr / (pr + rs)
    return out


def g03_recorded_table() -> dict:
    """The recorded SFT runs of the widget (runs.mask_runs: a small gpt_mini from scratch on 4–5-term
    sums of digits, direct answers, 3 seeds averaged): held-out accuracy and training loss."""
    from posttrain.lessons import runs
    rec = runs.recorded()
    on, off = rec["sft mask=1 seeds"], rec["sft mask=0 seeds"]
    return table(["SFT step", "held-out accuracy, prompt masked", "prompt trained on", "training loss, masked",
                  "training loss, trained on"],
                 [[st, f"{a:.2f}", f"{b:.2f}", f"{la:.2f}", f"{lb:.2f}"]
                  for st, a, b, la, lb in zip(on["step"], on["acc"], off["acc"], on["loss"], off["loss"])])


def _mask_run(masked: bool) -> dict:
    from posttrain.lessons import runs
    return runs.recorded()[f"sft mask={int(masked)} seeds"]


def g03_mask_share() -> float:
    """Share of the trained positions that are prompt characters, unmasked, on the recorded runs' task."""
    from posttrain.lessons import runs
    from posttrain.models.tokenizer import BASE_CHARS, CharTokenizer
    from posttrain.tasks.arithmetic import ArithmeticTask
    tok, task = CharTokenizer(BASE_CHARS), ArithmeticTask(runs.MASK_TASK)
    pr = rs = 0
    for it in task.items(1000, "train", 0):
        pr += len(tok.chat_prompt(task.prompt(it))) - 1
        rs += len(tok.chat_response(it.target(False)))
    return pr / (pr + rs)


# ---- gpt_mini 04 · chain of thought -----------------------------------------------------------

def g04_table() -> dict:
    """benchmarks/results/cot_vs_direct.json: nano pretrained, then 800 SFT steps on direct answers or
    on CoT traces, sums of 2–6 two-digit terms (10–99), held-out greedy accuracy by term count."""
    r = result("cot_vs_direct")
    return table(["terms K", "additions in the sum", "direct answer", "chain of thought", "distinct problems (90^K)"],
                 [[k, k - 1, f"{r['direct'][f'eval/greedy_acc_k{k}']:.2f}", f"{r['cot'][f'eval/greedy_acc_k{k}']:.2f}",
                   f"{90 ** k:.1e}" if k > 3 else f"{90 ** k:,}"] for k in range(2, 7)])


def g04_target(terms: tuple, cot: bool) -> str:
    from posttrain.tasks.arithmetic import Problem
    return Problem(terms).target(cot)


# ---- gpt_mini 05 · DPO ------------------------------------------------------------------------

def g05_first_step(beta: float = 0.1) -> dict:
    """preference_loss on one pair when π_θ = π_ref (every log-ratio 0): the loss and its gradient
    with respect to the chosen and rejected log-probs."""
    import torch
    from posttrain.preference.dpo import DPOLossConfig, SeqLogps, preference_loss
    lp = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    zero, one = torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    loss, _ = preference_loss(DPOLossConfig("dpo", beta), SeqLogps(lp[:1], lp[1:], zero, zero, one, one))
    (g,) = torch.autograd.grad(loss.sum(), lp)
    return {"loss": float(loss.detach()), "grad_chosen": float(g[0]), "grad_rejected": float(g[1])}


def g05_family_table() -> dict:
    """benchmarks/results/dpo_family.json: from the same SFT checkpoint and the same verifier-labelled
    pairs, 100 steps each; held-out pass@1 and the final mean log-probabilities of the pairs."""
    rows = []
    for r in result("dpo_family"):
        if r["run"] in ("dpo lr 1e-5", "dpo lr 3e-6", "dpo_nll lr 1e-5", "orpo lr 1e-5"):
            ev = {e["step"]: e["eval/pass@1"] for e in r["evals"]}
            rows.append([r["run"], f"{ev[0]:.3f} → {ev[50]:.3f} → {ev[100]:.3f}", f"{r['final_logps_chosen']:.2f}",
                         f"{r['final_logps_rejected']:.2f}"])
    return table(["loss, learning rate", "held-out pass@1 at steps 0 → 50 → 100", "log π(chosen), end",
                  "log π(rejected), end"], rows)


def g05_run(name: str) -> dict:
    return next(r for r in result("dpo_family") if r["run"] == name)


# ---- gpt_mini 06 · RL with verifiable rewards (GRPO) -----------------------------------------

def g06_group_table() -> dict:
    """grpo.advantages for the group r = (1, 1, 0, 0) and (1, 0, 0, 0), both std conventions."""
    import torch
    from posttrain.algorithms import grpo
    rows = []
    for rewards in ((1.0, 1.0, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0), (1.0, 1.0, 1.0, 1.0)):
        r = torch.tensor(rewards, dtype=torch.float64)
        adv = {std: grpo.advantages(r, torch.zeros(4, dtype=torch.long), grpo.Config(std=std)) for std in ("population", "unbiased")}
        rows.append([", ".join(f"{x:g}" for x in rewards),
                     *[", ".join(f"{float(a):+.3f}" for a in adv[std]) for std in ("population", "unbiased")]])
    return table(["rewards of the group", "A, population std (the course's tables)", "A, unbiased std (torch, TRL, verl)"], rows)


def g06_degenerate_table() -> dict:
    """benchmarks/results/claims.json: 300 train prompts, each prompt's pass rate p estimated from 32
    samples of the SFT model; fresh groups of K: the share with all-equal rewards, against
    p^K + (1 − p)^K per prompt and against the same formula at the mean p."""
    d = result("claims")["degenerate"]
    return table(["K", "observed", "predicted, per-prompt p", f"predicted from the mean p = {d['mean_p']:.2f}"],
                 [[r["K"], f"{r['observed']:.2f}", f"{r['predicted_per_prompt']:.2f}", f"{r['predicted_mean_p']:.2f}"]
                  for r in d["rows"]])


def g06_group_runs() -> dict:
    return {r["run"]: r for r in result("claims")["group"]}


def g06_config() -> dict:
    from posttrain.config import RLConfig, load_config
    c = load_config(RLConfig, "grpo_arith", [])
    return {"K": c.samples_per_prompt, "prompts": c.prompts_per_step, "lr": c.optim.lr, "kl": c.algo["kl_coef"]}


FACTS: dict[str, Callable[[], object]] = {
    "rl22a_worked_table": rl22a_worked_table,
    "rl22a_worked_disagg_s": lambda: rl22a_worked()["step_s"],
    "rl22a_worked_colo_s": lambda: rl22a_worked("colocated")["step_s"],
    "rl22a_worked_idle_s": lambda: rl22a_worked()["idle_s"]["trainer"],
    "rl22a_worked_tok_s": lambda: tp.useful_tokens_per_s(64, 16, 1024, rl22a_worked()["step_s"]),
    "rl22a_worked_tokens": lambda: WORKED_TOKENS,
    "rl22a_role_table": rl22a_role_table,
    "rl22a_rollout_share": lambda: 100 * tp.role_model()["shares"]["rollout"],
    "rl22a_length_table": rl22a_length_table,
    "rl22a_share_8192": lambda: 100 * tp.role_model(response_len=8192)["shares"]["rollout"],
    "rl22a_colo_drop_pct": rl22a_colo_drop,
    "rl22a_k32_rollout_ratio": lambda: rl22a_k_doubling()["rollout_ratio"],
    "rl22a_k32_step_ratio": lambda: rl22a_k_doubling()["step_ratio"],
    "rl22a_sync_70b_s": lambda: tp.role_model(params_b=70, topology="async")["terms"]["sync"],
    "rl22a_cpu_table": rl22a_cpu_table,
    "rl22a_cpu_bottleneck": lambda: rl22a_cpu_roles()["bottleneck"],
    "rl22a_cpu_train_share": lambda: 100 * rl22a_cpu_roles()["shares"]["train"],
    "rl22a_cpu_rollout_share": lambda: 100 * rl22a_cpu_roles()["shares"]["rollout"],
    "rl22a_cpu_equation_s": lambda: rl22a_cpu_roles()["step_s"],
    "rl22a_cpu_measured_s": rl22a_cpu_measured_s,
    "rl22a_default_rollout_s": lambda: tp.role_model()["terms"]["rollout"],
    "rl22a_default_step_s": lambda: tp.role_model()["step_s"],
    "rl22b_maxk_table": rl22b_maxk_table,
    "rl22b_maxk_16_1": lambda: tp.max_of_k(16, 1.0),
    "rl22b_k32_c05_pct": lambda: rl22b_k32_pct(0.5),
    "rl22b_k32_c1_pct": lambda: rl22b_k32_pct(1.0),
    "rl22b_k32_c2_pct": lambda: rl22b_k32_pct(2.0),
    "rl22b_tail_table": rl22b_tail_table,
    "rl22b_cutoff_table": rl22b_cutoff_table,
    "rl22b_cutoff_steps_all": lambda: rl22b_cutoff()["all"]["steps"],
    "rl22b_cutoff_steps_cut": lambda: rl22b_cutoff()["cut"]["steps"],
    "rl22b_cutoff_tokens_all": lambda: rl22b_cutoff()["all"]["tokens"],
    "rl22b_cutoff_tokens_cut": lambda: rl22b_cutoff()["cut"]["tokens"],
    "rl22b_cutoff_mean_all": lambda: rl22b_cutoff()["all"]["mean"],
    "rl22b_cutoff_mean_cut": lambda: rl22b_cutoff()["cut"]["mean"],
    "rl22b_overlong_table": rl22b_overlong_table,
    "rl22b_w_cap_tax": lambda: kpi("stragglers", "straggler tax max/mean − 1", cap=True),
    "rl22b_w_capdyn_tax": lambda: kpi("stragglers", "straggler tax max/mean − 1", cap=True, dynk=True),
    "rl22b_w_capdyn_saved": lambda: kpi("stragglers", "decode saved", cap=True, dynk=True),
    "rl22b_w_course_tax": lambda: kpi("stragglers", "straggler tax max/mean − 1", cap=True, rule="course"),
    "rl22b_w_cv2_tax": lambda: kpi("stragglers", "straggler tax max/mean − 1", cv=2.0),
    "rl22b_w_cv2_longest": lambda: kpi("stragglers", "τ_R = longest response", cv=2.0),
    "rl22c_topology_table": rl22c_topology_table,
    "rl22c_async_speedup": lambda: rl22c_topologies()["async"]["speedup_vs_colocated"],
    "rl22c_disagg_idle_s": lambda: rl22c_topologies()["disaggregated"]["idle_s"]["trainer"],
    "rl22c_course_clip_2": lambda: 100 * (1 - math.exp(-2 / 20)),
    "rl22c_course_clip_8": lambda: 100 * (1 - math.exp(-8 / 20)),
    "rl22c_measured_table": rl22c_measured_table,
    "rl22c_fixed4_clip_pct": lambda: 100 * _async_runs()["fixed4_none"]["mean clip/frac"],
    "rl22c_fixed4_logratio": lambda: _async_runs()["fixed4_tis"]["mean offpolicy/log_ratio_abs"],
    "rl22c_fixed4_ratio_max": lambda: _async_runs()["fixed4_none"]["mean ratio/max"],
    "rl22c_async1_logratio": lambda: _async_runs()["async_tis"]["mean offpolicy/log_ratio_abs"],
    "rl22c_sync_gain_pts": lambda: 100 * rl22c_gain("sync", "pass@1_gain_mean"),
    "rl22c_sync_gain_sd_pts": lambda: 100 * rl22c_gain("sync", "pass@1_gain_sd"),
    "rl22c_async_gain_pts": lambda: 100 * rl22c_gain("async_tis", "pass@1_gain_mean"),
    "rl22c_async_gain_sd_pts": lambda: 100 * rl22c_gain("async_tis", "pass@1_gain_sd"),
    "rl22c_cpu_async_speedup": rl22c_cpu_async_speedup,
    "rl22c_stale_table": rl22c_stale_table,
    "rl22c_w_clip32": lambda: f'{100 * kpi("async_pipe", "clip fraction (mean over the run)", delta=32):.0f}%',
    "rl22c_w_steps32": lambda: kpi("async_pipe", "steps to accuracy 0.7", delta=32),
    "rl22c_w_wall32": lambda: kpi("async_pipe", "wall clock to accuracy 0.7", delta=32),
    "rl23_alarm_table": rl23_alarm_table,
    "rl23_real_runs_table": rl23_real_runs_table,
    "rl23_modes_table": rl23_modes_table,
    "rl23_classify_table": rl23_classify_table,
    "rl23_classify_break": lambda: kpi("classify", "consistent?", reward="preference pairs",
                                       data="on-policy (samples its own answers)"),
    "rl24_tokens_per_step": lambda: 1024 * 64 * 16,
    "rl24_decode_tok_s": lambda: tp.decode_tokens_per_s(14e9, 8.6e9, 32),
    "rl24_train_tok_s": lambda: tp.train_tokens_per_s(7e9),
    "rl24_speed_ratio": lambda: tp.train_tokens_per_s(7e9) / tp.decode_tokens_per_s(14e9, 8.6e9, 32),
    "rl24_sizing_table": rl24_sizing_table,
    "rl24_state_tib": rl24_state_tib,
    "rl24_hbm_gib": lambda: 8 * 80e9 / GIB,
    "rl24_gap": lambda: rl24_traps()["gap"],
    "rl24_gap_tokens": lambda: rl24_traps()["tokens"],
    "rl24_ref_trainable": lambda: rl24_traps()["ref_trainable"],
    "rl24_ref_params": lambda: rl24_traps()["ref_params"],
    "rl24_stopped": lambda: rl24_traps()["stopped"],
    "rl24_eos_in_loss": lambda: rl24_traps()["eos_in_loss"],
    "rl25_logits_gib": lambda: __import__("posttrain.shapes", fromlist=["x"]).logits_bytes(32768, 131072) / GIB,
    "rl25_chunk_table": rl25_chunk_table,
    "rl25_prefix_table": rl25_prefix_table,
    "rl25_engine_prompt_tokens": lambda: rl25_engine_prefix()["prompt_tokens"],
    "rl25_engine_prefill_tokens": lambda: rl25_engine_prefix()["prefill_tokens"],
    "rl25_engine_prefills": lambda: rl25_engine_prefix()["prefills"],
    "rl25_chunked_exact": rl25_chunked_exact,
    "rl25_wrong_t_gap": lambda: rl24_traps()["wrong_t"],
    "rl25_sampler_t": lambda: rl24_traps()["T"],
    "rl25_cast_ms": lambda: 140e9 / 3.35e12 * 1000,
    "rl25_w_gp05": lambda: kpi("kernels", "prefix-sharing saving K/(1 + K·G/P)", gp=0.5),
    "rl25_w_k64": lambda: kpi("kernels", "prefix-sharing saving K/(1 + K·G/P)", K=64, gp=0.05),
    "rl26_cost_table": rl26_cost_table,
    "rl26_extremes_table": rl26_extremes_table,
    "rl26_train_over_serve": lambda: memory_ratio(),
    "rl27_kl_table": rl27_kl_table,
    "rl27_gaps_table": rl27_gaps_table,
    "rl27_gae_table": rl27_gae_table,
    "rl27_lora_params": lambda: rl27_lora()["params"],
    "rl27_lora_pct": lambda: 100 * rl27_lora()["frac"],
    "rl27_lora_measured_pct": lambda: 100 * rl27_lora()["measured_frac"],
    "rl27_lora_opt_ratio": lambda: rl27_lora()["opt_ratio"],
    "rl27_w_bias_none16": lambda: kpi("off_policy", "bias", delta=16, mode="none"),
    "rl27_w_bias_tis16": lambda: kpi("off_policy", "bias", delta=16, mode="tis"),
    "rl27_w_capped_tis16": lambda: kpi("off_policy", "capped / masked tokens", delta=16, mode="tis"),
    "rl27_w_bias_tis16_c10": lambda: kpi("off_policy", "bias", delta=16, mode="tis", cap=10.0),
    "rl27_w_sd_tis16_c10": lambda: kpi("off_policy", "std over 200 batches", delta=16, mode="tis", cap=10.0),
    "rl27_w_sd_tis16": lambda: kpi("off_policy", "std over 200 batches", delta=16, mode="tis"),
    "rl28_amdahl_table": rl28_amdahl_table,
    "rl28_two_on_ten": lambda: 100 * (amdahl(0.1, 2) - 1),
    "rl28_cpu_table": rl28_cpu_table,
    "rl28_train_1gpu_s": lambda: tp.train_time_s(32768, 7e9),
    "rl28_train_8gpu_s": lambda: tp.train_time_s(32768, 7e9, gpus=8),
    "rl28_w_trainonly_speedup": lambda: kpi("budget", "speed-up", prefix=False, cbatch=False, train_opts=True),
    "rl28_w_trainonly_disagg": lambda: kpi("budget", "speed-up", prefix=False, cbatch=False, train_opts=True,
                                           placement="disaggregated"),
    "rl28_w_prefixonly_speedup": lambda: kpi("budget", "speed-up", prefix=True, cbatch=False, train_opts=False),
    "rl28_w_all_speedup": lambda: kpi("budget", "speed-up", prefix=True, cbatch=True, spec=True, fp8=True,
                                       train_opts=True, sync="overlapped", refpool=True),
    "rl28_w_all_largest": lambda: kpi("budget", "largest remaining slice", prefix=True, cbatch=True, spec=True, fp8=True,
                                       train_opts=True, sync="overlapped", refpool=True),
    "g01_parts_table": g01_parts_table,
    "g01_presets_table": g01_presets_table,
    "g01_nano_params": lambda: __import__("posttrain.models.gpt_mini", fromlist=["x"]).count_params(_nano()),
    "g01_module_params": g01_module_count,
    "g01_course_params": lambda: __import__("posttrain.shapes", fromlist=["x"]).count_params(
        __import__("posttrain.shapes", fromlist=["x"]).resolve_model("course-minigpt")),
    "g01_block_over_d2": lambda: (lambda c: (4 * c.d_model ** 2 + 3 * c.d_model * c.d_ff + 2 * c.d_model) / c.d_model ** 2)(_nano()),
    "g01_peak_32_unscaled": lambda: g01_softmax_peak(32, False),
    "g01_peak_32_scaled": lambda: g01_softmax_peak(32, True),
    "g01_peak_512_unscaled": lambda: g01_softmax_peak(512, False),
    "g01_flops_fwd": lambda: 2 * __import__("posttrain.models.gpt_mini", fromlist=["x"]).count_params(_nano()),
    "g02_loss_table": g02_loss_table,
    "g02_context_table": g02_context_table,
    "g02_floor": lambda: g02_corpus_stats()["floor"],
    "g02_final_loss": lambda: __import__("posttrain.lessons.runs", fromlist=["x"]).recorded()["pretrain"]["loss"][-1],
    "g02_p_7_after_34": lambda: g02_prob("3+4=", "7"),
    "g02_targets_per_step": lambda: g02_tokens()["targets"],
    "g02_tokens_seen": lambda: g02_tokens()["seen"],
    "g02_chinchilla": lambda: g02_tokens()["chinchilla"],
    "g02_chinchilla_pct": lambda: 100 * g02_tokens()["frac"],
    "g02_ln10": lambda: math.log(10),
    "g02_ent_99_t1": lambda: g02_entropy("9+9=", 1.0),
    "g02_ent_99_t2": lambda: g02_entropy("9+9=", 2.0),
    "g03_mask_table": g03_mask_table,
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
    "g04_table": g04_table,
    "g04_direct_acc": lambda: result("cot_vs_direct")["direct"]["eval/greedy_acc"],
    "g04_cot_acc": lambda: result("cot_vs_direct")["cot"]["eval/greedy_acc"],
    "g04_direct_len": lambda: result("cot_vs_direct")["direct"]["eval/length_mean"],
    "g04_cot_len": lambda: result("cot_vs_direct")["cot"]["eval/length_mean"],
    "g04_example_cot": lambda: g04_target((3, 4, 5, 6), True),
    "g04_example_direct": lambda: g04_target((3, 4, 5, 6), False),
    "g04_example_len": lambda: len(g04_target((3, 4, 5, 6), True)),
    "g04_compound_100": lambda: 0.99 ** 100,
    "g04_w_cot_1layer": lambda: kpi("cot", "chain of thought, K = 2 → 6", layers=1),
    "g04_w_direct6": lambda: kpi("cot", "held-out accuracy (this setting)", cot=False, K=6),
    "g04_w_cot6": lambda: kpi("cot", "held-out accuracy (this setting)", cot=True, K=6),
    "g04_len_ratio": lambda: result("cot_vs_direct")["cot"]["eval/length_mean"] / result("cot_vs_direct")["direct"]["eval/length_mean"],
    "g04_acc_ratio": lambda: result("cot_vs_direct")["cot"]["eval/greedy_acc"] / result("cot_vs_direct")["direct"]["eval/greedy_acc"],
    "g05_loss0": lambda: g05_first_step()["loss"],
    "g05_ln2": lambda: math.log(2),
    "g05_grad_chosen": lambda: g05_first_step()["grad_chosen"],
    "g05_grad_rejected": lambda: g05_first_step()["grad_rejected"],
    "g05_family_table": g05_family_table,
    "g05_dpo_end": lambda: g05_run("dpo lr 1e-5")["evals"][-1]["eval/pass@1"],
    "g05_nll_end": lambda: g05_run("dpo_nll lr 1e-5")["evals"][-1]["eval/pass@1"],
    "g05_start": lambda: g05_run("dpo lr 1e-5")["evals"][0]["eval/pass@1"],
    "g05_dpo_chosen": lambda: g05_run("dpo lr 1e-5")["final_logps_chosen"],
    "g05_nll_chosen": lambda: g05_run("dpo_nll lr 1e-5")["final_logps_chosen"],
    "g06_group_table": g06_group_table,
    "g06_degenerate_table": g06_degenerate_table,
    "g06_k2_degenerate": lambda: result("claims")["degenerate"]["rows"][0]["observed"],
    "g06_k8_degenerate": lambda: result("claims")["degenerate"]["rows"][2]["observed"],
    "g06_mean_p": lambda: result("claims")["degenerate"]["mean_p"],
    "g06_k2_first10_degenerate": lambda: g06_group_runs()["group_2"]["group/degenerate_frac_first10"],
    "g06_k8_first10_degenerate": lambda: g06_group_runs()["group_8"]["group/degenerate_frac_first10"],
    "g06_k2_pass_end": lambda: g06_group_runs()["group_2"]["pass@1_end"],
    "g06_k8_pass_end": lambda: g06_group_runs()["group_8"]["pass@1_end"],
    "g06_group_pass_start": lambda: g06_group_runs()["group_2"]["pass@1_start"],
    "g06_cfg_K": lambda: g06_config()["K"],
    "g06_cfg_prompts": lambda: g06_config()["prompts"],
    "g06_cfg_lr": lambda: g06_config()["lr"],
    "g06_cfg_kl": lambda: g06_config()["kl"],
    "g06_lr_ratio": lambda: __import__("posttrain.config", fromlist=["x"]).SFTConfig().optim.lr / g06_config()["lr"],
    "g06_w_beta05_final": lambda: kpi("grpo_sim", "final P(correct)", beta=0.5),
    "g06_w_k2_dead": lambda: kpi("grpo_sim", "groups with no signal, steps 1–40", K=2),
    "g06_w_k2_p40": lambda: kpi("grpo_sim", "P(correct) at step 40", K=2),
    "g06_sync_gain_pts": lambda: 100 * rl22c_gain("sync", "pass@1_gain_mean"),
}
