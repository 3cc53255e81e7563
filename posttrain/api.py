"""The Python API: every stage as a function, on the same config path as the CLI.

    import posttrain
    run = posttrain.rl(init="runs/sft", dataset="data/train.jsonl", reward_funcs=[correct, fmt],
                       reward_weights=[1.0, 0.1], steps=50, out="runs/x")
    run.metrics[-1]["eval/pass@1"], run.path, run.policy, run.evaluate(samples=8)

Keyword arguments are config keys: top-level ones by name (`steps=50`, `init=...`), sections as
dicts (`rollout={"samples_per_prompt": 4}`, `optim={"lr": 1e-5}`) or dotted through `**{...}`
(`**{"algo.kl_coef": 0.0}`); a YAML preset with `config="grpo_arith"`. They are validated exactly
like `key=value` on the command line (unknown keys, types, TRL's names). What only Python can
give is handed over as objects:

  dataset / test_dataset   a path, a list of row dicts, or a `datasets.Dataset`; rows in memory are
                           written to RUN_DIR/data/*.jsonl so the run's config.yaml points at them
  reward_funcs             callables (TRL's or verl's signature) or "FILE.py:FUNC" strings
  correct_func             a callable deciding correctness for evaluation
  pairs                    preference rows for dpo / rm (a path or a list of dicts)

Each function returns a `Run`: `.path`, `.metrics` (metrics.jsonl as dicts), `.summary` (the last
step's metrics and the final checkpoint), `.policy` (a `transformers` model for Hugging Face runs,
the gpt_mini module otherwise), `.tokenizer`, and `.evaluate(...)` on the run's own task.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from posttrain import tasks
from posttrain.errors import UsageError
from posttrain.logging import read_metrics
from posttrain.tasks import config_class, make
from posttrain.tasks.rewards import describe

STAGES = {
    "pretrain": ("posttrain.config:PretrainConfig", "posttrain.recipes.pretrain"),
    "sft": ("posttrain.config:SFTConfig", "posttrain.recipes.sft"),
    "rl": ("posttrain.config:RLConfig", "posttrain.recipes.rl"),
    "dpo": ("posttrain.config:DPOConfig", "posttrain.recipes.dpo"),
    "rm": ("posttrain.config:RMConfig", "posttrain.recipes.rm"),
}


@dataclass
class Run:
    """A finished stage: where it wrote, what it measured, and the trained policy."""

    path: Path
    stage: str
    summary: dict
    task: Any = field(default=None, repr=False)

    @property
    def metrics(self) -> list[dict]:
        return read_metrics(self.path)

    @cached_property
    def _loaded(self):
        from posttrain import checkpoint  # entry: no torch until called

        return checkpoint.load_model(self.path)

    @property
    def policy(self):
        """The trained weights: a transformers model for Hugging Face runs, else a gpt_mini module."""
        model = self._loaded[0]
        return getattr(model, "hf", model)

    @property
    def tokenizer(self):
        tok = self._loaded[1]
        return getattr(tok, "tok", tok)

    def evaluate(
        self,
        problems: int = 200,
        samples: int = 8,
        k=(1, 8),
        temperature: float = 1.0,
        seed: int = 0,
        max_new_tokens: int | None = None,
    ) -> dict:
        """Held-out greedy accuracy, pass@k, maj@k and mean reward of the final checkpoint on this run's
        task (its reward functions included)."""
        from posttrain.eval import evaluate  # entry: no torch until called
        from posttrain.tasks.pool import pool_for  # entry: no torch until called

        model, tok, _ = self._loaded
        task = self.task if self.task is not None else _task_of_run(self.path)
        items = task.items(problems, "test", seed)
        with pool_for(task, _config_of_run(self.path)) as pool:  # as the run scored: workers for your code
            res = evaluate(
                model,
                tok,
                task,
                items,
                n=samples,
                ks=tuple(x for x in k if x <= samples),
                temperature=temperature,
                seed=seed,
                max_new_tokens=max_new_tokens,
                pool=pool,
            )
        res.pop("per_k")
        return res


def _config_of_run(path: Path) -> dict:
    import yaml

    file = Path(path, "config.yaml")
    return (yaml.safe_load(file.read_text()) or {}) if file.exists() else {}


def _task_of_run(path: Path):
    from posttrain.config import build  # entry: no torch until called

    section = _config_of_run(path).get("task") or {}
    return make(build(config_class(section.get("name", "arithmetic")), section, "task."))


def _rows_file(rows, out: Path, name: str) -> str:
    """A path for rows given in memory (a list of dicts, a `datasets.Dataset`): written under
    RUN_DIR/data/, so the run's config names a real file."""
    if isinstance(rows, (str, Path)):
        return str(rows)
    path = out / "data" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    if hasattr(rows, "to_list"):  # a datasets.Dataset
        rows = rows.to_list()
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise UsageError(f"{name}: give a path, a list of row dicts or a datasets.Dataset")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _nest(kwargs: dict) -> dict:
    """`{"algo.kl_coef": 0}` and `{"algo": {...}}` as one nested dict."""
    out: dict = {}
    for key, value in kwargs.items():
        *path, leaf = key.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        if isinstance(value, dict) and isinstance(node.get(leaf), dict):
            node[leaf] = {**node[leaf], **value}
        else:
            node[leaf] = value
    return out


def run_stage(
    stage: str,
    config: str | None = None,
    *,
    resume: bool = False,
    dataset=None,
    test_dataset=None,
    reward_funcs=None,
    reward_weights=None,
    correct_func=None,
    pairs=None,
    **keys,
) -> Run:
    """One stage through the CLI's config path; see the module docstring."""
    from posttrain.config import load_config  # entry: no torch until called

    cls_path, module = STAGES[stage]
    module_name, cls_name = cls_path.split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    data = _nest(keys)
    if (
        (reward_funcs is not None or correct_func is not None)
        and dataset is None
        and (data.get("task") or {}).get("name") != "dataset"
    ):
        raise UsageError(
            "reward_funcs= and correct_func= need a dataset: pass dataset= (or task={'name': 'dataset', ...})"
        )
    out = Path(data.get("out") or f"runs/{stage}")
    data["out"] = str(out)
    task_keys = data.setdefault("task", {}) if any(x is not None for x in (dataset, reward_funcs, correct_func)) else {}
    if dataset is not None:
        task_keys.update(name="dataset", train=_rows_file(dataset, out, "train"))
        if test_dataset is not None:
            task_keys["test"] = _rows_file(test_dataset, out, "test")
    if reward_funcs is not None:
        task_keys["reward"] = ",".join(f if isinstance(f, str) else describe(f) for f in reward_funcs)  # the record
    if reward_weights is not None:
        task_keys["reward_weights"] = list(reward_weights)
    if pairs is not None:
        data["pairs"] = _rows_file(pairs, out, "pairs")
    cfg = load_config(cls, config, data=data)
    task = None
    if reward_funcs is not None or correct_func is not None:  # Python callables travel as objects
        task = tasks.make(cfg.task, reward_funcs=reward_funcs, correct_func=correct_func)
    recipe = importlib.import_module(module)
    summary = recipe.run(cfg, resume=resume, task=task) if task is not None else recipe.run(cfg, resume=resume)
    return Run(Path(cfg.out or f"runs/{stage}"), stage, summary, task)


def pretrain(config: str | None = None, **keys) -> Run:
    """Pretraining (next-token) on a task's corpus; see `posttrain pretrain --help` for the keys."""
    return run_stage("pretrain", config, **keys)


def sft(config: str | None = None, **keys) -> Run:
    """Supervised fine-tuning; `dataset=` rows with prompt/completion or messages."""
    return run_stage("sft", config, **keys)


def rl(config: str | None = None, **keys) -> Run:
    """RL (GRPO and the zoo: `algo={"name": ...}`); `dataset=` + `reward_funcs=` for your own problem."""
    return run_stage("rl", config, **keys)


def dpo(config: str | None = None, **keys) -> Run:
    """DPO and its family; `pairs=` TRL preference rows (or sampled from the policy and the task)."""
    return run_stage("dpo", config, **keys)


def rm(config: str | None = None, **keys) -> Run:
    """A Bradley–Terry (or ORM) reward model; `pairs=` TRL preference rows."""
    return run_stage("rm", config, **keys)
