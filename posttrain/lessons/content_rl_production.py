"""The RL track's last three parts: production (signal, data and systems, 15–23), the engineer
(24–25) and the synthesis (26–28). content.LESSONS strings these after the foundations."""

from __future__ import annotations

from posttrain.lessons.content_lesson import ALG, P3, P4, P5, Lesson

PRODUCTION = [
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
        ["posttrain.reward_models.reward_model:bradley_terry_loss", "posttrain.reward_models.reward_model:RewardModel"],
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
        "Colocated: rollout and training share GPUs and take turns. Disaggregated: separate pools, which "
        "overlap only if the samples may be a version stale. Async: the sampler runs ahead of the trainer by "
        "a bounded number of versions.",
        "Compared on the same GPUs, overlap pays where a phase does not shorten on more GPUs (a rollout's "
        "long tail); its cost is staleness, which the importance ratio has to correct.",
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
            "posttrain.framework.decode_loop:DecodeLoop._window",
            "posttrain.framework.decode_loop:DecodeLoop._admit",
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
        "A step's wall time is the sum (colocated, on-policy split) or the overlap (one step off, async) of per-role "
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
        [f"{ALG}.dapo:overlong_penalty", "posttrain.framework.decode_loop:DecodeLoop._retire"],
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
        ["posttrain.framework.decode_loop:DecodeLoop._prefill", "posttrain.framework.logprobs:sequence_logprobs"],
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
]
