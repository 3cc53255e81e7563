"""Role 6, the controller: one RL step as numbered calls to the other roles.

    ❶ rollout     engine.generate(prompts, n)            samples with behaviour logprobs
    ❷ reward      score_samples(task, samples)           verifier per sample, errors counted
    ❸ groups      degenerate groups kept / skipped / resampled (config `degenerate`)
    ❹ collate     collate_samples(samples)               padded RolloutBatch (framework/batch.py)
    ❺ reference   reference.score(batch)                 ref_logprobs (only when needed)
       critic      critic_values(trainer.model, batch)    V_old, before ❻ (only with a critic: PPO)
    ❻ advantages  algorithm.advantages(rewards, groups)  (+ algorithm.value_targets with a critic)
       correction  correct_off_policy(model, batch)      IS weights π_prox/μ (async, vLLM: on by default)
    ❼ train       trainer.step(batch, loss_fn)           epochs × minibatches of optimizer steps
    ❽ sync        weight_sync.sync()                     the sampler gets the new weights
    ❾ metrics     one flat dict, with a timer per role

The controller never touches parameters, logits or rewards itself: each line hands data
from one role to the next, each role's output a field of a new batch (`dataclasses.replace`). The step loop around it (resume, eval, checkpoints, logs) is
framework/loop.py. In async mode (distributed/async_rollout.py) ❶–❸ run on a producer that
works ahead of the trainer by at most `max_staleness` versions, and ❽ publishes a version
that the producer loads between two requests; the step reads the same.

With N ranks (framework/world.py) each rank's controller runs the same step on its own share: ❶ samples
the rank's contiguous block of the step's prompt groups (prompt ids global, so every sample is the one a
1-rank run draws), ❷ scores them, ❸–❼ on its own rows; the metrics, the degenerate-group decision and the
whitening statistics are collectives over every rank's records (`_step_records`, `core.across`).
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager

import numpy as np
import torch

from posttrain.algorithms.core import across, broadcast
from posttrain.framework.agent import Episode, episode_metrics, run_episodes
from posttrain.framework.batch import budgets, collate_samples, to_device
from posttrain.framework.card import phase
from posttrain.framework.critic import critic_values, needs_critic
from posttrain.framework.off_policy import correct_off_policy
from posttrain.framework.rollout import SamplingParams
from posttrain.framework.sample import Sample
from posttrain.framework.trainer import policy_loss_fn
from posttrain.framework.world import current
from posttrain.sizing.throughput import max_of_k
from posttrain.tasks.base import MultiTurnTask, component_means, score_samples
from posttrain.tasks.pool import make_pool, verifier_args


class Controller:
    def __init__(self, cfg, task, tokenizer, engine, reference, algorithm, algo_cfg, trainer, sync, source=None):
        self.cfg, self.task, self.tok = cfg, task, tokenizer
        self.engine, self.reference, self.trainer, self.sync = engine, reference, trainer, sync
        self.algorithm, self.algo_cfg = algorithm, algo_cfg
        r = cfg.rollout
        stops = tuple(r.stop_token_ids)  # rollout.stop_token_ids: besides the end-of-turn
        self.sampling = SamplingParams(temperature=r.temperature, max_new_tokens=r.max_new_tokens, stop_ids=stops)
        self.loss_fn = policy_loss_fn(algorithm, algo_cfg, cfg.rollout.temperature)
        self.timers: dict[str, float] = {}
        self.source = source  # None: collect inline (sync); else .get(step) -> (samples, metrics)
        # auto: on where the sampler is not the trainer's exact policy (stale async samples, vLLM's kernels)
        auto = "tis" if cfg.scale.async_ or cfg.rollout.backend == "vllm" else "none"
        self.correction = auto if cfg.scale.off_policy_correction == "auto" else cfg.scale.off_policy_correction
        self.last_samples: list = []
        self.on_batch = None  # optional hook(step, samples, batch) before ❼: the audit trace
        self.pool = make_pool(task, *verifier_args(cfg))  # None = in-process
        self.world = current()  # this rank among the run's (one in a plain process)

    def score_tokens(self) -> int:
        """The micro-batch budget of the trainer's model without gradient (PPO's V_old, the off-policy
        correction): optim.micro_batch_tokens as framework/batch.budgets reads it."""
        return budgets(self.trainer.cfg.micro_batch_tokens, getattr(self.trainer, "runtime", None)).score

    def timer(self, name: str):
        return timed(self.timers, name)

    def step(self, step: int) -> dict:
        cfg, self.timers = self.cfg, {}
        # ❶ ❷ ❸ inline, or (async) from a producer running ahead: distributed/async_rollout.py
        samples, metrics = self.source.get(step) if self.source is not None else self.collect(step)
        self.last_samples = samples  # for the audit log
        if not samples:  # every group degenerate: no update
            return {**metrics, **self.timers, "train/skipped_step": 1.0}
        replace = dataclasses.replace
        critic = needs_critic(self.algorithm, self.algo_cfg)
        with self.timer("collate"):
            batch = to_device(collate_samples(samples, self.tok.pad_id), self.trainer.device)  # ❹
        if self.reference is not None:
            with self.timer("reference"):
                batch = replace(batch, ref_logprobs=self.reference.score(batch))  # ❺
        if critic:  # critic hook (PPO only):
            with self.timer("critic"):  # V_old of the rollout for GAE
                batch = replace(batch, values=critic_values(self.trainer.model, batch, self.score_tokens()))
        with self.timer("algorithm"), across(self.world):  # batch-wide statistics: every rank's rows
            adv = self.algorithm.advantages(batch.rewards, batch.group_index, self.algo_cfg, batch=batch)
            if critic:  # the value loss's target
                batch = replace(batch, returns=self.algorithm.value_targets(batch.rewards, batch, self.algo_cfg))
            mask = batch.loss_mask
            batch = replace(batch, advantages=broadcast(adv, mask) if adv.dim() == 1 else adv * mask)  # ❻
        if self.on_batch is not None:
            self.on_batch(step, samples, batch)  # audit (recipes/rl.py), pre-update
        if self.correction != "none":  # stale samples: IS weights
            with self.timer("proximal"):  # from the behaviour logprobs
                batch, corrected = correct_off_policy(
                    self.trainer.model,
                    batch,
                    self.correction,
                    cfg.scale.off_policy_cap,
                    cfg.rollout.temperature,
                    self.score_tokens(),
                    self.trainer.cfg.packing,
                )
                metrics.update(corrected)
        with self.timer("train"):
            train = self.trainer.train(
                batch, self.loss_fn, cfg.optim.epochs, cfg.optim.minibatches, cfg.rollout.max_new_tokens
            )  # ❼
        with self.timer("sync"):
            sync = self.sync.sync()  # ❽
        metrics.update(train)
        metrics.update(sync)
        timers = dict(zip(self.timers, self.world.max(list(self.timers.values()))))  # the slowest rank's
        metrics.update(timers)  # ❾
        tokens = self.world.sum([float(batch.loss_mask.sum())])[0]  # every rank's
        metrics["train/tokens_per_s"] = tokens / max(timers["time/train_s"], 1e-9)
        metrics["train/skipped_step"] = 0.0
        return metrics

    def collect(self, step: int):
        """Generate and score groups until `prompts_per_step` groups are usable (or the
        attempt cap is hit). `degenerate`: keep = use every group; skip = drop groups whose
        rewards are all equal; resample = also draw fresh prompts to refill the batch.
        With N ranks each samples its block of the groups; the decisions are every rank's."""
        cfg, world, timers = self.cfg, self.world, dict[str, float]()  # own timers: async runs this on a thread
        n, P = cfg.rollout.samples_per_prompt, cfg.rollout.prompts_per_step
        kept: list[tuple[int, Sample]] = []  # (attempt, sample) of this rank's usable groups
        order: list[tuple[int, int, int]] = []  # (attempt, group, index) of every rank's, in the 1-rank order
        first: dict | None = None  # the metrics of the first draw
        attempts = cfg.rollout.max_resample_attempts if cfg.rollout.degenerate == "resample" else 1
        for attempt in range(attempts):
            want = P - len(order) // n
            items = self.task.items(want, "train", seed=f"{cfg.seed}/{step}/{attempt}")
            mine = world.span(want)  # this rank's whole groups; prompt ids stay global (group_offset)
            items = items[mine.start : mine.stop]
            prompts = [self.tok.encode(self.tok.chat_prompt(self.task.prompt(it))) for it in items]
            offset = len(order) // n + mine.start
            with timed(timers, "rollout"):
                if isinstance(self.task, MultiTurnTask):  # agent episodes (framework/agent.py)
                    samples = run_episodes(
                        self.engine,
                        self.tok,
                        self.task,
                        items,
                        n,
                        self.sampling,
                        seed=cfg.seed,
                        step=step * 1000 + attempt,
                        group_offset=offset,
                    )
                else:
                    samples = self.engine.generate(
                        prompts,
                        n + cfg.rollout.overprovision,
                        self.sampling,
                        seed=cfg.seed,
                        step=step * 1000 + attempt,
                        items=items,
                        group_offset=offset,
                        keep=n if cfg.rollout.overprovision else None,
                    )
            with timed(timers, "reward"):
                reward_metrics = score_samples(self.task, samples, self.pool, step)
            every = world.gather([_record(s) for s in samples]) if world.size > 1 else samples
            groups = group_rewards(every)
            if first is None:  # metrics of the first draw
                first = {
                    **reduced(world, reward_metrics),
                    **component_means(every),
                    **group_metrics(groups),
                    **sample_metrics(every, cfg.rollout.max_new_tokens),
                    **{
                        k if k.startswith("rollout/") else f"rollout/{k}": float(v)
                        for k, v in reduced(world, self.engine.stats).items()
                    },
                    **episode_metrics([s for s in every if isinstance(s, Episode)]),
                }
            dropped = {g for g, (_, degenerate) in groups.items() if degenerate and cfg.rollout.degenerate != "keep"}
            kept += [(attempt, s) for s in samples if s.group not in dropped]
            order += [(attempt, s.group, s.index) for s in every if s.group not in dropped]
            if len(order) >= P * n:
                break
        assert first is not None  # attempts >= 1: one draw at least
        first["rollout/attempts"] = float(attempt + 1)
        first["group/kept_frac"] = len(order) / (P * n)
        first.update(zip(timers, world.max(list(timers.values()))))  # the slowest rank's
        chosen = set(order[: P * n])  # the first prompts_per_step usable groups, as one rank takes them
        mine = [(a, s) for a, s in kept if (a, s.group, s.index) in chosen]
        if world.size > 1 and cfg.rollout.degenerate != "keep":
            return self._even(mine), first
        return [s for _, s in mine], first

    def _even(self, mine: list) -> list:
        """Several ranks, some groups dropped (degenerate skip / resample): whole groups dealt out again, a
        contiguous block to each rank in the 1-rank order. A rank left with none gets the first group with
        nothing to learn (loss mask 0), so that it still takes part in the step's collectives."""
        by_group: dict[tuple, list] = {}
        for a, s in self.world.gather(mine):  # (attempt, sample) of every rank, in the 1-rank order
            by_group.setdefault((a, s.group), []).append(s)
        blocks = list(by_group.values())
        if not blocks:
            return []
        span = self.world.span(len(blocks))
        out = [s for b in blocks[span.start : span.stop] for s in b]
        return out or [dataclasses.replace(s, response_mask=[0] * len(s.response_mask)) for s in blocks[0]]


@contextmanager
def timed(timers: dict, name: str):
    """Time a role, name it in a CUDA out-of-memory error raised inside (framework/card.py), and mark it
    for torch.profiler (`posttrain/NAME`: bench/profile.py groups a step's ops by it)."""
    t0 = time.perf_counter()
    with phase(name), torch.profiler.record_function(f"posttrain/{name}"):
        yield
    timers[f"time/{name}_s"] = timers.get(f"time/{name}_s", 0.0) + time.perf_counter() - t0


def group_rewards(samples) -> dict:
    """group -> (rewards, degenerate?) ; degenerate = every reward of the group equal."""
    by_group: dict[int, list[float]] = {}
    for s in samples:
        by_group.setdefault(s.group, []).append(s.reward)
    return {g: (r, max(r) - min(r) < 1e-8) for g, r in by_group.items()}


def group_metrics(groups: dict) -> dict:
    n = max(len(groups), 1)
    return {
        "group/all_pass_frac": sum(min(r) >= 1.0 for r, _ in groups.values()) / n,
        "group/all_fail_frac": sum(max(r) <= 0.0 for r, _ in groups.values()) / n,
        "group/degenerate_frac": sum(d for _, d in groups.values()) / n,
    }


def sample_metrics(samples, max_new_tokens: int) -> dict:
    lengths = np.array([len(s.response_ids) for s in samples], dtype=float)
    rewards = np.array([s.reward for s in samples], dtype=float)
    ok = rewards >= 1.0
    return {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()),
        "length/mean": float(lengths.mean()),
        "length/max": float(lengths.max()),
        "length/correct_mean": float(lengths[ok].mean()) if ok.any() else 0.0,
        "length/wrong_mean": float(lengths[~ok].mean()) if (~ok).any() else 0.0,
        "length/truncated_frac": float(np.mean([s.finish_reason == "length" for s in samples])),
        **max_of_k_metrics(lengths),
    }


def max_of_k_metrics(lengths: np.ndarray) -> dict:
    """The long tail of a step (lesson 22b): a synchronous rollout lasts as long as its longest
    sample. max_of_k = longest / mean, observed over the step's K = B·K samples; _expected = the
    exact expectation for K log-normal lengths with this mean and CV (throughput.max_of_k), so a
    tail heavier than log-normal reads above it and a lighter one below."""
    mean = float(lengths.mean())
    cv = float(lengths.std() / mean) if mean > 0 else 0.0
    return {
        "length/cv": cv,
        "length/p95": float(np.percentile(lengths, 95)),
        "length/max_of_k": float(lengths.max()) / mean if mean > 0 else 0.0,
        "length/max_of_k_expected": max_of_k(len(lengths), cv),
    }


def _record(s: Sample) -> Sample:
    """A sample as the step's metrics and decisions read it on every rank: its ids, logprobs and item
    stay on the rank that drew it."""
    return dataclasses.replace(s, prompt_ids=[], response_logprobs=[], item=None, text="", completion=None)


def reduced(world, metrics: dict) -> dict:
    """One rank's share of the step's metrics made the step's: counts (ints, errors, timeouts) add up,
    `*/max` and times take the largest, every other value (a rate, a mean) the mean over ranks."""
    if world.size == 1:
        return metrics
    parts = world.gather([metrics])
    out = {}
    for k in metrics:
        vals = [float(p[k]) for p in parts if k in p]
        if k.endswith("/max") or k.startswith("time/"):
            out[k] = max(vals)
        elif isinstance(metrics[k], int) or k.endswith(("/errors", "/timeouts", "/workers_replaced")):
            out[k] = sum(vals)
        else:
            out[k] = sum(vals) / len(vals)
    return out
