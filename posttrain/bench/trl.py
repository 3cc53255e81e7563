"""`posttrain rl` vs TRL's GRPOTrainer on the same tiny random Hugging Face Llama, in one run.

    posttrain bench trl [--steps 12] [--shapes 64x16,8x16] [--out benchmarks/results/vs_trl.json]
    python benchmarks/vs_trl.py ...                                        (the same)

Both sides get: the same model directory (a random LlamaForCausalLM, ~4.5M parameters,
posttrain's character vocabulary, written by models/hf.write_tiny), fp32 on the CPU with the
same thread count, the same prompts in the same order (TRL's dataset is built in memory from
the prompts `posttrain rl` draws at each step, unshuffled), the same verifier (the last
integer equals the sum), the same completions per step (prompts × group of 8) and cap of new
tokens, temperature 1, GRPO with the sequence-mean-token-mean loss, no KL (TRL's default
β = 0: no reference model on either side), AdamW with the same lr, betas, clip and a
constant schedule, one optimizer step per generation. TRL runs with bf16, fp16, gradient
checkpointing and vLLM off (its defaults cost 10-26× on this CPU) and HF_HUB_OFFLINE=1.

The FLOP floor of a step is the same work at the measured matmul peak: 6·N·tokens trained
(prompt + completion, posttrain's `train/tokens`) plus 2·N·tokens generated, N = parameters;
each side's `floor_frac` is floor ÷ its median step time (1.0 = the machine's limit).

Measured per side: median seconds per optimizer step after `--warmup` steps (generation,
scoring and the update; evaluation excluded), the median CPU seconds of the process per step
(`time.process_time`; far less sensitive than wall time to other jobs on a shared machine,
and equal to wall time on a quiet one with --threads 1), generated tokens per second, mean
completion length, and the mean reward of the last three steps. The machine's load average
and its measured matmul peak are recorded: on a shared machine absolute times are inflated.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from posttrain.bench import finish, matmul_peak_gflops, transformers_version
from posttrain.config import RLConfig, load_config
from posttrain.errors import UsageError
from posttrain.framework.controller import Controller
from posttrain.models.hf import load_hf, write_tiny
from posttrain.recipes import rl
from posttrain.tasks.arithmetic import ArithmeticTask, verify

# ~4.5M parameters: d 256, 6 layers, 8 heads, SwiGLU 640 (gpt_mini's `micro` with a narrower MLP)
MODEL = dict(arch="llama", d_model=256, n_layers=6, n_heads=8, n_kv_heads=8, d_ff=640, max_len=128)
GROUP = 8
TASK = ["task.min_terms=1", "task.max_terms=2", "task.max_value=9"]  # a random model scores > 0 sometimes


def rl_config(model_dir, out, completions, tokens, steps, lr, threads, seed):
    return load_config(
        RLConfig,
        None,
        [
            f"init={model_dir}",
            f"out={out}",
            "overwrite=true",
            f"steps={steps}",
            f"seed={seed}",
            f"prompts_per_step={completions // GROUP}",
            f"samples_per_prompt={GROUP}",
            f"max_new_tokens={tokens}",
            "algorithm=grpo",
            "algo.kl_coef=0",
            "algo.aggregation=seq-mean-token-mean",
            f"optim.lr={lr}",
            "optim.betas=[0.9,0.999]",
            "optim.weight_decay=0",
            "optim.grad_clip=1.0",
            "optim.schedule=constant",
            f"threads={threads}",
            "eval_problems=1",
            "eval_samples=1",
            f"log_every={steps}",
            *TASK,
        ],
    )


def step_prompts(cfg) -> list[tuple[str, int]]:
    """(prompt text, gold answer) of every group `posttrain rl` samples, step by step, in order."""
    _, tok = load_hf(cfg.init)
    task = ArithmeticTask(cfg.task)
    out = []
    for step in range(1, cfg.steps + 1):  # the controller's seeds (framework/controller.py)
        for it in task.items(cfg.rollout.prompts_per_step, "train", seed=f"{cfg.seed}/{step}/0"):
            out.append((tok.chat_prompt(task.prompt(it)), it.answer))
    return out


def run_posttrain(cfg) -> list[dict]:
    cpu, step = [], Controller.step

    def timed_step(self, n):  # CPU seconds of each controller step
        c0 = time.process_time()
        out = step(self, n)
        cpu.append(time.process_time() - c0)
        return out

    Controller.step = timed_step
    try:
        rl.run(cfg)
    finally:
        Controller.step = step
    rows = [json.loads(line) for line in open(Path(cfg.out) / "metrics.jsonl")]
    rows = [r for r in rows if r.get("step", 0) >= 1 and "time/step_s" in r]
    return [{**r, "cpu_s": c} for r, c in zip(rows, cpu)]


def run_trl(cfg, prompts, out) -> list[dict]:
    os.environ["HF_HUB_OFFLINE"] = "1"
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    def reward(prompts, completions, answer, **kwargs):
        return [verify(c, a) for c, a in zip(completions, answer)]

    class Clock(TrainerCallback):
        def __init__(self):
            self.ends = []

        def on_train_begin(self, args, state, control, **kw):
            self.ends.append((time.perf_counter(), time.process_time()))

        def on_step_end(self, args, state, control, **kw):
            self.ends.append((time.perf_counter(), time.process_time()))

    n = cfg.rollout.prompts_per_step * GROUP
    args = GRPOConfig(
        output_dir=str(out),
        max_steps=cfg.steps,
        per_device_train_batch_size=n,
        gradient_accumulation_steps=1,
        num_generations=GROUP,
        max_completion_length=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        learning_rate=cfg.optim.lr,
        adam_beta1=0.9,
        adam_beta2=0.999,
        weight_decay=0.0,
        max_grad_norm=1.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=0.0,
        loss_type="grpo",
        num_iterations=1,
        shuffle_dataset=False,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_vllm=False,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        seed=cfg.seed,
        dataloader_num_workers=0,
        disable_dropout=True,
    )
    model = AutoModelForCausalLM.from_pretrained(cfg.init, dtype="float32", local_files_only=True)
    tok = AutoTokenizer.from_pretrained(cfg.init, local_files_only=True)
    data = Dataset.from_dict({"prompt": [p for p, _ in prompts], "answer": [a for _, a in prompts]})
    clock = Clock()
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok, callbacks=[clock]
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    times = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(clock.ends, clock.ends[1:])]
    return [
        {
            "time/step_s": t,
            "cpu_s": c,
            "reward/mean": h["reward"],
            "length/mean": h.get("completions/mean_length", float("nan")),
        }
        for (t, c), h in zip(times, logs)
    ]


def summarize(rows: list[dict], completions: int, warmup: int) -> dict:
    timed = rows[warmup:] or rows
    step_s = statistics.median(r["time/step_s"] for r in timed)
    length = statistics.mean(r["length/mean"] for r in timed)
    return {
        "step_s": round(step_s, 4),
        "cpu_s_per_step": round(statistics.median(r["cpu_s"] for r in timed), 4),
        "tokens_per_s": round(completions * length / step_s, 1),
        "mean_completion_length": round(length, 2),
        "steps_timed": len(timed),
        "reward_last3": round(statistics.mean(r["reward/mean"] for r in rows[-3:]), 4),
        "reward_first": round(rows[0]["reward/mean"], 4),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="posttrain bench trl", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the timing")
    ap.add_argument("--shapes", default="64x16,8x16", help="completions x new tokens per step, comma-separated")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/vs_trl.json")
    args = ap.parse_args(argv)
    import torch

    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(args.threads)
    import trl

    result = {
        "load_before": os.getloadavg(),
        "threads": args.threads,
        "matmul_peak_gflops": round(matmul_peak_gflops(args.threads), 1),  # how busy the machine was
        "versions": {"torch": torch.__version__, "transformers": transformers_version(), "trl": trl.__version__},
        "model": MODEL,
        "group": GROUP,
        "steps": args.steps,
        "warmup": args.warmup,
        "lr": args.lr,
        "task": TASK,
        "shapes": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_tiny(Path(tmp, "model"), seed=args.seed, **MODEL)

        result["params"] = load_hf(model_dir)[0].num_params()
        for shape in args.shapes.split(","):
            completions, tokens = (int(x) for x in shape.lower().split("x"))
            if completions % GROUP:
                raise UsageError(f"--shapes {shape}: completions must be a multiple of the group size {GROUP}")
            cfg = rl_config(
                model_dir, Path(tmp, f"ours_{shape}"), completions, tokens, args.steps, args.lr, args.threads, args.seed
            )
            trl_rows = run_trl(cfg, step_prompts(cfg), Path(tmp, f"trl_{shape}"))
            torch.set_num_threads(args.threads)
            ours_rows = run_posttrain(cfg)
            row = {
                "trl": summarize(trl_rows, completions, args.warmup),
                "posttrain": summarize(ours_rows, completions, args.warmup),
            }
            timed = ours_rows[args.warmup :] or ours_rows
            trained = statistics.median(r["train/tokens"] for r in timed)
            generated = completions * row["posttrain"]["mean_completion_length"]
            floor = (6 * trained + 2 * generated) * result["params"] / (result["matmul_peak_gflops"] * 1e9)
            row["floor_s"] = round(floor, 4)
            row["tokens_trained_per_step"], row["tokens_generated_per_step"] = trained, round(generated, 1)
            for side in ("trl", "posttrain"):
                row[side]["floor_frac"] = round(floor / row[side]["step_s"], 3)
            row["speedup"] = round(row["trl"]["step_s"] / row["posttrain"]["step_s"], 2)
            row["speedup_cpu"] = round(row["trl"]["cpu_s_per_step"] / row["posttrain"]["cpu_s_per_step"], 2)
            result["shapes"][shape] = row
            print(
                f"{shape}: TRL {row['trl']['step_s']:.3f} s/step, posttrain {row['posttrain']['step_s']:.3f} "
                f"s/step: {row['speedup']}x wall, {row['speedup_cpu']}x CPU time; FLOP floor {floor:.3f} s: "
                f"TRL at {row['trl']['floor_frac']:.0%} of it, posttrain at {row['posttrain']['floor_frac']:.0%}",
                flush=True,
            )
    return finish(result, args.out, load_key="load_after")


if __name__ == "__main__":
    main()
