"""The RL track's first three parts: orientation (00), the six roles around the loss (01–08) and
the algorithms as one lineage (09–14). content.LESSONS strings these after one another."""

from __future__ import annotations

from posttrain.lessons.content_lesson import ALG, P0, P1, P2, Lesson

FOUNDATIONS = [
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
]
