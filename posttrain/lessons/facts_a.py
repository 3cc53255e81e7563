"""Numbers quoted by the text of lessons 00–12 (posttrain/lessons/text/rl-00.md … rl-12.md).

Each fact is a function of no arguments that returns a number, a short string or a table
{"columns": [...], "rows": [[...], ...]}, computed by posttrain's own functions (the algorithms,
the sampler, the trainer's logprobs, the weight sync, the memory planner), by a lesson widget at a
setting other than its default (registry.compute: the page then quotes exactly what the widget
shows), or read from a committed benchmark JSON. None trains a model; each runs in well under a
second on one core. Names carry their lesson number (rl03_…) and are unique across facts_a/b/c.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import torch

from posttrain import algorithms, memory
from posttrain.algorithms import core, dr_grpo, grpo, ppo, reinforce, rloo
from posttrain.lessons import registry

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
BANDIT = [0.1, 0.3, 0.9, 0.4, 0.2]          # the course's 5-armed bandit (lesson 01), arms A–E
ARMS = "ABCDE"


def kpi(widget: str, label: str, **knobs):
    """The KPI `label` of `widget` at `knobs` (other knobs at their defaults), as the page shows it."""
    out = registry.compute(widget, {k: registry.fmt(v) for k, v in knobs.items()})
    found = dict(out["kpis"])
    if label not in found:
        raise KeyError(f"widget {widget} has no KPI {label!r}; it has {list(found)}")
    return found[label]


def table(columns: list[str], rows: list[list]) -> dict:
    return {"columns": columns, "rows": rows}


def signed(xs) -> str:
    return ", ".join(f"{float(x):+.2f}" for x in xs)


@functools.lru_cache(maxsize=None)
def _json(name: str):
    return json.loads((RESULTS / name).read_text())


def _tiny_model(seed: int = 0):
    """A randomly initialised 2-layer gpt_mini (d = 32) and the built-in tokenizer: big enough to
    sample and score real sequences, small enough for a fact."""
    from posttrain.models.gpt_mini import ModelConfig, build_model
    from posttrain.models.tokenizer import CharTokenizer
    torch.manual_seed(seed)
    tok = CharTokenizer()
    model = build_model(ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=64), tok.vocab_size)
    return model, tok


# ---- 00 · orientation ---------------------------------------------------------------------------

def rl00_n_algorithms() -> int:
    return len(algorithms.ALGORITHMS)


def rl00_lineage_table() -> dict:
    """Advantages of one group (1, 0, 0, 0) under each algorithm's own defaults, and the extra
    models each one keeps in memory (memory.ROLES)."""
    from posttrain.lessons.widgets_lineage import LINEAGE, lineage_advantages
    adv = lineage_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64))
    rows = []
    for name in LINEAGE:
        roles = memory.ROLES[name]
        extra = [k for k in ("reference", "critic") if getattr(roles, k)]
        rows.append([name, signed(adv[name]), " + ".join(extra) or "none"])
    return table(["algorithm", "A for rewards (1, 0, 0, 0)", "models besides the policy"], rows)


# ---- 01 · the policy gradient on a bandit -----------------------------------------------------------

def _bandit_grad(theta: torch.Tensor, arm: int, reward: float) -> torch.Tensor:
    """∂/∂θ of REINFORCE's loss for one sampled arm (reinforce.loss, A = R, no baseline)."""
    theta = theta.clone().requires_grad_(True)
    lp = torch.log_softmax(theta, -1)[arm].view(1, 1)                    # [1, 1] log π(arm)
    cfg = reinforce.Config()
    adv = reinforce.advantages(torch.tensor([reward], dtype=torch.float64), torch.zeros(1, dtype=torch.long), cfg)
    mask = torch.ones(1, 1, dtype=torch.float64)
    loss, _ = reinforce.loss(lp, {"loss_mask": mask, "advantages": adv, "old_logprobs": lp.detach()}, cfg,
                             core.batch_norm(mask))
    (g,) = torch.autograd.grad(loss, theta)
    return g


def rl01_one_step() -> dict:
    """One update from the uniform policy after sampling C (reward 0.9), η = 0.4."""
    theta = torch.zeros(5, dtype=torch.float64)
    new = theta - 0.4 * _bandit_grad(theta, 2, BANDIT[2])
    pi0, pi1 = torch.softmax(theta, -1), torch.softmax(new, -1)
    rows = [[ARMS[i], f"{float(new[i]):+.3f}", f"{float(pi0[i]):.3f}", f"{float(pi1[i]):.3f}"] for i in range(5)]
    return table(["arm", "θ after", "π before", "π after"], rows)


def rl01_expected_grad() -> dict:
    """E_a~π[r(a)·∇log π(a)] at the uniform policy, summed exactly over the five arms."""
    theta = torch.zeros(5, dtype=torch.float64)
    pi = torch.softmax(theta, -1)
    ascent = -sum(float(pi[a]) * _bandit_grad(theta, a, BANDIT[a]) for a in range(5))   # −∇loss = ∇J
    return table(["arm", "reward r", "expected gradient on θ"],
                 [[ARMS[i], BANDIT[i], f"{float(ascent[i]):+.3f}"] for i in range(5)])


def rl01_mean_reward_uniform() -> float:
    return round(sum(BANDIT) / len(BANDIT), 3)


def rl01_break_wrong_share() -> float:
    return kpi("bandit", "seeds ending on a wrong arm", lr=2.0)


def rl01_slow_pi_c() -> float:
    return kpi("bandit", "mean max π", lr=0.05)


def rl01_slow_c_share() -> float:
    return kpi("bandit", "seeds ending on C (best)", lr=0.05)


# ---- 02 · rollout: behaviour logprobs -------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _rollout_batch(temperature: float = 0.7):
    """8 samples (2 prompts × 4) from the tiny model through Engine.generate, collated."""
    from posttrain.framework.batch import collate_samples
    from posttrain.framework.rollout import Engine, SamplingParams
    model, tok = _tiny_model()
    prompts = [tok.encode(tok.chat_prompt(q)) for q in ("3+4+5", "7+8")]
    samples = Engine(model, tok, max_slots=16).generate(
        prompts, 4, SamplingParams(temperature=temperature, max_new_tokens=12), seed=0)
    return model, collate_samples(samples, tok.pad_id)


def rl02_parity_max_abs() -> float:
    """max |behaviour logprob − trainer logprob| over the response tokens, same weights, same T."""
    from posttrain.framework.trainer import sequence_logprobs
    model, b = _rollout_batch()
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, b["input_ids"], 0.7)
    return float(((lp - b["old_logprobs"]).abs() * b["loss_mask"]).max())


def rl02_wrong_temperature_gap() -> float:
    """mean |difference| when the trainer scores at T = 1 what was sampled at T = 0.7."""
    from posttrain.framework.trainer import sequence_logprobs
    model, b = _rollout_batch()
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, b["input_ids"], 1.0)
    return round(float(core.masked_mean((lp - b["old_logprobs"]).abs(), b["loss_mask"])), 3)


def rl02_response_tokens() -> int:
    return int(_rollout_batch()[1]["loss_mask"].sum())


def rl02_stale_vs_recomputed() -> dict:
    """After one gradient step (plain SGD, lr 0.1) on a GRPO loss, the ratio against the
    recorded behaviour logprobs vs against logprobs recomputed with the new weights."""
    from posttrain.framework.trainer import sequence_logprobs
    model, b = _tiny_model()[0], dict(_rollout_batch()[1])
    b["rewards"] = torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 0])
    b["advantages"] = core.broadcast(grpo.advantages(b["rewards"], b["group_index"], grpo.Config()), b["loss_mask"])
    cfg, norm = grpo.Config(kl_coef=0.0), core.batch_norm(b["loss_mask"])
    lp, _ = sequence_logprobs(model, b["input_ids"], 0.7)
    loss, _ = grpo.loss(lp, b, cfg, norm)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    with torch.no_grad():
        for p, g in zip(model.parameters(), grads):
            p -= 0.1 * g
        new, _ = sequence_logprobs(model, b["input_ids"], 0.7)
    rows = []
    for name, old in (("recorded at sampling", b["old_logprobs"]), ("recomputed after the step", new * b["loss_mask"])):
        _, m = grpo.loss(new, {**b, "old_logprobs": old}, cfg, norm)
        rows.append([name, f"{float(m['ratio/mean']):.3f}", f"{float(m['ratio/max']):.3f}", f"{float(m['clip/frac']):.3f}"])
    return table(["old logprobs", "mean ratio", "max ratio", "clip/frac"], rows)


def rl02_degenerate_table() -> dict:
    """P(all K responses get the same reward) in the sampler widget, by temperature and K."""
    Ks = (2, 4, 8)
    rows = [[T, kpi("sampler", "P(response right) = p²", temperature=T)]
            + [kpi("sampler", "P(degenerate group), formula", temperature=T, K=k) for k in Ks]
            for T in (0.25, 0.5, 1.0, 1.5)]
    return table(["temperature", "P(response right)"] + [f"P(degenerate), K = {k}" for k in Ks], rows)


def rl02_degenerate_observed() -> dict:
    """claims.json: the SFT(CoT) model on 300 train prompts; observed vs predicted degenerate share."""
    d = _json("claims.json")["degenerate"]
    return table(["K", "observed", "Σ per prompt p^K + (1−p)^K", "at the mean p"],
                 [[r["K"], r["observed"], r["predicted_per_prompt"], r["predicted_mean_p"]] for r in d["rows"]])


def rl02_mean_p() -> float:
    return _json("claims.json")["degenerate"]["mean_p"]


def rl02_break_degenerate() -> float:
    return kpi("sampler", "P(degenerate group), formula", temperature=0.25, K=2)


# ---- 03 · reward and reference -------------------------------------------------------------------

PROBES = ["let me think 3+4=7, 7+5=12, so 12#", "12#", "let me think... 12#", "11#", "120#", "no digits here#",
          "12 is wrong, it is 13#"]


def rl03_probes() -> dict:
    from posttrain.tasks.arithmetic import last_integer, verify
    rows = []
    for p in PROBES:
        got = last_integer(p)
        rows.append([p, "none" if got is None else got, verify(p, 12)])
    return table(["response to <3+4+5>", "last integer", "reward (gold 12)"], rows)


def rl03_k_table() -> dict:
    """k1, k2, k3 of one token as functions of d = log π_ref − log π_θ (core.kl)."""
    ds = torch.tensor([-2.0, -0.5, 0.0, 0.5, 2.0], dtype=torch.float64)
    policy = torch.zeros_like(ds)
    est = {k: core.kl(policy, ds, k) for k in core.KL_ESTIMATORS}
    return table(["d = log π_ref − log π_θ", "k1", "k2", "k3"],
                 [[f"{float(d):+.1f}"] + [f"{float(est[k][i]):+.3f}" for k in core.KL_ESTIMATORS] for i, d in enumerate(ds)])


def rl03_swap_table() -> dict:
    """The kl widget at shift 1.0, 4096 samples, with the arguments in order and swapped."""
    rows = []
    for order in ("policy, ref", "ref, policy"):
        k = {lab: kpi("kl", lab, shift=1.0, samples=4096, order=order) for lab in ("exact KL", "k1 mean", "k3 mean")}
        rows.append([order, k["exact KL"], k["k1 mean"], k["k3 mean"]])
    return table(["arguments of kl()", "exact KL(π_θ‖π_ref)", "k1 mean", "k3 mean"], rows)


BETAS = (0.0, 0.001, 0.002, 0.005, 0.05, 0.2, 1.0)
HACK_THETA = 5.0        # the beta widget's reward function rises through its flaw only past θ = 5


def rl03_beta_table() -> dict:
    rows = []
    for b in BETAS:
        theta = kpi("beta", "final θ", beta=b)
        rows.append([b, theta, kpi("beta", "final reward", beta=b), kpi("beta", "final KL", beta=b),
                     "yes" if theta > HACK_THETA else "no"])
    return table(["β", "final θ", "final reward", "final KL = θ²", f"past the flaw (θ > {HACK_THETA:g})?"], rows)


def rl03_beta0_theta() -> float:
    return kpi("beta", "final θ", beta=0.0)


def rl03_beta1_theta() -> float:
    return kpi("beta", "final θ", beta=1.0)


def rl03_reference_frozen() -> dict:
    """Reference(policy) of the tiny model, then the policy's weights move: the policy's own
    logprobs change, the reference's do not (it is a frozen deep copy)."""
    from posttrain.framework.reference import Reference
    from posttrain.framework.trainer import score_logprobs
    _, b = _rollout_batch()
    policy = _tiny_model()[0]                                            # same weights as the sampler's
    ref = Reference(policy, temperature=0.7)
    pol0, ref0 = score_logprobs(policy, b, 0.7), ref.score(b)
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(1.05)                                                 # stands in for an optimizer step
    pol1, ref1 = score_logprobs(policy, b, 0.7), ref.score(b)
    n_train = sum(p.numel() for p in ref.model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in ref.model.parameters())
    return table(["reference parameters", "of them trainable", "largest change of the policy's logprobs",
                  "largest change of ref_logprobs"],
                 [[n_all, n_train, f"{float((pol1 - pol0).abs().max()):.3f}", f"{float((ref1 - ref0).abs().max()):.3f}"]])


# ---- 04 · the algorithm plug-in -----------------------------------------------------------------

def rl04_std_table() -> dict:
    """GRPO advantages of rewards (0, 0, 1) under the two std conventions (grpo.advantages)."""
    rw, g = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64), torch.zeros(3, dtype=torch.long)
    rows = []
    for std in core.STD_MODES:
        _, sd, _ = core.group_stats(rw, g, std)
        rows.append([std, f"{float(sd[0]):.3f}", signed(grpo.advantages(rw, g, grpo.Config(std=std)))])
    return table(["group std", "σ", "GRPO advantages"], rows)


def rl04_scale_table() -> dict:
    """Advantages of the same group with its rewards scaled by ¼: GRPO divides the scale away,
    the estimators without /std keep it (posttrain.algorithms' own advantages(), population std)."""
    g = torch.zeros(3, dtype=torch.long)
    rows = []
    for rw in ((0.0, 0.0, 1.0), (0.0, 0.0, 0.25)):
        r = torch.tensor(rw, dtype=torch.float64)
        rows.append([", ".join(f"{x:g}" for x in rw), signed(grpo.advantages(r, g, grpo.Config(std="population"))),
                     signed(rloo.advantages(r, g, rloo.Config())), signed(dr_grpo.advantages(r, g, dr_grpo.Config()))])
    return table(["rewards", "GRPO", "RLOO", "Dr. GRPO"], rows)


def rl04_defaults_table() -> dict:
    """Each registered algorithm's defaults as its Config() has them."""
    rows = []
    for name, mod in algorithms.ALGORITHMS.items():
        cfg = mod.Config()
        show = lambda x: "none" if x is None else f"{x:g}"
        clip = f"{show(cfg.eps_low)} / {show(cfg.eps_high)}" if hasattr(cfg, "eps_low") else "—"
        rows.append([name, getattr(cfg, "aggregation", "—"), f"{getattr(cfg, 'kl_coef', 0.0):g}",
                     "yes" if mod.needs_reference(cfg) else "no", clip])
    return table(["algorithm", "loss aggregation", "KL coefficient β", "reference loaded", "clip ε low / high"], rows)


# ---- 05 · the trainer --------------------------------------------------------------------------

def _toy_batch(lengths=(7, 2, 3, 1, 2, 2), width: int = 8, drift: float = 0.0,
               rewards=(1, 0, 1, 0, 0, 1), groups=(0, 0, 0, 1, 1, 1)) -> dict:
    """Responses of the given lengths (column 0 stands in for the prompt), random behaviour
    logprobs, GRPO advantages of `rewards` within `groups`; the trainer's logprobs are the
    sampler's + U(−drift, drift) (drift 0: ratio 1)."""
    g = torch.Generator().manual_seed(0)
    B = len(lengths)
    mask = torch.zeros(B, width, dtype=torch.float64)
    for i, n in enumerate(lengths):
        mask[i, 1:1 + n] = 1
    attn = mask.clone()
    attn[:, 0] = 1
    old = -torch.rand(B, width, generator=g, dtype=torch.float64) * 2 * mask
    lp = old + (torch.rand(B, width, generator=g, dtype=torch.float64) * 2 - 1) * drift * mask
    rw, gi = torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups)
    return {"input_ids": torch.zeros(B, width, dtype=torch.long), "attention_mask": attn, "loss_mask": mask,
            "old_logprobs": old, "logprobs": lp, "rewards": rw, "group_index": gi,
            "advantages": core.broadcast(grpo.advantages(rw, gi, grpo.Config()), mask)}


def rl05_microbatch_table() -> dict:
    """The loss of one batch vs the sum over its micro-batches (trainer.split_micro_batches, 16
    padded tokens each) with the batch's normaliser, vs the mean of micro-batches each normalised
    by its own tokens/sequences."""
    from posttrain.framework.trainer import split_micro_batches
    b = _toy_batch(drift=0.3)
    rows = []
    for mode in core.AGGREGATIONS:
        cfg = grpo.Config(kl_coef=0.0, aggregation=mode)
        whole, _ = grpo.loss(b["logprobs"], b, cfg, core.batch_norm(b["loss_mask"]))
        micro = split_micro_batches(b, 16)
        shared = sum(float(grpo.loss(m["logprobs"], m, cfg, core.batch_norm(b["loss_mask"], b["loss_mask"].shape[1]))[0])
                     for m in micro)
        alone = sum(float(grpo.loss(m["logprobs"], m, cfg, core.batch_norm(m["loss_mask"], b["loss_mask"].shape[1]))[0])
                    for m in micro) / len(micro)
        rows.append([mode, f"{float(whole):+.4f}", f"{shared:+.4f}", f"{alone:+.4f}"])
    return table(["aggregation", "whole batch", "Σ micro-batches, batch normaliser",
                  "mean of micro-batches, own normaliser"], rows)


def rl05_micro_rows() -> str:
    from posttrain.framework.trainer import split_micro_batches
    return "+".join(str(len(m["loss_mask"])) for m in split_micro_batches(_toy_batch(), 16))


def rl05_clip_equals_reinforce() -> float:
    """max |∇ GRPO clipped loss − ∇ REINFORCE loss| over the logprobs at ratio 1 (same aggregation)."""
    b = _toy_batch()
    norm = core.batch_norm(b["loss_mask"])
    grads = []
    for mod, cfg in ((grpo, grpo.Config(kl_coef=0.0, aggregation="token-mean")),
                     (reinforce, reinforce.Config(aggregation="token-mean"))):
        lp = b["logprobs"].clone().requires_grad_(True)
        loss, _ = mod.loss(lp, b, cfg, norm)
        grads.append(torch.autograd.grad(loss, lp)[0])
    return float((grads[0] - grads[1]).abs().max())


def rl05_optim_table() -> dict:
    from posttrain.config import RLConfig
    o = RLConfig().optim
    return table(["learning rate", "AdamW betas", "weight decay", "gradient-norm clip", "micro-batch (padded tokens)"],
                 [[f"{o.lr:g}", f"{o.betas[0]:g}, {o.betas[1]:g}", f"{o.weight_decay:g}", f"{o.grad_clip:g}",
                   o.micro_batch_tokens]])


def rl05_break_clipped() -> float:
    return kpi("loss_assembly", "clip/frac (gradient zeroed)", eps=0.05, drift=1.0)


def rl05_break_outside() -> float:
    return kpi("loss_assembly", "ρ outside [1−ε, 1+ε]", eps=0.05, drift=1.0)


# ---- 06 · weight sync --------------------------------------------------------------------------

def rl06_sync_table() -> dict:
    rows = [[n, kpi("sync", "steps outside the clip band", sync_every=n), kpi("sync", "final reward EMA", sync_every=n)]
            for n in (1, 2, 3, 5, 8, 10, 20, 40)]
    return table(["sync every N steps", "steps outside the clip band", "final reward EMA"], rows)


def rl06_separate_sync() -> dict:
    """WeightSync in `separate` mode on the tiny model: the sampler's copy before and after sync()."""
    from posttrain.framework.rollout import Engine
    from posttrain.framework.weight_sync import WeightSync
    model, tok = _tiny_model()
    engine = Engine(model, tok)
    sync = WeightSync(model, engine, mode="separate")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)                                                 # the trainer steps
    gap = lambda: max(float((a - b).detach().abs().max()) for a, b in zip(model.parameters(), engine.model.parameters()))
    before, v0 = gap(), engine.policy_version
    m = sync.sync()
    return table(["sampler is a copy", "largest weight gap before sync", "after sync", "bytes copied",
                  "policy_version before → after"],
                 [["yes" if engine.model is not model else "no", f"{before:.3f}", f"{gap():.3f}", int(m["sync/bytes"]),
                   f"{v0} → {engine.policy_version}"]])


def rl06_stale_runs() -> dict:
    """async_vs_sync.json, seed 0: the same GRPO run on fresh samples and on samples exactly 4
    versions old, with and without the importance correction."""
    names = {"sync": "synchronous (fresh)", "fixed4_none": "4 versions stale, no correction",
             "fixed4_tis": "4 versions stale, truncated IS"}
    rows = [[names[r["run"]], f"{r['pass@1_before']:.3f} → {r['pass@1_after']:.3f}", f"{r['mean ratio/max']:.2f}",
             f"{r['mean clip/frac']:.4f}"]
            for r in _json("async_vs_sync.json")["runs"] if r["seed"] == 0 and r["run"] in names]
    return table(["run (60 steps)", "held-out pass@1", "mean of max ratio", "mean clip/frac"], rows)


# ---- 07 · the controller -----------------------------------------------------------------------

def rl07_group_metrics() -> dict:
    """controller.group_rewards / group_metrics on four groups of three rewards."""
    from types import SimpleNamespace

    from posttrain.framework.controller import group_metrics, group_rewards
    groups = [[1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 1, 0]]
    samples = [SimpleNamespace(group=g, reward=float(r)) for g, rs in enumerate(groups) for r in rs]
    found = group_rewards(samples)
    m = group_metrics(found)
    rows = [[", ".join(str(r) for r in rs), "yes" if found[g][1] else "no"] for g, rs in enumerate(groups)]
    rows.append(["group/degenerate_frac", m["group/degenerate_frac"]])
    rows.append(["group/all_pass_frac, group/all_fail_frac", f"{m['group/all_pass_frac']}, {m['group/all_fail_frac']}"])
    return table(["rewards of the group", "degenerate?"], rows)


def rl07_keep_vs_skip() -> dict:
    """GRPO's gradient on the useful groups' tokens when two degenerate groups are kept in the batch
    (degenerate=keep) vs dropped (skip): kept, they add nothing but still count in the normaliser."""
    b = _toy_batch(lengths=(3, 5, 4, 2, 6, 3, 2, 4), rewards=(1, 0, 0, 1, 1, 1, 0, 0),   # groups 2, 3 degenerate
                   groups=(0, 0, 1, 1, 2, 2, 3, 3))
    useful = slice(0, 4)
    rows = []
    for mode in ("token-mean", "seq-mean-token-mean"):
        cfg = grpo.Config(kl_coef=0.0, aggregation=mode)
        norms = []
        for keep in (True, False):
            sub = b if keep else {k: v[useful] for k, v in b.items()}
            lp = sub["logprobs"].clone().requires_grad_(True)
            loss, _ = grpo.loss(lp, sub, cfg, core.batch_norm(sub["loss_mask"]))
            (grad,) = torch.autograd.grad(loss, lp)
            norms.append(float(grad[useful].norm()))
        rows.append([mode, f"{norms[0]:.4f}", f"{norms[1]:.4f}", f"{norms[0] / norms[1]:.3f}"])
    return table(["aggregation", "gradient norm, degenerate groups kept", "… skipped", "kept / skipped"], rows)


def rl07_step_example() -> dict:
    """Three answers to <3+4+5> through the verifier, grpo.advantages (population std) and
    collate_samples, as one controller step hands them on."""
    from posttrain.framework.batch import collate_samples
    from posttrain.framework.rollout import Sample
    from posttrain.models.tokenizer import CharTokenizer
    from posttrain.tasks.arithmetic import verify
    tok = CharTokenizer()
    prompt = tok.encode(tok.chat_prompt("3+4+5"))
    texts = ["12#", "11#", "14#"]
    samples = [Sample(prompt, tok.encode(t), [0.0] * len(t), [1] * len(t), "stop", 0, 0, i, reward=verify(t, 12))
               for i, t in enumerate(texts)]
    b = collate_samples(samples, tok.pad_id)
    adv = grpo.advantages(b["rewards"].double(), b["group_index"], grpo.Config(std="population"))
    rows = [[t, s.reward, f"{float(a):+.2f}"] for t, s, a in zip(texts, samples, adv)]
    rows.append(["batch input_ids shape", str(tuple(b["input_ids"].shape)), f"{int(b['loss_mask'].sum())} loss tokens"])
    return table(["response", "reward", "advantage"], rows)


def _grpo_length_run() -> dict:
    return next(r for r in _json("claims.json")["length"] if r["algorithm"] == "grpo")


def rl07_degenerate_first() -> float:
    return _grpo_length_run()["group/degenerate_frac_first10"]


def rl07_degenerate_last() -> float:
    return _grpo_length_run()["group/degenerate_frac_last10"]


# ---- 08 · agent episodes -----------------------------------------------------------------------

def rl08_mask_table() -> dict:
    """REINFORCE's loss on the lesson's episode (tool output in the middle) when the tool tokens'
    logprobs are changed to garbage, with the tool mask and without it."""
    from posttrain.framework.batch import collate
    from posttrain.lessons.widgets_loop import TURNS
    from posttrain.models.tokenizer import CharTokenizer
    tok = CharTokenizer()
    prompt = tok.encode(TURNS[0][1])
    response, is_tool = [], []
    for role, text in TURNS[1:]:
        ids = tok.encode(text)
        response += ids
        is_tool += [role == "tool"] * len(ids)
    tool = torch.zeros(len(prompt) + len(response), dtype=torch.bool)
    tool[len(prompt):] = torch.tensor(is_tool)
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(1, tool.numel(), generator=g, dtype=torch.float64)
    garbage = torch.where(tool, torch.full_like(lp, -50.0), lp)          # the tool tokens scored absurdly
    rows = []
    for masked in (True, False):
        rmask = [0 if (t and masked) else 1 for t in is_tool]
        b = collate([prompt], [response], tok.pad_id, response_masks=[rmask])
        mask = b["loss_mask"].double()
        b = {"loss_mask": mask, "advantages": torch.tensor([1.0], dtype=torch.float64), "old_logprobs": lp}
        cfg, norm = reinforce.Config(), core.batch_norm(mask)
        losses = [float(reinforce.loss(x, b, cfg, norm)[0]) for x in (lp, garbage)]
        x = lp.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(reinforce.loss(x, b, cfg, norm)[0], x)
        rows.append(["on" if masked else "off", int(mask.sum()), f"{losses[0]:.3f}", f"{losses[1]:.3f}",
                     f"{float(grad[0, tool].abs().max()):.1f}"])
    return table(["tool mask", "tokens in the loss", "loss", "loss, tool tokens rescored",
                  "largest gradient on a tool token"], rows)


def rl08_observation_text() -> str:
    from posttrain.framework.agent import observation_ids
    from posttrain.models.tokenizer import CharTokenizer
    tok = CharTokenizer()
    return tok.decode(observation_ids(tok, "1368"))


# ---- 09 · REINFORCE -----------------------------------------------------------------------------

def rl09_error_table() -> dict:
    rows = [[k, kpi("snr", "mean |ĝ − target|", K=k), kpi("snr", "σ/√K (σ of one rollout)", K=k)] for k in (1, 4, 16, 64)]
    return table(["K rollouts", "mean |ĝ − E[ĝ]|", "σ/√K"], rows)


def rl09_baseline_table() -> dict:
    """Mean and total variance of the one-sample gradient r(a)·∇log π(a) − b·∇log π(a) on the
    bandit at the uniform policy, enumerated exactly over the arms (reinforce.loss's gradient)."""
    theta = torch.zeros(5, dtype=torch.float64)
    pi = torch.softmax(theta, -1)
    mean_r = sum(float(pi[a]) * BANDIT[a] for a in range(5))
    rows = []
    for name, b in (("none (b = 0)", 0.0), (f"expected reward (b = {mean_r:.2f})", mean_r), ("b = 1", 1.0)):
        gs = torch.stack([-_bandit_grad(theta, a, BANDIT[a] - b) for a in range(5)])   # [5 arms, 5 params]
        mean = (pi[:, None] * gs).sum(0)
        var = float((pi[:, None] * (gs - mean) ** 2).sum())
        rows.append([name, signed(mean), f"{var:.4f}"])
    return table(["baseline", "mean gradient (arms A–E)", "variance (sum over θ)"], rows)


def rl09_variance_ratio() -> float:
    """Variance without a baseline ÷ variance with b = the expected reward (rl09_baseline_table)."""
    t = rl09_baseline_table()["rows"]
    return float(t[0][2]) / float(t[1][2])


def rl09_course_floor() -> float:
    """The snr widget's error against the course's fixed direction at K = 64: it no longer falls."""
    return kpi("snr", "mean |ĝ − target|", K=64, target="course")


def _algo_runs() -> list[dict]:
    return _json("algorithms.json")


def rl09_reinforce_runs() -> dict:
    rows = [[r["seed"], f"{r['pass@1_start']:.3f} → {r['pass@1_end']:.3f}", f"{r['reward_first10']:.3f} → {r['reward_last10']:.3f}"]
            for r in _algo_runs() if r["algorithm"] == "reinforce"]
    return table(["seed", "held-out pass@1 (50 steps)", "train reward, first → last 10 steps"], rows)


# ---- 10 · PPO ------------------------------------------------------------------------------------

def rl10_clip_table() -> dict:
    """The six cells of the clip, ε = 0.2: core.ppo_clip_loss and its gradient with respect to log π."""
    rows = []
    for rho in (0.7, 1.0, 1.4):
        for adv in (1.0, -1.0):
            lp = torch.tensor([math.log(rho)], dtype=torch.float64, requires_grad=True)
            loss, clipped = core.ppo_clip_loss(lp, torch.zeros(1, dtype=torch.float64),
                                               torch.tensor([adv], dtype=torch.float64), 0.2, 0.2)
            (g,) = torch.autograd.grad(loss.sum(), lp)
            rows.append([rho, f"{adv:+g}", f"{rho * adv:+.2f}", f"{min(max(rho, 0.8), 1.2) * adv:+.2f}",
                         f"{float(g[0]):+.2f}", "killed" if bool(clipped) else "flows"])
    return table(["ρ", "A", "ρA", "clip(ρ)·A", "∂loss/∂log π", "gradient"], rows)


def rl10_gae_table() -> dict:
    """ppo.gae on one 4-token response: reward 1 on the last token, critic V = 0.2, 0.4, 0.6, 0.8."""
    r = torch.tensor([[0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    v = torch.tensor([[0.2, 0.4, 0.6, 0.8]], dtype=torch.float64)
    m = torch.ones_like(r)
    rows = []
    for lam in (0.0, 0.95, 1.0):
        adv, _ = ppo.gae(r, v, m, gamma=1.0, lam=lam)
        rows.append([f"λ = {lam:g}", signed(adv[0])])
    return table(["GAE", "advantages of tokens 1–4"], rows)


def _reuse(eps: float, epochs: int, seeds: int = 1000, n: int = 16, lr: float = 2.0):
    """`epochs` full-batch steps of the clipped loss on ONE batch of n pulls of the bandit (Bernoulli
    rewards with the arms' means), from the uniform policy, for `seeds` batches at once."""
    g = torch.Generator().manual_seed(0)
    old = torch.log_softmax(torch.zeros(seeds, 5, dtype=torch.float64), -1)
    a = torch.multinomial(old.exp(), n, replacement=True, generator=g)              # [S, n]
    r = (torch.rand(seeds, n, generator=g, dtype=torch.float64) < torch.tensor(BANDIT, dtype=torch.float64)[a]).double()
    adv = r - r.mean(1, keepdim=True)                                               # [S, n] centred in the batch
    theta = torch.zeros(seeds, 5, dtype=torch.float64, requires_grad=True)
    for _ in range(epochs):
        loss, _ = core.ppo_clip_loss(torch.log_softmax(theta, -1).gather(1, a), old.gather(1, a), adv, eps, eps)
        (grad,) = torch.autograd.grad(loss.mean(1).sum(), theta)
        with torch.no_grad():
            theta -= lr * grad
    with torch.no_grad():
        lp = torch.log_softmax(theta, -1)
        kl = (lp.exp() * (lp - old)).sum(-1)                                        # KL(π_new ‖ π_old) [S]
        wrong = (lp.exp()[:, [0, 1, 3, 4]].max(-1).values > 0.5).double()           # > ½ on a wrong arm
    return float(kl.mean()), float(wrong.mean())


def rl10_reuse_table() -> dict:
    rows = []
    for e in (1, 4, 10, 30):
        c, u = _reuse(0.2, e), _reuse(1e9, e)
        rows.append([e, f"{c[0]:.3f}", f"{c[1]:.1%}", f"{u[0]:.3f}", f"{u[1]:.1%}"])
    return table(["epochs on one batch", "clip ε = 0.2: KL to π_old", "clip: seeds > ½ on a wrong arm",
                  "no clip: KL to π_old", "no clip: seeds > ½ on a wrong arm"], rows)


def _plan(algo: str) -> dict:
    return memory.plan("qwen2.5-7b", algo=algo, gpus=8, suggest=False)


def rl10_memory_table() -> dict:
    rows = []
    for algo in ("grpo", "ppo"):
        p = _plan(algo)
        comp = p["pools"]["colocated"]["components"]
        rows.append([algo, f"{comp.get('critic', 0.0) / 1e9:.1f}", f"{comp.get('reference', 0.0) / 1e9:.1f}",
                     f"{p['peak_bytes'] / 1e9:.1f}", "yes" if p["fits"] else "no"])
    return table(["algorithm", "critic, GB per GPU", "reference, GB per GPU", "peak, GB per GPU", "fits an 80 GB H100?"], rows)


def _clip_run() -> dict:
    return next(r for r in _json("claims.json")["clip"] if r["run"] == "clip_0.2")


def rl10_reuse_clip_frac() -> str:
    return f"{_clip_run()['clip_frac']:.2%}"


def rl10_onpolicy_clip_frac() -> float:
    """The largest clip fraction of any run in algorithms.json (one optimizer step per batch)."""
    return max(r["clip_frac"] for r in _algo_runs())


# ---- 11 · GRPO ---------------------------------------------------------------------------------

def rl11_patterns_table() -> dict:
    """GRPO advantages of a right and of a wrong answer in a group of 4 with c right answers."""
    rows = []
    for c in range(5):
        rw = torch.tensor([1.0] * c + [0.0] * (4 - c), dtype=torch.float64)
        g = torch.zeros(4, dtype=torch.long)
        row = [c]
        for std in ("population", "unbiased"):
            a = grpo.advantages(rw, g, grpo.Config(std=std))
            row += [f"{float(a[0]):+.3f}" if c else "—", f"{float(a[-1]):+.3f}" if c < 4 else "—"]
        rows.append(row)
    return table(["right answers of 4", "A right (population)", "A wrong (population)",
                  "A right (unbiased)", "A wrong (unbiased)"], rows)


def rl11_group_runs() -> dict:
    rows = []
    for r in _json("claims.json")["group"]:
        k = int(r["run"].split("_")[1])
        rows.append([f"{128 // k} × {k}", f"{r['group/degenerate_frac_first10']:.2f} → {r['group/degenerate_frac_last10']:.2f}",
                     f"{r['pass@1_start']:.3f} → {r['pass@1_end']:.3f}"])
    return table(["prompts × group size (128 samples a step)", "degenerate groups, first → last 10 steps",
                  "held-out pass@1 (100 steps)"], rows)


def rl11_memory_saving() -> str:
    grpo_peak, ppo_peak = _plan("grpo")["peak_bytes"], _plan("ppo")["peak_bytes"]
    return f"{1 - grpo_peak / ppo_peak:.0%}"


# ---- 12 · RLOO ---------------------------------------------------------------------------------

def rl12_scale_table() -> dict:
    rows = []
    for k in (2, 3, 4, 8, 16):
        rw = torch.tensor([1.0] + [0.0] * (k - 1), dtype=torch.float64)
        g = torch.zeros(k, dtype=torch.long)
        ratio = rloo.advantages(rw, g, rloo.Config())[0] / dr_grpo.advantages(rw, g, dr_grpo.Config())[0]
        rows.append([k, f"{float(ratio):.3f}", f"{k / (k - 1):.3f}"])
    return table(["K", "A_RLOO / (r − mean), measured", "K/(K−1)"], rows)


def rl12_bias_table() -> dict:
    """Monte-Carlo mean of the gradient on the bandit's logits at the uniform policy, 100,000 groups of
    K = 4 (Bernoulli rewards), with the group-mean baseline (r − mean) and leave-one-out (RLOO),
    against the exact gradient π_a(r_a − r̄)."""
    K, N = 4, 100_000
    g = torch.Generator().manual_seed(0)
    pi = torch.full((5,), 0.2, dtype=torch.float64)
    means = torch.tensor(BANDIT, dtype=torch.float64)
    a = torch.multinomial(pi, N * K, replacement=True, generator=g)                 # [N·K]
    r = (torch.rand(N * K, generator=g, dtype=torch.float64) < means[a]).double()
    gi = torch.arange(N).repeat_interleave(K)
    onehot = torch.nn.functional.one_hot(a, 5).double()                             # ∇_θ log π(a) = e_a − π
    score = onehot - pi
    exact = pi * (means - (pi * means).sum())
    rows = [["exact", signed(exact), "1.000"]]
    for name, adv in (("group mean (r − mean)", dr_grpo.advantages(r, gi, dr_grpo.Config())),
                      ("leave-one-out (RLOO)", rloo.advantages(r, gi, rloo.Config()))):
        est = (adv[:, None] * score).mean(0)
        rows.append([name, signed(est), f"{float(est @ exact / (exact @ exact)):.3f}"])
    return table(["baseline", "mean gradient (arms A–E)", "size relative to exact"], rows)


def rl12_runs_table() -> dict:
    """algorithms.json: the same SFT(CoT) start, 50 steps each, three seeds."""
    rows = []
    for name in ("reinforce", "rloo", "grpo", "dr_grpo", "ppo"):
        gains = [r["pass@1_end"] - r["pass@1_start"] for r in _algo_runs() if r["algorithm"] == name]
        rows.append([name, len(gains), f"{sum(gains) / len(gains):+.3f}", f"{min(gains):+.3f} … {max(gains):+.3f}"])
    return table(["algorithm", "seeds", "mean gain in pass@1", "range over seeds"], rows)


FACTS = {name: fn for name, fn in sorted(globals().items()) if name.startswith("rl") and name[2:4].isdigit()
         and callable(fn)}
