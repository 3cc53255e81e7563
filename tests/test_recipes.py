"""Stages end to end on tiny budgets: they run, chain, and resume to identical numbers."""

import json

import pytest
import torch
from safetensors.torch import load_file

from posttrain import checkpoint
from posttrain.config import RLConfig, SFTConfig, load_config
from posttrain.logging import read_jsonl, read_metrics
from posttrain.recipes import dpo, rl, sft

from conftest import TINY_TASK


def _weights(run_dir):
    return load_file(str(checkpoint.latest(run_dir) / "model.safetensors"))


def _same_weights(a, b):
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _metrics_without_time(run_dir):
    return [
        {k: v for k, v in m.items() if not k.startswith(("time/", "rollout/", "train/tokens_per_s", "memory/"))}
        for m in read_metrics(run_dir)
    ]


def test_chain_writes_run_directory(sft_ckpt):
    assert (sft_ckpt / "config.yaml").exists() and (sft_ckpt / "metrics.jsonl").exists()
    ckpt = checkpoint.latest(sft_ckpt)
    assert {p.name for p in ckpt.iterdir()} >= {
        "model.safetensors",
        "model.json",
        "trainer.pt",
        "meta.json",
        "tokenizer.posttrain.json",
    }
    assert json.loads((ckpt / "meta.json").read_text())["stage"] == "sft"


class Killed(Exception):
    pass


def run_killed(monkeypatch, module, cfg, die_on_step: int):
    """Run a stage and kill it (no save, like SIGKILL) in the middle of optimizer step `die_on_step`."""
    from posttrain.framework.trainer import Trainer

    calls = {"n": 0}
    real = Trainer.step

    def dying(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == die_on_step:
            raise Killed
        return real(self, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(Trainer, "step", dying)
        with pytest.raises(Killed):
            module.run(cfg)


def test_sft_resume_is_exact(sft_ckpt, tmp_path, monkeypatch):
    common = [
        f"init={sft_ckpt}",
        "batch_size=8",
        "num_problems=200",
        "eval_problems=10",
        "save_every=2",
        "steps=5",
        "device=cpu",  # the same numbers after a resume: the CPU's fp32 (a GPU's bf16 and atomics differ)
        *TINY_TASK,
    ]
    sft.run(load_config(SFTConfig, None, [f"out={tmp_path}/full", *common]))
    cfg = load_config(SFTConfig, None, [f"out={tmp_path}/half", *common])
    run_killed(monkeypatch, sft, cfg, die_on_step=4)
    assert checkpoint.latest(tmp_path / "half").name == "step_000002"
    sft.run(cfg, resume=True)
    assert _same_weights(tmp_path / "full", tmp_path / "half")
    assert _metrics_without_time(tmp_path / "full") == _metrics_without_time(tmp_path / "half")


@pytest.mark.slow
def test_rl_runs_and_resumes_exactly(sft_ckpt, tmp_path, monkeypatch):
    common = [
        f"init={sft_ckpt}",
        "prompts_per_step=2",
        "samples_per_prompt=4",
        "eval_problems=4",
        "eval_samples=2",
        "save_every=1",
        "eval_every=0",
        "steps=3",
        "optim.schedule=cosine",
        "device=cpu",  # the same numbers after a resume: the CPU's fp32 (a GPU's bf16 and atomics differ)
        *TINY_TASK,
    ]
    rl.run(load_config(RLConfig, None, [f"out={tmp_path}/full", *common]))
    cfg = load_config(RLConfig, None, [f"out={tmp_path}/half", *common])
    run_killed(monkeypatch, rl, cfg, die_on_step=3)
    rl.run(cfg, resume=True)
    full = read_metrics(tmp_path / "full")
    assert [m["step"] for m in full] == [0, 1, 2, 3] and "eval/pass@1" in full[0]  # step 0: the start
    assert all(m["ratio/mean"] == pytest.approx(1.0, abs=1e-4) for m in full[1:])
    assert all(m["mismatch/logprob_abs"] < 1e-4 for m in full[1:])
    assert "eval/pass@1" in full[-1] and "eval/pass@2" in full[-1]
    assert _same_weights(tmp_path / "full", tmp_path / "half")
    assert _metrics_without_time(tmp_path / "full") == _metrics_without_time(tmp_path / "half")
    assert read_jsonl(tmp_path / "full" / "samples.jsonl") == read_jsonl(tmp_path / "half" / "samples.jsonl") != []


def _pairs_file(path, n=24):
    """Verifier-style pairs from the task's gold traces: rejected ends in a wrong answer."""
    from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask

    task = ArithmeticTask(ArithmeticConfig(max_terms=3))
    rows = [
        {
            "prompt": task.prompt(it),
            "chosen": it.target(True),
            "rejected": it.target(True)[: -len(str(it.answer))] + str(it.answer + 1),
        }
        for it in task.items(n, "train", 0)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("loss_type", ["dpo", "simpo"])
def test_dpo_runs_and_resumes_exactly(sft_ckpt, tmp_path, monkeypatch, loss_type):
    pairs = _pairs_file(tmp_path / "pairs.jsonl")
    common = [
        f"init={sft_ckpt}",
        f"pairs={pairs}",
        f"loss_type={loss_type}",
        "batch_size=4",
        "steps=4",
        "save_every=2",
        "eval_every=0",
        "eval_problems=4",
        "eval_samples=2",
        "optim.micro_batch_tokens=40",
        "device=cpu",  # log 2 to 1e-5 and a resume to the bit: the CPU's fp32
        *TINY_TASK,
    ]
    dpo.run(load_config(dpo.DPOConfig, None, [f"out={tmp_path}/full", *common]))
    full = read_metrics(tmp_path / "full")
    assert [m["step"] for m in full] == [0, 1, 2, 3, 4] and "eval/pass@1" in full[0]
    assert all(m["train/micro_batches"] > 1 for m in full[1:])  # pairs split across micro-batches
    if loss_type == "dpo":
        assert full[1]["loss"] == pytest.approx(0.693147, abs=1e-5)  # policy = reference: log 2
        assert full[1]["pref/margin"] == pytest.approx(0.0, abs=1e-6)
    assert (tmp_path / "full" / "pairs.jsonl").read_text().count("\n") == 24
    cfg = load_config(dpo.DPOConfig, None, [f"out={tmp_path}/half", *common])
    run_killed(monkeypatch, dpo, cfg, die_on_step=4)
    dpo.run(cfg, resume=True)
    assert _same_weights(tmp_path / "full", tmp_path / "half")
    assert _metrics_without_time(tmp_path / "full") == _metrics_without_time(tmp_path / "half")


def test_dpo_micro_batches_give_the_full_batch_gradient(sft_ckpt, tmp_path):
    """The per-pair loss normalised by the WHOLE batch's pairs: micro-batch gradients add up."""
    from posttrain.algorithms.core import batch_norm
    from posttrain.preference.data import collate_pairs, encode_pairs, load_jsonl

    model, tok, _ = checkpoint.load_model(sft_ckpt)
    encoded = encode_pairs(tok, load_jsonl(_pairs_file(tmp_path / "p.jsonl", 6))[0])
    batch = collate_pairs(encoded, range(6), tok.pad_id)
    batch["ref_logps"] = torch.linspace(-9, -3, 12)
    loss_fn = dpo.dpo_loss_fn(dpo.loss_config(dpo.DPOConfig()))
    grads = []
    for max_tokens in (10_000, 60):
        from posttrain.framework.batch import split_micro_batches

        model.zero_grad()
        norm = batch_norm(batch["loss_mask"])
        parts = split_micro_batches(batch, max_tokens, unit=2)
        for mb in parts:
            loss_fn(model, mb, norm)[0].backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert len(parts) > 1
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_dpo_bad_inputs(sft_ckpt, tmp_path):
    from posttrain import UsageError

    with pytest.raises(UsageError, match="loss_type='dpop' is unknown"):
        dpo.run(load_config(dpo.DPOConfig, None, [f"init={sft_ckpt}", "loss_type=dpop", f"out={tmp_path}/a"]))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+2", "chosen": "3"}\n')
    with pytest.raises(UsageError, match="bad.jsonl:1: missing field 'rejected'"):
        dpo.run(load_config(dpo.DPOConfig, None, [f"init={sft_ckpt}", f"pairs={bad}", f"out={tmp_path}/b"]))
    # one sample per prompt never gives a right and a wrong answer: no pair, and the error says why
    # (was "a 3-step model is wrong on every prompt", which depends on the random init)
    with pytest.raises(UsageError, match="no preference pairs .*all_wrong"):
        dpo.run(
            load_config(
                dpo.DPOConfig,
                None,
                [f"init={sft_ckpt}", "pair_prompts=8", "samples_per_prompt=1", f"out={tmp_path}/c", *TINY_TASK],
            )
        )


def test_pipeline_chains_stages_skips_done_ones_and_validates(tmp_path):
    from posttrain import UsageError
    from posttrain.recipes import pipeline

    pairs = _pairs_file(tmp_path / "pairs.jsonl")
    over = [
        f"out={tmp_path}/pipe",
        "eval_problems=4",
        "eval_samples=2",
        "task.max_terms=3",
        "pretrain.steps=2",
        "pretrain.batch_size=4",
        "pretrain.seq_len=32",
        "pretrain.corpus_chars=4000",
        "sft.steps=2",
        "sft.batch_size=8",
        "sft.num_problems=100",
        "sft.eval_problems=4",
        "dpo.steps=2",
        f"dpo.pairs={pairs}",
        "dpo.batch_size=4",
        "dpo.eval_problems=4",
        "dpo.eval_samples=2",
        "rl.steps=2",
        "rl.prompts_per_step=2",
        "rl.samples_per_prompt=2",
        "rl.eval_problems=4",
        "rl.eval_samples=2",
    ]
    cfg = load_config(pipeline.PipelineConfig, None, over)
    rows = pipeline.run(cfg)["rows"]
    assert [r["stage"] for r in rows] == ["pretrain", "sft", "dpo", "rl"]
    assert all(0 <= r["pass@1"] <= 1 and r["wall_s"] > 0 for r in rows)
    assert json.loads((tmp_path / "pipe" / "summary.json").read_text()) == rows
    page = (tmp_path / "pipe" / "rl" / "report.html").read_text()  # the RL stage's report, with
    assert "Health alarms" in page and "by the throughput equation" in page  # its throughput.json
    # each stage starts from the one before it
    for prev, name in [("pretrain", "sft"), ("sft", "dpo"), ("dpo", "rl")]:
        assert str(tmp_path / "pipe" / prev) in (tmp_path / "pipe" / name / "config.yaml").read_text()
    again = pipeline.run(cfg)["rows"]  # everything done: skipped, same weights, and the
    assert [r["wall_s"] for r in again] == [r["wall_s"] for r in rows]  # times the stages took when they ran
    assert [r["pass@1"] for r in again] == [r["pass@1"] for r in rows]
    with pytest.raises(UsageError, match="stages='sft,pretrain'"):
        pipeline.run(load_config(pipeline.PipelineConfig, None, [*over, "stages=sft,pretrain"]))


def test_kill_during_checkpoint_write_keeps_the_previous_one(sft_ckpt, tmp_path, monkeypatch):
    """A crash inside save (here: while writing trainer.pt of step 4) leaves step 2 loadable,
    no half-written checkpoint under a real name, and --resume finishes to the same weights."""
    common = [
        f"init={sft_ckpt}",
        "batch_size=8",
        "num_problems=200",
        "eval_problems=10",
        "save_every=2",
        "steps=6",
        "device=cpu",  # the same numbers after a resume: the CPU's fp32 (a GPU's bf16 and atomics differ)
        *TINY_TASK,
    ]
    sft.run(load_config(SFTConfig, None, [f"out={tmp_path}/full", *common]))
    cfg = load_config(SFTConfig, None, [f"out={tmp_path}/half", *common])
    real_save, calls = torch.save, {"n": 0}

    def dying_save(obj, f, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:  # the second checkpoint's trainer.pt
            with open(f, "wb") as fh:
                fh.write(b"half")  # a torn write, then the process dies
            raise Killed
        return real_save(obj, f, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(torch, "save", dying_save)
        with pytest.raises(Killed):
            sft.run(cfg)
    ckpts = sorted(p.name for p in (tmp_path / "half" / "checkpoints").iterdir())
    assert ckpts == ["step_000002", "step_000004.tmp"]
    assert checkpoint.latest(tmp_path / "half").name == "step_000002"
    checkpoint.load_trainer_state(checkpoint.latest(tmp_path / "half"))  # loadable
    sft.run(cfg, resume=True)
    assert _same_weights(tmp_path / "full", tmp_path / "half")
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "half" / "checkpoints").iterdir())


def test_nonfinite_steps_in_a_row_stop_the_run_with_a_checkpoint(sft_ckpt, tmp_path, monkeypatch, capsys):
    from posttrain import TrainingHalted, cli
    from posttrain.recipes import common

    monkeypatch.setattr(common, "lm_loss", lambda model, mb, norm: (model(mb["input_ids"]).sum() * float("nan"), {}))
    monkeypatch.setattr(sft, "lm_loss", common.lm_loss)
    args = [
        "sft",
        f"init={sft_ckpt}",
        "batch_size=4",
        "num_problems=50",
        "steps=20",
        "max_nonfinite_steps=3",
        f"out={tmp_path}/nan",
        *TINY_TASK,
    ]
    assert cli.main(args) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("posttrain sft: stopped: 3 steps in a row had a non-finite loss") and "\n" not in err
    assert checkpoint.latest(tmp_path / "nan").name == "step_000003"
    ms = read_metrics(tmp_path / "nan")
    assert [m["train/nonfinite_skipped"] for m in ms] == [1.0, 1.0, 1.0]
    with pytest.raises(TrainingHalted):
        sft.run(load_config(SFTConfig, None, args[1:] + ["overwrite=true"]))


def test_sft_target_acc_stops_at_the_first_evaluation_that_reaches_it(sft_ckpt, tmp_path, monkeypatch):
    from posttrain.recipes import chain

    accs = iter([0.2, 0.4, 0.6, 0.8])  # greedy accuracy at steps 2, 4, 6, 8

    def fake_evaluate(*args, **kwargs):
        return {"eval/greedy_acc": next(accs), "per_k": {}}

    monkeypatch.setattr(sft, "evaluate", fake_evaluate)
    cfg = load_config(
        SFTConfig,
        None,
        [
            f"out={tmp_path}/sft",
            f"init={sft_ckpt}",
            "steps=10",
            "eval_every=2",
            "target_acc=0.5",
            "batch_size=4",
            "num_problems=50",
            *TINY_TASK,
        ],
    )
    summary = sft.run(cfg)
    last = checkpoint.latest(tmp_path / "sft")
    assert last.name == "step_000006" and summary["eval/greedy_acc"] == 0.6
    assert "0.600 ≥ target_acc 0.5" in json.loads((last / "meta.json").read_text())["finished_early"]
    assert [m["step"] for m in read_metrics(tmp_path / "sft")][-1] == 6
    assert chain._run_stage(sft, cfg, tmp_path / "sft") == 0.0  # the pipeline counts it as done
