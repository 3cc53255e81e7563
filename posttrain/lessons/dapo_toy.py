"""The DAPO ablation toy (lesson 13): a tabular policy trained by posttrain's own dapo.advantages
and dapo.loss, once for each of the 16 settings of DAPO's four switches.

The task. Prompt p has a gold answer g_p ∈ {0, 1, 2} and a difficulty n_p ∈ {0..5}. A response is
a run of THINK tokens ended by one answer token; it is right when the answer is g_p AND it
thought at least n_p tokens first. A response that reaches MAX_LEN tokens without answering is
truncated (reward 0). Hard prompts need long responses, so length, truncation and the length
normaliser all matter, as in reasoning RL.

The policy. A table of logits θ[p, t, v] (prompt × position × {THINK, a0, a1, a2}); at the start
P(THINK) = ½ everywhere. Its exact accuracy over all prompts is computed from the table (no
sampling), so the curves carry no evaluation noise.

The loop, as posttrain's controller runs it: sample PROMPTS prompts × K responses recording the
behaviour logprobs, score, advantages (dapo.advantages), then EPOCHS × MINIBATCHES clipped
updates (dapo.loss, Adam) on shuffled minibatches of the same samples, so the ratio leaves 1
and the clip matters. The switches:

  ① clip-higher      eps_high 0.28 instead of 0.2
  ② dynamic sampling  draw up to REFILLS extra rounds of prompts and keep only groups with mixed
                      rewards until the batch is full (the controller's degenerate=resample);
                      off: all-equal groups stay in the batch with A = 0
  ③ token-level loss  aggregation token-mean instead of GRPO's seq-mean-token-mean
  ④ overlong shaping  overlong_buffer BUFFER before MAX_LEN (dapo.overlong_penalty)

Each run is ~1 s on one CPU thread; runs.py records all 16 settings (3 seeds each, ~30 s) in
data/runs.json.
"""

from __future__ import annotations

import itertools

import torch

from posttrain.algorithms import core, dapo
from posttrain.framework.batch import RolloutBatch

N_PROMPTS, MAX_LEN, V, THINK = 48, 12, 4, 0
PROMPTS, K, MINIBATCHES, EPOCHS, REFILLS, BUFFER = 8, 4, 4, 2, 3, 3
STEPS, EVERY, LR, SEEDS = 150, 5, 0.1, 3
SWITCHES = ("clip_higher", "dynamic_sampling", "token_mean", "overlong")


def task():
    p = torch.arange(N_PROMPTS)
    return p % 3, p % 8  # gold [P], need [P]


def config(clip_higher: bool, dynamic_sampling: bool, token_mean: bool, overlong: bool) -> dapo.Config:
    """dapo.Config with the four switches set; everything else DAPO's defaults (no KL)."""
    return dapo.Config(
        eps_high=0.28 if clip_higher else 0.2,
        dynamic_sampling=dynamic_sampling,
        aggregation="token-mean" if token_mean else "seq-mean-token-mean",
        overlong_buffer=BUFFER if overlong else 0,
        max_len=MAX_LEN,
        std="population",
    )


def accuracy(theta: torch.Tensor, gold: torch.Tensor, need: torch.Tensor) -> float:
    """Exact P(right) averaged over prompts: Σ_{n ≥ need} P(n THINKs, then g) for n < MAX_LEN."""
    p = torch.softmax(theta, -1)  # [P, L, V]
    alive = torch.cumprod(torch.cat([torch.ones(N_PROMPTS, 1, dtype=p.dtype), p[:, :-1, THINK]], 1), 1)  # [P, L]
    answer = p[torch.arange(N_PROMPTS), :, 1 + gold]  # [P, L]  P(answer g at t)
    ok = torch.arange(MAX_LEN).unsqueeze(0) >= need.unsqueeze(1)  # [P, L]
    return float((alive * answer * ok).sum(1).mean())


def entropy(theta: torch.Tensor) -> float:
    """Token entropy (core.entropy_from_logits) averaged over the positions a response reaches,
    each weighted by the probability of reaching it: the entropy of the tokens sampled."""
    p = torch.softmax(theta, -1)
    alive = torch.cumprod(torch.cat([torch.ones(N_PROMPTS, 1, dtype=p.dtype), p[:, :-1, THINK]], 1), 1)  # [P, L]
    return float((core.entropy_from_logits(theta) * alive).sum() / alive.sum())


def rollout(theta, prompts, gen):
    """K responses per prompt: tokens [B, L], loss_mask [B, L], behaviour logprobs [B, L]."""
    B = len(prompts) * K
    pid = prompts.repeat_interleave(K)  # [B]
    logp = torch.log_softmax(theta[pid], -1)  # [B, L, V]
    toks = torch.multinomial(logp.exp().view(-1, V), 1, generator=gen).view(B, MAX_LEN)
    stop = (toks != THINK).long()
    first = torch.where(stop.any(1), stop.argmax(1), torch.full((B,), MAX_LEN))  # index of the answer
    mask = (torch.arange(MAX_LEN).unsqueeze(0) <= first.unsqueeze(1)).double()  # [B, L]
    old = logp.gather(-1, toks.unsqueeze(-1)).squeeze(-1) * mask
    return pid, toks, mask, old, first


def score(pid, toks, first, gold, need):
    ans = toks.gather(1, first.clamp(max=MAX_LEN - 1).unsqueeze(1)).squeeze(1) - 1
    right = (first < MAX_LEN) & (ans == gold[pid]) & (first >= need[pid])
    return right.double(), first == MAX_LEN  # reward [B], truncated [B]


def run(
    clip_higher: bool,
    dynamic_sampling: bool,
    token_mean: bool,
    overlong: bool,
    seed: int = 0,
    steps: int = STEPS,
    staleness: int = 0,
    correction: str = "none",
) -> dict:
    """One training run. staleness Δ > 0 samples every step from the weights of Δ updates ago
    (an async sampler at fixed staleness: distributed/async_rollout's `stale: fixed`); the
    behaviour logprobs are then those of the old weights, and `correction` is the trainer's
    off-policy correction (framework/off_policy.correct_off_policy): none = the PPO ratio is taken
    against the sampler's logprobs, so the clip absorbs the drift; tis/mask = the ratio against
    the current weights and the advantages reweighted by core.off_policy_weights (cap 2)."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    gold, need = task()
    cfg = config(clip_higher, dynamic_sampling, token_mean, overlong)
    theta = torch.zeros(N_PROMPTS, MAX_LEN, V, dtype=torch.float64)
    theta[..., THINK] = torch.log(torch.tensor(3.0))  # P(THINK) = ½ at the start
    theta.requires_grad_(True)
    opt = torch.optim.Adam([theta], lr=LR)
    out = {k: [] for k in ("step", "acc", "reward", "entropy", "useful", "samples", "length", "truncated", "clip")}
    samples, history = 0, [theta.detach().clone()]  # history[-1]: the current weights
    for step in range(1, steps + 1):
        with torch.no_grad():
            sampler = history[max(0, len(history) - 1 - staleness)]  # Δ versions behind the trainer
            prompts = torch.randint(0, N_PROMPTS, (PROMPTS,), generator=gen)
            pid, toks, mask, old, first = rollout(sampler, prompts, gen)
            rew, trunc = score(pid, toks, first, gold, need)
            samples += len(pid)
            fair_reward, fair_len, fair_trunc = (
                float(rew.mean()),
                float(mask.sum(1).mean()),
                float(trunc.double().mean()),
            )
            if dynamic_sampling:  # refill with mixed groups only
                keep = ~dapo.degenerate(rew, torch.arange(len(pid)) // K)
                parts = [(t[keep] for t in (pid, toks, mask, old, first, rew))]
                have = int(keep.sum()) // K
                for _ in range(REFILLS):
                    if have >= PROMPTS:
                        break
                    extra = torch.randint(0, N_PROMPTS, (PROMPTS,), generator=gen)
                    e_pid, e_toks, e_mask, e_old, e_first = rollout(sampler, extra, gen)
                    e_rew, _ = score(e_pid, e_toks, e_first, gold, need)
                    samples += len(e_pid)
                    e_keep = ~dapo.degenerate(e_rew, torch.arange(len(e_pid)) // K)
                    take = min(int(e_keep.sum()) // K, PROMPTS - have)
                    idx = e_keep.nonzero().squeeze(1)[: take * K]
                    parts.append(t[idx] for t in (e_pid, e_toks, e_mask, e_old, e_first, e_rew))
                    have += take
                cols = list(zip(*[tuple(p) for p in parts]))
                pid, toks, mask, old, first, rew = (torch.cat(c) for c in cols)
            group = torch.arange(len(pid)) // K  # [B] one index per group
            adv = core.broadcast(dapo.advantages(rew, group, cfg, batch=RolloutBatch(loss_mask=mask)), mask)  # [B, L]
            useful = float((~dapo.degenerate(rew, group)).sum()) / K / PROMPTS  # signal groups / batch size
            if correction != "none":  # framework/off_policy's correct_off_policy
                prox = torch.log_softmax(theta[pid], -1).gather(-1, toks.unsqueeze(-1)).squeeze(-1) * mask
                w, _ = core.off_policy_weights(prox, old, mask, correction, 2.0)
                old, adv = prox, adv * w
        clip = []
        order = torch.cat([torch.randperm(len(pid), generator=gen) for _ in range(EPOCHS)])
        for mb in order.chunk(MINIBATCHES * EPOCHS):
            logp = torch.log_softmax(theta[pid[mb]], -1)  # [b, L, V]
            lp = logp.gather(-1, toks[mb].unsqueeze(-1)).squeeze(-1) * mask[mb]
            batch = RolloutBatch(loss_mask=mask[mb], old_logprobs=old[mb], advantages=adv[mb])
            loss, m = dapo.loss(lp, batch, cfg, core.batch_norm(mask[mb]))
            (g,) = torch.autograd.grad(loss, theta)
            theta.grad = g
            opt.step()
            clip.append(float(m["clip/frac"]))
        history.append(theta.detach().clone())
        del history[: -(staleness + 1)]  # keep Δ + 1 versions
        if step % EVERY == 0:
            with torch.no_grad():
                ent = entropy(theta.detach())
            out["step"].append(step)
            out["acc"].append(round(accuracy(theta.detach(), gold, need), 4))
            out["reward"].append(round(fair_reward, 4))
            out["entropy"].append(round(ent, 4))
            out["useful"].append(round(useful, 4))
            out["samples"].append(samples)
            out["length"].append(round(fair_len, 3))
            out["truncated"].append(round(fair_trunc, 4))
            out["clip"].append(round(sum(clip) / len(clip), 4) if clip else 0.0)  # empty: nothing to refill
    return out


def key(clip_higher: bool, dynamic_sampling: bool, token_mean: bool, overlong: bool) -> str:
    return "dapo " + " ".join(
        f"{n}={int(v)}" for n, v in zip(SWITCHES, (clip_higher, dynamic_sampling, token_mean, overlong))
    )


def averaged(switches: tuple, seeds: int = SEEDS, steps: int = STEPS, **kw) -> dict:
    """The run's curves averaged over `seeds` seeds (one seed is too noisy to compare settings)."""
    runs = [run(*switches, seed=s, steps=steps, **kw) for s in range(seeds)]
    out = {"step": runs[0]["step"]}
    for k in runs[0]:
        if k != "step":
            out[k] = [round(sum(r[k][i] for r in runs) / seeds, 4) for i in range(len(out["step"]))]
    return out


def all_runs() -> dict:
    torch.set_num_threads(1)
    return {key(*s): averaged(s) for s in itertools.product((False, True), repeat=4)}


STALENESS, CORRECTIONS = (0, 1, 2, 4, 8, 16, 32), ("none", "tis")


def stale_key(staleness: int, correction: str) -> str:
    return f"stale delta={staleness} correction={correction}"


def stale_runs() -> dict:
    """All four DAPO switches on, the sampler Δ versions behind, with and without the correction."""
    torch.set_num_threads(1)
    return {
        stale_key(d, c): averaged((True, True, True, True), staleness=d, correction=c)
        for d in STALENESS
        for c in CORRECTIONS
    }
