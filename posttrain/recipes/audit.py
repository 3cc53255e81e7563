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


class Audit:
    """samples.jsonl, the per-sample trace (docs/architecture.md §7): at every evaluation, the highest-reward
    and some random samples of the step just trained, token by token.

    Hooked into the controller before the update (`Controller.on_batch`), so the batch still
    holds what the loss saw: behaviour logprobs (sampler), reference logprobs, advantages. The
    trainer's logprobs are one no-grad forward on the audited rows only, at the weights that
    sampled them: trainer − behaviour is the sampler/trainer mismatch of each token.
    """

    def __init__(self, run_dir: Path, model, tok, cfg: RLConfig, runtime):
        self.path, self.model, self.tok, self.cfg, self.rt = Path(run_dir, "samples.jsonl"), model, tok, cfg, runtime
        self.rows: list[dict] = []

    def on_batch(self, step: int, samples, batch: RolloutBatch) -> None:
        if not eval_due(self.cfg, step) or self.cfg.eval.save_samples <= 0:
            return
        order = sorted(range(len(samples)), key=lambda i: -samples[i].reward)
        top = order[: self.cfg.eval.save_samples // 2]
        rest = [i for i in range(len(samples)) if i not in top]
        rest = random.Random(f"{self.cfg.seed}/{step}").sample(
            rest, min(len(rest), self.cfg.eval.save_samples - len(top))
        )
        pick = top + rest
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
            self.rows.append(
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

    def flush(self) -> None:
        """Append the rows captured for this evaluation (none at step 0: nothing was trained)."""
        with open(self.path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in self.rows)
        self.rows = []
