"""Stage 4, RL with verifiable rewards: wire the six roles and run the controller.

    posttrain rl configs/grpo_arith.yaml [init=RUN_OR_CHECKPOINT] [key=value ...]

Without `init`, the default SFT(CoT) checkpoint is trained once (pretrain → SFT, a few
minutes on a CPU) into `runs/cache/` and reused by every later run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path

from posttrain import algorithms, checkpoint
from posttrain.config import RLConfig, build
from posttrain.eval import evaluate, response_budget
from posttrain.framework.controller import Controller
from posttrain.framework.loop import train_loop
from posttrain.framework.reference import Reference
from posttrain.framework.rollout import Engine
from posttrain.framework.trainer import Trainer, needs_critic
from posttrain.framework.weight_sync import WeightSync
from posttrain.models.heads import ActorCritic
from posttrain.recipes.common import Run, init_model, print_plan
from posttrain.tasks.arithmetic import ArithmeticTask

CACHE = Path(os.environ.get("POSTTRAIN_CACHE", "runs/cache"))


def default_init() -> str:
    """The default SFT(CoT) checkpoint: trained once with the pipeline's defaults, then cached."""
    from posttrain.config import load_config
    from posttrain.recipes.pipeline import PipelineConfig, train_chain
    root = CACHE / "sft_cot"
    if checkpoint.latest(root / "sft") is None:
        print(f"no init= given: training the default SFT(CoT) checkpoint once into {root} "
              "(pretrain → SFT); later runs reuse it")
    train_chain(load_config(PipelineConfig, "pipeline", [f"out={root}"]), upto="sft")
    return str(root / "sft")


def run(cfg: RLConfig, resume: bool = False) -> dict:
    algorithm = algorithms.get(cfg.algorithm)             # validate everything before any work
    algo_cfg = build(algorithm.Config, cfg.algo, "algo.")
    if cfg.degenerate not in ("keep", "skip", "resample"):
        from posttrain import UsageError
        raise UsageError(f"degenerate={cfg.degenerate!r} is unknown; use keep, skip or resample")
    init = cfg.init or default_init()
    r = Run(cfg, "rl", resume)
    model, tok = init_model(cfg, init, r.rt.device)
    task = ArithmeticTask(cfg.task)
    max_new = cfg.max_new_tokens or response_budget(task, task.items(500, "train", cfg.seed))
    cfg = dataclasses.replace(cfg, max_new_tokens=max_new)
    engine = Engine(model, tok, max_slots=cfg.max_slots)
    sync = WeightSync(model, engine, cfg.weight_sync)
    reference = Reference(model, cfg.temperature) if algorithm.needs_reference(algo_cfg) else None
    # Critic (PPO): the trainer optimises policy + value head (+ a separate critic trunk) as one
    # module; the sampler, the reference and model.safetensors keep the bare policy, and the
    # critic's weights travel in trainer.pt with the optimizer (extra state below).
    actor_critic = ActorCritic(model, algo_cfg.critic) if needs_critic(algorithm, algo_cfg) else None
    trainer = Trainer(actor_critic if actor_critic is not None else model, cfg.optim,
                      cfg.steps * cfg.epochs * cfg.minibatches, r.rt)
    controller = Controller(cfg, rlhf_task(task, cfg.reward_model, r.rt.device), tok, engine, reference,
                            algorithm, algo_cfg, trainer, sync)
    n = cfg.prompts_per_step * cfg.samples_per_prompt
    print_plan("rl", {"params": model.num_params(), "prompts/step": cfg.prompts_per_step,
                      "samples/prompt": cfg.samples_per_prompt, "samples/step": n,
                      "max tokens/step": n * max_new, "optimizer steps/step": cfg.epochs * cfg.minibatches,
                      "steps": cfg.steps, "algorithm": cfg.algorithm, "reference": reference is not None,
                      "weight_sync": cfg.weight_sync,
                      **({"critic": algo_cfg.critic} if actor_critic is not None else {})})
    heldout = task.items(cfg.eval_problems, "test", cfg.seed)
    k = cfg.eval_samples

    def evaluate_fn(_model):
        res = evaluate(engine.model, tok, task, heldout, n=k, ks=(1, k), seed=cfg.seed, engine=engine,
                       max_new_tokens=max_new)
        res.pop("per_k")
        audit(r.dir, controller, cfg)
        return res

    def get_state():
        critic = {"critic": actor_critic.critic_state_dict()} if actor_critic is not None else {}
        return {"policy_version": engine.policy_version, **critic}

    def set_state(s):
        engine.policy_version = s.get("policy_version", 0)
        if actor_critic is not None and "critic" in s:
            actor_critic.load_critic_state_dict(s["critic"])
    state = (get_state, set_state)
    summary = train_loop(r, model, tok, trainer, controller.step, evaluate=evaluate_fn, extra_state=state, eval_at_start=True,
                      meta={"task": "arithmetic", "algorithm": cfg.algorithm},
                      show=("reward/mean", "eval/pass@1", "kl/ref", "clip/frac"))
    if cfg.reward_model:                                  # RLHF: the proxy-vs-true curve beside the metrics
        from posttrain.preference.rlhf import write_curve
        print(f"over-optimisation curve: {r.dir / 'overoptimization.csv'}  turn: {write_curve(r.dir)}")
    return summary


def rlhf_task(task, reward_model: str, device):
    """The task as the controller sees it: with `reward_model=RUN`, a frozen RM's score is the
    reward and the verifier is logged beside it (preference/rlhf.py); evaluation keeps the verifier."""
    if not reward_model:
        return task
    from posttrain.preference.reward_model import RewardModelScorer
    from posttrain.preference.rlhf import RewardModelTask
    return RewardModelTask(task, RewardModelScorer.from_checkpoint(reward_model, device))


def audit(run_dir: Path, controller: Controller, cfg: RLConfig) -> None:
    """samples.jsonl: the highest-reward and some random samples of the last step."""
    samples = getattr(controller, "last_samples", [])
    if not samples:
        return
    top = sorted(samples, key=lambda s: -s.reward)[: cfg.save_samples // 2]
    rest = random.Random(len(samples)).sample(samples, min(len(samples), cfg.save_samples - len(top)))
    with open(run_dir / "samples.jsonl", "a") as f:
        for s in top + rest:
            f.write(json.dumps({"policy_version": s.policy_version, "prompt": controller.tok.decode(s.prompt_ids),
                                "response": s.text, "response_ids": s.response_ids,
                                "behaviour_logprobs": [round(x, 5) for x in s.response_logprobs],
                                "reward": s.reward, "components": s.reward_components,
                                "finish_reason": s.finish_reason, "error": s.reward_error}) + "\n")


def demo(name: str, steps: int = 30, argv: list[str] | None = None) -> dict:
    """`python -m posttrain.algorithms.<name>`: a short run of one algorithm on the shared task
    from the default SFT(CoT) checkpoint; prints reward and held-out accuracy before/after."""
    import sys

    from posttrain.config import load_config
    overrides = [f"algorithm={name}", f"steps={steps}", f"out=runs/demo_{name}", "overwrite=true",
                 f"eval_every={max(steps // 3, 1)}", *(sys.argv[1:] if argv is None else argv)]
    cfg = load_config(RLConfig, "grpo_arith", overrides)
    summary = run(cfg)
    print(f"{name}: reward/mean {summary.get('reward/mean', 0):.3f}  "
          f"held-out pass@1 {summary.get('eval/pass@1', 0):.3f}  pass@{cfg.eval_samples} "
          f"{summary.get(f'eval/pass@{cfg.eval_samples}', 0):.3f}")
    return summary
