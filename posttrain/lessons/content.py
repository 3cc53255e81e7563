"""The lessons' text, in posttrain's own words: what each idea is, why it exists, where the code
lives (links computed from the live source), and which widgets it carries."""

from __future__ import annotations

from dataclasses import dataclass, field

from posttrain import UsageError


@dataclass
class Lesson:
    id: str
    number: str
    title: str
    part: str
    idea: str
    why: str
    code: list[str]                                   # "module:qualname", resolved by pages.code_ref
    widgets: list[str] = field(default_factory=list)  # names in the widget registry


P1, P2, P3, G = ("Part I · the six roles", "Part II · the algorithm lineage", "Part III · systems",
                 "gpt_mini · the whole pipeline on a tiny model")
ALG = "posttrain.algorithms"

INTRO = ("Each page explains one idea of RL post-training and lets you turn its knobs. The plots are "
         "computed by posttrain's own functions (the same ones the trainer runs), so what you see is what "
         "the framework does. Every widget has at least one setting that breaks training; the page says which.")

LESSONS = [
    Lesson("rl-01", "01", "What post-training RL is", P1,
           "Sample an answer from the policy, score it, and raise the log-probability of the answer in "
           "proportion to its score. The gradient of expected reward is the expected reward times the "
           "gradient of the log-probability (the score-function, or log-derivative, trick), so the "
           "update needs samples and scores only, never a differentiable reward.",
           "Supervised learning needs the right answer; RL needs only a way to tell good answers from bad "
           "ones. That is what lets a model improve past its demonstrations on checkable tasks.",
           [f"{ALG}.reinforce:advantages", f"{ALG}.reinforce:surrogate", f"{ALG}.reinforce:loss"], ["bandit"]),
    Lesson("rl-02", "02", "Rollout: sampling and the behaviour logprobs", P1,
           "The rollout role draws K responses per prompt and, at the moment it samples each token, records "
           "that token's log-probability under the exact distribution it sampled from. Temperature is "
           "applied in one function that the trainer imports too, so sampler and trainer agree.",
           "Every off-policy correction (the PPO ratio, async importance weights) divides the trainer's "
           "probability by this recorded one. Recompute it after an update and the ratio is always 1: the "
           "clip silently never fires.",
           ["posttrain.framework.rollout:sample_tokens", "posttrain.framework.rollout:token_logprobs",
            "posttrain.framework.rollout:Engine.generate"], ["sampler"]),
    Lesson("rl-03", "03", "Reward and reference", P1,
           "The reward comes from a verifier (here: the last integer of the response against the gold "
           "answer). The reference is a frozen copy of the starting policy; the loss adds β times an "
           "estimate of KL(π_θ ‖ π_ref) computed on the sampled tokens, usually k3 = e^d − 1 − d.",
           "A verifier is cheap and exact but only checks what it checks; the KL anchor keeps the policy "
           "close to a model that still writes sensibly, so it cannot drift into whatever the reward "
           "function happens to over-reward.",
           ["posttrain.tasks.arithmetic:verify", f"{ALG}.core:kl", "posttrain.framework.reference:Reference"],
           ["verifier", "kl", "beta"]),
    Lesson("rl-04", "04", "Algorithm: advantages and a loss", P1,
           "An algorithm is two pure functions: <code>advantages(rewards, group_index, cfg)</code> and "
           "<code>loss(logprobs, batch, cfg, norm)</code>. Everything shared (masked means, aggregation "
           "modes, KL estimators, the clip) lives in <code>core.py</code>.",
           "Keeping the algorithm this small is what makes REINFORCE, GRPO, RLOO and Dr. GRPO readable as "
           "patches of one another, and lets the same trainer run all of them.",
           [f"{ALG}:get", f"{ALG}.grpo:advantages", f"{ALG}.rloo:advantages", f"{ALG}.core:group_stats"],
           ["advantages"]),
    Lesson("rl-05", "05", "Trainer: where gradients flow", P1,
           "The trainer recomputes the policy's logprobs on the batch, calls the algorithm's loss on them, "
           "and runs the project's only <code>backward()</code>, then clips the gradient norm and steps "
           "AdamW. Big batches are split into micro-batches whose losses use the whole batch's normaliser.",
           "Three logprobs meet in one loss: the sampler's (old), the trainer's (new, with gradient) and "
           "the reference's. Seeing each token's contribution is the fastest way to debug a run.",
           ["posttrain.framework.trainer:Trainer.step", f"{ALG}.grpo:loss", f"{ALG}.core:ppo_clip_loss",
            f"{ALG}.core:finish_loss"], ["loss_assembly"]),
    Lesson("rl-06", "06", "Weight sync", P1,
           "After each optimizer step the new weights go to the sampler: a no-op when both share one module, "
           "a versioned copy otherwise. Every sample carries the <code>policy_version</code> that produced it.",
           "A sampler that runs on old weights produces samples whose ratio to the current policy drifts "
           "out of the clip band; the updates they feed are clipped to nothing while the loss still looks fine.",
           ["posttrain.framework.weight_sync:WeightSync.sync", f"{ALG}.core:importance_ratio"], ["sync"]),
    Lesson("rl-07", "07", "Controller: the loop", P1,
           "One step: rollout → rewards → reference logprobs → advantages → collate → train step → weight "
           "sync → metrics. The controller calls the roles in that order and owns the policy for groups "
           "that carry no signal (skip, keep or resample).",
           "Keeping orchestration separate from the math is what lets the same loop run in one process or "
           "across Ray actors, and keeps each role testable alone.",
           ["posttrain.framework.controller:Controller.step", "posttrain.framework.batch:collate_samples"],
           ["controller"]),
    Lesson("rl-08", "08", "Agent episodes: masking tool output", P1,
           "In a multi-turn episode the response interleaves the policy's turns with text the environment "
           "inserted (tool results). Those tokens get <code>response_mask = 0</code> from whoever produced "
           "them and never enter a loss or a metric.",
           "Without the mask, the policy is trained to write the tool's output itself — it learns to fake "
           "observations instead of learning when to call the tool.",
           ["posttrain.framework.batch:collate"], ["tool_mask"]),
    Lesson("rl-09", "09", "REINFORCE", P2,
           "The loss is −A·Σ_t log π(y_t) with A = R (no baseline): the plainest unbiased policy gradient. "
           "Subtracting any baseline that does not depend on the sampled response keeps it unbiased and "
           "lowers its variance.",
           "Its variance is the problem every later algorithm attacks: one binary reward per response "
           "says little, and the estimate only sharpens like 1/√K in the number of samples.",
           [f"{ALG}.reinforce:advantages", f"{ALG}.reinforce:loss"], ["snr"]),
    Lesson("rl-10", "10", "PPO: critic, GAE, clip", P2,
           "PPO learns a value function to serve as the baseline (with GAE for per-token advantages) and "
           "limits each update with the clipped ratio −min(ρA, clip(ρ, 1−ε, 1+ε)A), so several epochs can "
           "reuse one batch of samples.",
           "Reusing samples makes the policy drift from the one that sampled; the clip removes the "
           "incentive to move further once the ratio has left the band, in the direction that would help.",
           [f"{ALG}.core:ppo_clip_loss", f"{ALG}.ppo:gae", f"{ALG}.ppo:loss"], ["clip"]),
    Lesson("rl-11", "11", "GRPO: the group replaces the critic", P2,
           "Sample G responses per prompt and use their own mean and standard deviation as the baseline "
           "and scale: A_i = (R_i − mean)/(std + ε). The loss is PPO's clipped surrogate with the KL in it.",
           "A value network as big as the policy costs memory and is noisy early in training; for outcome "
           "rewards the group gives a good baseline for free.",
           [f"{ALG}.grpo:advantages", f"{ALG}.grpo:loss", f"{ALG}.core:group_stats"], ["grpo_group"]),
    Lesson("rl-12", "12", "RLOO: leave one out", P2,
           "Compare each response with the mean of the other K−1: A_i = R_i − mean_{j≠i} R_j, which equals "
           "K/(K−1)·(R_i − mean). No clip, no std.",
           "Including a sample in its own baseline biases the gradient by a factor (K−1)/K; leaving it out "
           "makes the estimator unbiased at the same cost.",
           [f"{ALG}.rloo:advantages"], ["rloo"]),
    Lesson("rl-13", "13", "DAPO: four practical switches", P2,
           "Clip-higher (ε_high = 0.28), dynamic sampling (refill groups that are all right or all wrong), "
           "a token-level loss, and a soft penalty for responses that run into the length cap.",
           "Each fixes a failure seen at scale: entropy collapse, wasted steps on easy prompts, long answers "
           "under-weighted, and truncated answers punished as if they were wrong.",
           [f"{ALG}.dapo:degenerate", f"{ALG}.dapo:overlong_penalty", f"{ALG}.dapo:advantages"], ["dapo"]),
    Lesson("rl-14", "14", "Dr. GRPO: removing two biases", P2,
           "GRPO with two switches flipped: no division by the group std, and no division by each "
           "response's own length (a constant normaliser instead).",
           "Dividing by |y_i| gives the tokens of short responses more gradient than those of long ones, so "
           "long wrong answers are punished less and grow; dividing by the std over-weights prompts that "
           "are almost always right or wrong.",
           [f"{ALG}.dr_grpo:Config", f"{ALG}.core:aggregate", f"{ALG}.core:batch_norm"], ["length_bias"]),
    Lesson("rl-16", "16", "DPO and its family", P2,
           "The KL-regularised reward-maximisation problem has a closed-form optimum in which the reward is "
           "β·log π/π_ref. DPO trains the policy directly with a Bradley–Terry loss on that implicit reward "
           "over preference pairs: no reward model, no sampling.",
           "It is cheap and stable, but off-policy: it can push the probabilities of both the chosen and the "
           "rejected answers down, and it learns only from the pairs it is given.",
           ["posttrain.preference.dpo:preference_loss"], ["dpo4", "pref_curves"]),
    Lesson("rl-19", "19", "Topology: where the roles run", P3,
           "Colocated: rollout and training share GPUs and take turns. Disaggregated: separate pools, so "
           "one phase hides the other. Async: the sampler runs ahead of the trainer by a bounded number of "
           "versions.",
           "Rollout dominates a step; overlapping it with training is the largest speed-up available, and "
           "its cost is staleness, which the importance ratio has to correct.",
           ["posttrain.framework.weight_sync:WeightSync.sync"], ["topology"]),
    Lesson("rl-20", "20", "The KV cache", P3,
           "Decoding a token attends over the keys and values of every earlier token; the engine keeps "
           "them in a cache instead of recomputing the prefix, so each step costs one token's forward.",
           "Decode reads all the weights and the whole cache for every step: at long lengths and high "
           "concurrency the cache, not the model, decides what fits and how fast it runs.",
           ["posttrain.models.gpt_mini:KVCache", "posttrain.models.gpt_mini:KVCache.copy_row"], ["kv"]),
    Lesson("rl-21", "21", "Scheduling: continuous batching, shared prefill", P3,
           "The engine decodes a pool of slots in one forward per step; a slot whose response ends is "
           "refilled with the next waiting sample at once, and the K samples of a prompt copy one prefill.",
           "Response lengths are long-tailed: a static batch waits for its longest member while the other "
           "slots idle. Refilling keeps the forward full.",
           ["posttrain.framework.rollout:Engine", "posttrain.framework.rollout:_Run._step",
            "posttrain.framework.rollout:_Run._admit"], ["scheduler"]),
    Lesson("rl-22", "22", "Memory math", P3,
           "Training a parameter costs about 18 bytes (bf16 weight, fp32 master copy, fp32 gradient, two "
           "Adam moments); serving it costs 2 bytes plus the KV cache. Activations grow with sequence "
           "length and batch, and checkpointing trades recomputation for most of them.",
           "Whether a recipe fits decides the topology before anything else: how many GPUs the trainer "
           "needs, whether the sampler can share them, how long the sequences may be.",
           ["posttrain.models.gpt_mini:count_params"], ["memory"]),
    Lesson("rl-22a", "22a", "The throughput equation", P3,
           "A step's wall time is the sum (colocated) or the overlap (disaggregated, async) of per-role "
           "times: rollout, verification, reference, training, sync. Useful tokens per second divide the "
           "tokens that reach the loss by that time.",
           "It tells you which term to attack: at long responses rollout is almost the whole step, and "
           "speeding up the trainer changes nothing.",
           ["posttrain.framework.controller:Controller.timer", "posttrain.framework.controller:Controller.step"],
           ["throughput"]),
    Lesson("rl-22c", "22c", "Async pipelining and staleness", P3,
           "An async run lets rollout produce samples from weights up to Δ versions old while the trainer "
           "steps; each sample's behaviour logprobs let the ratio correct for the gap.",
           "The further ahead the sampler runs, the more tokens fall outside the clip band: past a "
           "staleness of a few versions the speed-up is paid for with discarded gradient.",
           [f"{ALG}.core:importance_ratio", f"{ALG}.core:ratio_metrics"], ["topology"]),
    Lesson("gpt-01", "G01", "The model under every stage", G,
           "gpt_mini is a small decoder-only transformer shaped like Llama: token embeddings, blocks of "
           "RMSNorm → attention with rotary positions → RMSNorm → SwiGLU MLP, a final norm and an output "
           "head. The same class runs pretraining, SFT, DPO and RL, and exports to Hugging Face.",
           "Knowing where the parameters and FLOPs are (the blocks, ~12d² each) is what every memory and "
           "throughput estimate later builds on.",
           ["posttrain.models.gpt_mini:count_params", "posttrain.models.gpt_mini:GPTMini",
            "posttrain.models.gpt_mini:Attention.forward"], ["shapes"]),
    Lesson("gpt-02", "G02", "Pretraining", G,
           "Next-token prediction on raw text: every position of every window is a training example, and "
           "the loss is the cross-entropy of the true next character.",
           "It gives the model the statistics of the language (here: arithmetic traces) that every later "
           "stage only reshapes; sampling from it shows what it has learned.",
           ["posttrain.recipes.pretrain:run", "posttrain.recipes.common:lm_loss",
            "posttrain.lessons.runs:pretrain_run"], ["next_char"]),
    Lesson("gpt-03", "G03", "Supervised fine-tuning and the loss mask", G,
           "SFT trains on (prompt, response) pairs in a chat template, with the loss only on response "
           "tokens: the collate function sets <code>loss_mask = 1</code> from the first response token on.",
           "The prompt is given, not generated; training on it wastes capacity on predicting questions "
           "and blurs what the model should produce.",
           ["posttrain.framework.batch:collate", "posttrain.recipes.sft:SFTBatches",
            "posttrain.lessons.runs:sft_run"], ["sft_mask"]),
    Lesson("gpt-04", "G04", "Chain of thought", G,
           "Same loss, different data: the response first writes the running sums, then the answer. "
           "<code>{3+4=7;7+5=12}12#</code> instead of <code>12#</code>.",
           "A forward pass has a fixed number of layers; each written token adds another pass, so a "
           "multi-step sum no longer has to fit inside one.",
           ["posttrain.tasks.arithmetic:Problem.trace", "posttrain.tasks.arithmetic:Problem.target"], ["cot"]),
    Lesson("gpt-05", "G05", "DPO on the tiny model", G,
           "Pairs of a correct (chosen) and a corrupted (rejected) answer; the loss raises the chosen "
           "answer's log-ratio to the frozen SFT model relative to the rejected one's.",
           "It is the cheapest preference stage: four forward passes per pair, no sampling. Its first loss "
           "is always ln 2, since the policy starts equal to the reference.",
           ["posttrain.preference.dpo:preference_loss", "posttrain.recipes.dpo:run"], ["dpo_pair"]),
    Lesson("gpt-06", "G06", "RL with verifiable rewards (GRPO)", G,
           "Sample K answers per problem, score them with the verifier, compute group advantages, and "
           "update with the clipped loss and a KL anchor to the SFT model.",
           "It trains on the model's own samples, so it can fix the mistakes the model actually makes; "
           "it needs prompts the model sometimes, but not always, gets right.",
           ["posttrain.recipes.rl:run", f"{ALG}.grpo:advantages"], ["grpo_sim"]),
]

LINEAGE = [
    ("rl-09", "REINFORCE", "−A·log π with A = R; unbiased, high variance"),
    ("rl-10", "PPO", "+ learned critic and GAE as the baseline, + the clipped ratio"),
    ("rl-11", "GRPO", "critic replaced by the group mean/std of G samples per prompt"),
    ("rl-12", "RLOO", "baseline = mean of the other G−1 samples (unbiased), no clip"),
    ("rl-13", "DAPO", "clip-higher, dynamic sampling, token-level loss, overlong shaping"),
    ("rl-14", "Dr. GRPO", "no /std, no /|y_i|"),
]

PATHS = [
    ("I want to understand sampling", ["rl-02", "rl-20", "rl-21"]),
    ("I want to change the algorithm", ["rl-04", "rl-11", "rl-14"]),
    ("I want to size a cluster", ["rl-19", "rl-22", "rl-22a"]),
]

# (lesson, the course's widget bug, decision, why) — SEED_SPEC Part B 88 and Part D
DECISIONS = [
    ("03", "the β widget never reaches the reward-hack region (θ stays < 2.2 even at β = 0)",
     "fixed, course kept as an option:", "the 'fixed' step size (η = 1) lets β = 0 run into the hack; 'course' "
     "reproduces the original numbers (β = 0 → θ = 2.14)."),
    ("09", "the error is measured against (1, 0.4), not E[ĝ], so it has a floor ≈ 0.77 and '0.45/√K' is a constant",
     "fixed, course kept as an option:", "the default measures against E[ĝ] and shows σ/√K computed from "
     "samples; 'course' reproduces the floor (0.93 / 0.81 / 0.78 at K = 1 / 4 / 16)."),
    ("05", "frac_clipped counts every token with ρ outside the band",
     "both shown:", "posttrain's clip/frac counts only tokens whose gradient the clip zeroes; the widget also "
     "shows the course's out-of-band share."),
    ("07", "the collated batch is (3, 12)", "kept ours:", "posttrain's template gives (3, 10) for <3+4+5> and "
     "3-token answers; the shape is computed by collate_samples, not typed in."),
    ("11", "population std in widgets vs. torch's unbiased std in code", "both, as a knob:",
     "posttrain's default is unbiased (TRL/verl); the widgets start on population to match the tables."),
    ("14", "GRPO's per-token weight printed as A/|y_i| (0.05) while Dr. GRPO is A/K",
     "kept ours:", "core.aggregate also divides by the number of sequences, so GRPO gives 0.025 / 0.00125; "
     "the long/short ratio (5%) is the same."),
    ("16", "IPO's target applied to the β-scaled gap", "fixed:",
     "IPO's minimum is at h = 1/(2β) on the unscaled log-ratio gap, as in the paper and TRL."),
    ("22a", "the widget divides rollout and training time by 4 twice, so it cannot reproduce its own "
     "worked example (32 s, 33k tok/s)", "fixed, course kept as an option:", "'fixed' drops the extra ÷4; "
     "'course' reproduces the widget (τ_step 12.4 s, 84.7k tok/s, rollout 81%)."),
    ("21", "the scheduling widget is a formula with made-up constants", "replaced:",
     "the widget runs posttrain's Engine on a simulated workload and counts its decode steps."),
]

NOT_YET = [
    "Lessons 00, 15, 17, 18, 18a, 22, 22a, 22b, 23–28: no page yet (the memory planner and throughput "
    "equation widgets plug into the registry as one entry each once posttrain/memory.py and throughput.py land).",
]


def by_id(lesson_id: str) -> Lesson:
    for ls in LESSONS:
        if ls.id == lesson_id:
            return ls
    raise UsageError(f"no lesson {lesson_id!r}; lessons: {', '.join(ls.id for ls in LESSONS)}")
