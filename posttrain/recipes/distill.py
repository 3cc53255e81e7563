"""On-policy distillation: the student learns from a frozen teacher's scores of its own samples.

    posttrain distill teacher=RUN_OR_CHECKPOINT [init=STUDENT] [loss=rkl|jsd] [beta=0.5] [key=value ...]

Each step: ❶ the student samples `samples_per_prompt` responses to `prompts_per_step` train
prompts; ❷ the verifier scores them (logged as `reward/mean`, never trained on); ❸ one
optimizer step on the per-token objective of preference/distill.py, the teacher's forward
run on the same tokens. Colocated: the sampler is the trained module, so every batch is the
current student's (ratio 1, `mismatch/logprob_abs` 0). Held-out pass@1 of the student at
step 0, every `eval_every` steps and at the end, and once of the teacher for reference.
The teacher must share the student's tokenizer (any size of gpt_mini: the built-in one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from posttrain import UsageError, checkpoint
from posttrain.config import OptimConfig, RunConfig, SamplerConfig, to_dict
from posttrain.eval import evaluate, response_budget
from posttrain.framework.backends import make_engine, make_sync
from posttrain.framework.batch import collate_samples, to_device
from posttrain.framework.loop import train_loop
from posttrain.framework.rollout import SamplingParams
from posttrain.framework.trainer import Trainer
from posttrain.preference.distill import LOSSES, distill_loss_fn
from posttrain.recipes.common import Run, init_model, predict_memory, print_plan
from posttrain.recipes.rl import default_init, prompt_width
from posttrain.sizing.card import phase
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from posttrain.tasks.base import score_samples


@dataclass
class DistillConfig(RunConfig):
    steps: int = 100
    eval_every: int = 25
    init: str = ""  # the student; "" = the default SFT(CoT) checkpoint (cached)
    teacher: str = ""  # the teacher checkpoint, run dir or hub id (required), e.g. an RL'd model
    loss: str = "rkl"  # rkl: per-token reverse-KL advantage (policy gradient) | jsd: generalized JSD, backprop
    beta: float = 0.5  # jsd: 0 = forward KL(T‖S) (mode-covering), 1 = reverse KL(S‖T) (mode-seeking)
    coef: float = 1.0  # rkl: scale c of the advantage −c·(log π_S − log π_T)
    task: ArithmeticConfig = field(default_factory=ArithmeticConfig)
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=5e-5, weight_decay=0.0, schedule="constant")
    )  # an RL-sized lr: the teacher's signal is dense but on-policy
    prompts_per_step: int = 16  # prompts per step
    samples_per_prompt: int = 4  # student samples per prompt (no group baseline is needed: every token is scored)
    temperature: float = 1.0  # sampling temperature; both models' distributions are taken at it
    rollout: SamplerConfig = field(default_factory=SamplerConfig)  # the student's sampler (rollout.backend)
    eval_problems: int = 200  # held-out problems per evaluation
    eval_samples: int = 8  # samples per held-out problem (pass@1, pass@n)


def check(cfg: DistillConfig) -> None:
    if not cfg.teacher:
        raise UsageError("distill needs teacher=RUN_OR_CHECKPOINT (e.g. an `rl` run); the student is init=")
    if cfg.loss not in LOSSES:
        raise UsageError(f"loss={cfg.loss!r} is unknown; use {' or '.join(LOSSES)}")
    if not 0.0 <= cfg.beta <= 1.0:
        raise UsageError(f"beta={cfg.beta} must be in [0, 1] (0 = forward KL, 1 = reverse KL)")
    if cfg.temperature <= 0:
        raise UsageError(f"temperature={cfg.temperature} must be > 0: the student samples its own rollouts")


def run(cfg: DistillConfig, resume: bool = False) -> dict:
    check(cfg)

    r = Run(cfg, "distill", resume)  # a bad --resume or out= fails before the default init
    init = cfg.init or default_init()
    student, tok = init_model(cfg, init, r)
    task = ArithmeticTask(cfg.task)
    max_new = response_budget(task, task.items(500, "train", cfg.seed))
    plen = prompt_width(cfg, tok, task)
    predict_memory(r, "distill", student, plen + max_new, plen, {**to_dict(cfg), "max_new_tokens": max_new})
    teacher, t_tok, t_path = checkpoint.load_model(cfg.teacher, r.rt.device)
    if t_tok.chars != tok.chars:
        raise UsageError(
            f"teacher {str(t_path)!r} has another tokenizer than the student; distill needs the same vocabulary"
        )
    teacher.eval().requires_grad_(False)  # frozen by construction
    engine = make_engine(student, tok, cfg.rollout)  # rollout.backend: the student's sampler
    sync = make_sync(student, engine, cfg.rollout)
    sampling = SamplingParams(temperature=cfg.temperature, max_new_tokens=max_new)
    trainer = Trainer(student, cfg.optim, cfg.steps, r.rt)
    loss_fn = distill_loss_fn(teacher, cfg.loss, cfg.beta, cfg.coef, cfg.temperature)
    heldout = task.items(cfg.eval_problems, "test", cfg.seed)
    k = cfg.eval_samples

    def heldout_eval(model):
        ev = engine if model is student else None  # the teacher: the built-in engine
        res = evaluate(model, tok, task, heldout, n=k, ks=(1, k), seed=cfg.seed, max_new_tokens=max_new, engine=ev)
        res.pop("per_k")
        return res

    teacher_res = heldout_eval(teacher) if r.resume_from is None else {}
    print_plan(
        "distill",
        {
            "student params": student.num_params(),
            "teacher params": teacher.num_params(),
            "teacher": str(t_path),
            "loss": cfg.loss,
            **({"beta": cfg.beta} if cfg.loss == "jsd" else {}),
            "prompts/step": cfg.prompts_per_step,
            "samples/step": cfg.prompts_per_step * cfg.samples_per_prompt,
            "steps": cfg.steps,
            **{f"teacher {k_}": round(v, 3) for k_, v in teacher_res.items() if isinstance(v, float)},
        },
    )

    def step_fn(step: int) -> dict:
        items = task.items(cfg.prompts_per_step, "train", seed=f"{cfg.seed}/{step}")
        prompts = [tok.encode(tok.chat_prompt(task.prompt(it))) for it in items]
        with phase("rollout"):
            samples = engine.generate(
                prompts, cfg.samples_per_prompt, sampling, seed=cfg.seed, step=step, items=items
            )  # ❶
        metrics = score_samples(task, samples)  # ❷
        batch = to_device(collate_samples(samples, tok.pad_id), trainer.device)
        with phase("train"):  # the teacher scores inside the loss
            metrics.update(trainer.step(batch, loss_fn))  # ❸
        metrics.update(sync.sync())  # ❹ the sampler gets the new weights
        metrics["reward/mean"] = float(batch.rewards.mean())
        metrics["length/mean"] = float(batch.loss_mask.sum(-1).mean())
        return metrics

    summary = train_loop(
        r,
        student,
        tok,
        trainer,
        step_fn,
        evaluate=heldout_eval,
        eval_at_start=True,
        meta={"task": "arithmetic", "teacher": str(t_path), "loss": cfg.loss},
        show=("distill/reverse_kl", "reward/mean", "eval/pass@1"),
    )
    if teacher_res:
        (r.dir / "teacher_eval.json").write_text(json.dumps(teacher_res, indent=1))
        print(
            f"teacher held-out pass@1 {teacher_res['eval/pass@1']:.3f}; student "
            f"{summary.get('eval/pass@1', float('nan')):.3f}"
        )
    return summary
