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
    Lesson("rl-15", "15", "RLHF and the reward model", P2,
           "When no program can check an answer, people compare pairs of answers and a reward model learns "
           "a score whose differences predict their choices: the Bradley–Terry loss −log σ(r_w − r_l). The "
           "policy is then trained against that score, with a KL anchor.",
           "Preferences are cheap to collect and capture what is hard to write down, but the learned score "
           "is only right near the data it saw, which is why the anchor matters more here than with a verifier.",
           ["posttrain.preference.reward_model:bradley_terry_loss", "posttrain.preference.reward_model:RewardModel"],
           ["bt_rm"]),
    Lesson("rl-16", "16", "DPO and its family", P2,
           "The KL-regularised reward-maximisation problem has a closed-form optimum in which the reward is "
           "β·log π/π_ref. DPO trains the policy directly with a Bradley–Terry loss on that implicit reward "
           "over preference pairs: no reward model, no sampling.",
           "It is cheap and stable, but off-policy: it can push the probabilities of both the chosen and the "
           "rejected answers down, and it learns only from the pairs it is given.",
           ["posttrain.preference.dpo:preference_loss"], ["dpo4", "pref_curves"]),
    Lesson("rl-17", "17", "Outcome and process rewards, and search", P2,
           "An outcome reward model scores a finished answer; a process reward model scores every step. "
           "At test time either can rerank N samples, and a PRM can also steer a beam search that keeps "
           "only the most promising partial chains.",
           "Long chains fail at one step; scoring steps puts the signal where the error is, and search "
           "spends samples on chains that still look right.",
           ["posttrain.eval:pass_at_k", "posttrain.eval:majority_correct"], ["prm"]),
    Lesson("rl-18", "18", "Environments, verifiers and reward hacking", P2,
           "A verifier is a function from (prompt, response) to a reward. Whatever it rewards, the policy "
           "will find, including what it rewards by mistake.",
           "A leak in the verifier becomes the behaviour you train; held-out evaluation with a strict "
           "checker is the only signal that tells real progress from gaming.",
           ["posttrain.tasks.arithmetic:ArithmeticTask.reward", "posttrain.tasks.math_answer:score",
            "posttrain.tasks.base:safe_reward"], ["hacking"]),
    Lesson("rl-18a", "18a", "Data: where the gradient is", P2,
           "With a group baseline and 0/1 rewards, a prompt solved with probability p gives advantages whose "
           "square averages p(1−p): no signal at p = 0 or 1, most at ½. Curation keeps prompts near the "
           "middle and re-measures as the policy improves.",
           "Prompts that are always or never solved cost full rollouts and produce zero gradient; filtering "
           "them is often the cheapest speed-up a run has.",
           ["posttrain.data.curate:probe", "posttrain.data.curate:bucket", "posttrain.data.curate:curate",
            f"{ALG}.dapo:degenerate"], ["curation"]),
    Lesson("rl-19", "19", "Topology: where the roles run", P3,
           "Colocated: rollout and training share GPUs and take turns. Disaggregated: separate pools, so "
           "one phase hides the other. Async: the sampler runs ahead of the trainer by a bounded number of "
           "versions.",
           "Rollout dominates a step; overlapping it with training is the largest speed-up available, and "
           "its cost is staleness, which the importance ratio has to correct.",
           ["posttrain.throughput:compare_topologies", "posttrain.framework.weight_sync:WeightSync.sync"], ["topology"]),
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
           ["posttrain.memory:plan", "posttrain.memory:envelope", "posttrain.shapes:kv_bytes_per_token"],
           ["planner", "memory"]),
    Lesson("rl-22a", "22a", "The throughput equation", P3,
           "A step's wall time is the sum (colocated) or the overlap (disaggregated, async) of per-role "
           "times: rollout, verification, reference, training, sync. Useful tokens per second divide the "
           "tokens that reach the loss by that time.",
           "It tells you which term to attack: at long responses rollout is almost the whole step, and "
           "speeding up the trainer changes nothing.",
           ["posttrain.throughput:step_time", "posttrain.throughput:role_model",
            "posttrain.throughput:from_metrics", "posttrain.framework.controller:Controller.timer"], ["throughput"]),
    Lesson("rl-22b", "22b", "Long-tail rollouts", P3,
           "Response lengths are long-tailed (roughly log-normal), and a step waits for the longest of "
           "its B·K responses, whose expected length grows with K and with the spread of the distribution.",
           "The tail, not the mean, sets the rollout time. A length cap near the 95th percentile, dynamic K "
           "(stop a group once it has both a right and a wrong answer) and packing attack it directly.",
           [f"{ALG}.dapo:overlong_penalty", "posttrain.framework.rollout:_Run._retire"], ["stragglers"]),
    Lesson("rl-22c", "22c", "Async pipelining and staleness", P3,
           "An async run lets rollout produce samples from weights up to Δ versions old while the trainer "
           "steps; each sample's behaviour logprobs let the ratio correct for the gap.",
           "The further ahead the sampler runs, the more tokens fall outside the clip band: past a "
           "staleness of a few versions the speed-up is paid for with discarded gradient.",
           [f"{ALG}.core:importance_ratio", f"{ALG}.core:ratio_metrics"], ["topology"]),
    Lesson("rl-25", "25", "Kernels for RL", P3,
           "Two savings that need no approximation: K samples of one prompt can share its prefill (the "
           "prompt's keys and values are computed once), and the trainer's log-probs can be computed over "
           "vocabulary chunks instead of materialising every logit.",
           "At long contexts the logits tensor alone is larger than the model's activations; at large K "
           "the repeated prompt is most of the prefill.",
           ["posttrain.framework.rollout:_Run._prefill", "posttrain.framework.trainer:sequence_logprobs"], ["kernels"]),
    Lesson("rl-26", "26", "Why recipes look the way they do", P3,
           "Three forces pick a recipe: how much verifiable signal the task has, how much estimator bias "
           "you can tolerate, and what the cluster costs. Extreme settings recover the named recipes.",
           "It is a way to read a new paper: which force moved, and which of the lessons' switches it flipped.",
           [f"{ALG}:get"], ["forces"]),
    Lesson("rl-28", "28", "Bottlenecks and where to optimise", P3,
           "Time each role every step (posttrain logs time/rollout_s, time/train_s, time/sync_s), then "
           "spend effort on the largest slice. Optimisations compose multiplicatively within a role and "
           "additively across roles.",
           "A 2× on a 10% slice buys 5%: the common mistake is to tune the trainer while rollout is most of the step.",
           ["posttrain.framework.controller:Controller.timer"], ["budget"]),
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
    ("I want a better reward", ["rl-03", "rl-15", "rl-18", "rl-18a"]),
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
    ("17", "the beam search uses far fewer step samples than best-of-N (24 vs. 96 at N = 16), yet is "
     "called a fixed budget", "fixed, course kept as an option:", "'matched' gives the beam the same step "
     "budget (it then beats reranking); 'course' keeps K = ceil(N/6B)."),
    ("16", "IPO's target applied to the β-scaled gap", "fixed:",
     "IPO's minimum is at h = 1/(2β) on the unscaled log-ratio gap, as in the paper and TRL."),
    ("22a", "the widget divides rollout and training time by 4 twice, so it cannot reproduce its own "
     "worked example (32 s, 33k tok/s)", "both shown:", "the widget's formula is posttrain.throughput.role_model "
     "as the page computes it (τ_step 12.4 s, 84.7k tok/s, rollout 81%); the worked example is "
     "throughput.step_time on the text's role times (32 s, trainer idle 20 s, 32.8k tok/s)."),
    ("22b", "the p95 cap is sorted[floor(0.95·K)], the maximum itself for K ≤ 19, so the cap does nothing "
     "at the default K = 16", "fixed, course kept as an option:", "'fixed' interpolates the 95th percentile; "
     "'course' reproduces the no-op (τ_R 4015 with or without the cap)."),
    ("22b", "the resample button is a no-op (the generator is reseeded from the knobs)", "kept, on purpose:",
     "our widget has no resample button; the lengths are a deterministic function of the knobs, so the "
     "exported copy and the server agree."),
    ("20", "the hint says GQA shrinks the cache ~4×", "corrected:", "the page shows the per-model numbers "
     "(4× for the 7B preset, 8× for 70B)."),
    ("G02", "'greedy continue' samples", "fixed:", "temperature 0 is the sampler's real greedy (argmax)."),
    ("G03", "the index says 'drag the mask boundary'; the widget is a toggle", "kept a toggle:",
     "the mask boundary is computed by collate from the template; the toggle and the example pick it."),
    ("G04", "the static KPIs disagree with the script's", "fixed:", "every KPI is computed (the CoT token "
     "count from posttrain's own trace)."),
    ("G06", "'at β = 0 p may cross 1.0'", "corrected:", "p is a probability, clamped to [0, 1]; it reaches 1 and "
     "stays (an absorbing state where every group is dead)."),
    ("21", "the scheduling widget is a formula with made-up constants", "replaced:",
     "the widget runs posttrain's Engine on a simulated workload and counts its decode steps."),
]

NOT_YET = [
    "Lessons 00 (orientation: its map is this index), 23, 24 and 27 (no widget in the course either) have no page yet.",
    "Lesson 22's planner widget shows one colocated pool; split placements (separate trainer, reference "
    "and rollout pools) are in `posttrain memory` but not yet a knob here.",
]


def by_id(lesson_id: str) -> Lesson:
    for ls in LESSONS:
        if ls.id == lesson_id:
            return ls
    raise UsageError(f"no lesson {lesson_id!r}; lessons: {', '.join(ls.id for ls in LESSONS)}")
