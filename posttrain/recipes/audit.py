"""samples.jsonl: the audited samples of a run, token by token (docs/architecture.md §7)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from posttrain.config import RLConfig
from posttrain.framework.batch import RolloutBatch
from posttrain.framework.logprobs import sequence_logprobs
from posttrain.framework.loop import eval_due
from posttrain.framework.world import current


class Audit:
    """samples.jsonl, the per-sample trace (docs/architecture.md §7): at every evaluation, the highest-reward
    and some random samples of the step just trained, token by token.

    Hooked into the controller before the update (`Controller.on_batch`), so the batch still
    holds what the loss saw: behaviour logprobs (sampler), reference logprobs, advantages. The
    trainer's logprobs are one no-grad forward on the audited rows only, at the weights that
    sampled them: trainer − behaviour is the sampler/trainer mismatch of each token.

    With N ranks the pick is the 1-rank run's, over every rank's samples in rank order (their rewards
    gathered); each rank writes the rows of the picked samples it holds, and rank 0 gathers the rows.
    """

    def __init__(self, run_dir: Path, model, tok, cfg: RLConfig, runtime):
        self.path, self.model, self.tok, self.cfg, self.rt = Path(run_dir, "samples.jsonl"), model, tok, cfg, runtime
        self.rows: list[dict] = []
        self.world = current()

    def on_batch(self, step: int, samples, batch: RolloutBatch) -> None:
        if not eval_due(self.cfg, step) or self.cfg.eval.save_samples <= 0:
            return
        rewards = self.world.gather([[s.reward for s in samples]])  # one list per rank
        first = sum(len(r) for r in rewards[: self.world.rank])  # this rank's first sample, globally
        every = [x for r in rewards for x in r]
        order = sorted(range(len(every)), key=lambda i: -every[i])
        top = order[: self.cfg.eval.save_samples // 2]
        rest = [i for i in range(len(every)) if i not in top]
        rest = random.Random(f"{self.cfg.seed}/{step}").sample(
            rest, min(len(rest), self.cfg.eval.save_samples - len(top))
        )
        chosen = top + rest
        pick = [i - first for i in chosen if first <= i < first + len(samples)]  # the ones held here
        rows = self._rows(step, samples, batch, pick, {i - first for i in top}) if pick else []
        position = {i: k for k, i in enumerate(chosen)}
        mine = [(position[i + first], row) for i, row in zip(pick, rows)]
        self.rows += [row for _, row in sorted(self.world.gather(mine), key=lambda x: x[0])]

    def _rows(self, step: int, samples, batch: RolloutBatch, pick: list[int], top: set[int]) -> list[dict]:
        out = []
        with torch.no_grad(), self.rt.autocast():
            trainer_lp, _ = sequence_logprobs(self.model, batch.input_ids[pick], self.cfg.rollout.temperature)  # [n, T]
        columns = {
            "behaviour_logprobs": batch.old_logprobs[pick],
            "trainer_logprobs": trainer_lp,
            "ref_logprobs": batch.ref_logprobs[pick] if batch.ref_logprobs is not None else None,
            "advantages": batch.advantages[pick],
        }
        for row, i in enumerate(pick):
            s = samples[i]
            cols = slice(len(s.prompt_ids), len(s.prompt_ids) + len(s.response_ids))  # response tokens
            per_token = {
                k: None if v is None else [round(float(x), 5) for x in v[row, cols].float().cpu()]
                for k, v in columns.items()
            }
            out.append(
                {
                    "step": step,
                    "selection": "top" if i in top else "random",
                    "policy_version": s.policy_version,
                    "prompt": self.tok.decode(s.prompt_ids),
                    "response": s.text,
                    "response_ids": s.response_ids,
                    "response_tokens": [self.tok.decode([t]) for t in s.response_ids],
                    **per_token,
                    "advantage": round(sum(per_token["advantages"]) / max(len(s.response_ids), 1), 5),  # token mean
                    "reward": s.reward,
                    "components": s.reward_components,
                    "finish_reason": s.finish_reason,
                    "error": s.reward_error,
                }
            )
        return out

    def flush(self) -> None:
        """Append the rows captured for this evaluation (none at step 0: nothing was trained); rank 0 writes."""
        if not self.world.main:
            self.rows = []
            return
        with open(self.path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in self.rows)
        self.rows = []
