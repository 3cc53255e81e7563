"""An OpenEnv environment: reset(seed) poses a sum of integers, step(message) scores the reply.

    python examples/envs/arith_openenv.py --port 8001        # serve it (OpenEnv's HTTP + WebSocket app)
    posttrain rl task.name=openenv task.url=http://127.0.0.1:8001 task.observation_field=question ...

Written against openenv-core alone: an `Environment` with typed Action/Observation models, served by
`create_app`. One step per episode: the reward is 1 when the last integer of the message equals
the sum, and the episode is done.
"""

import random
import re
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class SumAction(Action):
    message: str = Field(..., description="the policy's reply")


class SumObservation(Observation):
    question: str = Field(default="", description="the sum to compute, e.g. 3+4+5")
    feedback: str = Field(default="", description="correct or wrong, after the reply")


class SumEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True          # every WebSocket session gets its own instance

    def __init__(self, min_terms: int = 2, max_terms: int = 4, max_value: int = 19):
        self.min_terms, self.max_terms, self.max_value = min_terms, max_terms, max_value
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.answer = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, max_terms: int | None = None,
              min_terms: int | None = None, **kwargs) -> SumObservation:
        rng = random.Random(seed)
        count = rng.randint(min_terms or self.min_terms, max_terms or self.max_terms)
        terms = [rng.randint(0, self.max_value) for _ in range(count)]
        self.answer = sum(terms)
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return SumObservation(question="+".join(map(str, terms)), done=False, reward=0.0)

    def step(self, action: SumAction, timeout_s: float | None = None, **kwargs) -> SumObservation:
        self._state.step_count += 1
        numbers = re.findall(r"-?\d+", action.message)
        ok = bool(numbers) and int(numbers[-1]) == self.answer
        return SumObservation(feedback="correct" if ok else "wrong", done=True, reward=float(ok))

    @property
    def state(self) -> State:
        return self._state


app = create_app(SumEnvironment, SumAction, SumObservation, env_name="arith_sum", max_concurrent_envs=256)


if __name__ == "__main__":
    import argparse

    import uvicorn
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=8001)
    uvicorn.run(app, host="127.0.0.1", port=p.parse_args().port)
