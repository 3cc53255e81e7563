"""External rollouts inside RL: outside agent code drives episodes through the server; training uses
the served tokens. A real server on 127.0.0.1, real verifiers and OpenEnv packages, bounded requests."""

import math
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from posttrain.config import RLConfig, load_config
from posttrain.framework.batch import collate_samples
from posttrain.framework.logprobs import sequence_logprobs
from posttrain.framework.rollout import Engine
from posttrain.logging import read_metrics
from posttrain.serve.app import RLPolicy, create_app
from posttrain.serve.batcher import Batcher
from posttrain.serve.records import Recorder, episode_samples
from posttrain.serve.server import Server

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "envs"
T = 20.0


@pytest.fixture
def model_tok():
    from posttrain.models.gpt_mini import GPTMini, ModelConfig
    from posttrain.models.tokenizer import CharTokenizer

    tok = CharTokenizer()
    torch.manual_seed(1)
    return GPTMini(ModelConfig(preset="nano").resolved(tok.vocab_size)).eval(), tok


def test_tokens_trained_on_are_the_tokens_served(model_tok):
    """A scripted two-turn agent over HTTP; the episode's sample holds exactly the served completions
    (mask 1) with the observation between them (mask 0), and the trainer's recomputed logprobs equal
    the served ones within 1e-5 (fp32)."""
    model, tok = model_tok
    engine = Engine(model, tok, max_slots=8)
    batcher, rec = Batcher(engine), Recorder()
    server = Server(create_app(batcher, tok, "p", engine.max_len, policy=RLPolicy(1.0, 10, rec))).start()
    try:
        rec.open(["e"])
        served = []
        messages = [{"role": "user", "content": "12+30"}]
        for _turn in range(2):
            r = httpx.post(
                server.url + "/chat/completions",
                headers={"X-Episode-Id": "e"},
                timeout=T,
                json={"model": "p", "messages": messages, "logprobs": True, "return_token_ids": True},
            )
            assert r.status_code == 200
            body = r.json()
            ch = body["choices"][0]
            served.append(
                (body["prompt_token_ids"], ch["token_ids"], [c["logprob"] for c in ch["logprobs"]["content"]])
            )
            messages += [{"role": "assistant", "content": ch["message"]["content"]}, {"role": "user", "content": "7"}]
        turns = rec.close(["e"])["e"]
    finally:
        server.close()
        batcher.close()
    samples = episode_samples(turns, group=0, index=0)
    (p0, c0, l0), (p1, c1, l1) = served
    # the reply came back as text and the template re-rendered it: turn 1's prompt continues turn 0's tokens
    # (a reply cut by the length cap gets its end-of-turn from the template: an observation token, mask 0)
    assert p1[: len(p0) + len(c0)] == p0 + c0
    obs = p1[len(p0) + len(c0) :]
    assert tok.decode(obs) == ("<7>" if c0[-1] == tok.eot_id else "#<7>")
    assert len(samples) == 1
    s = samples[0]
    assert s.prompt_ids == p0 and s.response_ids == c0 + obs + c1
    assert s.response_mask == [1] * len(c0) + [0] * len(obs) + [1] * len(c1)
    batch = collate_samples(samples, tok.pad_id)
    lp, _ = sequence_logprobs(model, batch.input_ids, 1.0)  # [B, T]
    mask = batch.loss_mask.bool()
    assert batch.input_ids[mask].tolist() == c0 + c1  # trained on = served, in order
    served_lp = torch.tensor(l0 + l1)
    assert torch.allclose(batch.old_logprobs[mask], served_lp)  # behaviour logprobs as served
    assert (lp[mask] - served_lp).abs().max() < 1e-5  # recomputed = served (fp32)


def rl_cfg(out, init, task: list[str], **kw):
    over = [
        f"out={out}",
        f"init={init}",
        "steps=2",
        "eval_every=2",
        "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=3",
        "rollout.max_new_tokens=24",
        "eval.problems=3",
        "eval.samples=2",
        "eval.save_samples=2",
        "threads=1",
        "verifier.timeout_s=60",
        "device=cpu",  # trained on what was served, to 1e-4: the CPU's fp32
        *task,
    ]
    return load_config(RLConfig, None, over + [f"{k}={v}" for k, v in kw.items()])


@pytest.mark.slow
def test_a_verifiers_environment_trains_through_the_server(sft_ckpt, tmp_path):
    pytest.importorskip("verifiers")
    from posttrain.recipes import rl

    env = tmp_path / "sums_env.py"  # an environment written with verifiers alone, in a file
    env.write_text((EXAMPLES / "arith_verifiers.py").read_text())
    rl.run(rl_cfg(tmp_path / "run", sft_ckpt, [f"task.name=verifiers:{env}", "task.env_args={n: 50, eval_n: 20}"]))
    metrics = read_metrics(tmp_path / "run")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for m in metrics[1:]:
        assert m["rollout/episodes"] == 6 and m["rollout/requests"] == 6 and m["rollout/episodes_without_tokens"] == 0
        assert m["reward/errors"] == 0 and m["reward/timeouts"] == 0
        assert m["mismatch/logprob_abs"] < 1e-4  # trained on what was served
        assert 0.0 <= m["reward/mean"] <= 1.0 and "reward/last_number_is_the_sum" in m
    assert "eval/greedy_acc" in metrics[0] and "eval/pass@2" in metrics[-1]


def test_a_bad_verifiers_name_is_one_line_before_training(tmp_path):
    from posttrain import UsageError, tasks

    cfg = load_config(RLConfig, None, [f"task.name=verifiers:{tmp_path}/missing.py"])
    with pytest.raises(UsageError, match="no such file"):
        tasks.make(cfg.task)
    (tmp_path / "noenv.py").write_text("x = 1\n")
    with pytest.raises(UsageError, match="no load_environment"):
        tasks.make(load_config(RLConfig, None, [f"task.name=verifiers:{tmp_path}/noenv.py"]).task)


@pytest.fixture
def openenv_server():
    pytest.importorskip("openenv")
    sys.path.insert(0, str(EXAMPLES))
    try:
        import arith_openenv
    finally:
        sys.path.remove(str(EXAMPLES))
    server = Server(arith_openenv.app).start()  # the OpenEnv app (HTTP + WebSocket) on 127.0.0.1
    yield server.url[: -len("/v1")]
    server.close()


@pytest.mark.slow
def test_an_openenv_environment_trains_through_the_server(sft_ckpt, tmp_path, openenv_server):
    from posttrain.recipes import rl

    rl.run(
        rl_cfg(
            tmp_path / "run",
            sft_ckpt,
            ["task.name=openenv", f"task.url={openenv_server}", "task.observation_field=question"],
        )
    )
    metrics = read_metrics(tmp_path / "run")
    for m in metrics[1:]:
        assert m["rollout/episodes"] == 6 and m["rollout/episodes_without_tokens"] == 0
        assert m["reward/errors"] == 0 and m["reward/done"] == 1.0 and m["reward/turns"] == 1.0
        assert m["mismatch/logprob_abs"] < 1e-4
    first = (tmp_path / "run" / "first_prompt.txt").read_text()
    assert first.startswith("<") and first.endswith(">") and "+" in first  # the reset's question


class FaultyTask:
    """A user's external task whose episodes raise, hang, return a non-number or NaN, or play fairly."""

    external = True

    def items(self, n, split, seed):
        return ["raise", "hang", "text", "nan", "fair"][:n]

    def prompt(self, item):
        return "1+1"

    async def episode(self, item, endpoint, episode_id):
        import asyncio

        client = endpoint.openai(episode_id)
        reply = await client.chat.completions.create(
            model=endpoint.model, messages=[{"role": "user", "content": "1+1"}], max_tokens=4
        )
        await client.close()
        if item == "raise":
            raise RuntimeError("the environment broke")
        if item == "hang":
            await asyncio.sleep(60)
        return {"text": "high", "nan": math.nan}.get(item, float(len(reply.choices[0].message.content) >= 0))


@pytest.mark.slow
def test_an_environment_that_raises_hangs_or_lies_costs_its_episode_not_the_step(model_tok):
    from posttrain.envs.source import ExternalRollouts

    model, tok = model_tok
    cfg = load_config(
        RLConfig,
        None,
        [
            "rollout.prompts_per_step=5",
            "rollout.samples_per_prompt=2",
            "rollout.max_new_tokens=4",
            "verifier.timeout_s=10",
        ],
    )  # a loaded machine serves slowly
    src = ExternalRollouts(cfg, FaultyTask(), tok, Engine(model, tok, max_slots=16))
    try:
        samples, metrics = src.get(1)
    finally:
        src.close()
    assert metrics["reward/errors"] == 6 and metrics["reward/timeouts"] == 2  # raise, text, nan (×2); hang (×2)
    assert metrics["rollout/episodes_without_tokens"] == 0 and len(samples) == 10  # every served token is kept
    by_item = {s.item: s for s in samples}
    assert all(by_item[k].reward == 0.0 and by_item[k].reward_error for k in ("raise", "hang", "text", "nan"))
    assert by_item["fair"].reward == 1.0 and by_item["fair"].reward_error is None
    assert "timeout" in by_item["hang"].reward_error and "not a finite number" in by_item["nan"].reward_error


def test_held_out_episodes_the_environment_failed_are_counted_beside_the_accuracy(model_tok):
    from posttrain.envs.source import ExternalRollouts

    model, tok = model_tok
    cfg = load_config(RLConfig, None, ["rollout.max_new_tokens=4", "verifier.timeout_s=10"])
    src = ExternalRollouts(cfg, FaultyTask(), tok, Engine(model, tok, max_slots=16))
    try:
        res = src.evaluate(["raise", "text", "nan", "fair"], k=2)
    finally:
        src.close()
    # greedy: 3 failed episodes of 4; sampled: 2 × 3 of 8; only "fair" is correct
    assert res["eval/errors"] == 9 and res["eval/timeouts"] == 0
    assert res["eval/greedy_acc"] == 0.25 and res["eval/pass@1"] == 0.25 and res["eval/pass@2"] == 0.25


def test_an_openenv_server_at_capacity_makes_episodes_wait_not_fail(model_tok):
    # OpenEnv serves at most max_concurrent_envs sessions; 8 concurrent episodes against a server
    # holding 2 were refused (CAPACITY_REACHED) and scored 0: now they wait for a free session
    pytest.importorskip("openenv")
    from openenv.core.env_server.http_server import create_app as openenv_app

    from posttrain.envs.openenv_env import OpenEnvConfig, OpenEnvTask
    from posttrain.envs.source import ExternalRollouts

    sys.path.insert(0, str(EXAMPLES))
    try:
        import arith_openenv
    finally:
        sys.path.remove(str(EXAMPLES))
    env_server = Server(
        openenv_app(
            arith_openenv.SumEnvironment,
            arith_openenv.SumAction,
            arith_openenv.SumObservation,
            env_name="arith_sum",
            max_concurrent_envs=2,
        )
    ).start()
    model, tok = model_tok
    cfg = load_config(
        RLConfig,
        None,
        [
            "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=4",
            "rollout.max_new_tokens=8",
            "verifier.timeout_s=60",
        ],
    )
    task = OpenEnvTask(OpenEnvConfig(url=env_server.url[: -len("/v1")], observation_field="question"))
    src = ExternalRollouts(cfg, task, tok, Engine(model, tok, max_slots=16))
    try:
        samples, metrics = src.get(1)
    finally:
        src.close()
        env_server.close()
    assert metrics["reward/errors"] == 0 and metrics["reward/timeouts"] == 0
    assert metrics["rollout/episodes_without_tokens"] == 0 and len(samples) == 8
    assert metrics["reward/capacity_waits"] > 0 and metrics["reward/done"] == 1.0  # the server was full, and waited for
