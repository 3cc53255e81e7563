"""Facts of lessons 09–12 (REINFORCE, PPO, GRPO, RLOO); see facts_a.py."""

from __future__ import annotations

import math

import torch

from posttrain.algorithms import core, dr_grpo, grpo, ppo, rloo
from posttrain.lessons.facts_a_tools import (
    BANDIT,
    algo_runs,
    at,
    bandit_grad,
    kpi,
    load_json,
    signed,
    table,
)
from posttrain.sizing import memory

# ---- 09 · REINFORCE -----------------------------------------------------------------------------

SNR_ERR, SNR_NONE, SNR_LOO = "mean |ĝ − target|", "none (REINFORCE)", "leave-one-out (RLOO)"


def rl09_error_table() -> dict:
    """The snr widget's mean error against E[ĝ] by K, without a baseline and with leave-one-out."""
    base = kpi("snr", SNR_ERR, K=1)
    rows = []
    for k in (1, 4, 16):
        rows.append(
            [
                k,
                kpi("snr", SNR_ERR, K=k, baseline=SNR_NONE),
                f"{base / k**0.5:.3f}",
                kpi("snr", "estimates that are exactly 0", K=k, baseline=SNR_NONE),
                "— (no others)" if k == 1 else kpi("snr", SNR_ERR, K=k, baseline=SNR_LOO),
            ]
        )
    return table(
        [
            "K rollouts",
            "no baseline: mean |ĝ − E[ĝ]|",
            "K = 1 error ÷ √K",
            "no baseline: estimates = 0",
            "leave-one-out: mean |ĝ − E[ĝ]|",
        ],
        rows,
    )


def rl09_baseline_table() -> dict:
    """Mean and total variance of the one-sample gradient r(a)·∇log π(a) − b·∇log π(a) on the
    bandit at the uniform policy, enumerated exactly over the arms (reinforce.loss's gradient)."""
    theta = torch.zeros(5, dtype=torch.float64)
    pi = torch.softmax(theta, -1)
    mean_r = sum(float(pi[a]) * BANDIT[a] for a in range(5))
    rows = []
    for name, b in (("none (b = 0)", 0.0), (f"expected reward (b = {mean_r:.2f})", mean_r), ("b = 1", 1.0)):
        gs = torch.stack([-bandit_grad(theta, a, BANDIT[a] - b) for a in range(5)])  # [5 arms, 5 params]
        mean = (pi[:, None] * gs).sum(0)
        var = float((pi[:, None] * (gs - mean) ** 2).sum())
        rows.append([name, signed(mean), f"{var:.4f}"])
    return table(["baseline", "mean gradient (arms A–E)", "variance (sum over θ)"], rows)


def rl09_variance_ratio() -> float:
    """Variance without a baseline ÷ variance with b = the expected reward (rl09_baseline_table)."""
    t = rl09_baseline_table()["rows"]
    return float(t[0][2]) / float(t[1][2])


def rl09_reinforce_runs() -> dict:
    rows = [
        [
            r["seed"],
            f"{r['pass@1_start']:.3f} → {r['pass@1_end']:.3f}",
            f"{r['reward_first10']:.3f} → {r['reward_last10']:.3f}",
            f"{r['entropy']:.3f}",
        ]
        for r in algo_runs()
        if r["algorithm"] == "reinforce"
    ]
    return table(
        ["seed", "held-out pass@1 (50 steps)", "train reward, first → last 10 steps", "entropy (mean over the run)"],
        rows,
    )


# ---- 10 · PPO ------------------------------------------------------------------------------------


def rl10_clip_table() -> dict:
    """The six cells of the clip, ε = 0.2: core.ppo_clip_loss and its gradient with respect to log π."""
    rows = []
    for rho in (0.7, 1.0, 1.4):
        for adv in (1.0, -1.0):
            lp = torch.tensor([math.log(rho)], dtype=torch.float64, requires_grad=True)
            loss, clipped = core.ppo_clip_loss(
                lp, torch.zeros(1, dtype=torch.float64), torch.tensor([adv], dtype=torch.float64), 0.2, 0.2
            )
            (g,) = torch.autograd.grad(loss.sum(), lp)
            rows.append(
                [
                    rho,
                    f"{adv:+g}",
                    f"{rho * adv:+.2f}",
                    f"{min(max(rho, 0.8), 1.2) * adv:+.2f}",
                    f"{float(g[0]):+.2f}",
                    "killed" if bool(clipped) else "flows",
                ]
            )
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
    a = torch.multinomial(old.exp(), n, replacement=True, generator=g)  # [S, n]
    r = (torch.rand(seeds, n, generator=g, dtype=torch.float64) < torch.tensor(BANDIT, dtype=torch.float64)[a]).double()
    adv = r - r.mean(1, keepdim=True)  # [S, n] centred in the batch
    theta = torch.zeros(seeds, 5, dtype=torch.float64, requires_grad=True)
    for _ in range(epochs):
        loss, _ = core.ppo_clip_loss(torch.log_softmax(theta, -1).gather(1, a), old.gather(1, a), adv, eps, eps)
        (grad,) = torch.autograd.grad(loss.mean(1).sum(), theta)
        with torch.no_grad():
            theta -= lr * grad
    with torch.no_grad():
        lp = torch.log_softmax(theta, -1)
        kl = (lp.exp() * (lp - old)).sum(-1)  # KL(π_new ‖ π_old) [S]
        wrong = (lp.exp()[:, [0, 1, 3, 4]].max(-1).values > 0.5).double()  # > ½ on a wrong arm
    return float(kl.mean()), float(wrong.mean())


def rl10_reuse_table() -> dict:
    rows = []
    for e in (1, 4, 10, 30):
        c, u = _reuse(0.2, e), _reuse(1e9, e)
        rows.append([e, f"{c[0]:.3f}", f"{c[1]:.1%}", f"{u[0]:.3f}", f"{u[1]:.1%}"])
    return table(
        [
            "epochs on one batch",
            "clip ε = 0.2: KL to π_old",
            "clip: seeds > ½ on a wrong arm",
            "no clip: KL to π_old",
            "no clip: seeds > ½ on a wrong arm",
        ],
        rows,
    )


def rl10_eps_table() -> dict:
    """The clip widget's 8 epochs over one batch, by ε (its KPIs at each ε)."""
    labels = ("tokens with a gradient, epoch 3", "reward gained over the epochs", "KL(π ‖ π_old) after the epochs")
    return table(
        ["clip ε"] + list(labels), [[e] + [kpi("clip", lab, eps=e) for lab in labels] for e in (0.05, 0.1, 0.2, 0.3)]
    )


def rl10_noclip_wrong() -> str:
    """Share of the bandit batches that end > ½ on a wrong arm after 30 unclipped epochs."""
    return rl10_reuse_table()["rows"][-1][4]


def _plan(algo: str) -> dict:
    return memory.plan("qwen2.5-7b", algo=algo, gpus=8, suggest=False)


def rl10_memory_table() -> dict:
    rows = []
    for algo in ("grpo", "ppo"):
        p = _plan(algo)
        comp = p["pools"]["colocated"]["components"]
        rows.append(
            [
                algo,
                f"{comp.get('critic', 0.0) / 1e9:.1f}",
                f"{comp.get('reference', 0.0) / 1e9:.1f}",
                f"{p['peak_bytes'] / 1e9:.1f}",
                "yes" if p["fits"] else "no",
            ]
        )
    return table(
        ["algorithm", "critic, GB per GPU", "reference, GB per GPU", "peak, GB per GPU", "fits an 80 GB H100?"], rows
    )


def _clip_run() -> dict:
    return next(r for r in load_json("claims.json")["clip"] if r["run"] == "clip_0.2")


def rl10_reuse_clip_frac() -> str:
    return f"{_clip_run()['clip_frac']:.2%}"


def rl10_onpolicy_clip_frac() -> float:
    """The largest clip fraction of any run in algorithms.json (one optimizer step per batch)."""
    return max(r["clip_frac"] for r in algo_runs())


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
    return table(
        [
            "right answers of 4",
            "A right (population)",
            "A wrong (population)",
            "A right (unbiased)",
            "A wrong (unbiased)",
        ],
        rows,
    )


def rl11_group_runs() -> dict:
    rows = []
    for r in load_json("claims.json")["group"]:
        k = int(r["run"].split("_")[1])
        rows.append(
            [
                f"{128 // k} × {k}",
                f"{r['group/degenerate_frac_first10']:.2f} → {r['group/degenerate_frac_last10']:.2f}",
                f"{r['pass@1_start']:.3f} → {r['pass@1_end']:.3f}",
            ]
        )
    return table(
        [
            "prompts × group size (128 samples a step)",
            "degenerate groups, first → last 10 steps",
            "held-out pass@1 (100 steps)",
        ],
        rows,
    )


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
    a = torch.multinomial(pi, N * K, replacement=True, generator=g)  # [N·K]
    r = (torch.rand(N * K, generator=g, dtype=torch.float64) < means[a]).double()
    gi = torch.arange(N).repeat_interleave(K)
    onehot = torch.nn.functional.one_hot(a, 5).double()  # ∇_θ log π(a) = e_a − π
    score = onehot - pi
    exact = pi * (means - (pi * means).sum())
    rows = [["exact", signed(exact), "1.000"]]
    for name, adv in (
        ("group mean (r − mean)", dr_grpo.advantages(r, gi, dr_grpo.Config())),
        ("leave-one-out (RLOO)", rloo.advantages(r, gi, rloo.Config())),
    ):
        est = (adv[:, None] * score).mean(0)
        rows.append([name, signed(est), f"{float(est @ exact / (exact @ exact)):.3f}"])
    return table(["baseline", "mean gradient (arms A–E)", "size relative to exact"], rows)


def rl12_runs_table() -> dict:
    """algorithms.json: the same SFT(CoT) start, 50 steps each, three seeds."""
    rows = []
    for name in ("reinforce", "rloo", "grpo", "dr_grpo", "ppo"):
        gains = [r["pass@1_end"] - r["pass@1_start"] for r in algo_runs() if r["algorithm"] == name]
        rows.append([name, len(gains), f"{sum(gains) / len(gains):+.3f}", f"{min(gains):+.3f} … {max(gains):+.3f}"])
    return table(["algorithm", "seeds", "mean gain in pass@1", "range over seeds"], rows)


# ---- practitioner checks: GAE over a long answer, k3's gradient, AdamW and a reward scale ------------


def _first_token_weight(lam: float, length: int) -> float:
    """ppo.gae on one response of `length` tokens, reward 1 on the last, a critic that predicts
    0 everywhere, γ = 1: the first token's advantage, i.e. the weight the terminal reward keeps."""
    r = torch.zeros(1, length, dtype=torch.float64)
    r[0, -1] = 1.0
    adv, _ = ppo.gae(r, torch.zeros_like(r), torch.ones_like(r), 1.0, lam)  # [1, T]
    return float(adv[0, 0])


def rl10_lam095_100() -> str:
    return f"{_first_token_weight(0.95, 101):.3f}"  # 100 tokens before the reward


def rl10_lam095_1000() -> str:
    return f"{_first_token_weight(0.95, 1001):.0e}"  # 1,000 tokens before the reward


def _k3_gradients() -> dict:
    """The expected gradient of β·k3 used as a loss (samples y ~ π_θ not differentiated), computed
    exactly on a 5-way categorical with core.kl, against the gradients of both KL directions."""
    g = torch.Generator().manual_seed(0)
    theta = (0.5 * torch.randn(5, generator=g, dtype=torch.float64)).requires_grad_(True)
    ref = torch.log_softmax(0.5 * torch.randn(5, generator=g, dtype=torch.float64), -1)  # k3 under its cap
    logp = torch.log_softmax(theta, -1)
    p = logp.exp()
    grads = {}
    for name, value in (
        ("k3 in the loss", (p.detach() * core.kl(logp, ref, "k3")).sum()),  # E_{y~π}[k3(y)], y fixed
        ("reverse KL(π‖π_ref)", (p * (logp - ref)).sum()),
        ("forward KL(π_ref‖π)", (ref.exp() * (ref - logp)).sum()),
    ):
        (grads[name],) = torch.autograd.grad(value, theta, retain_graph=True)
    return grads


def rl11_k3_grad_vs_forward() -> str:
    g = _k3_gradients()
    return f"{float((g['k3 in the loss'] - g['forward KL(π_ref‖π)']).abs().max()):.0e}"


def rl11_k3_grad_vs_reverse() -> str:
    g = _k3_gradients()
    return f"{float((g['k3 in the loss'] - g['reverse KL(π‖π_ref)']).abs().max()):.2f}"


def rl11_k3_grad_norm() -> str:
    return f"{float(_k3_gradients()['k3 in the loss'].norm()):.2f}"


def _adamw_displacement(scale: float, sgd: bool = False) -> torch.Tensor:
    """Ten optimizer steps on 1,000 weights fed the same random gradients times `scale`: AdamW with
    posttrain's defaults (framework/trainer.py; config.OptimConfig betas) or plain SGD at lr 1e-3."""
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(1000, generator=g) * 1e-2 for _ in range(10)]
    w = torch.zeros(1000, requires_grad=True)
    opt = torch.optim.SGD([w], lr=1e-3) if sgd else torch.optim.AdamW([w], lr=1e-3, betas=(0.9, 0.95))
    for gr in grads:
        w.grad = gr * scale
        opt.step()
    return w.detach().clone()  # [1000]


def rl12_adam_scale_ratio() -> str:
    """|Δw| with the gradient ×10 over |Δw| without: AdamW's update is scale-free up to its ε."""
    return f"{float(_adamw_displacement(10.0).norm() / _adamw_displacement(1.0).norm()):.4f}"


def rl12_sgd_scale_ratio() -> str:
    return f"{float(_adamw_displacement(10.0, sgd=True).norm() / _adamw_displacement(1.0, sgd=True).norm()):.1f}"


# ---- one KPI of a widget at another setting ------------------------------------------------------

AT = {
    "rl09_k1_zero": at("snr", "estimates that are exactly 0", K=1),
    "rl09_k1_error": at("snr", SNR_ERR, K=1),
    "rl09_course_floor": at("snr", "mean |ĝ − target|", K=64, target="course"),
    "rl10_tight_tokens": at("clip", "tokens with a gradient, epoch 3", eps=0.05),
}


FACTS = {
    name: fn for name, fn in sorted(globals().items()) if name.startswith("rl") and name[2:4].isdigit() and callable(fn)
} | AT
