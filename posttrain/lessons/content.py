"""The course's structure: each lesson's id, number, title, part and track, where its code lives
(links computed from the live source) and which widgets it carries. A lesson's text is
text/<id>.md (rendered by markdown.py); the short `idea`/`why` strings here stand in for a lesson
that has no text file yet, and give the gpt_mini index its one-line summaries."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from posttrain import UsageError
from posttrain.lessons.decisions import DECISIONS  # noqa: F401  (content.DECISIONS, read by pages)


@dataclass
class Lesson:
    id: str
    number: str
    title: str
    part: str
    idea: str
    why: str
    code: list[str]  # "module:qualname", resolved by pages.code_ref
    widgets: list[str] = field(default_factory=list)  # names in the widget registry

    @property
    def track(self) -> str:
        return "gpt" if self.id.startswith("gpt-") else "rl"


P0 = "Start here · orientation"
P1 = "Part I · the framework: six roles around the loss"
P2 = "Part II · the algorithms: one lineage"
P3 = "Part III · production: signal, data and systems"
P4 = "Part IV · the engineer"
P5 = "Part V · synthesis"
G = "gpt_mini · the whole pipeline on a tiny model"
PARTS = [P0, P1, P2, P3, P4, P5]  # the RL track, in reading order
TRACKS = {
    "rl": ("RL post-training, from first principles", "index.html"),  # track → (title, its index page)
    "gpt": ("gpt_mini: post-training a tiny model", "gpt_mini.html"),
}
TEXT_DIR = Path(__file__).resolve().parent / "text"  # text/<lesson-id>.md; gpt-index.md is the gpt_mini index
ALG = "posttrain.algorithms"

INTRO = (
    "Each page explains one idea of RL post-training and lets you turn its knobs. The plots are "
    "computed by posttrain's own functions (the same ones the trainer runs), so what you see is what "
    "the framework does. Every widget has at least one setting that breaks training; the page says which."
)

LESSONS = [
    Lesson(
        "rl-00",
        "00",
        "Orientation: one loop, six roles, one lineage",
        P0,
        "Every RL post-training system runs the same loop: the policy samples answers (rollout), "
        "something scores them (reward), a frozen copy gives the anchor (reference), an algorithm turns "
        "scores into advantages and a loss, the trainer steps, and the new weights go back to the "
        "sampler. The algorithms differ only in the baseline and scale of the advantage: REINFORCE → PPO "
        "(a learned critic) → GRPO (the group replaces the critic) → RLOO, DAPO and Dr. GRPO (patches).",
        "Three questions decide every design: where the signal comes from (lessons 03, 15–18a), how "
        "noisy and biased the gradient estimate is (04, 09–14), and what it costs on the cluster "
        "(05–06, 19–28). Knowing which question a change answers tells you where to look when it breaks.",
        ["posttrain.framework.controller:Controller.step", f"{ALG}:get", f"{ALG}.ppo:gae"],
        ["forces_map", "lineage"],
    ),
    Lesson(
        "rl-01",
        "01",
        "What post-training RL is",
        P1,
        "Sample an answer from the policy, score it, and raise the log-probability of the answer in "
        "proportion to its score. The gradient of expected reward is the expected reward times the "
        "gradient of the log-probability (the score-function, or log-derivative, trick), so the "
        "update needs samples and scores only, never a differentiable reward.",
        "Supervised learning needs the right answer; RL needs only a way to tell good answers from bad "
        "ones. That is what lets a model improve past its demonstrations on checkable tasks.",
        [f"{ALG}.reinforce:advantages", f"{ALG}.reinforce:surrogate", f"{ALG}.reinforce:loss"],
        ["bandit"],
    ),
    Lesson(
        "rl-02",
        "02",
        "Rollout: sampling and the behaviour logprobs",
        P1,
        "The rollout role draws K responses per prompt and, at the moment it samples each token, records "
        "that token's log-probability under the exact distribution it sampled from. Temperature is "
        "applied in one function that the trainer imports too, so sampler and trainer agree.",
        "Every off-policy correction (the PPO ratio, async importance weights) divides the trainer's "
        "probability by this recorded one. Recompute it after an update and the ratio is always 1: the "
        "clip silently never fires.",
        [
            "posttrain.framework.rollout:sample_tokens",
            "posttrain.framework.rollout:token_logprobs",
            "posttrain.framework.rollout:Engine.generate",
        ],
        ["sampler"],
    ),
    Lesson(
        "rl-03",
        "03",
        "Reward and reference",
        P1,
        "The reward comes from a verifier (here: the last integer of the response against the gold "
        "answer). The reference is a frozen copy of the starting policy; the loss adds β times an "
        "estimate of KL(π_θ ‖ π_ref) computed on the sampled tokens, usually k3 = e^d − 1 − d.",
        "A verifier is cheap and exact but only checks what it checks; the KL anchor keeps the policy "
        "close to a model that still writes sensibly, so it cannot drift into whatever the reward "
        "function happens to over-reward.",
        ["posttrain.tasks.arithmetic:verify", f"{ALG}.core:kl", "posttrain.framework.reference:Reference"],
        ["verifier", "kl", "beta"],
    ),
    Lesson(
        "rl-04",
        "04",
        "Algorithm: advantages and a loss",
        P1,
        "An algorithm is two pure functions: <code>advantages(rewards, group_index, cfg)</code> and "
        "<code>loss(logprobs, batch, cfg, norm)</code>. Everything shared (masked means, aggregation "
        "modes, KL estimators, the clip) lives in <code>core.py</code>.",
        "Keeping the algorithm this small is what makes REINFORCE, GRPO, RLOO and Dr. GRPO readable as "
        "patches of one another, and lets the same trainer run all of them.",
        [f"{ALG}:get", f"{ALG}.grpo:advantages", f"{ALG}.rloo:advantages", f"{ALG}.core:group_stats"],
        ["advantages"],
    ),
    Lesson(
        "rl-05",
        "05",
        "Trainer: where gradients flow",
        P1,
        "The trainer recomputes the policy's logprobs on the batch, calls the algorithm's loss on them, "
        "and runs the project's only <code>backward()</code>, then clips the gradient norm and steps "
        "AdamW. Big batches are split into micro-batches whose losses use the whole batch's normaliser.",
        "Three logprobs meet in one loss: the sampler's (old), the trainer's (new, with gradient) and "
        "the reference's. Seeing each token's contribution is the fastest way to debug a run.",
        [
            "posttrain.framework.trainer:Trainer.step",
            f"{ALG}.grpo:loss",
            f"{ALG}.core:ppo_clip_loss",
            f"{ALG}.core:finish_loss",
        ],
        ["loss_assembly"],
    ),
    Lesson(
        "rl-06",
        "06",
        "Weight sync",
        P1,
        "After each optimizer step the new weights go to the sampler: a no-op when both share one module, "
        "a versioned copy otherwise. Every sample carries the <code>policy_version</code> that produced it.",
        "A sampler that runs on old weights produces samples whose ratio to the current policy drifts "
        "out of the clip band; the updates they feed are clipped to nothing while the loss still looks fine.",
        ["posttrain.framework.weight_sync:WeightSync.sync", f"{ALG}.core:importance_ratio"],
        ["sync"],
    ),
    Lesson(
        "rl-07",
        "07",
        "Controller: the loop",
        P1,
        "One step: rollout → rewards → reference logprobs → advantages → collate → train step → weight "
        "sync → metrics. The controller calls the roles in that order and owns the policy for groups "
        "that carry no signal (skip, keep or resample).",
        "Keeping orchestration separate from the math is what lets the same loop run in one process or "
        "across Ray actors, and keeps each role testable alone.",
        ["posttrain.framework.controller:Controller.step", "posttrain.framework.batch:collate_samples"],
        ["controller"],
    ),
    Lesson(
        "rl-08",
        "08",
        "Agent episodes: masking tool output",
        P1,
        "In a multi-turn episode the response interleaves the policy's turns with text the environment "
        "inserted (tool results). Those tokens get <code>response_mask = 0</code> from whoever produced "
        "them and never enter a loss or a metric.",
        "Without the mask, the policy is trained to write the tool's output itself — it learns to fake "
        "observations instead of learning when to call the tool.",
        ["posttrain.framework.batch:collate"],
        ["tool_mask"],
    ),
    Lesson(
        "rl-09",
        "09",
        "REINFORCE",
        P2,
        "The loss is −A·Σ_t log π(y_t) with A = R (no baseline): the plainest unbiased policy gradient. "
        "Subtracting any baseline that does not depend on the sampled response keeps it unbiased and "
        "lowers its variance.",
        "Its variance is the problem every later algorithm attacks: one binary reward per response "
        "says little, and the estimate only sharpens like 1/√K in the number of samples.",
        [f"{ALG}.reinforce:advantages", f"{ALG}.reinforce:loss"],
        ["snr"],
    ),
    Lesson(
        "rl-10",
        "10",
        "PPO: critic, GAE, clip",
        P2,
        "PPO learns a value function to serve as the baseline (with GAE for per-token advantages) and "
        "limits each update with the clipped ratio −min(ρA, clip(ρ, 1−ε, 1+ε)A), so several epochs can "
        "reuse one batch of samples.",
        "Reusing samples makes the policy drift from the one that sampled; the clip removes the "
        "incentive to move further once the ratio has left the band, in the direction that would help.",
        [f"{ALG}.core:ppo_clip_loss", f"{ALG}.ppo:gae", f"{ALG}.ppo:loss"],
        ["clip"],
    ),
    Lesson(
        "rl-11",
        "11",
        "GRPO: the group replaces the critic",
        P2,
        "Sample G responses per prompt and use their own mean and standard deviation as the baseline "
        "and scale: A_i = (R_i − mean)/(std + ε). The loss is PPO's clipped surrogate with the KL in it.",
        "A value network as big as the policy costs memory and is noisy early in training; for outcome "
        "rewards the group gives a good baseline for free.",
        [f"{ALG}.grpo:advantages", f"{ALG}.grpo:loss", f"{ALG}.core:group_stats"],
        ["grpo_group"],
    ),
    Lesson(
        "rl-12",
        "12",
        "RLOO: leave one out",
        P2,
        "Compare each response with the mean of the other K−1: A_i = R_i − mean_{j≠i} R_j, which equals "
        "K/(K−1)·(R_i − mean). No clip, no std.",
        "Including a sample in its own baseline biases the gradient by a factor (K−1)/K; leaving it out "
        "makes the estimator unbiased at the same cost.",
        [f"{ALG}.rloo:advantages"],
        ["rloo"],
    ),
    Lesson(
        "rl-13",
        "13",
        "DAPO: four practical switches",
        P2,
        "Clip-higher (ε_high = 0.28), dynamic sampling (refill groups that are all right or all wrong), "
        "a token-level loss, and a soft penalty for responses that run into the length cap.",
        "Each fixes a failure seen at scale: entropy collapse, wasted steps on easy prompts, long answers "
        "under-weighted, and truncated answers punished as if they were wrong.",
        [
            f"{ALG}.dapo:degenerate",
            f"{ALG}.dapo:overlong_penalty",
            f"{ALG}.dapo:advantages",
            "posttrain.lessons.dapo_toy:run",
        ],
        ["dapo", "dapo_ablation"],
    ),
    Lesson(
        "rl-14",
        "14",
        "Dr. GRPO: removing two biases",
        P2,
        "GRPO with two switches flipped: no division by the group std, and no division by each "
        "response's own length (a constant normaliser instead).",
        "Dividing by |y_i| gives the tokens of short responses more gradient than those of long ones, so "
        "long wrong answers are punished less and grow; dividing by the std over-weights prompts that "
        "are almost always right or wrong.",
        [f"{ALG}.dr_grpo:Config", f"{ALG}.core:aggregate", f"{ALG}.core:batch_norm"],
        ["length_bias"],
    ),
    Lesson(
        "rl-15",
        "15",
        "RLHF and the reward model",
        P3,
        "When no program can check an answer, people compare pairs of answers and a reward model learns "
        "a score whose differences predict their choices: the Bradley–Terry loss −log σ(r_w − r_l). The "
        "policy is then trained against that score, with a KL anchor.",
        "Preferences are cheap to collect and capture what is hard to write down, but the learned score "
        "is only right near the data it saw, which is why the anchor matters more here than with a verifier.",
        ["posttrain.preference.reward_model:bradley_terry_loss", "posttrain.preference.reward_model:RewardModel"],
        ["bt_rm"],
    ),
    Lesson(
        "rl-16",
        "16",
        "DPO and its family",
        P3,
        "The KL-regularised reward-maximisation problem has a closed-form optimum in which the reward is "
        "β·log π/π_ref. DPO trains the policy directly with a Bradley–Terry loss on that implicit reward "
        "over preference pairs: no reward model, no sampling.",
        "It is cheap and stable, but off-policy: it can push the probabilities of both the chosen and the "
        "rejected answers down, and it learns only from the pairs it is given.",
        ["posttrain.preference.dpo:preference_loss"],
        ["dpo4", "pref_curves"],
    ),
    Lesson(
        "rl-17",
        "17",
        "Outcome and process rewards, and search",
        P3,
        "An outcome reward model scores a finished answer; a process reward model scores every step. "
        "At test time either can rerank N samples, and a PRM can also steer a beam search that keeps "
        "only the most promising partial chains.",
        "Long chains fail at one step; scoring steps puts the signal where the error is, and search "
        "spends samples on chains that still look right.",
        ["posttrain.eval:pass_at_k", "posttrain.eval:majority_correct"],
        ["prm"],
    ),
    Lesson(
        "rl-18",
        "18",
        "Environments, verifiers and reward hacking",
        P3,
        "A verifier is a function from (prompt, response) to a reward. Whatever it rewards, the policy "
        "will find, including what it rewards by mistake.",
        "A leak in the verifier becomes the behaviour you train; held-out evaluation with a strict "
        "checker is the only signal that tells real progress from gaming.",
        [
            "posttrain.tasks.arithmetic:ArithmeticTask.reward",
            "posttrain.tasks.math_answer:score",
            "posttrain.tasks.base:safe_reward",
        ],
        ["hacking"],
    ),
    Lesson(
        "rl-18a",
        "18a",
        "Data: where the gradient is",
        P3,
        "With a group baseline and 0/1 rewards, a prompt solved with probability p gives advantages whose "
        "square averages p(1−p): no signal at p = 0 or 1, most at ½. Curation keeps prompts near the "
        "middle and re-measures as the policy improves.",
        "Prompts that are always or never solved cost full rollouts and produce zero gradient; filtering "
        "them is often the cheapest speed-up a run has.",
        [
            "posttrain.data.curate:probe",
            "posttrain.data.curate:bucket",
            "posttrain.data.curate:curate",
            f"{ALG}.dapo:degenerate",
        ],
        ["curation"],
    ),
    Lesson(
        "rl-19",
        "19",
        "Topology: where the roles run",
        P3,
        "Colocated: rollout and training share GPUs and take turns. Disaggregated: separate pools, so "
        "one phase hides the other. Async: the sampler runs ahead of the trainer by a bounded number of "
        "versions.",
        "Rollout dominates a step; overlapping it with training is the largest speed-up available, and "
        "its cost is staleness, which the importance ratio has to correct.",
        ["posttrain.sizing.throughput:compare_topologies", "posttrain.framework.weight_sync:WeightSync.sync"],
        ["topology"],
    ),
    Lesson(
        "rl-20",
        "20",
        "The KV cache",
        P3,
        "Decoding a token attends over the keys and values of every earlier token; the engine keeps "
        "them in a cache instead of recomputing the prefix, so each step costs one token's forward.",
        "Decode reads all the weights and the whole cache for every step: at long lengths and high "
        "concurrency the cache, not the model, decides what fits and how fast it runs.",
        ["posttrain.models.gpt_mini:KVCache", "posttrain.models.gpt_mini:KVCache.copy_row"],
        ["kv"],
    ),
    Lesson(
        "rl-21",
        "21",
        "Scheduling: continuous batching, shared prefill",
        P3,
        "The engine decodes a pool of slots in one forward per step; a slot whose response ends is "
        "refilled with the next waiting sample at once, and the K samples of a prompt copy one prefill.",
        "Response lengths are long-tailed: a static batch waits for its longest member while the other "
        "slots idle. Refilling keeps the forward full.",
        [
            "posttrain.framework.rollout:Engine",
            "posttrain.framework.rollout:_Run._step",
            "posttrain.framework.rollout:_Run._admit",
        ],
        ["scheduler"],
    ),
    Lesson(
        "rl-22",
        "22",
        "Memory math",
        P3,
        "Training a parameter costs about 18 bytes (bf16 weight, fp32 master copy, fp32 gradient, two "
        "Adam moments); serving it costs 2 bytes plus the KV cache. Activations grow with sequence "
        "length and batch, and checkpointing trades recomputation for most of them.",
        "Whether a recipe fits decides the topology before anything else: how many GPUs the trainer "
        "needs, whether the sampler can share them, how long the sequences may be.",
        [
            "posttrain.sizing.memory:plan",
            "posttrain.sizing.memory:envelope",
            "posttrain.sizing.shapes:kv_bytes_per_token",
        ],
        ["planner", "memory"],
    ),
    Lesson(
        "rl-22a",
        "22a",
        "The throughput equation",
        P3,
        "A step's wall time is the sum (colocated) or the overlap (disaggregated, async) of per-role "
        "times: rollout, verification, reference, training, sync. Useful tokens per second divide the "
        "tokens that reach the loss by that time.",
        "It tells you which term to attack: at long responses rollout is almost the whole step, and "
        "speeding up the trainer changes nothing.",
        [
            "posttrain.sizing.throughput:step_time",
            "posttrain.sizing.throughput:role_model",
            "posttrain.sizing.throughput:from_metrics",
            "posttrain.framework.controller:Controller.timer",
        ],
        ["throughput"],
    ),
    Lesson(
        "rl-22b",
        "22b",
        "Long-tail rollouts",
        P3,
        "Response lengths are long-tailed (roughly log-normal), and a step waits for the longest of "
        "its B·K responses, whose expected length grows with K and with the spread of the distribution.",
        "The tail, not the mean, sets the rollout time. A length cap near the 95th percentile, dynamic K "
        "(stop a group once it has both a right and a wrong answer) and packing attack it directly.",
        [f"{ALG}.dapo:overlong_penalty", "posttrain.framework.rollout:_Run._retire"],
        ["stragglers"],
    ),
    Lesson(
        "rl-22c",
        "22c",
        "Async pipelining and staleness",
        P3,
        "An async run lets rollout produce samples from weights up to Δ versions old while the trainer "
        "steps; each sample's behaviour logprobs let the ratio correct for the gap.",
        "The further ahead the sampler runs, the more tokens fall outside the clip band: past a "
        "staleness of a few versions the speed-up is paid for with discarded gradient.",
        [f"{ALG}.core:importance_ratio", f"{ALG}.core:ratio_metrics"],
        ["async_pipe"],
    ),
    Lesson(
        "rl-23",
        "23",
        "Famous recipes and how runs fail",
        P3,
        "Published recipes are compositions of the stages in these lessons: InstructGPT is SFT → a reward "
        "model → PPO with a KL anchor; R1-Zero is GRPO from the base model with a verifier and a format "
        "reward; R1 adds a small cold-start SFT, rejection-sampled SFT and a second RL round; Tülu 3 is "
        "SFT → DPO → RL on verifiable rewards. In posttrain such a chain is a pipeline config. Runs fail "
        "in a handful of recurring ways, and each leaves a trace in one metric: entropy for collapse, "
        "<code>clip/frac</code> for a stale sampler, <code>group/degenerate_frac</code> for prompts that "
        "are too easy, train reward rising while held-out accuracy stays flat for reward hacking.",
        "The loss curve says almost nothing about an RL run. <code>posttrain report</code> runs a fixed "
        "set of alarms on every run's metrics; knowing which alarm matches which cause turns a "
        "mysterious plateau into a config change.",
        [
            "posttrain.report:alarms",
            "posttrain.report:entropy_collapse",
            "posttrain.report:clip_fraction_high",
            "posttrain.report:degenerate_groups",
            "posttrain.recipes.pipeline:run",
        ],
        ["failures", "classify"],
    ),
    Lesson(
        "rl-24",
        "24",
        "The RL infra engineer",
        P4,
        "The job is keeping the loop fast and correct at once: rollout is most of each step's time, so "
        "the sampler's throughput, the placement of the roles on GPUs and the cost of moving weights "
        "decide the speed; and a handful of silent bugs decide whether the numbers mean anything — "
        "sampler and trainer disagreeing on log-probs, a reference that is not frozen, stale samples, "
        "an EOS token scored on one side only, tool tokens left in the loss.",
        "The first questions on any whiteboard are 'does it fit?' and 'where do the seconds go?'. "
        "posttrain answers both with pure functions (the memory planner and the role-time model) and "
        "guards the correctness traps with tests: log-prob parity, a frozen reference, masks set by the "
        "producer of each token.",
        [
            "posttrain.sizing.memory:plan",
            "posttrain.sizing.throughput:role_model",
            "posttrain.framework.reference:Reference",
            "posttrain.framework.weight_sync:WeightSync.sync",
        ],
        ["sizing"],
    ),
    Lesson(
        "rl-25",
        "25",
        "Kernels for RL",
        P4,
        "Two savings that need no approximation: K samples of one prompt can share its prefill (the "
        "prompt's keys and values are computed once), and the trainer's log-probs can be computed over "
        "vocabulary chunks instead of materialising every logit.",
        "At long contexts the logits tensor alone is larger than the model's activations; at large K "
        "the repeated prompt is most of the prefill.",
        ["posttrain.framework.rollout:_Run._prefill", "posttrain.framework.logprobs:sequence_logprobs"],
        ["kernels"],
    ),
    Lesson(
        "rl-26",
        "26",
        "Why recipes look the way they do",
        P5,
        "Three forces pick a recipe: how much verifiable signal the task has, how much estimator bias "
        "you can tolerate, and what the cluster costs. Extreme settings recover the named recipes.",
        "It is a way to read a new paper: which force moved, and which of the lessons' switches it flipped.",
        [f"{ALG}:get"],
        ["forces"],
    ),
    Lesson(
        "rl-27",
        "27",
        "Concepts the course leaves out",
        P5,
        "The course lists seventeen gaps. posttrain closes several of them in code: GAE for PPO, the three "
        "KL estimators k1/k2/k3, an entropy bonus (<code>entropy_coef</code>), reward whitening, "
        "checkpoint and resume, LoRA, and truncated importance weights for samples from an older policy. "
        "The last is the one an async run needs: a sample drawn Δ versions ago is weighted by "
        "w = π_now/π_old, capped at C so one unlikely token cannot dominate the batch. Still open here: "
        "process reward model training, RLAIF judges, FP8, MoE routing under RL and multi-LoRA serving.",
        "Staleness is what async pipelining buys its speed with; without a correction the gradient "
        "estimates the policy that sampled, not the one being trained, and the error grows with Δ.",
        [
            f"{ALG}.core:off_policy_weights",
            f"{ALG}.ppo:gae",
            f"{ALG}.core:kl",
            f"{ALG}.core:masked_whiten",
            "posttrain.checkpoint:save",
            "posttrain.models.lora:apply_lora",
        ],
        ["off_policy", "gaps"],
    ),
    Lesson(
        "rl-28",
        "28",
        "Bottlenecks and where to optimise",
        P5,
        "Time each role every step (posttrain logs time/rollout_s, time/train_s, time/sync_s), then "
        "spend effort on the largest slice. Optimisations compose multiplicatively within a role and "
        "additively across roles.",
        "A 2× on a 10% slice buys 5%: the common mistake is to tune the trainer while rollout is most of the step.",
        ["posttrain.framework.controller:Controller.timer"],
        ["budget"],
    ),
    Lesson(
        "gpt-01",
        "G01",
        "The model under every stage",
        G,
        "gpt_mini is a small decoder-only transformer shaped like Llama: token embeddings, blocks of "
        "RMSNorm → attention with rotary positions → RMSNorm → SwiGLU MLP, a final norm and an output "
        "head. The same class runs pretraining, SFT, DPO and RL, and exports to Hugging Face.",
        "Knowing where the parameters and FLOPs are (the blocks, ~12d² each) is what every memory and "
        "throughput estimate later builds on.",
        [
            "posttrain.models.gpt_mini:count_params",
            "posttrain.models.gpt_mini:GPTMini",
            "posttrain.models.gpt_mini:Attention.forward",
        ],
        ["shapes"],
    ),
    Lesson(
        "gpt-02",
        "G02",
        "Pretraining",
        G,
        "Next-token prediction on raw text: every position of every window is a training example, and "
        "the loss is the cross-entropy of the true next character.",
        "It gives the model the statistics of the language (here: arithmetic traces) that every later "
        "stage only reshapes; sampling from it shows what it has learned.",
        ["posttrain.recipes.pretrain:run", "posttrain.recipes.common:lm_loss", "posttrain.lessons.runs:pretrain_run"],
        ["next_char"],
    ),
    Lesson(
        "gpt-03",
        "G03",
        "Supervised fine-tuning and the loss mask",
        G,
        "SFT trains on (prompt, response) pairs in a chat template, with the loss only on response "
        "tokens: the collate function sets <code>loss_mask = 1</code> from the first response token on.",
        "The prompt is given, not generated; training on it wastes capacity on predicting questions "
        "and blurs what the model should produce.",
        ["posttrain.framework.batch:collate", "posttrain.recipes.sft:SFTBatches", "posttrain.lessons.runs:sft_run"],
        ["sft_mask"],
    ),
    Lesson(
        "gpt-04",
        "G04",
        "Chain of thought",
        G,
        "Same loss, different data: the response first writes the running sums, then the answer. "
        "<code>{3+4=7;7+5=12}12#</code> instead of <code>12#</code>.",
        "A forward pass has a fixed number of layers; each written token adds another pass, so a "
        "multi-step sum no longer has to fit inside one.",
        ["posttrain.tasks.arithmetic:Problem.trace", "posttrain.tasks.arithmetic:Problem.target"],
        ["cot"],
    ),
    Lesson(
        "gpt-05",
        "G05",
        "DPO on the tiny model",
        G,
        "Pairs of a correct (chosen) and a corrupted (rejected) answer; the loss raises the chosen "
        "answer's log-ratio to the frozen SFT model relative to the rejected one's.",
        "It is the cheapest preference stage: four forward passes per pair, no sampling. Its first loss "
        "is always ln 2, since the policy starts equal to the reference.",
        ["posttrain.preference.dpo:preference_loss", "posttrain.recipes.dpo:run"],
        ["dpo_pair"],
    ),
    Lesson(
        "gpt-06",
        "G06",
        "RL with verifiable rewards (GRPO)",
        G,
        "Sample K answers per problem, score them with the verifier, compute group advantages, and "
        "update with the clipped loss and a KL anchor to the SFT model.",
        "It trains on the model's own samples, so it can fix the mistakes the model actually makes; "
        "it needs prompts the model sometimes, but not always, gets right.",
        ["posttrain.recipes.rl:run", f"{ALG}.grpo:advantages"],
        ["grpo_sim"],
    ),
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
    ("I am new here", ["rl-00", "rl-01", "rl-07"]),
    ("I want to understand sampling", ["rl-02", "rl-20", "rl-21"]),
    ("I want to change the algorithm", ["rl-04", "rl-11", "rl-14"]),
    ("I want a better reward", ["rl-03", "rl-15", "rl-18", "rl-18a"]),
    ("I want to size a cluster", ["rl-19", "rl-22", "rl-22a"]),
]

NOT_YET = [
    "Lesson 22's planner widget shows one colocated pool; split placements (separate trainer, reference "
    "and rollout pools) are a knob only in lesson 24's sizing widget (and in `posttrain memory`).",
]


def track(lesson: Lesson) -> list[Lesson]:
    """The lessons of the track the lesson belongs to, in reading order."""
    return [ls for ls in LESSONS if ls.track == lesson.track]


def text_path(page_id: str) -> Path:
    return TEXT_DIR / f"{page_id}.md"


def by_id(lesson_id: str) -> Lesson:
    for ls in LESSONS:
        if ls.id == lesson_id:
            return ls
    raise UsageError(f"no lesson {lesson_id!r}; lessons: {', '.join(ls.id for ls in LESSONS)}")
