"""Agent episodes: masks, chat-template equality, tool errors, loss invariance to tool output."""

import dataclasses

import pytest
import torch

from posttrain import algorithms
from posttrain.algorithms.core import batch_norm, broadcast
from posttrain.framework.agent import Episode, episode_metrics, observation_ids, run_episodes
from posttrain.framework.batch import collate_samples
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.framework.sample import Sample
from posttrain.framework.trainer import policy_loss_fn
from posttrain.tasks.base import score_samples
from posttrain.tasks.tools import (
    ToolArithmeticConfig,
    ToolArithmeticTask,
    ToolEnv,
    ToolError,
    calculator,
    safe_eval,
    tool_calls,
)


class ScriptedEngine:
    """An engine whose policy is a function of the conversation text: `script(text) -> turn`.
    Honours the stop ids and the length cap like the real one; logprob of every token −0.5."""

    def __init__(self, tok, script, max_len=256):
        self.tok, self.script, self.max_len, self.policy_version, self.calls = tok, script, max_len, 3, []

    def generate(self, prompts, n, sampling, seed=0, step=0, items=None, group_offset=0):
        self.calls.append((len(prompts), n, step))
        stops = {self.tok.eot_id, *sampling.stop_ids}
        out = []
        for g, p in enumerate(prompts):
            for j in range(n):
                ids = self.tok.encode(self.script(self.tok.decode(p)))[: sampling.max_new_tokens]
                cut = next((i + 1 for i, t in enumerate(ids) if t in stops), None)
                ids = ids[:cut] if cut else ids
                out.append(
                    Sample(
                        list(p),
                        ids,
                        [-0.5] * len(ids),
                        [1] * len(ids),
                        "stop" if cut else "length",
                        self.policy_version,
                        g,
                        j,
                    )
                )
        return out


def caller(text):
    """Calls the calculator on the question, then copies the result."""
    if "⟩" in text:
        return text.rsplit("⟨", 1)[1].split("⟩")[0] + "#"
    return "⟦" + text[1 : text.index(">")] + "⟧"


@pytest.fixture
def task():
    return ToolArithmeticTask(ToolArithmeticConfig(min_digits=5, max_digits=5))


def test_safe_eval_table():
    assert safe_eval("12+30") == 42 and safe_eval("(3+5)*2") == 16 and safe_eval("-4--4") == 0
    assert calculator("7/2") == "3.5" and calculator("100000+23456") == "123456"
    for bad, why in [
        ("1/0", "division by zero"),
        ("__import__('os')", "unsupported"),
        ("2**8", "unsupported"),
        ("1.5+1", "unsupported"),
        ("9" * 40 + "*" + "9" * 40, "too large"),
        ("1+", "cannot parse"),
        ("x" * 300, "longer"),
    ]:
        with pytest.raises(ToolError, match=why):
            safe_eval(bad)
    assert tool_calls("a⟦1+2⟧b⟦3⟧c⟦4") == ["1+2", "3"]


def test_episode_tokens_masks_and_reward(tok, task):
    item = task.items(1, "train", 0)[0]
    eng = ScriptedEngine(tok, caller)
    [ep] = run_episodes(eng, tok, task, [item], 1, SamplingParams(max_new_tokens=40))
    call, obs, answer = f"⟦{item.question}⟧", f"⟨{item.answer}⟩", f"{item.answer}#"
    assert ep.text == call + obs + answer
    assert ep.response_mask == [1] * len(call) + [0] * len(obs) + [1] * len(answer)
    assert ep.response_logprobs == [-0.5] * len(call) + [0.0] * len(obs) + [-0.5] * len(answer)
    assert (ep.reward, ep.reward_components) == (1.0, {"correct": 1.0, "tool_called": 1.0})
    assert (ep.turns, ep.tool_calls, ep.finish_reason, ep.policy_version) == (2, 1, "stop", 3)
    # the concatenated turn tokens are what the chat template renders for the whole conversation
    assert ep.prompt_ids + ep.response_ids == tok.encode(tok.render(item.question, ep.conversation))
    assert ep.conversation == [("policy", call), ("observation", str(item.answer)), ("policy", answer)]
    # collate: loss_mask is the response mask at columns P + j, no behaviour logprob on observations
    b = collate_samples([ep], tok.pad_id)
    P = len(ep.prompt_ids)
    assert b.loss_mask[0, :P].sum() == 0
    assert b.loss_mask[0, P : P + len(ep.response_ids)].tolist() == ep.response_mask
    obs_cols = slice(P + len(call), P + len(call) + len(obs))
    assert b.loss_mask[0, obs_cols].sum() == 0 and b.old_logprobs[0, obs_cols].abs().sum() == 0
    assert tok.decode(b.input_ids[0, obs_cols].tolist()) == obs


def test_direct_answer_and_turn_limit(tok, task):
    item = task.items(1, "train", 1)[0]
    [ep] = run_episodes(ScriptedEngine(tok, lambda t: "12#"), tok, task, [item], 1, SamplingParams(max_new_tokens=40))
    assert (ep.turns, ep.tool_calls, ep.reward, ep.response_mask) == (1, 0, 0.0, [1, 1, 1])
    # a policy that only ever calls: stopped by the env's call budget, then by the turn limit
    always = lambda t: "⟦1+1⟧"
    [ep] = run_episodes(ScriptedEngine(tok, always), tok, task, [item], 1, SamplingParams(max_new_tokens=40))
    assert ep.tool_calls == task.config.max_calls and ep.finish_reason == "stop" and ep.reward == 0.0
    [ep] = run_episodes(
        ScriptedEngine(tok, always), tok, task, [item], 1, SamplingParams(max_new_tokens=40), max_turns=1
    )
    assert ep.turns == 1 and ep.finish_reason == "length" and ep.response_mask[-1] == 0


def test_group_layout_and_shared_first_prompt(tok, task):
    items = task.items(3, "train", 2)
    eng = ScriptedEngine(tok, caller)
    eps = run_episodes(eng, tok, task, items, 4, SamplingParams(max_new_tokens=40), step=5, group_offset=7)
    assert [(e.group, e.index) for e in eps] == [(g, j) for g in range(3) for j in range(4)]
    assert eng.calls[0] == (3, 4, 5 * 64) and eng.calls[1] == (12, 1, 5 * 64 + 1)
    assert all(e.reward == 1.0 for e in eps)
    m = score_samples(task, eps)  # episodes arrive scored: kept as they are
    assert m["reward/correct"] == 1.0 and all(e.reward == 1.0 for e in eps)
    assert episode_metrics(eps) == {
        "agent/tool_call_rate": 1.0,
        "agent/tool_calls_mean": 1.0,
        "agent/tool_errors": 0.0,
        "agent/turns_mean": 2.0,
    }


def test_tool_errors_and_timeouts_become_observations(tok, task):
    item = task.items(1, "train", 3)[0]

    def slow(_):
        raise TimeoutError("after 2s")

    def buggy(_):
        raise RuntimeError("boom")

    for tool, want, kind in [
        (slow, "error: timeout after 2s", "timeout"),
        (buggy, "error: RuntimeError", "crash"),
        (calculator, "error: division by zero", "tool"),
    ]:
        env = ToolEnv(task, item, tool)
        env.reset()
        obs, r, done, info = env.step("⟦1/0⟧")
        assert (obs, r, done, info["tool_error"]) == (want, 0.0, False, kind)

    class Erroring(ToolArithmeticTask):
        def make_env(self, it):
            return ToolEnv(self, it, calculator)

    [ep] = run_episodes(
        ScriptedEngine(tok, lambda t: "⟦1/0⟧" if "⟩" not in t else "0#"),
        tok,
        Erroring(task.config),
        [item],
        1,
        SamplingParams(max_new_tokens=40),
    )
    assert ep.tool_errors == 1 and ("observation", "error: division by zero") in ep.conversation


def test_observation_is_sanitised(tok):
    ids = observation_ids(tok, "a#b⟧c€" + "x" * 100)
    text = tok.decode(ids)
    assert text.startswith("⟨a?b?c?x") and text.endswith("⟩") and len(text) == 66


def _loss(model, episodes, tok, adv):
    algo = algorithms.get("grpo")
    cfg = algo.Config(kl_coef=0.0)
    b = collate_samples(episodes, tok.pad_id)
    b = dataclasses.replace(b, advantages=broadcast(torch.tensor(adv), b.loss_mask))
    fn = policy_loss_fn(algo, cfg, 1.0)
    model.zero_grad()
    loss, _ = fn(model, b, batch_norm(b.loss_mask, b.loss_mask.shape[1]))
    loss.backward()
    return float(loss.detach()), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_loss_unchanged_when_tool_output_changes(tok, nano, task):
    """Same policy tokens, different observation text: same loss and same gradient, because
    observation tokens are masked (episodes that end on an observation: nothing conditions on it)."""
    items = task.items(2, "train", 4)
    eps = {}
    for name, tool in [("a", lambda s: "1234"), ("b", lambda s: "9z9z")]:

        class T(ToolArithmeticTask):
            def make_env(self, it, tool=tool):
                return ToolEnv(self, it, tool)

        eps[name] = run_episodes(
            ScriptedEngine(tok, caller), tok, T(task.config), items, 2, SamplingParams(max_new_tokens=40), max_turns=1
        )
    assert [e.response_ids for e in eps["a"]] != [e.response_ids for e in eps["b"]]
    assert [e.response_mask for e in eps["a"]] == [e.response_mask for e in eps["b"]]
    la, ga = _loss(nano, eps["a"], tok, [1.0, -1.0, 0.5, -0.5])
    lb, gb = _loss(nano, eps["b"], tok, [1.0, -1.0, 0.5, -0.5])
    assert la == pytest.approx(lb, abs=1e-6) and torch.allclose(ga, gb, atol=1e-7)
    # and the mask matters: unmasking the observation changes the loss
    unmasked = [dataclasses.replace(e, response_mask=[1] * len(e.response_ids)) for e in eps["b"]]
    assert _loss(nano, unmasked, tok, [1.0, -1.0, 0.5, -0.5])[0] != pytest.approx(lb, abs=1e-4)


def test_real_engine_episodes_render_the_template(tok, nano, task):
    """With the real engine and a random model: whatever it writes, prompt + response tokens are
    the rendered conversation, the masks mark exactly the injected spans, logprobs are finite."""
    items = task.items(4, "train", 5)
    eng = Engine(nano, tok, max_slots=16)
    eps = run_episodes(eng, tok, task, items, 3, SamplingParams(temperature=1.0, max_new_tokens=24), seed=1)
    again = run_episodes(eng, tok, task, items, 3, SamplingParams(temperature=1.0, max_new_tokens=24), seed=1)
    assert [e.response_ids for e in eps] == [e.response_ids for e in again]
    for e in eps:
        assert e.prompt_ids + e.response_ids == tok.encode(tok.render(e.item.question, e.conversation))
        want = []
        for role, text in e.conversation:
            want += [1] * len(text) if role == "policy" else [0] * len(tok.chat_tool_result(text))
        assert e.response_mask == want
        assert all(lp == 0.0 for lp, m in zip(e.response_logprobs, e.response_mask) if m == 0)
        assert all(lp <= 0.0 for lp, m in zip(e.response_logprobs, e.response_mask) if m == 1)
        assert isinstance(e, Episode) and e.finish_reason in ("stop", "length")


@pytest.mark.slow
def test_python_tool_env_runs_code_in_the_sandbox(tok):
    pytest.importorskip("posttrain.tasks.sandbox")
    task = ToolArithmeticTask(ToolArithmeticConfig(tool="python", min_digits=5, max_digits=5, demo_tool_frac=1.0))
    item = task.items(1, "train", 0)[0]
    assert item.target() == f"⟦print({item.question})⟧⟨{item.answer}⟩{item.answer}"
    env = task.make_env(item)
    env.reset()
    assert env.step(f"⟦print({item.question})⟧")[0] == str(item.answer)
    obs, _, done, info = env.step("⟦import sys; sys.exit(3)⟧")
    assert not done and obs.startswith("error:") and info["tool_error"] == "tool"
    env = task.make_env(item)
    env.reset()
    obs, _, _, info = env.step("⟦while True: pass⟧")
    assert obs == "error: timeout after 5s" and info["tool_error"] == "timeout"


def test_evaluation_splits_accuracy_by_tool_use(tok, task):
    """eval/acc_with_tool and eval/acc_without_tool say where held-out accuracy comes from."""
    from posttrain.eval import evaluate_episodes

    items = task.items(8, "test", 0)
    odd = lambda text: int(text[1 : text.index(">")].split("+")[0]) % 2 == 1  # first term odd: call the tool
    eng = ScriptedEngine(tok, lambda t: caller(t) if odd(t) else "12#")  # else a wrong guess
    eng.model = torch.nn.Linear(1, 1)
    out = evaluate_episodes(eng, tok, task, items, n=2, ks=(1,), max_new_tokens=40)
    share = sum(odd(f"<{it.question}>") for it in items) / len(items)
    assert 0 < share < 1
    assert out["eval/tool_call_rate"] == share and out["eval/pass@1"] == share
    assert out["eval/acc_with_tool"] == 1.0 and out["eval/acc_without_tool"] == 0.0
