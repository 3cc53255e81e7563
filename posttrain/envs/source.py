"""External rollouts inside RL: outside agent code drives episodes against the live policy over HTTP.

    rollouts = ExternalRollouts(cfg, task, tok, engine)      # starts `posttrain serve` on 127.0.0.1
    controller.source = rollouts                             # ❶–❸ of a step come from here
    samples, metrics = rollouts.get(step)

A step draws `prompts_per_step` items and opens `samples_per_prompt` episodes per item, each with
an id. The task's driver (a `verifiers` environment, an OpenEnv client loop, a user's agent) runs
them against the server, sending the id with every request; the server samples at the run's
temperature and records what it served (serve/records.py). When the driver returns, the
episodes are closed and their served tokens become the step's samples, with the episode's
reward: training sees exactly the sampled tokens and their behaviour logprobs, observations
masked, never a re-tokenisation of the agent's text.

Faults are the episode's, not the run's: a driver that raises, hangs past `verifier.timeout_s`
or returns a reward that is not a finite number scores 0 and is counted (`reward/errors`,
`reward/timeouts`); an episode that never reached the server has no tokens to train and is
counted (`rollout/episodes_without_tokens`). The step goes on.

A driver is a coroutine on the task (envs/__init__.py): `episode(item, endpoint, episode_id)`
or, for environments that score a group together, `group(item, endpoint, episode_ids)`;
each returns a RewardResult or a number per episode. Episodes of a step run concurrently on
one event loop, so their requests meet in the server's batcher.

Not bit-reproducible: which requests share an engine call depends on the agents' timing, and
the draws depend on the call (serve/batcher.py). The built-in path stays exactly reproducible.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from dataclasses import dataclass

import numpy as np

from posttrain import postmortem
from posttrain.errors import UsageError
from posttrain.eval import pass_at_k
from posttrain.framework.controller import group_metrics, group_rewards, sample_metrics
from posttrain.serve.batcher import Batcher
from posttrain.serve.records import Recorder, episode_samples
from posttrain.serve.server import Server
from posttrain.tasks.base import RewardResult


@dataclass
class Endpoint:
    """What a driver needs to reach the policy: an OpenAI base URL, the model name, the sampling."""

    base_url: str
    model: str
    temperature: float
    max_tokens: int
    api_key: str = "posttrain"  # the server checks none; OpenAI clients insist on one

    def openai(self, episode_id: str | None = None, **kw):
        """An `openai.AsyncOpenAI` client that names `episode_id` on every request (X-Episode-Id)."""
        from openai import AsyncOpenAI

        headers = {"X-Episode-Id": episode_id} if episode_id else None
        return AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, default_headers=headers, max_retries=0, **kw)


def checked(result) -> RewardResult:
    """A driver's answer for one episode as a RewardResult; anything but a finite number scores 0 with a reason."""
    if isinstance(result, RewardResult):
        r = result.reward
    elif isinstance(result, (int, float)) and not isinstance(result, bool):
        r, result = result, RewardResult(float(result))
    else:
        return RewardResult(0.0, error=f"the environment returned {type(result).__name__}, not a reward")
    if not isinstance(r, (int, float)) or isinstance(r, bool) or not math.isfinite(r):
        return RewardResult(0.0, error=f"the environment returned the reward {r!r}, not a finite number")
    result.reward = float(r)
    return result


class ExternalRollouts:
    """The RL step's rollout source for a task driven from outside (see the module docstring)."""

    def __init__(self, cfg, task, tok, engine, name: str = "policy"):
        if cfg.rollout.degenerate == "resample":
            raise UsageError(
                "rollout.degenerate=resample is not available with an external environment (episodes are "
                "driven from outside); use keep or skip"
            )
        if cfg.scale.async_ or cfg.scale.placement != "in-process" or cfg.rollout.overprovision:
            raise UsageError(
                f"task.name={cfg.task.name} drives episodes through the server: it runs with "
                "scale.placement=in-process, scale.async=false and rollout.overprovision=0"
            )
        from posttrain.serve.app import RLPolicy, create_app

        self.cfg, self.task, self.tok, self.engine = cfg, task, tok, engine
        self.recorder = Recorder()
        self.policy = RLPolicy(cfg.rollout.temperature, cfg.rollout.max_new_tokens, self.recorder)
        self.batcher = Batcher(engine, cfg.seed)
        self.server = Server(create_app(self.batcher, tok, name, engine.max_len, policy=self.policy)).start()
        self.endpoint = Endpoint(self.server.url, name, cfg.rollout.temperature, cfg.rollout.max_new_tokens)
        self.timeout = float(cfg.verifier.timeout_s)
        print(
            f"external rollouts: the policy is served on {self.server.url} (model {name!r}) for task.name="
            f"{cfg.task.name}",
            flush=True,
        )

    # -- one step ----------------------------------------------------------------------------

    def get(self, step: int):
        cfg = self.cfg
        items = self.task.items(cfg.rollout.prompts_per_step, "train", seed=f"{cfg.seed}/{step}/0")
        samples, metrics = self.run(items, cfg.rollout.samples_per_prompt)
        groups = group_rewards(samples)
        metrics.update(
            {**group_metrics(groups), **(sample_metrics(samples, cfg.rollout.max_new_tokens) if samples else {})}
        )
        kept = [s for s in samples if cfg.rollout.degenerate == "keep" or not groups[s.group][1]]
        metrics["group/kept_frac"] = len(kept) / max(len(samples), 1)
        metrics["rollout/attempts"] = 1.0
        return kept, metrics

    def run(self, items, n: int):
        """n episodes per item through the server: (samples, metrics). Samples of item g have group g."""
        ids = [[f"{uuid.uuid4().hex[:12]}-{g}-{j}" for j in range(n)] for g in range(len(items))]
        flat = [e for row in ids for e in row]
        before = dict(self.batcher.stats)
        overridden = self.policy.overridden
        self.recorder.open(flat)
        t0 = time.perf_counter()
        try:
            with postmortem.doing(f"while driving {len(flat)} episodes with {type(self.task).__qualname__}"):
                results = asyncio.run(self._drive(items, ids))
        finally:
            turns = self.recorder.close(flat)
        wall = time.perf_counter() - t0
        samples, empty = [], 0
        for g, row in enumerate(ids):
            for j, eid in enumerate(row):
                res = results[g][j]
                parts = episode_samples(turns[eid], g, j, items[g])
                empty += not parts
                for s in parts:
                    s.reward, s.reward_components, s.reward_error = res.reward, dict(res.components), res.error
                    s.text = self.tok.decode(s.response_ids)
                samples.extend(parts)
        flat_res = [r for row in results for r in row]
        generated = self.batcher.stats["serve/generated_tokens"] - before["serve/generated_tokens"]
        comps: dict = {}
        for r in flat_res:
            for k, v in r.components.items():
                comps.setdefault(k, []).append(v)
        timeouts = sum(r.error is not None and r.error.startswith("timeout") for r in flat_res)
        metrics = {
            "reward/errors": float(sum(r.error is not None for r in flat_res) - timeouts),
            "reward/timeouts": float(timeouts),
            "reward/episode_mean": float(np.mean([r.reward for r in flat_res])),
            **{f"reward/{k}": float(np.mean(v)) for k, v in comps.items()},
            "rollout/episodes": float(len(flat)),
            "rollout/episodes_without_tokens": float(empty),
            "rollout/samples_per_episode": len(samples) / max(len(flat) - empty, 1),
            "rollout/requests": float(self.batcher.stats["serve/requests"] - before["serve/requests"]),
            "rollout/engine_calls": float(self.batcher.stats["serve/calls"] - before["serve/calls"]),
            "rollout/generated_tokens": float(generated),
            "rollout/tokens_per_s": generated / max(wall, 1e-9),
            "rollout/sampling_overridden": float(self.policy.overridden - overridden),
            "time/rollout_s": wall,
        }  # episodes, scoring included (the env scores them)
        return samples, metrics

    async def _drive(self, items, ids) -> list[list[RewardResult]]:
        """Every group's driver on one loop; each group (or episode) under the deadline."""
        grouped = hasattr(self.task, "group")

        async def one(coro, count: int) -> list[RewardResult]:
            try:
                out = await asyncio.wait_for(coro, self.timeout)
            except asyncio.TimeoutError:
                return [
                    RewardResult(
                        0.0, error=f"timeout: the environment took longer than verifier.timeout_s={self.timeout:g}"
                    )
                ] * count
            except Exception as e:  # noqa: BLE001 - an environment's bug costs its episodes, never the run
                return [RewardResult(0.0, error=f"{type(e).__name__}: {e}")] * count
            if not grouped:
                return [checked(out)]
            if not isinstance(out, (list, tuple)) or len(out) != count:
                return [
                    RewardResult(
                        0.0,
                        error=f"the environment returned {type(out).__name__} for a group of "
                        f"{count} episodes, not {count} rewards",
                    )
                ] * count
            return [checked(r) for r in out]

        if grouped:
            jobs = [one(self.task.group(items[g], self.endpoint, row), len(row)) for g, row in enumerate(ids)]
            return list(await asyncio.gather(*jobs))
        jobs = [[one(self.task.episode(items[g], self.endpoint, e), 1) for e in row] for g, row in enumerate(ids)]
        flat = await asyncio.gather(*(j for row in jobs for j in row))
        n = len(ids[0]) if ids else 0
        return [[flat[g * n + j][0] for j in range(n)] for g in range(len(ids))]

    # -- evaluation ------------------------------------------------------------------------

    def evaluate(self, items, k: int, prefix: str = "eval/") -> dict:
        """Greedy (temperature 0) episodes and, with k > 1, k sampled ones per held-out item: the
        keys of eval.evaluate, with "correct" = the episode's reward ≥ 1 (or its `correct` component).
        An episode the environment failed scores 0 there too, so the failures are counted beside
        the accuracy (`errors`, `timeouts`, over greedy and sampled episodes): a low pass@1 then
        says whether the policy or the environment failed."""
        greedy, _ = self._results(items, 1, 0.0)
        sampled = self._results(items, k, self.cfg.rollout.temperature)[0] if k > 1 else []
        timeouts = sum(r.error is not None and r.error.startswith("timeout") for r in greedy + sampled)
        out = {
            f"{prefix}greedy_acc": float(np.mean([_correct(r) for r in greedy])),
            f"{prefix}greedy_reward": float(np.mean([r.reward for r in greedy])),
            f"{prefix}errors": float(sum(r.error is not None for r in greedy + sampled) - timeouts),
            f"{prefix}timeouts": float(timeouts),
        }
        if k > 1:
            correct = [sum(_correct(r) for r in sampled[i * k : (i + 1) * k]) for i in range(len(items))]
            out[f"{prefix}pass@1"] = float(np.mean([pass_at_k(k, c, 1) for c in correct]))
            out[f"{prefix}pass@{k}"] = float(np.mean([pass_at_k(k, c, k) for c in correct]))
            out[f"{prefix}reward_mean"] = float(np.mean([r.reward for r in sampled]))
        return out

    def _results(self, items, n: int, temperature: float):
        ids = [[f"eval-{uuid.uuid4().hex[:12]}-{g}-{j}" for j in range(n)] for g in range(len(items))]
        flat = [e for row in ids for e in row]
        saved, self.policy.temperature = self.policy.temperature, temperature
        self.recorder.open(flat)
        try:
            with postmortem.doing(f"while driving {len(flat)} evaluation episodes with {type(self.task).__qualname__}"):
                results = asyncio.run(self._drive(items, ids))
        finally:
            self.recorder.close(flat)
            self.policy.temperature = saved
        return [r for row in results for r in row], flat

    def close(self) -> None:
        self.server.close()
        self.batcher.close()


def _correct(r: RewardResult) -> float:
    if r.error is not None:
        return 0.0
    if "correct" in r.components:
        return float(r.components["correct"] >= 1.0)
    return float(r.reward >= 1.0)
