"""Stage 4, RL with verifiable rewards: wire the six roles and run the controller.

    posttrain rl configs/grpo_arith.yaml [init=RUN_OR_CHECKPOINT] [key=value ...]

Without `init`, the run starts from the default SFT(CoT) checkpoint (recipes/warm_start.py: trained
once, a few minutes on a CPU, into `runs/cache/`). This file is the composition root of the RL stage: it
checks the config, builds each role once and hands `Controller.step` to the step loop; the audited
samples are recipes/audit.py's.
"""

from __future__ import annotations

import dataclasses

import torch

from posttrain import algorithms
from posttrain.config import RLConfig, save_config
from posttrain.distributed.placement import check_scale_config, place
from posttrain.distributed.ranks import rank_trainer
from posttrain.distributed.run_summary import write_summary
from posttrain.envs.source import ExternalRollouts
from posttrain.errors import UsageError
from posttrain.eval import evaluate, evaluate_episodes, response_budget
from posttrain.framework.batch import budgets
from posttrain.framework.controller import Controller
from posttrain.framework.critic import needs_critic
from posttrain.framework.loop import train_loop
from posttrain.framework.trainer import Trainer
from posttrain.logging import read_metrics
from posttrain.models.heads import ActorCritic
from posttrain.precision import FORMATS
from posttrain.recipes.audit import Audit
from posttrain.recipes.common import Run, init_model, make_task, predict_memory, prepare_task, print_plan, prompt_width
from posttrain.recipes.warm_start import default_init, refuse_default_init
from posttrain.reward_models.judge import JudgeTask
from posttrain.reward_models.rlhf import write_curve
from posttrain.reward_models.wrap import with_reward_model
from posttrain.tasks.base import MultiTurnTask
from posttrain.tasks.leaky import HackingMonitor
from posttrain.tasks.pool import make_pool, verifier_args


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
    task = make_task(cfg, task)  # rows and reward functions load here
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
    if isinstance(task, JudgeTask):  # freeze the template, reach the judge (reward_models/judge.py)
        if cfg.verifier.workers > 0:
            raise UsageError(
                "task.judge with verifier.workers > 0: the judge has its own deadline and concurrency "
                "(task.judge.timeout_s, task.judge.concurrency); set verifier.workers=0"
            )
        task.start(r.dir, resume, cfg.rollout.samples_per_prompt)
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
    # N ranks: each trains on the groups it sampled, sharded (FSDP2) or replicated (distributed/ranks.py); built
    # before the sampler: sharded under bf16, the sampler's plain copy then holds bf16 weights, not fp32 ones
    trainer = rank_trainer(trainer, trainer.model, r.world, cfg.scale.trainer_shard, local_rows=True)
    placement = place(cfg, model, tok, r.rt)  # in-process or Ray workers (distributed/)
    engine = placement.engine
    # RLHF measures the KL from the start even without a KL term: it is the x-axis of the over-optimisation curve
    measure_kl = bool(cfg.reward_model) and "kl_coef" in {f.name for f in dataclasses.fields(algo_cfg)}
    reference = placement.reference(cfg, model, r.rt) if algorithm.needs_reference(algo_cfg) or measure_kl else None
    controller = Controller(
        cfg,
        with_reward_model(task, cfg.reward_model, r.rt.device),  # RLHF: the RM's score is the reward
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
            **({"ranks": r.world.size, "trainer_shard": cfg.scale.trainer_shard} if r.world.size > 1 else {}),
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
    if not r.world.main:  # rank 0 writes what is read from the run's logs
        return summary
    write_summary(r.dir, read_metrics(r.dir), "async" if cfg.scale.async_ else "colocated", n)  # throughput.json
    if cfg.reward_model:  # RLHF: the proxy-vs-true curve beside the metrics
        print(f"over-optimisation curve: {r.dir / 'overoptimization.csv'}  turn: {write_curve(r.dir)}")
    return summary
