"""Stages end to end on tiny budgets: they run, chain, and resume to identical numbers."""

import json

import pytest
import torch
from safetensors.torch import load_file

from posttrain import checkpoint
from posttrain.config import PretrainConfig, RLConfig, SFTConfig, load_config
from posttrain.logging import read_metrics
from posttrain.recipes import pretrain, rl, sft

from conftest import TINY_TASK




def _weights(run_dir):
    return load_file(str(checkpoint.latest(run_dir) / "model.safetensors"))


def _same_weights(a, b):
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _metrics_without_time(run_dir):
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "rollout/", "train/tokens_per_s"))}
            for m in read_metrics(run_dir)]


def test_chain_writes_run_directory(sft_ckpt):
    assert (sft_ckpt / "config.yaml").exists() and (sft_ckpt / "metrics.jsonl").exists()
    ckpt = checkpoint.latest(sft_ckpt)
    assert {p.name for p in ckpt.iterdir()} >= {"model.safetensors", "model.json", "trainer.pt", "meta.json",
                                                "tokenizer.posttrain.json"}
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
    common = [f"init={sft_ckpt}", "batch_size=8", "num_problems=200", "eval_problems=10", "save_every=2",
              "steps=5", *TINY_TASK]
    sft.run(load_config(SFTConfig, None, [f"out={tmp_path}/full", *common]))
    cfg = load_config(SFTConfig, None, [f"out={tmp_path}/half", *common])
    run_killed(monkeypatch, sft, cfg, die_on_step=4)
    assert checkpoint.latest(tmp_path / "half").name == "step_000002"
    sft.run(cfg, resume=True)
    assert _same_weights(tmp_path / "full", tmp_path / "half")
    assert _metrics_without_time(tmp_path / "full") == _metrics_without_time(tmp_path / "half")


def test_rl_runs_and_resumes_exactly(sft_ckpt, tmp_path, monkeypatch):
    common = [f"init={sft_ckpt}", "prompts_per_step=2", "samples_per_prompt=4", "eval_problems=4",
              "eval_samples=2", "save_every=1", "eval_every=0", "steps=3", "optim.schedule=cosine", *TINY_TASK]
    rl.run(load_config(RLConfig, None, [f"out={tmp_path}/full", *common]))
    cfg = load_config(RLConfig, None, [f"out={tmp_path}/half", *common])
    run_killed(monkeypatch, rl, cfg, die_on_step=3)
    rl.run(cfg, resume=True)
    full = read_metrics(tmp_path / "full")
    assert [m["step"] for m in full] == [0, 1, 2, 3] and "eval/pass@1" in full[0]   # step 0: the start
    assert all(m["ratio/mean"] == pytest.approx(1.0, abs=1e-4) for m in full[1:])
    assert all(m["mismatch/logprob_abs"] < 1e-4 for m in full[1:])
    assert "eval/pass@1" in full[-1] and "eval/pass@2" in full[-1]
    assert _same_weights(tmp_path / "full", tmp_path / "half")
    assert _metrics_without_time(tmp_path / "full") == _metrics_without_time(tmp_path / "half")
    assert (tmp_path / "full" / "samples.jsonl").exists()
