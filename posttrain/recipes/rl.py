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

import torch

from posttrain import UsageError, algorithms, checkpoint, tasks
from posttrain.config import RLConfig, load_config, save_config
from posttrain.distributed.placement import check_scale_config, place
from posttrain.distributed.run_summary import write_summary
from posttrain.distributed.trainer_group import TrainerGroup
from posttrain.envs.source import ExternalRollouts
from posttrain.eval import evaluate, response_budget
from posttrain.framework.agent import evaluate_episodes
from posttrain.framework.batch import RolloutBatch, budgets
from posttrain.framework.controller import Controller
from posttrain.framework.critic import needs_critic
from posttrain.framework.logprobs import sequence_logprobs
from posttrain.framework.loop import eval_due, train_loop
from posttrain.framework.trainer import Trainer
from posttrain.logging import read_metrics
from posttrain.models.heads import ActorCritic
from posttrain.precision import FORMATS
from posttrain.preference.reward_model import load_scorer
from posttrain.preference.rlhf import RewardModelTask, write_curve
from posttrain.recipes.common import Run, init_model, predict_memory, prepare_task, print_plan
from posttrain.tasks.base import MultiTurnTask
from posttrain.tasks.judge import JudgeTask
from posttrain.tasks.leaky import HackingMonitor
from posttrain.tasks.pool import make_pool, verifier_args

CACHE = Path(os.environ.get("POSTTRAIN_CACHE", "runs/cache"))


def refuse_default_init(cfg) -> None:
    """No init= on your own data (task.name=dataset, your Task class, an environment): refused in one
    line before any work. The default checkpoint knows only the built-in sums, so RL from it on your
    rows would spend minutes building it and then learn from a policy that has never seen their format
    (issue 29); the line names the commands that warm a model up on your data instead."""
    name = cfg.task.name
    if cfg.init or (name in tasks.TASKS and name != "dataset"):
        return
    keys = f"task.name={name}" + "".join(
        f" task.{k}={getattr(cfg.task, k)}" for k in ("train", "test") if getattr(cfg.task, k, "")
    )
    raise UsageError(
        f"task.name={name} without init= would start from the default checkpoint, which "
        f"knows only the built-in sums; warm a model up on your task first (posttrain pretrain {keys} "
        f"out=runs/my/pt, then posttrain sft {keys} init=runs/my/pt out=runs/my/sft) and give init=runs/my/sft, "
        "or init= a Hugging Face model directory"
    )


def default_init() -> str:
    """The default SFT(CoT) checkpoint: trained once with the pipeline's defaults, then cached
    (built-in tasks only: `refuse_default_init`)."""
    from posttrain.recipes.pipeline import PipelineConfig, train_chain  # cycle: posttrain.recipes.pipeline

    root = CACHE / "sft_cot"
    if checkpoint.latest(root / "sft") is None:
        print(
            f"no init= given: training the default SFT(CoT) checkpoint once into {root} "
            "(pretrain → SFT); later runs reuse it"
        )
    train_chain(load_config(PipelineConfig, "pipeline", [f"out={root}"]), upto="sft")
    return str(root / "sft")


def check_config(cfg: RLConfig) -> None:
    """Combinations no run can honour, refused before any work (one line each, with the fix)."""
    if cfg.rollout.degenerate not in ("keep", "skip", "resample"):
        raise UsageError(f"rollout.degenerate={cfg.rollout.degenerate!r} is unknown; use keep, skip or resample")
    if cfg.rollout.temperature <= 0:
        raise UsageError(
            f"rollout.temperature={cfg.rollout.temperature} samples greedily: RL needs a sampling distribution "
            "(behaviour logprobs, different samples per group); use rollout.temperature > 0, e.g. 1.0"
        )

    if cfg.rollout.precision not in FORMATS:
        raise UsageError(f"rollout.precision={cfg.rollout.precision!r} is unknown; use {', '.join(FORMATS)}")
    if cfg.rollout.precision != "fp32" and cfg.rollout.backend == "vllm":
        raise UsageError(
            f"rollout.precision={cfg.rollout.precision} emulates a low-precision sampler in the built-in engine; "
            "use rollout.backend=posttrain, or rollout.precision=fp32 with vllm"
        )
    if cfg.rollout.precision != "fp32" and (cfg.scale.async_ or cfg.scale.placement != "in-process"):
        raise UsageError(
            f"rollout.precision={cfg.rollout.precision} emulates the sampler in-process only; "
            "use scale.placement=in-process with async off, or rollout.precision=fp32"
        )
    n = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    if cfg.optim.minibatches < 1 or n % cfg.optim.minibatches:
        divisors = [d for d in range(1, n + 1) if n % d == 0]
        raise UsageError(
            f"optim.minibatches={cfg.optim.minibatches} does not divide the {n} samples of a step "
            f"(rollout.prompts_per_step={cfg.rollout.prompts_per_step} × rollout.samples_per_prompt="
            f"{cfg.rollout.samples_per_prompt}); "
            f"use one of {', '.join(map(str, divisors))}"
        )


def check_group_size(cfg: RLConfig, algorithm, algo_cfg) -> None:
    """samples_per_prompt=1 with an algorithm whose advantage is relative to its group: every
    group is a singleton, so every advantage is exactly 0 and no step could learn. Refused
    rather than warned: the run would only burn compute. Found by asking the algorithm itself
    for the advantages of two singleton groups with different rewards."""
    if cfg.rollout.samples_per_prompt != 1:
        return
    mask = torch.ones(2, 1)
    probe = {"loss_mask": mask, "old_logprobs": 0 * mask, "ref_logprobs": 0 * mask, "values": 0 * mask}
    try:
        adv = algorithm.advantages(torch.tensor([0.0, 1.0]), torch.tensor([0, 1]), algo_cfg, batch=probe)
    except Exception:  # an algorithm that needs more than this probe: the run's own checks apply
        return
    if bool((adv == 0).all()):
        raise UsageError(
            f"rollout.samples_per_prompt=1: {cfg.algo.name}'s advantage is relative to the other samples "
            "of its prompt, so with one sample per prompt every advantage is 0 and nothing is learned; use "
            "rollout.samples_per_prompt >= 2 (e.g. 8), or an algorithm without a group baseline (ppo, "
            "reinforce with algo.baseline=none)"
        )


def check_context(cfg: RLConfig, model, tok, task, init: str) -> None:
    """The longest prompt (of 200 train and the held-out ones) plus max_new_tokens must fit the
    model's context, and every rollout.stop_token_ids a token id: refused here, before the first
    rollout, not as a traceback mid-step."""
    items = task.items(200, "train", cfg.seed) + task.items(cfg.eval.problems, "test", cfg.seed)
    longest = max(len(tok.encode(tok.chat_prompt(task.prompt(it)))) for it in items)
    room = model.config.max_seq_len - longest
    if cfg.rollout.max_new_tokens > room:
        raise UsageError(
            f"rollout.max_new_tokens={cfg.rollout.max_new_tokens}: the longest prompt ({longest} tokens) "
            f"plus it exceeds the context of {init} ({model.config.max_seq_len} tokens); use "
            f"rollout.max_new_tokens <= {room} (0 = what the task needs)"
        )
    vocab = model.config.vocab_size
    bad = [i for i in cfg.rollout.stop_token_ids if not 0 <= i < vocab]
    if bad:
        raise UsageError(f"rollout.stop_token_ids has {bad[0]}, not a token id of {init} (0 … {vocab - 1})")


def prompt_width(cfg: RLConfig, tok, task) -> int:
    """Tokens of the longest of 200 train prompts: a step's rows are at most this + max_new_tokens."""
    return max(len(tok.encode(tok.chat_prompt(task.prompt(it)))) for it in task.items(200, "train", cfg.seed))


def rl_plan(cfg: RLConfig, tok, task, micro_batch_tokens: int | None = None) -> dict:
    """One RL step in units. Token and micro-batch counts are upper bounds: every sample padded to
    the longest prompt (of 200 train prompts) plus max_new_tokens; real batches are shorter.
    `micro_batch_tokens`: the trainer's budget (Trainer.budgets.train; None: the config's, auto's CPU value)."""
    n = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    width = prompt_width(cfg, tok, task) + cfg.rollout.max_new_tokens
    budget = micro_batch_tokens or budgets(cfg.optim.micro_batch_tokens).train
    rows_per_micro = max(1, budget // width)  # how the trainer packs rows
    steps = cfg.optim.epochs * cfg.optim.minibatches  # minibatches divide n (check_config)
    micro = steps * -(-(n // cfg.optim.minibatches) // rows_per_micro)
    return {
        "prompts/step": cfg.rollout.prompts_per_step,
        "samples/prompt": cfg.rollout.samples_per_prompt,
        "samples/step": n,
        "max tokens/step": n * width,
        "max micro-batches/step": micro,
        "optimizer steps/step": steps,
    }


def run(cfg: RLConfig, resume: bool = False, task=None) -> dict:
    """The RL stage; `task` is a ready task object (the Python API hands over the user's reward
    functions that way), else `cfg.task` builds it."""
    algorithm = algorithms.get(cfg.algo.name)  # validate everything before any work
    algo_cfg = cfg.algo
    check_config(cfg)
    check_group_size(cfg, algorithm, algo_cfg)
    check_scale_config(cfg)
    task = task if task is not None else tasks.make(cfg.task)  # rows and reward functions load here
    refuse_default_init(cfg)
    r = Run(cfg, "rl", resume)  # a bad --resume or out= fails before the default init
    init = cfg.init or default_init()
    model, tok = init_model(cfg, init, r)
    task.reward_bound = cfg.verifier.reward_bound  # safe_reward's bound, in-process and in pool workers
    check_context(cfg, model, tok, task, init)
    max_new = cfg.rollout.max_new_tokens or response_budget(task, task.items(500, "train", cfg.seed))
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_new_tokens=max_new))
    save_config(cfg, r.dir / "config.yaml")  # every value resolved, max_new_tokens included
    prepare_task(task, tok, model, max_new, r.dir, "rl")
    plen = prompt_width(cfg, tok, task)
    predict_memory(r, "rl", model, plen + max_new, plen, cfg)  # before anything else is built: the process's share
    if isinstance(task, JudgeTask):  # freeze the template, reach the judge (tasks/judge.py)
        if cfg.verifier.workers > 0:
            raise UsageError(
                "task.judge with verifier.workers > 0: the judge has its own deadline and concurrency "
                "(task.judge.timeout_s, task.judge.concurrency); set verifier.workers=0"
            )
        task.start(r.dir, resume, cfg.rollout.samples_per_prompt)
    placement = place(cfg, model, tok, r.rt)  # in-process or Ray workers (distributed/)
    engine = placement.engine
    # RLHF measures the KL from the start even without a KL term: it is the x-axis of the over-optimisation curve
    measure_kl = bool(cfg.reward_model) and "kl_coef" in {f.name for f in dataclasses.fields(algo_cfg)}
    reference = placement.reference(cfg, model, r.rt) if algorithm.needs_reference(algo_cfg) or measure_kl else None
    # Critic (PPO): the trainer optimises policy + value head (+ a separate critic trunk) as one
    # module; the sampler, the reference and model.safetensors keep the bare policy, and the
    # critic's weights travel in trainer.pt with the optimizer (extra state below).
    actor_critic = ActorCritic(model, algo_cfg.critic) if needs_critic(algorithm, algo_cfg) else None
    trainer = Trainer(
        actor_critic if actor_critic is not None else model,
        cfg.optim,
        cfg.steps * cfg.optim.epochs * cfg.optim.minibatches,
        r.rt,
    )
    if cfg.scale.trainer_ranks > 1:  # data-parallel over local processes (distributed/)
        trainer = TrainerGroup(trainer, cfg)
    controller = Controller(
        cfg,
        rlhf_task(task, cfg.reward_model, r.rt.device),
        tok,
        engine,
        reference,
        algorithm,
        algo_cfg,
        trainer,
        placement.sync,
    )
    if cfg.scale.async_:
        controller.source = controller.sync = placement.asynchronous(cfg, controller.collect)
    external = None
    if getattr(task, "external", False):  # episodes driven from outside through the server
        controller.source = external = ExternalRollouts(cfg, task, tok, engine)
    n = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    vllm = cfg.rollout.backend == "vllm"  # its logprobs are not the trainer's bit for bit: corrected
    print_plan(
        "rl",
        {
            "params": model.num_params(),
            **rl_plan(cfg, tok, task, trainer.budgets.train),
            "steps": cfg.steps,
            "algorithm": cfg.algo.name,
            "reference": reference is not None,
            "weight_sync": "whole state, pushed" if vllm else cfg.scale.weight_sync,
            **({"rollout_backend": "vllm", "off_policy_correction": controller.correction} if vllm else {}),
            "placement": cfg.scale.placement,
            **({"rollout_workers": cfg.scale.rollout_workers} if cfg.scale.placement == "ray" else {}),
            **(
                {"trainer_ranks": cfg.scale.trainer_ranks, "trainer_shard": cfg.scale.trainer_shard}
                if cfg.scale.trainer_ranks > 1
                else {}
            ),
            **({"async": True, "max_staleness": cfg.scale.max_staleness} if cfg.scale.async_ else {}),
            **({"critic": algo_cfg.critic} if actor_critic is not None else {}),
            **({"verifier_workers": len(controller.pool.workers)} if controller.pool is not None else {}),
        },
    )
    heldout = task.items(cfg.eval.problems, "test", cfg.seed)
    k = cfg.eval.samples
    trace = Audit(r.dir, model, tok, cfg, r.rt)
    controller.on_batch = trace.on_batch

    # the held-out scoring goes through the verifier pool too (a crashing verifier costs a sample, not the
    # run); through a pool of its own when the trained reward is not the task's verifier (an RM, a leaky
    # proxy), or when the async producer may be scoring with the controller's at the same time
    eval_task = getattr(task, "heldout_task", task)
    shared = controller.task is eval_task and not cfg.scale.async_
    eval_pool = controller.pool if shared else make_pool(eval_task, *verifier_args(cfg))

    def evaluate_fn(_model):
        ev = placement.eval_engine
        if external is not None:  # the environment's own episodes, greedy and sampled
            res = {**external.evaluate(heldout, k), "per_k": {}}
        elif isinstance(task, MultiTurnTask):  # agent tasks: episodes with the tools
            res = evaluate_episodes(ev, tok, task, heldout, n=k, ks=(1, k), seed=cfg.seed, max_new_tokens=max_new)
        else:
            res = evaluate(
                model,
                tok,
                eval_task,
                heldout,
                n=k,
                ks=(1, k),
                seed=cfg.seed,
                engine=ev,
                max_new_tokens=max_new,
                pool=eval_pool,
            )  # leaky: its true verifier
        res.pop("per_k")
        trace.flush()
        return res

    def get_state():
        critic = {"critic": actor_critic.critic_state_dict()} if actor_critic is not None else {}
        return {"policy_version": placement.version, "older_versions": placement.older_versions(), **critic}

    def set_state(s):
        placement.set_version(s.get("policy_version", 0), s.get("older_versions"))
        if actor_critic is not None and "critic" in s:
            actor_critic.load_critic_state_dict(s["critic"])

    state = (get_state, set_state)
    step_fn = controller.step
    if getattr(task, "proxy_reward", False):  # a leaky verifier: watch proxy vs true reward
        step_fn = HackingMonitor(controller.step)
    try:
        summary = train_loop(
            r,
            model,
            tok,
            trainer,
            step_fn,
            evaluate=evaluate_fn,
            extra_state=state,
            eval_at_start=True,
            meta={"task": cfg.task.name, "algorithm": cfg.algo.name},
            show=("reward/mean", "eval/pass@1", "kl/ref", "clip/frac"),
        )
    finally:
        if eval_pool is not None and eval_pool is not controller.pool:
            eval_pool.close()
        if external is not None:
            external.close()
        placement.close()
        if cfg.scale.trainer_ranks > 1:
            trainer.close()
    write_summary(r.dir, read_metrics(r.dir), "async" if cfg.scale.async_ else "colocated", n)  # throughput.json
    if cfg.reward_model:  # RLHF: the proxy-vs-true curve beside the metrics
        print(f"over-optimisation curve: {r.dir / 'overoptimization.csv'}  turn: {write_curve(r.dir)}")
    return summary


def rlhf_task(task, reward_model: str, device):
    """The task as the controller sees it: with `reward_model=RUN`, a frozen RM's score is the
    reward and the verifier is logged beside it (preference/rlhf.py); evaluation keeps the verifier."""
    if not reward_model:
        return task

    return RewardModelTask(task, load_scorer(reward_model, device))


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


def demo(name: str, steps: int = 30, argv: list[str] | None = None) -> dict:
    """`python -m posttrain.algorithms.<name>`: a short run of one algorithm on the shared task
    from the default SFT(CoT) checkpoint; prints reward and held-out accuracy before/after."""
    import sys

    overrides = [
        f"algo.name={name}",
        f"steps={steps}",
        f"out=runs/demo_{name}",
        "overwrite=true",
        f"eval_every={max(steps // 3, 1)}",
        *(sys.argv[1:] if argv is None else argv),
    ]
    cfg = load_config(RLConfig, "grpo_arith", overrides)
    summary = run(cfg)
    print(
        f"{name}: reward/mean {summary.get('reward/mean', 0):.3f}  "
        f"held-out pass@1 {summary.get('eval/pass@1', 0):.3f}  pass@{cfg.eval.samples} "
        f"{summary.get(f'eval/pass@{cfg.eval.samples}', 0):.3f}"
    )
    return summary
