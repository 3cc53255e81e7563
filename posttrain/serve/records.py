"""What the server sampled for each episode, and how an episode's requests become training samples.

Inside RL every request names its episode (header `X-Episode-Id` or `X-Session-ID`, or the
OpenAI `user` field). The server records each choice it returns as a `Turn`: the exact prompt
ids it rendered, the completion ids it served, their behaviour logprobs and policy versions.
Training uses these tokens; nothing is re-tokenised from the agent's text.

`episode_samples` joins an episode's turns into samples. Turn k+1 continues turn k when its
prompt starts with turn k's prompt + completion (the agent sent the conversation back and the
chat template rendered the assistant's reply as it was sampled): the tokens in between are the
environment's observation (response_mask 0, logprob 0) and the new completion follows (mask 1).

    turn 0   prompt P0 ──► completion C0
    turn 1   prompt P1 = P0 + C0 + O1 ──► completion C1
    sample   prompt P0, response C0 (1) + O1 (0) + C1 (1)

A turn whose prompt does not extend any earlier chain (the agent rewrote the history, or a
template re-renders the reply differently) starts a new sample of the same episode: every
served token is trained exactly once, with the episode's reward.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from posttrain.framework.agent import Episode


@dataclass
class Turn:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # behaviour logprobs of completion_ids (the served distribution)
    versions: list[int]  # policy version behind each completion token
    policy_version: int
    finish_reason: str  # stop | length


class Recorder:
    """Turns of the open episodes, by episode id (thread-safe: the server's handlers add, the
    rollout source opens and closes)."""

    def __init__(self):
        self._open: dict[str, list[Turn]] = {}
        self._lock = threading.Lock()

    def open(self, ids) -> None:
        with self._lock:
            for eid in ids:
                self._open[str(eid)] = []

    def is_open(self, eid: str) -> bool:
        with self._lock:
            return eid in self._open

    def add(self, eid: str, turn: Turn) -> bool:
        """Record a served turn; False when the episode is not open (nothing recorded)."""
        with self._lock:
            if eid not in self._open:
                return False
            self._open[eid].append(turn)
            return True

    def close(self, ids) -> dict[str, list[Turn]]:
        """End these episodes: their turns, and later requests naming them are refused."""
        with self._lock:
            return {str(eid): self._open.pop(str(eid), []) for eid in ids}


def episode_samples(turns: list[Turn], group: int, index: int, item=None) -> list[Episode]:
    """An episode's served turns as samples (see the module docstring), in the order they began."""
    chains: list[Episode] = []
    for t in turns:
        chain = _extended(chains, t.prompt_ids)
        if chain is None:
            chain = Episode(
                prompt_ids=list(t.prompt_ids),
                response_ids=[],
                response_logprobs=[],
                response_mask=[],
                finish_reason=t.finish_reason,
                policy_version=t.policy_version,
                group=group,
                index=index,
                item=item,
                token_versions=[],
            )
            chains.append(chain)
        else:
            obs = t.prompt_ids[len(chain.prompt_ids) + len(chain.response_ids) :]  # the env's tokens in between
            chain.response_ids += obs
            chain.response_logprobs += [0.0] * len(obs)
            chain.response_mask += [0] * len(obs)
            chain.token_versions += [t.policy_version] * len(obs)
            chain.tool_calls += 1
        chain.response_ids += t.completion_ids
        chain.response_logprobs += t.logprobs
        chain.response_mask += [1] * len(t.completion_ids)
        chain.token_versions += t.versions
        chain.policy_version = min(chain.policy_version, t.policy_version)
        chain.finish_reason = t.finish_reason
        chain.turns += 1
    return [c for c in chains if any(c.response_mask)]


def _extended(chains: list[Episode], prompt: list[int]) -> Episode | None:
    """The chain whose tokens so far are a prefix of `prompt` (the longest, if several)."""
    best, best_len = None, -1
    for c in chains:
        n = len(c.prompt_ids) + len(c.response_ids)
        if (
            n > best_len
            and n <= len(prompt)
            and prompt[: len(c.prompt_ids)] == c.prompt_ids
            and prompt[len(c.prompt_ids) : n] == c.response_ids
        ):
            best, best_len = c, n
    return best
