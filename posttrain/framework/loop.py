"""The step loop every stage shares: resume, signals, checkpoints, evaluation, logs.

A stage supplies `step_fn(step) -> metrics`. Everything a step consumes is a pure function
of (seed, step) — the SFT batch, the RL prompts and the sampling keys — so the data
position is the step counter and a resumed run sees exactly what it would have seen.
SIGINT/SIGTERM finish the current step, save a checkpoint, then stop. A death no signal
handler sees (SIGKILL, a segfault, os._exit in a verifier) loses at most `save_minutes` of
work: a checkpoint is written whenever that much time has passed since the last one, and
the run's watcher (posttrain/postmortem.py) says where it died.

With N ranks (framework/world.py) every rank runs this loop over the same steps; rank 0 alone logs,
evaluates and writes checkpoints (the state in them is gathered from every rank: a collective), and
the decisions only it can make (an early stop) or any rank can (a signal) reach every rank.
"""

from __future__ import annotations

import signal
import threading
import time

import torch

from posttrain import checkpoint, checkpoint_shards, postmortem, runtime
from posttrain.config import to_dict
from posttrain.errors import TrainingHalted
from posttrain.framework.card import OutOfMemory, phase
from posttrain.framework.trainer import Trainer
from posttrain.framework.world import current
from posttrain.logging import RunLogger


def eval_due(cfg, step: int) -> bool:
    """Evaluation steps: every `eval_every` steps and the last one."""
    return bool(cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps


def save_due(cfg, step: int, since_s: float, save_s: float) -> bool:
    """A checkpoint after this step (before the last, which always gets one)? Every `save_every`
    steps, and once `save_minutes` have passed since the last checkpoint (or the start): the gap
    is at least 19 times the last save's duration, so saving never takes more than 5% of the time.
    Saving reads the run's state and changes none of it: the numbers are the same either way."""
    if step >= cfg.steps:
        return False
    if cfg.save_every and step % cfg.save_every == 0:
        return True
    return cfg.save_minutes > 0 and since_s >= max(60 * cfg.save_minutes, 19 * save_s)


def train_loop(
    run,
    model,
    tokenizer,
    trainer: Trainer,
    step_fn,
    *,
    evaluate=None,
    meta: dict | None = None,
    show=("loss",),
    extra_state=None,
    eval_at_start: bool = False,
    until=None,
) -> dict:
    """Call `step_fn(step) -> metrics` from the resume point to cfg.steps; checkpoint, evaluate, log.

    `run` has .cfg (common keys), .dir, .stage and .resume_from (a checkpoint or None).
    `extra_state` is an optional (get, set) pair for state beyond model/optimizer/RNG.
    `eval_at_start` logs an evaluation of the starting weights as step 0 (RL: before/after).
    `until(metrics) -> str` ends the run early after an evaluation when it returns a reason;
    the checkpoint is written at that step with `finished_early` in its meta.json.
    """
    cfg = run.cfg
    start = 0
    world = current()
    if run.resume_from is not None:
        state = getattr(run, "resume_state", None) or checkpoint.load_trainer_state(run.resume_from)
        checkpoint.restore_weights(model, run.resume_from)
        trainer.load_state_dict(state["trainer"])
        if state["trainer"].get("optimizer") is None:  # a sharded run's: every rank reads its part
            trainer.load_shards(run.resume_from / checkpoint_shards.DIR)
        runtime.set_rng_state(state["rng"])
        start = state["step"]
        if extra_state is not None:
            extra_state[1](state.get("extra", {}))
        print(f"resumed from {run.resume_from} at step {start}")
    logger: RunLogger | QuietLogger
    if world.main:
        logger = RunLogger(
            run.dir,
            run.stage,
            cfg.steps,
            cfg.log_every,
            show=show,
            start_step=start,
            tensorboard=cfg.tensorboard,
            wandb=cfg.wandb,
            config=to_dict(cfg),
        )
    else:
        logger = QuietLogger()
        evaluate = None  # rank 0 evaluates: its plain module holds the same weights as every rank's
    if evaluate is not None and eval_at_start and start == 0:
        postmortem.step("the evaluation of the starting weights (step 0)")
        with phase("eval"):
            logger.log(0, evaluate(model))
    clock = {"last": time.monotonic(), "cost": 0.0}  # the last checkpoint's end, and how long it took

    def save(step):
        postmortem.step(f"writing the checkpoint of step {step}")
        t0 = time.monotonic()
        staged = trainer.sharded  # every rank writes its optimizer shard into the checkpoint, then rank 0 the rest
        if staged:
            if world.main:
                checkpoint.stage(run.dir, step)
            world.barrier()
            trainer.save_shards(checkpoint.tmp_path(run.dir, step) / checkpoint_shards.DIR)
            world.barrier()
        state = {
            "trainer": trainer.state_dict(),
            "rng": runtime.rng_state(),
            "step": step,
            "data_position": step,
            "extra": extra_state[0]() if extra_state is not None else {},
        }
        path = checkpoint.step_path(run.dir, step)
        with trainer.master_weights():  # sharded: the fp32 weights, gathered from every rank
            if world.main:
                path = checkpoint.save(
                    run.dir, step, model, tokenizer, state, {"stage": run.stage, **(meta or {})}, cfg.keep_last, staged
                )
        world.barrier()  # no rank goes on before the checkpoint is whole (a resume reads it)
        clock.update(last=time.monotonic(), cost=time.monotonic() - t0)
        return path

    # SIGINT/SIGTERM finish the current step, save a checkpoint, then stop (never mid-step).
    stop = []
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {
            sig: signal.signal(sig, lambda signum, frame: stop.append(signum))
            for sig in (signal.SIGINT, signal.SIGTERM)
        }
    last, end, reason = {}, cfg.steps, ""
    device = next(model.parameters()).device
    predicted = getattr(run, "predicted_peak", None)  # recipes/common.show_memory_prediction
    try:
        for step in range(start + 1, cfg.steps + 1):
            postmortem.step(f"step {step} of {cfg.steps}")
            t0 = time.perf_counter()
            with phase("step"):  # the step's own phases (rollout, reference, train, …) name it first
                metrics = step_fn(step)
            metrics["time/step_s"] = time.perf_counter() - t0
            if evaluate is not None and eval_due(cfg, step):
                postmortem.step(f"the evaluation at step {step} of {cfg.steps}")
                with phase("eval"):
                    metrics.update(evaluate(model))
            metrics["memory/peak_gib"] = runtime.peak_memory_bytes(device) / 2**30  # so far: CUDA tensors, CPU RSS
            if predicted is not None:
                metrics["memory/predicted_gib"] = predicted["peak_gib"]
            logger.log(step, metrics)
            last = metrics
            reason = until(metrics) if until is not None and eval_due(cfg, step) and world.main else ""
            reason = world.broadcast(reason) if until is not None and eval_due(cfg, step) else reason
            if world.size > 1:  # a signal that reached one rank stops them all, at the same step
                stop[:] = [signal.SIGTERM] if world.max([float(bool(stop))])[0] else []
            if reason and step < cfg.steps:
                end = step
                logger.message(f"stopping early at step {step}: {reason}")
                break
            if stop and step < cfg.steps:
                path = save(step)
                logger.message(f"stopped by signal: checkpoint saved to {path}; continue with --resume {run.dir}")
                logger.close()
                raise KeyboardInterrupt
            if cfg.max_nonfinite_steps and trainer.nonfinite_in_a_row >= cfg.max_nonfinite_steps:
                path = save(step)
                logger.close()
                raise TrainingHalted(
                    f"{trainer.nonfinite_in_a_row} steps in a row had a non-finite loss or gradient and were "
                    f"skipped (last checkpoint {path}); lower optim.lr or check the data, then --resume {run.dir}"
                )
            if save_due(cfg, step, time.monotonic() - clock["last"], clock["cost"]):
                save(step)
        if reason:
            meta = {**(meta or {}), "finished_early": reason}
        warning = nonfinite_warning(trainer, model, end)
        if warning:  # marked in meta.json, said on the console and in the summary
            meta = {**(meta or {}), "nonfinite_steps": int(trainer.nonfinite_total), "weights_finite": warning[1]}
        path = save(end)
    except OutOfMemory as e:  # nothing saved after it: the last checkpoint is the one to resume from
        logger.close()
        raise e.in_run(run.dir) from None
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)
        postmortem.done()  # from here on Python reports what happens (an exception, a clean end)
    if warning:
        logger.message(f"warning: {warning[0]} ({path})")
    logger.close()
    if warning and not warning[1]:
        raise TrainingHalted(
            f"{warning[0]}; the checkpoint {path} is marked weights_finite=false in meta.json: "
            f"lower optim.lr and resume from an earlier checkpoint, or start again"
        )
    return {"checkpoint": str(path), **last, **({"warning": warning[0]} if warning else {})}


def nonfinite_warning(trainer, model, steps: int) -> tuple[str, bool] | None:
    """(what to say, are the final weights finite?) when steps were skipped for a non-finite loss
    or gradient during the run (Trainer.nonfinite_total, kept across resumes); None otherwise.
    Skipped updates never reach the weights, but an update that was finite can still have made
    them non-finite (a huge lr), which only the weights themselves tell."""
    skipped = int(getattr(trainer, "nonfinite_total", 0))
    if not skipped:
        return None
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    text = (
        f"{skipped} of {steps} steps had a non-finite loss or gradient and were skipped; the final weights "
        f"are {'finite' if finite else 'NOT finite (NaN or inf)'}"
    )
    return text, finite


class QuietLogger:
    """The logger of a rank other than 0: rank 0 writes the run's logs."""

    def log(self, step: int, metrics: dict) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass
