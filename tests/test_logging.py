"""Metric sinks (jsonl, TensorBoard, W&B offline) and the per-sample trace in samples.jsonl."""

import json
import sys
import time

import pytest

from posttrain.config import RLConfig, load_config
from posttrain.logging import RunLogger, WandbConfig, read_jsonl, truncate_jsonl

from conftest import TINY_TASK


def _scalars(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run_dir / "tensorboard"))
    ea.Reload()
    return [(e.step, e.value) for e in ea.Scalars(tag)]


def test_tensorboard_events_hold_the_logged_scalars_and_a_resume_replaces_later_steps(tmp_path):
    log = RunLogger(tmp_path, "t", 3)
    for step in (1, 2, 3):
        log.log(step, {"loss": 1.0 / step, "reward/mean": 0.25 * step, "note": "text is not a scalar"})
    log.close()
    assert _scalars(tmp_path, "loss") == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    assert _scalars(tmp_path, "reward/mean") == [(1, 0.25), (2, 0.5), (3, 0.75)]
    # resumed from step 2: the killed run's step 3 is dropped from every sink, then re-logged
    log = RunLogger(tmp_path, "t", 4, start_step=2)
    log.log(3, {"loss": 9.0})
    log.log(4, {"loss": 8.0})
    log.close()
    assert _scalars(tmp_path, "loss") == [(1, 1.0), (2, 0.5), (3, 9.0), (4, 8.0)]
    assert [m["loss"] for m in read_jsonl(tmp_path / "metrics.jsonl")] == [1.0, 0.5, 9.0, 8.0]


def test_without_tensorboard_a_note_is_printed_once_and_jsonl_still_written(tmp_path, monkeypatch, capsys):
    from posttrain import logging as plog

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    monkeypatch.setattr(plog, "_notes_shown", set())
    for name in ("a", "b"):
        log = RunLogger(tmp_path / name, "t", 1)
        log.log(1, {"loss": 2.0})
        log.close()
    out = capsys.readouterr().out
    assert out.count("note: TensorBoard event files are off: the tensorboard package is not installed") == 1
    assert not (tmp_path / "a" / "tensorboard").exists()
    assert read_jsonl(tmp_path / "b" / "metrics.jsonl") == [{"step": 1, "loss": 2.0}]


def test_wandb_offline_writes_its_run_directory_and_resume_continues_the_same_run(tmp_path):
    log = RunLogger(tmp_path, "rl", 2, wandb=WandbConfig(project="posttrain-test", mode="offline"), config={"steps": 2})
    log.log(1, {"loss": 1.0})
    log.close()
    run_id = (tmp_path / "wandb_run_id").read_text()
    files = list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(files) == 1 and files[0].stat().st_size > 0
    second = int(time.time())  # wandb names offline run directories by the second: a resume
    while int(time.time()) == second:  # started within the same second would reuse the first one's
        time.sleep(0.05)
    log = RunLogger(tmp_path, "rl", 2, start_step=1, wandb=WandbConfig(project="posttrain-test", mode="offline"))
    log.log(2, {"loss": 0.5})
    log.close()
    assert (tmp_path / "wandb_run_id").read_text() == run_id
    assert len(list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))) == 2


def test_truncate_jsonl_keeps_rows_up_to_the_resume_step(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps({"step": s, "i": i}) + "\n" for s in (1, 2, 2, 3) for i in range(1)))
    truncate_jsonl(path, 2)
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 2]
    truncate_jsonl(path, 0)  # a fresh run starts with no rows
    assert not path.exists()


def test_rl_trace_rows_hold_per_token_logprobs_and_advantages(sft_ckpt, tmp_path, monkeypatch):
    """samples.jsonl at each eval: top-reward + random rows; trainer logprobs (taken before the
    update) equal the behaviour ones; at step 1 the reference is the policy itself."""
    from posttrain.recipes import rl
    from posttrain.tasks.arithmetic import ArithmeticTask
    from posttrain.tasks.base import RewardResult

    # a reward with spread (parity of the response length) so advantages are not all zero
    monkeypatch.setattr(
        ArithmeticTask,
        "reward",
        lambda self, item, text: RewardResult(float(len(text) % 2), {"parity": float(len(text) % 2)}),
    )
    cfg = load_config(
        RLConfig,
        None,
        [
            f"init={sft_ckpt}",
            f"out={tmp_path}/rl",
            "prompts_per_step=2",
            "samples_per_prompt=4",
            "steps=2",
            "eval_every=1",
            "eval_problems=2",
            "eval_samples=1",
            "save_samples=4",
            "tensorboard=false",
            "device=cpu",  # trainer = behaviour logprobs to 1e-4: the CPU's fp32, not a GPU's bf16
            *TINY_TASK,
        ],
    )
    rl.run(cfg)
    rows = read_jsonl(tmp_path / "rl" / "samples.jsonl")
    assert [r["step"] for r in rows] == [1] * 4 + [2] * 4
    assert [r["selection"] for r in rows[:4]] == ["top", "top", "random", "random"]
    assert [r["policy_version"] for r in rows] == [0] * 4 + [1] * 4
    for step_rows in (rows[:4], rows[4:]):
        assert min(r["reward"] for r in step_rows[:2]) >= max(r["reward"] for r in step_rows[2:])
    for r in rows:
        n = len(r["response_ids"])
        assert "".join(r["response_tokens"]) == r["response"] and n > 0
        assert all(len(r[k]) == n for k in ("behaviour_logprobs", "trainer_logprobs", "ref_logprobs", "advantages"))
        assert max(abs(a - b) for a, b in zip(r["trainer_logprobs"], r["behaviour_logprobs"])) < 1e-4
        assert len(set(r["advantages"])) == 1 and r["advantage"] == pytest.approx(
            r["advantages"][0]
        )  # GRPO: one a sequence
        assert (r["advantage"] >= 0) == (r["reward"] == 1.0) or r["advantage"] == 0.0
        assert r["components"] == {"parity": r["reward"]} and r["finish_reason"] in ("stop", "length")
    assert all(r["ref_logprobs"] == pytest.approx(r["behaviour_logprobs"], abs=1e-4) for r in rows[:4])
    assert any(r["advantage"] != 0.0 for r in rows)
    from posttrain import checkpoint  # the policy version travels in the checkpoint

    assert checkpoint.load_trainer_state(checkpoint.latest(tmp_path / "rl"))["extra"]["policy_version"] == 2


# ---- the step plan printed at start ------------------------------------------------------------


def _plan_line(out: str, stage: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(f"[{stage}] "))


def test_step_plan_of_pretrain_and_sft_counts_what_the_trainer_does(sft_ckpt, tmp_path, capsys):
    from posttrain.config import PretrainConfig, SFTConfig
    from posttrain.models.tokenizer import CharTokenizer
    from posttrain.recipes import pretrain, sft
    from posttrain.recipes.common import EpochIndices
    from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask

    # 4 windows of 32 tokens; 100-token micro-batches hold 3 rows (96) → 2 micro-batches
    pretrain.run(
        load_config(
            PretrainConfig,
            None,
            [
                f"out={tmp_path}/pt",
                "steps=1",
                "batch_size=4",
                "seq_len=32",
                "corpus_chars=4000",
                "optim.micro_batch_tokens=100",
                "tensorboard=false",
                *TINY_TASK,
            ],
        )
    )
    line = _plan_line(capsys.readouterr().out, "pretrain")
    assert (
        "prompts/step: 0  samples/step: 4  tokens/step: 128  loss tokens/step: 124  micro-batches/step: 2  "
        "optimizer steps/step: 1  steps: 1"
    ) in line
    assert read_jsonl(tmp_path / "pt" / "metrics.jsonl")[0]["train/micro_batches"] == 2
    # SFT, 8 examples a step, one row per micro-batch: token counts of step 1's examples, by hand
    sft.run(
        load_config(
            SFTConfig,
            None,
            [
                f"out={tmp_path}/sft",
                f"init={sft_ckpt}",
                "steps=1",
                "batch_size=8",
                "num_problems=100",
                "eval_problems=2",
                "optim.micro_batch_tokens=1",
                "tensorboard=false",
                *TINY_TASK,
            ],
        )
    )
    line = _plan_line(capsys.readouterr().out, "sft")
    tok, task = CharTokenizer(), ArithmeticTask(ArithmeticConfig(max_terms=3))
    items = [task.items(100, "train", 0)[i] for i in EpochIndices(100, 8, 0)(1)]
    prompt = sum(len(tok.encode(tok.chat_prompt(task.prompt(it)))) for it in items)
    response = sum(len(tok.encode(tok.chat_response(it.target(True)))) for it in items)
    assert (
        f"prompts/step: 8  samples/step: 8  tokens/step: {prompt + response:,}  loss tokens/step: {response:,}  "
        "micro-batches/step: 8  optimizer steps/step: 1  steps: 1"
    ) in line
    assert read_jsonl(tmp_path / "sft" / "metrics.jsonl")[0]["train/micro_batches"] == 8


def test_rl_step_plan_bounds():
    from posttrain.models.tokenizer import CharTokenizer
    from posttrain.recipes.rl import rl_plan
    from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask

    tok, task = CharTokenizer(), ArithmeticTask(ArithmeticConfig(max_terms=3))
    cfg = load_config(
        RLConfig,
        None,
        [
            "prompts_per_step=4",
            "samples_per_prompt=4",
            "epochs=2",
            "minibatches=2",
            "max_new_tokens=20",
            "optim.micro_batch_tokens=100",
            *TINY_TASK,
        ],
    )
    prompt = max(len(tok.encode(tok.chat_prompt(task.prompt(it)))) for it in task.items(200, "train", 0))
    assert 8 <= prompt <= 15  # "<a+b+c>" with numbers below 100, plus the template
    rows = 100 // (prompt + 20)  # rows of width prompt+20 in one micro-batch
    assert rl_plan(cfg, tok, task) == {
        "prompts/step": 4,
        "samples/prompt": 4,
        "samples/step": 16,
        "max tokens/step": 16 * (prompt + 20),
        "max micro-batches/step": 4 * -(-8 // rows),
        "optimizer steps/step": 4,
    }
