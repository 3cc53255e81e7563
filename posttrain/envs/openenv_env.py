"""`task.name=openenv`: an OpenEnv environment server, played by the live policy through `posttrain serve`.

    posttrain rl task.name=openenv task.url=http://127.0.0.1:8001 task.action_field=message \
                 task.observation_field=prompt rollout.max_new_tokens=48

OpenEnv (PyPI `openenv-core`) serves an environment with a reset/step protocol; a session is a
WebSocket (`/ws`) holding one environment instance. Each episode here is a client loop, the
agent side of that protocol:

    obs = reset(seed=item seed)                      # the n episodes of an item share its seed
    repeat up to task.max_turns:
        reply = policy(chat so far + obs as a user turn)       # through the server, episode id attached
        obs, reward, done = step({action_field: reply})        # rewards summed over the episode
        until done

The client is openenv-core's own `GenericEnvClient` (dict actions and observations, no
environment package needed). The observation shown to the policy is `observation[observation_field]`
(or, when that is empty, the observation's fields as `key: value` lines). Items are reset
seeds: train seeds and held-out seeds are disjoint ranges, so a seeded environment gives
distinct held-out problems. An environment that raises, hangs or returns a non-numeric
reward costs its episode (envs/source.py), never the run.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from posttrain.errors import UsageError
from posttrain.tasks.base import RewardResult, TaskConfig

TEST_SEEDS = 1_000_000_000  # held-out reset seeds start here; train seeds stay below


@dataclass
class OpenEnvConfig(TaskConfig):
    name: str = "openenv"
    url: str = ""  # the OpenEnv server, e.g. http://127.0.0.1:8001 (its /ws is used)
    action_field: str = "message"  # the action's text field: the policy's reply goes here
    observation_field: str = ""  # the observation's text field shown to the policy; "" = every field
    system_prompt: str = ""  # optional system message before the first observation
    max_turns: int = 1  # policy turns per episode at most
    reset_args: dict = field(default_factory=dict)  # extra keyword arguments of reset()


class OpenEnvTask:
    """An OpenEnv environment as a posttrain task whose episodes run outside (envs/source.py)."""

    Config = OpenEnvConfig
    external = True

    def __init__(self, config: OpenEnvConfig):
        try:
            from openenv.core import GenericEnvClient  # noqa: F401
        except ImportError:
            raise UsageError("task.name=openenv needs openenv-core: pip install 'posttrain[openenv]'") from None
        if not config.url.startswith(("http://", "https://", "ws://", "wss://")):
            raise UsageError(
                f"task.url={config.url!r}: give the OpenEnv server's URL, e.g. task.url=http://127.0.0.1:8001"
            )
        if config.max_turns < 1:
            raise UsageError(f"task.max_turns={config.max_turns}: an episode needs at least one turn")
        self.config, self.name = config, config.name
        self._first: dict[int, list[dict]] = {}  # reset seed -> first messages (plans, audits)

    def items(self, n: int, split: str, seed) -> list[dict]:
        rng = random.Random(f"{split}/{seed}")
        base = TEST_SEEDS if split != "train" else 0
        return [{"seed": base + rng.randrange(TEST_SEEDS)} for _ in range(n)]

    def render(self, observation) -> str:
        obs = observation if isinstance(observation, dict) else {"observation": observation}
        key = self.config.observation_field
        if key:
            if key not in obs:
                raise KeyError(
                    f"the observation has no field {key!r} (fields: {', '.join(obs)}); set task.observation_field"
                )
            return str(obs[key])
        return "\n".join(f"{k}: {v}" for k, v in obs.items() if k not in ("metadata", "done", "reward"))

    def _opening(self, observation) -> list[dict]:
        system = [{"role": "system", "content": self.config.system_prompt}] if self.config.system_prompt else []
        return system + [{"role": "user", "content": self.render(observation)}]

    def _client(self):
        from openenv.core import GenericEnvClient

        return GenericEnvClient(base_url=self.config.url)

    def prompt(self, item: dict) -> list[dict]:
        """The first messages of an item's episodes (one reset, cached): for the step plan and the
        first-prompt printout; episodes themselves reset their own sessions."""
        if item["seed"] not in self._first:

            async def first():
                async with self._client() as env:
                    return (await env.reset(seed=item["seed"], **self.config.reset_args)).observation

            try:
                self._first[item["seed"]] = self._opening(asyncio.run(first()))
            except Exception as e:  # noqa: BLE001 - an unreachable server is the user's to fix, before training
                raise UsageError(
                    f"task.url={self.config.url}: cannot reset the OpenEnv environment "
                    f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})"
                ) from None
        return self._first[item["seed"]]

    async def episode(self, item: dict, endpoint, episode_id: str) -> RewardResult:
        """One episode: reset, then policy turn / step until done or max_turns; the summed reward."""
        policy = endpoint.openai(episode_id)
        total, steps, done = 0.0, 0, False
        try:
            env, result, waits = await self._open(item)
            async with env:
                messages = self._opening(result.observation)
                done = bool(result.done)
                while not done and steps < self.config.max_turns:
                    reply = await policy.chat.completions.create(
                        model=endpoint.model,
                        messages=messages,
                        max_tokens=endpoint.max_tokens,
                        temperature=endpoint.temperature,
                    )
                    text = reply.choices[0].message.content or ""
                    result = await env.step({self.config.action_field: text})
                    steps += 1
                    if result.reward is not None:
                        if isinstance(result.reward, bool) or not isinstance(result.reward, (int, float)):
                            return RewardResult(
                                0.0, error=f"the environment's reward {result.reward!r} is not a number"
                            )
                        total += float(result.reward)
                    done = bool(result.done)
                    messages += [
                        {"role": "assistant", "content": text},
                        {"role": "user", "content": self.render(result.observation)},
                    ]
        finally:
            await policy.close()
        return RewardResult(total, {"done": float(done), "turns": float(steps), "capacity_waits": float(waits)})

    async def _open(self, item: dict):
        """A session reset to the item's seed: (client, reset result, how often the server was full).

        An OpenEnv server holds at most its `max_concurrent_envs` sessions (1 unless the environment
        says otherwise) and frees a session only after its socket closed, so a step's episodes, or
        the next batch right after the last, can find it full: the reset answers CAPACITY_REACHED.
        Nothing was served to the policy yet, so the episode asks again after a pause (up to 1 s,
        under verifier.timeout_s like the whole episode) instead of scoring 0 for the server's queue."""
        from websockets.exceptions import ConnectionClosedOK

        waits, pause = 0, 0.05
        while True:
            env = self._client()
            await env.connect()
            try:
                return env, await env.reset(seed=item["seed"], **self.config.reset_args), waits
            except (RuntimeError, ConnectionClosedOK) as e:  # a full server answers the error, then closes;
                await env.close()  # the reset may meet either
                if isinstance(e, RuntimeError) and "CAPACITY_REACHED" not in str(e):
                    raise
            except BaseException:
                await env.close()
                raise
            waits += 1
            await asyncio.sleep(pause)
            pause = min(2 * pause, 1.0)
