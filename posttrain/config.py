"""Configs: one typed dataclass per stage, YAML files, dotted `key=value` overrides.

    cfg = load_config(SFTConfig, "configs/sft_cot.yaml", ["steps=200", "model.preset=micro"])

Every field carries a comment that says what it does (`posttrain STAGE --help` prints them).
This file holds the stages' dataclasses and the sections they share; reading a YAML file and
overrides into them, with an error naming any unknown key or wrong type, is config_load.py,
whose functions are importable from here too. The fully resolved config is saved in the run
directory as `config.yaml`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from posttrain.algorithms import grpo
from posttrain.algorithms.base import AlgoConfig
from posttrain.config_load import build, load_config, save_config, to_dict
from posttrain.logging import WandbConfig
from posttrain.models.gpt_mini import ModelConfig
from posttrain.models.lora import LoraConfig
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.tasks.base import TaskConfig

__all__ = [
    "RunConfig",
    "OptimConfig",
    "PretrainConfig",
    "SFTConfig",
    "VllmConfig",
    "SamplerConfig",
    "RolloutConfig",
    "RLOptimConfig",
    "EvalConfig",
    "VerifierConfig",
    "ScaleConfig",
    "RLConfig",
    "DPOConfig",
    "RMConfig",
    "DistillConfig",
    "RL_MOVED",
    "TRL_NAMES",
    "load_config",
    "build",
    "to_dict",
    "save_config",
]


@dataclass
class RunConfig:
    """Keys every stage accepts."""

    out: str = ""  # run directory; "" = runs/<stage>
    seed: int = 0  # seeds model init, data order and sampling
    steps: int = 100  # optimizer steps
    save_every: int = 0  # checkpoint every N steps (0 = only at the end, and every save_minutes)
    save_minutes: float = 10.0  # also checkpoint when this many minutes passed since the last one (0 = off);
    # a killed run loses at most that much. Never more than 5% of the time: the gap grows to 19× a save's duration
    keep_last: int = 2  # checkpoints kept on disk (older ones are deleted)
    eval_every: int = 0  # evaluate every N steps (0 = only at the end)
    log_every: int = 10  # print/log metrics every N steps
    device: str = "auto"  # auto | cpu | cuda | cuda:N ; auto = cuda if available
    dtype: str = "auto"  # auto | float32 | bfloat16 ; auto = fp32 on CPU, bf16 autocast on CUDA
    threads: int = 0  # torch CPU threads (0 = torch's default)
    grad_checkpointing: bool = False  # recompute each block's activations in backward: less memory, ~1/3 more compute
    overwrite: bool = False  # allow reusing a non-empty `out` without --resume
    max_nonfinite_steps: int = 10  # stop (with a checkpoint) after this many skipped non-finite steps in a row
    tensorboard: bool = True  # TensorBoard event files in RUN_DIR/tensorboard (when the package is installed)
    wandb: WandbConfig = field(default_factory=WandbConfig)  # a W&B run when wandb.project is set (offline by default)


@dataclass
class OptimConfig:
    lr: float = 3e-4  # peak learning rate (AdamW)
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW betas; 0.95 forgets faster than 0.999, steadier for small batches
    weight_decay: float = 0.1  # decoupled, applied to matrices only (not norms)
    grad_clip: float = 1.0  # clip the global gradient norm to this (0 = off)
    warmup_steps: int = 0  # linear warm-up from 0 to lr
    schedule: str = "cosine"  # constant | cosine | linear ; decay after warm-up, to min_lr_frac·lr
    min_lr_frac: float = 0.1  # floor of the decay as a fraction of lr
    micro_batch_tokens: int | str = "auto"  # largest micro-batch (computed tokens); bigger batches accumulate
    # gradients. auto: 8192 on the CPU (the reference 16,384); on CUDA the largest the run's memory prediction
    # (sizing/run_memory) fits in 75% of the card, at most 4 × a micro-batch's fixed cost (65,536 tokens), the
    # reference's and other passes without gradient sized alike; printed at start ([stage memory])
    packing: bool = False  # lay a micro-batch's sequences end to end in rows (attention kept within each): the
    # trainer's and the reference's forwards compute no padding but the rows' tails (framework/packing.py)
    packing_width: int = 0  # packed rows of at least this many tokens (0 = the micro-batch's longest sequence):
    # wider rows fill up, but their (dense) attention costs more
    packing_attention: str = "auto"  # auto | dense | flex | varlen: the packed rows' attention (models/attention.py):
    # a dense mask through sdpa, flex attention skipping masked tiles (CUDA only), or torch's Flash Attention varlen
    # kernel over the sequences' spans (CUDA, bf16/fp16 only); auto = flex on CUDA inside a compiled trunk
    # (optim.compile), dense otherwise (eager flex was slower than padded rows on an H200: README, On a GPU)
    compile: bool | str = False  # false | true | auto: torch.compile the trainer's and the reference's forward
    # (the trunk to the final hidden states; framework/compiled.py); auto = on with CUDA only. Off by default
    # until a GPU has measured its break-even (benchmarks/compile.py)
    compile_scope: str = "blocks"  # blocks | trunk: what optim.compile compiles; blocks = each repeated decoder
    # block once (regional compilation: the compile does not grow with depth), trunk = the whole trunk as one


@dataclass
class VllmConfig:
    """rollout.backend=vllm: the engine's memory and its colocation with the trainer (framework/backends/vllm_engine.py)."""

    gpu_memory_utilization: float = 0.3  # CUDA: fraction of the GPU vLLM takes (weights + KV cache); the trainer
    # keeps the rest
    kv_cache_mb: int = 0  # KV cache size; 0 = room for max_slots sequences of the model's context. Explicit on
    # CPU: vLLM's own default reserves ~90% of the NUMA node
    sleep: bool | str = "auto"  # auto | on | off (YAML reads on/off as true/false): sleep (weights and KV cache
    # off the GPU) while the trainer runs, wake for the next rollout; auto = on with CUDA (a CUDA feature of vLLM)


@dataclass
class SamplerConfig:
    """Which engine samples (framework/backends/): the stage's rollouts and evaluations."""

    backend: str = "posttrain"  # posttrain (the built-in engine, exactly on-policy) | vllm (pip install
    # 'posttrain[vllm]'; HF-format policies, gpt_mini through its HF export; off-policy correction on).
    # mismatch/logprob_abs compares the sampler's logprobs with the trainer's on either: backends side by side
    vllm: VllmConfig = field(default_factory=VllmConfig)  # rollout.backend=vllm only
    cuda_graphs: bool = True  # CUDA: replay the decode loop's steps as CUDA graphs (framework/decode_graphs.py;
    # vLLM: false = its enforce_eager); false = eager kernels, to measure what the graphs buy. No effect on CPU
    prefill_chunk: int = 16384  # padded prompt tokens per prefill forward of the built-in engine (up to 64
    # prompts); a longer prompt is prefilled alone, in chunks of this many through its cache: bounds the
    # prefill's activations (vLLM: max_num_batched_tokens)


@dataclass
class PretrainConfig(RunConfig):
    steps: int = 300
    eval_every: int = 100
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=ArithmeticConfig)  # `task.name` picks the task; the corpus is its traces
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=2e-3, warmup_steps=50))
    batch_size: int = 32  # sequences per step
    seq_len: int = 96  # tokens per sequence (random windows of the corpus)
    corpus_chars: int = 400_000  # size of the generated corpus


@dataclass
class SFTConfig(RunConfig):
    steps: int = 500
    init: str = ""  # checkpoint, run dir, HF directory or hub id org/name[@revision] ("" = random init from `model`)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=ArithmeticConfig)  # `task.name` picks the task (tasks/__init__.py)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, warmup_steps=30))
    lora: LoraConfig = field(default_factory=LoraConfig)  # lora.r > 0: train LoRA adapters only (HF models)
    rollout: SamplerConfig = field(default_factory=SamplerConfig)  # the sampler of data=rejection and evaluations
    cot: bool = True  # train on chain-of-thought traces (True) or direct answers (False)
    mask_prompt: bool = True  # loss on response tokens only; False = also learn to predict the prompt
    batch_size: int = 64  # examples per step
    num_problems: int = 20000  # distinct training problems generated (train split only)
    eval_problems: int = 600  # held-out problems in the end-of-stage evaluation
    data: str = "gold"  # gold: the task's own traces | rejection: the init model's verified samples (RFT)
    rejection_prompts: int = 2000  # data=rejection: train prompts sampled (at most num_problems)
    rejection_samples: int = 8  # data=rejection: samples per prompt; correct, distinct ones are kept
    target_acc: float = 0.0  # stop at the first evaluation (every eval_every steps) whose held-out greedy
    # accuracy reaches this; 0 = off. A warm-up for RL: start where RL has room


@dataclass
class RolloutConfig(SamplerConfig):
    """How each RL step samples."""

    prompts_per_step: int = 16  # prompts (groups) per step
    samples_per_prompt: int = 8  # responses per prompt: the group size G (TRL: num_generations)
    temperature: float = 1.0  # sampling temperature; the trainer recomputes logprobs at the same one
    max_new_tokens: int = 0  # response cap; 0 = what a correct trace of the task needs, plus slack
    # (TRL: max_completion_length)
    stop_token_ids: list[int] = field(default_factory=list)  # extra token ids that end a response, besides the
    # tokenizer's end-of-turn (vLLM: stop_token_ids); the RL rollouts only, not the evaluation
    degenerate: str = "keep"  # groups whose rewards are all equal: keep | skip | resample
    max_resample_attempts: int = 3  # with degenerate=resample: rollout rounds per step at most
    overprovision: int = 0  # straggler cut-off: start samples_per_prompt + this per prompt, keep the first to finish
    max_slots: int = 256  # rollout engine decode slots (continuous batching)
    precision: str = "fp32"  # sampler arithmetic: fp32 | bf16 | fp16, emulated (posttrain/precision.py) against
    # the trainer's fp32: the precision lab; logprob mismatch and clip act on the difference


@dataclass
class RLOptimConfig(OptimConfig):
    """AdamW as in every stage, plus how often one batch is reused."""

    epochs: int = 1  # passes over each batch (PPO-style reuse; 1 = strictly on-policy; TRL: num_iterations)
    minibatches: int = 1  # optimizer steps per pass (the batch split into this many minibatches)


@dataclass
class EvalConfig:
    """The held-out evaluation at step 0, every `eval_every` steps and at the end."""

    problems: int = 200  # held-out problems per evaluation (0 = no evaluation: `posttrain bench step` times steps only)
    samples: int = 8  # samples per held-out problem: pass@1, pass@<samples> and maj@<samples>
    save_samples: int = 8  # audited samples written to samples.jsonl at each eval (top-reward + random)


@dataclass
class VerifierConfig:
    """Where reward functions and verifiers run."""

    workers: int = -1  # verifier processes (tasks/pool.py); -1 = auto: 2 when scoring runs your code (task.name=
    # FILE.py:Class, task.reward / task.correct functions), 0 for the built-in tasks; 0 = in-process: cheapest,
    # but a hang stalls the step and a crash (segfault, os._exit) ends the run (docs/running.md: what workers=0 risks)
    timeout_s: float = 30.0  # per-call deadline with workers > 0; a late call scores 0 (reward/timeouts)
    memory_mb: int = 4096  # address space a worker may add to what it inherits (0 = no cap); past it an
    # allocation fails (MemoryError, reward 0) and the worker is replaced. Virtual memory: thread stacks and
    # malloc arenas count, so raise it for a verifier that starts many threads
    max_calls: int = 0  # replace a worker after this many calls (0 = never): bounds what a leaky verifier keeps
    reward_bound: float = 1e6  # a reward or component beyond ±this (or NaN, inf, not a number) scores 0, counted
    # in reward/errors: a broken verifier, not a generous one


@dataclass
class ScaleConfig:
    """Where the roles run, and how far rollouts may run ahead of the trainer (distributed/)."""

    placement: str = "in-process"  # in-process | ray (rollout workers as Ray actors; the trainer in the driver)
    rollout_workers: int = 2  # placement=ray: rollout actors, each an Engine with its own model copy
    weight_sync: str = "colocated"  # colocated (sampler shares the module) | separate (a copy, synced)
    async_: bool = False  # YAML `async: true`: rollouts run ahead on a producer; more throughput, stale samples
    max_staleness: int = 1  # async: samples at most this many policy versions behind the trainer (0 = sync)
    stale: str = "pace"  # async: pace = producers wait (no work wasted) | drop = run free, drop older batches
    # | fixed = every batch exactly max_staleness old (staleness experiments)
    partial_rollouts: bool = False  # async, in-process: an update may land mid-sample (between decode steps);
    # each token records the version that produced it. Fresher tokens, mixed samples
    off_policy_correction: str = "auto"  # none | tis | seq_tis | mask (IS weights from behaviour logprobs); auto = tis if async or rollout.backend=vllm
    # (mismatch/logprob_abs stays the sampler's logprobs against the trainer's either way: the same gap on every backend)
    off_policy_cap: float = 2.0  # C: truncate weights at C (tis, seq_tis) or zero them outside [1/C, C] (mask)
    sync_bucket_mb: float = 64.0  # weight sync across copies/processes: MB per transfer bucket
    sync_transport: str = "object_store"  # placement=ray: object_store (ray.put per bucket) | broadcast (a process
    # group of trainer + workers, one broadcast per bucket; gloo: the workers are CPU actors)
    gpus: int = 1  # ranks of the run, one GPU each (processes on a CPU): N > 1 starts torchrun --nproc-per-node N
    # for you; under torchrun its WORLD_SIZE decides. Every rank samples, scores and trains its share of the groups
    trainer_shard: str = "fsdp"  # with N ranks: fsdp = FSDP2 fully_shard, params, grads and AdamW state split
    # over the ranks (1/N each) | replicate = every rank a full copy, gradients all-reduced (PPO's critic needs it)
    trainer_ranks: int = 1  # gone: N ranks now all sample and train (scale.gpus=N, or torchrun); only 1 is accepted


# Flat names of the RL config before it had sections: accepted with a one-line note (until 0.3).
RL_MOVED = {
    "algorithm": "algo.name",
    "epochs": "optim.epochs",
    "minibatches": "optim.minibatches",
    **{
        k: f"rollout.{k}"
        for k in (
            "prompts_per_step",
            "samples_per_prompt",
            "temperature",
            "max_new_tokens",
            "degenerate",
            "max_resample_attempts",
            "overprovision",
            "max_slots",
        )
    },
    "eval_problems": "eval.problems",
    "eval_samples": "eval.samples",
    "save_samples": "eval.save_samples",
    "verifier_workers": "verifier.workers",
    "verifier_timeout_s": "verifier.timeout_s",
    **{
        k: f"scale.{k}"
        for k in (
            "placement",
            "rollout_workers",
            "weight_sync",
            "max_staleness",
            "stale",
            "partial_rollouts",
            "off_policy_correction",
            "off_policy_cap",
            "sync_bucket_mb",
            "sync_transport",
            "trainer_ranks",
            "trainer_shard",
        )
    },
    "async": "scale.async",
    "async_": "scale.async",
}
# TRL's GRPOConfig names, recognised so the error can name posttrain's key.
TRL_NAMES = {
    "beta": "algo.kl_coef",
    "num_generations": "rollout.samples_per_prompt",
    "max_completion_length": "rollout.max_new_tokens",
    "learning_rate": "optim.lr",
    "epsilon_high": "algo.eps_high",
    "epsilon": "algo.eps_low (and algo.eps_high)",
    "num_iterations": "optim.epochs",
    "max_steps": "steps",
    "max_grad_norm": "optim.grad_clip",
    "warmup_steps": "optim.warmup_steps",
    "lr_scheduler_type": "optim.schedule",
    "reward_funcs": "task.reward",
    "reward_weights": "task.reward_weights",
    "output_dir": "out",
    "logging_steps": "log_every",
    "save_steps": "save_every",
    "eval_steps": "eval_every",
    "per_device_train_batch_size": "rollout.prompts_per_step (× rollout.samples_per_prompt samples)",
    "scale_rewards": "algo.scale_by_std",
    "loss_type": "algo.aggregation (or algo.name=dr_grpo|dapo)",
}


@dataclass
class RLConfig(RunConfig):
    steps: int = 150
    eval_every: int = 50
    init: str = ""  # SFT checkpoint, run dir, HF directory or hub id org/name[@revision] (e.g.
    # Qwen/Qwen2.5-0.5B-Instruct); "" = the default SFT(CoT) checkpoint (trained once, cached)
    task: TaskConfig = field(default_factory=ArithmeticConfig)  # `task.name` picks the task (tasks/__init__.py)
    algo: AlgoConfig = field(default_factory=lambda: grpo.Config(kl_coef=0.01))  # `algo.name` picks the algorithm;
    # the other keys are its Config (posttrain rl --help algo)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: RLOptimConfig = field(
        default_factory=lambda: RLOptimConfig(lr=3e-5, weight_decay=0.0, schedule="constant")
    )  # RL lr ≈ SFT lr / 30
    eval: EvalConfig = field(default_factory=EvalConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)  # lora.r > 0: train LoRA adapters only
    reward_model: str = ""  # RLHF: an `rm` run (or its hub id) whose frozen score is the reward (verifier logged
    # as reward/true); RUN_A,RUN_B = an ensemble, the mean of their scores
    renamed = (RL_MOVED, TRL_NAMES)  # not a key (no annotation): the loader's notes and refusals (config_load.py)


@dataclass
class DPOConfig(RunConfig):  # posttrain dpo (recipes/dpo.py)
    steps: int = 100
    eval_every: int = 50
    init: str = ""  # SFT checkpoint, run dir or hub id org/name; "" = the default SFT(CoT) checkpoint (cached)
    task: TaskConfig = field(default_factory=ArithmeticConfig)  # prompts for sampled pairs and evaluation
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=1e-5, weight_decay=0.0, warmup_steps=10, schedule="constant")
    )
    lora: LoraConfig = field(default_factory=LoraConfig)  # lora.r > 0: train LoRA adapters only (Hugging Face models)
    # dpo | cdpo | robust | hinge | ipo | simpo | orpo | kto | dpo_nll. The default is DPO + NLL,
    # not TRL's plain "sigmoid": on this task plain DPO at lr 1e-5 pushes the chosen log-probs
    # down with the rejected ones and held-out pass@1 falls (0.567 → 0.371 in 100 steps,
    # benchmarks/dpo_family.py); the NLL term keeps the chosen likelihood (→ 0.621).
    loss_type: str = "dpo_nll"
    beta: float = 0.1  # β (ORPO's λ, IPO's τ); SimPO's paper uses 2.5
    label_smoothing: float = 0.1  # ε of cdpo / robust
    simpo_gamma: float = 1.375  # SimPO's target margin γ
    nll_alpha: float = 1.0  # weight of the chosen NLL in dpo_nll
    batch_size: int = 32  # pairs per step (64 rows)
    pairs: str = ""  # JSONL file of prompt/chosen/rejected; "" = sample pairs from the init policy
    on_bad: str = "error"  # a bad JSONL row: error (one line, file:line) | skip (counted)
    pair_prompts: int = 2000  # train-split prompts sampled for pairs
    samples_per_prompt: int = 8  # samples per prompt; a prompt with mixed rewards gives one pair
    same_length: bool = False  # only pairs whose two responses have equal token counts
    temperature: float = 1.0  # sampling temperature for pairs and evaluation
    eval_problems: int = 200  # held-out problems per evaluation (0 = no evaluation: pairs from a file, no task)
    eval_samples: int = 8  # samples per held-out problem: pass@1 and pass@<eval_samples>


@dataclass
class RMConfig(RunConfig):  # posttrain rm (recipes/rm.py)
    steps: int = 600
    eval_every: int = 100
    init: str = ""  # SFT checkpoint or run dir for the trunk; "" = the default SFT(CoT) checkpoint (cached)
    task: TaskConfig = field(default_factory=ArithmeticConfig)  # prompts for sampled pairs and evaluation
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=3e-4, weight_decay=0.0, warmup_steps=10, schedule="cosine")
    )  # whole trunk trained; 1e-4 barely moves, 1e-3 stalls at ~0.63
    objective: str = "bt"  # bt: Bradley–Terry on pairs | orm: BCE on each response's verifier label
    margin_coef: float = 1.0  # bt: subtract margin_coef × the pair's `margin` (JSONL column; 0 for sampled pairs)
    center_coef: float = 0.01  # bt: η of η·(r_w + r_l)², keeps scores near 0 for use as an RL reward (0 = off)
    batch_size: int = 64  # pairs per step (2× rows)
    pairs: str = ""  # JSONL file of prompt/chosen/rejected[/margin]; "" = sample pairs from the init policy
    on_bad: str = "error"  # a bad JSONL row: error (one line, file:line) | skip (counted)
    pair_prompts: int = 8000  # train-split prompts sampled for pairs; a prompt with mixed rewards gives one pair.
    # The RM needs thousands of pairs: with ~1.3k it memorises them (held-out ≈ chance)
    samples_per_prompt: int = 8  # samples per prompt; more finds pairs on easy/hard prompts too, at sampling cost
    pairs_per_prompt: int = 1  # train pairs per mixed prompt, no response reused (8 samples: at most 4);
    # more pairs from the same samples, free; held-out pairs stay one per prompt
    same_length: bool = False  # only pairs whose two responses have equal token counts (no length shortcut)
    temperature: float = 1.0  # sampling temperature for the pairs
    eval_prompts: int = 500  # test-split prompts sampled for held-out pairs (one per mixed prompt; 0 = no eval)
    eval_pairs: str = ""  # JSONL file of held-out pairs instead (for `pairs=FILE` data); "" = sample as above
    synthetic_pairs: int = 0  # extra train pairs: a train problem's gold CoT vs the same trace with one mistake
    # (preference/data.corrupted_pairs); free to build, they teach the RM to check steps


@dataclass
class DistillConfig(RunConfig):  # posttrain distill (recipes/distill.py)
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
