"""Agent episodes: multi-turn rollouts through an `Env`, tool output masked out of the loss.

    prompt        <1234567+89012>                 reset(item)
    turn 0        ⟦1234567+89012⟧                 policy: response_mask 1, behaviour logprobs
    observation   ⟨1323579⟩                       env.step(turn text): response_mask 0, logprob 0
    turn 1        1323579#                        policy; env.step → done, reward

Every policy turn is one `Engine.generate` call whose prompt is the whole conversation so
far (no KV sharing across turns: the prefix is prefilled again, simple and exact). The
first turn of an item's n episodes shares one prompt; later turns run every live episode
as its own prompt. A turn ends at end-of-turn, at a call close (the engine stops there and
the env runs the tool), or at the per-turn length cap; an episode ends when the env says
done, when a turn hits the length cap, or at the turn limit (`finish_reason="length"`).

Masks are set here, by the code that produced the tokens (docs/architecture.md §10): the policy's tokens get
response_mask 1 and their sampling logprobs; injected observation tokens get 0 and logprob 0,
so collate gives them loss_mask 0 and no algorithm ever sees them. Tool output is data: it is
sanitised to the tokenizer's plain characters (specials and unknown characters become '?')
so it can never close a turn or fake a call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from posttrain import postmortem
from posttrain.chat import CALL_CLOSE, SPECIALS
from posttrain.errors import UsageError
from posttrain.framework.rollout import SamplingParams
from posttrain.framework.sample import Sample
from posttrain.models.tokenizer import CharTokenizer


@dataclass
class Episode(Sample):
    conversation: list = field(default_factory=list)  # [(role, text)]: "policy" / "observation" turns
    turns: int = 0  # policy turns taken
    tool_calls: int = 0  # observations injected
    tool_errors: int = 0  # observations that report a tool error or timeout
    scored: bool = True  # the env has set reward / reward_components (score_samples keeps them)


def observation_ids(tok, text: str, task=None) -> list[int]:
    """Tokens of an observation as injected. Built-in tokenizer: `⟨text⟩`, with specials and
    characters outside the vocabulary replaced by '?' and capped at 64 chars. A Hugging Face
    tokenizer: the task's `observation_template` (default `<result>…</result>`), encoded with
    special-token strings split into plain text. Either way tool output never acts as markup."""
    if not isinstance(tok, CharTokenizer):
        template = getattr(task, "observation_template", "\n<result>{}</result>\n")
        return tok.encode_data(template.format(text[:256]))
    clean = "".join(c if c in tok.stoi and c not in SPECIALS else "?" for c in text[:64])
    return tok.encode(tok.chat_tool_result(clean))


def turn_stops(tok, task) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """What ends a policy turn so the env can act: the task's `stop` strings (default the built-in
    call close `⟧`). A stop that is one token stops the engine there; a longer one is found in the
    decoded text after sampling, and the turn is cut after the token that completes it."""
    declared = tuple(getattr(task, "stop", ()) or ())
    ids: list[int] = []
    rest: list[str] = []
    for s in declared or (CALL_CLOSE,):
        try:
            enc = tok.encode(s)
        except UsageError:
            if declared:  # a stop the task asked for must exist
                raise
            continue  # a vocabulary older than tool use: no call close
        (ids if len(enc) == 1 else rest).append(enc[0] if len(enc) == 1 else s)
    return tuple(ids), tuple(rest)


def _cut(tok, ids: list[int], stops: tuple[str, ...]) -> int:
    """How many of `ids` to keep: up to the token completing the first stop string (all if none)."""
    if not stops or not any(s in tok.decode(ids) for s in stops):
        return len(ids)
    for j in range(1, len(ids) + 1):
        if any(s in tok.decode(ids[:j]) for s in stops):
            return j
    return len(ids)


def token_text(tok, ids) -> str:
    """The text of sampled tokens (the built-in tokenizer keeps pads, so it re-encodes to the ids)."""
    return "".join(tok.chars[i] for i in ids) if isinstance(tok, CharTokenizer) else tok.decode(ids)


def run_episodes(
    engine,
    tok,
    task,
    items,
    n: int,
    sampling: SamplingParams,
    seed: int = 0,
    step: int = 0,
    group_offset: int = 0,
    max_turns: int | None = None,
) -> list[Episode]:
    """n episodes per item, group-major like `Engine.generate`; each comes back scored by its env.

    Randomness: turn 0 draws from (seed, step·64, group_offset + item, sample) like a single-turn
    call; turn t > 0 from (seed, step·64 + t, group_offset·n + rank among live episodes, 0).
    Both are pure in the call's arguments, so runs are reproducible and resumable."""
    max_turns = max_turns or int(getattr(task, "max_turns", 2))
    stop_ids, stop_strings = turn_stops(tok, task)
    stops = stop_ids + tuple(sampling.stop_ids)
    eps, envs = [], []
    for g, item in enumerate(items):
        for j in range(n):
            env = task.make_env(item)
            prompt = tok.encode(tok.chat_prompt(env.reset(item)))  # a question string or messages
            eps.append(
                Episode(
                    prompt_ids=prompt,
                    response_ids=[],
                    response_logprobs=[],
                    response_mask=[],
                    finish_reason="length",
                    policy_version=engine.policy_version,
                    group=g,
                    index=j,
                    item=item,
                )
            )
            envs.append(env)
    live, generated, seconds = list(range(len(eps))), 0.0, 0.0
    for turn in range(max_turns):
        if not live:
            break
        longest = max(len(eps[e].prompt_ids) + len(eps[e].response_ids) for e in live)
        cap = min(sampling.max_new_tokens, engine.max_len - longest)
        if cap < 1:  # the conversation fills the context: truncated
            break
        params = dataclasses.replace(sampling, max_new_tokens=cap, stop_ids=stops)
        if turn == 0:  # an item's n episodes share their first prompt
            outs = engine.generate(
                [eps[g * n].prompt_ids for g in range(len(items))],
                n,
                params,
                seed=seed,
                step=step * 64,
                group_offset=group_offset,
            )
        else:
            outs = engine.generate(
                [eps[e].prompt_ids + eps[e].response_ids for e in live],
                1,
                params,
                seed=seed,
                step=step * 64 + turn,
                group_offset=group_offset * n,
            )
            outs = dict(zip(live, outs))
        stats = getattr(engine, "stats", {})
        generated += stats.get("rollout/generated_tokens", 0.0)
        seconds += stats.get("rollout/time_s", 0.0)
        still = []
        for e in live:
            ep, out = eps[e], outs[e]
            keep = _cut(tok, out.response_ids, stop_strings)  # a multi-token stop string ends the turn here
            if keep < len(out.response_ids):
                out.response_ids, out.response_logprobs, out.finish_reason = (
                    out.response_ids[:keep],
                    out.response_logprobs[:keep],
                    "stop",
                )
            ep.response_ids += out.response_ids
            ep.response_logprobs += out.response_logprobs
            ep.response_mask += [1] * len(out.response_ids)
            text = token_text(tok, out.response_ids)
            ep.conversation.append(("policy", text))
            ep.turns += 1
            with postmortem.doing(f"while calling {type(envs[e]).__qualname__}.step (the task's environment)"):
                obs, reward, done, info = envs[e].step(text)
            ep.reward += float(reward)
            if done or out.finish_reason == "length":
                ep.finish_reason = "stop" if done else "length"
                ep.reward_components = dict(info.get("components", {}))
                ep.reward_error = info.get("error")
                continue
            ids = observation_ids(tok, obs or "", task)
            ep.response_ids += ids
            ep.response_logprobs += [0.0] * len(ids)  # no behaviour logprob: the policy did not sample these
            ep.response_mask += [0] * len(ids)
            ep.conversation.append(
                ("observation", tok.decode(ids)[1:-1] if isinstance(tok, CharTokenizer) else tok.decode(ids))
            )
            ep.tool_calls += 1
            ep.tool_errors += info.get("tool_error") is not None
            still.append(e)
        live = still
    for ep in eps:
        ep.text = tok.decode(ep.response_ids)
    if seconds > 0:  # rollout stats over all turns, not the last call's
        engine.stats = {
            **engine.stats,
            "rollout/generated_tokens": generated,
            "rollout/time_s": seconds,
            "rollout/tokens_per_s": generated / seconds,
        }
    return eps


def episode_metrics(episodes, prefix: str = "agent/") -> dict:
    if not episodes:
        return {}
    calls = np.array([e.tool_calls for e in episodes], dtype=float)
    return {
        f"{prefix}tool_call_rate": float((calls > 0).mean()),
        f"{prefix}tool_calls_mean": float(calls.mean()),
        f"{prefix}tool_errors": float(sum(e.tool_errors for e in episodes)),
        f"{prefix}turns_mean": float(np.mean([e.turns for e in episodes])),
    }


def solved(episode) -> bool:
    """Whether an episode is correct, for evaluation: its env's "correct" component when it logs
    one (a format or call reward is not a solved problem), else reward ≥ 1."""
    return float(episode.reward_components.get("correct", episode.reward)) >= 1.0
