"""The course's glossary: each term in a sentence or two, and the lesson that explains it.
Definitions are in the lessons' Markdown dialect (math allowed, no directives)."""

from __future__ import annotations

from posttrain.lessons import content, markdown
from posttrain.lessons.directives import esc

TERMS = [  # (term, lesson id, definition)
    (
        "Advantage",
        "rl-04",
        "How much better one response did than expected for its prompt, $A = R - b$. The loss scales each "
        "response's log-probability gradient by it, so only responses that beat the baseline are pushed up.",
    ),
    (
        "Baseline",
        "rl-09",
        "The expected reward $b$ subtracted from each reward before the update. Any baseline that does not "
        "depend on the sampled response leaves the gradient unbiased and can cut its variance a lot.",
    ),
    (
        "Behaviour logprob",
        "rl-02",
        "The log-probability of a sampled token under the exact distribution it was drawn from (same weights, "
        "same temperature), recorded by the sampler at that moment. Every off-policy correction divides by it.",
    ),
    (
        "Bradley–Terry model",
        "rl-15",
        "The assumption that a person prefers answer $w$ to $l$ with probability $\\sigma(r_w - r_l)$; a reward "
        "model is fitted by minimising $-\\log\\sigma(r_w - r_l)$ over labelled pairs.",
    ),
    (
        "Chain of thought",
        "gpt-04",
        "Writing the intermediate steps before the answer. Each written token is one more forward pass, so a "
        "problem no longer has to be solved inside the fixed depth of one pass.",
    ),
    (
        "Chunked prefill",
        "rl-21",
        "Splitting a long prompt's prefill into pieces that share forward passes with other sequences' decode "
        "steps, so one long prompt does not stall every running sample.",
    ),
    (
        "Clip (PPO ratio clip)",
        "rl-10",
        "The surrogate $\\min(\\rho A, \\operatorname{clip}(\\rho, 1-\\epsilon, 1+\\epsilon) A)$: once the ratio "
        "$\\rho$ has left the band in the direction that helps, the token's gradient is zero.",
    ),
    (
        "Clip-higher",
        "rl-13",
        "DAPO's asymmetric clip band, a larger upper bound ($\\epsilon_{high} = 0.28$ against 0.2), which leaves "
        "room to raise unlikely tokens and so slows the collapse of entropy.",
    ),
    (
        "Colocated, disaggregated, async",
        "rl-19",
        "Where the roles run: colocated shares the GPUs between rollout and training in turns; disaggregated "
        "gives each its own pool (on-policy, the pools take turns; one step off, they overlap on samples one "
        "version stale); async lets the sampler run ahead of the trainer by a bounded number of versions.",
    ),
    (
        "Continuous batching",
        "rl-21",
        "Refilling a decoding slot the moment its sequence ends instead of waiting for the whole batch, so the "
        "batched forward stays full while response lengths differ.",
    ),
    (
        "Critic (value function)",
        "rl-10",
        "A network $V(s)$ trained to predict the return from each prefix; PPO uses it as a per-token baseline. "
        "GRPO and RLOO drop it and use the other samples of the same prompt instead.",
    ),
    (
        "Degenerate group",
        "rl-18a",
        "A group whose responses all got the same reward (all right or all wrong). Its advantages are all zero, "
        "so it costs a full rollout and gives no gradient; posttrain counts, skips or resamples them.",
    ),
    (
        "DPO",
        "rl-16",
        "Direct preference optimisation: the Bradley–Terry loss on the implicit reward "
        "$\\beta \\log \\pi_\\theta(y)/\\pi_{ref}(y)$ of preference pairs. It trains the policy with no reward "
        "model and no sampling.",
    ),
    (
        "Dr. GRPO",
        "rl-14",
        "GRPO with two divisions removed: by the group's standard deviation and by each response's own length. "
        "Both introduced biases, toward easy or hard prompts and toward long wrong answers.",
    ),
    (
        "Dynamic sampling",
        "rl-13",
        "DAPO's refill of degenerate groups: keep sampling prompts until the batch is full of groups that carry "
        "a signal, so no step is spent on groups with zero advantage.",
    ),
    (
        "Entropy collapse",
        "rl-23",
        "The policy's token distribution becoming nearly deterministic early in a run. Exploration stops and "
        "reward plateaus; the entropy metric shows it before the reward does.",
    ),
    (
        "GAE",
        "rl-10",
        "Generalised advantage estimation: an exponentially weighted sum of one-step temporal-difference errors, "
        "$A_t = \\sum_l (\\gamma\\lambda)^l \\delta_{t+l}$, where $\\lambda$ trades the critic's bias against the "
        "variance of the sampled return.",
    ),
    (
        "Group",
        "rl-11",
        "The $G$ responses sampled for one prompt. GRPO uses their mean as the baseline and their standard "
        "deviation as the scale of each response's advantage.",
    ),
    (
        "GRPO",
        "rl-11",
        "Group relative policy optimisation: PPO's clipped loss with the critic replaced by group statistics, "
        "$A_i = (R_i - \\bar R)/(\\operatorname{std}(R) + \\varepsilon)$.",
    ),
    (
        "Importance ratio",
        "rl-10",
        "$\\rho = \\pi_\\theta(y_t)/\\pi_{old}(y_t)$, the current policy's probability of a sampled token over "
        "the behaviour policy's. It is exactly 1 on-policy and drifts as the samples grow stale.",
    ),
    (
        "KL anchor",
        "rl-03",
        "A penalty $\\beta \\cdot \\mathrm{KL}(\\pi_\\theta \\,\\|\\, \\pi_{ref})$ in the loss that keeps the "
        "policy near the reference model, so it cannot drift into whatever the reward over-rewards.",
    ),
    (
        "KL estimators k1, k2, k3",
        "rl-03",
        "Per-token estimates of the KL from the log-ratio $d = \\log \\pi_{ref} - \\log \\pi_\\theta$ of a "
        "sampled token: $k_1 = -d$ (unbiased, can be negative), $k_2 = d^2/2$ (biased, low variance), "
        "$k_3 = e^d - 1 - d$ (unbiased and never negative).",
    ),
    (
        "KV cache",
        "rl-20",
        "The keys and values of every earlier token, kept by the engine so each decoding step computes one new "
        "token instead of the whole prefix. At long lengths it, not the weights, fills the memory.",
    ),
    (
        "Loss aggregation",
        "rl-14",
        "How per-token losses become one number: a mean per sequence then over sequences, a mean over all "
        "tokens, or a sum over a constant. The choice decides how much each token of a long answer weighs.",
    ),
    (
        "Loss mask",
        "gpt-03",
        "A 0/1 flag per token saying whether it enters the loss. SFT sets it to 1 on response tokens only; agent "
        "episodes set it to 0 on tool output.",
    ),
    ("ORM", "rl-17", "Outcome reward model: scores a finished answer as a whole, one number per response."),
    (
        "Overlong shaping",
        "rl-13",
        "DAPO's soft penalty for responses that approach the length cap, so a truncated answer is not punished "
        "exactly like a wrong one.",
    ),
    (
        "pass@k",
        "rl-17",
        "The probability that at least one of $k$ samples is correct, estimated without bias from $n \\ge k$ "
        "samples with $c$ correct as $1 - \\binom{n-c}{k}/\\binom{n}{k}$.",
    ),
    (
        "Policy version",
        "rl-06",
        "The number of optimizer steps behind a set of weights. Every sample carries the version that produced "
        "it, which is how a run measures staleness.",
    ),
    (
        "PPO",
        "rl-10",
        "Proximal policy optimisation: a learned critic with GAE as the baseline and the clipped ratio, so "
        "several epochs can reuse one batch of samples safely.",
    ),
    (
        "Prefix caching",
        "rl-21",
        "Reusing the keys and values of a prompt that several sequences share, such as the $K$ samples of one "
        "prompt, instead of computing its prefill once per sequence.",
    ),
    (
        "PRM",
        "rl-17",
        "Process reward model: scores every step of a solution, so a long chain is judged where it fails and a "
        "search can drop chains that have already gone wrong.",
    ),
    (
        "Reference policy",
        "rl-03",
        "A frozen copy of the starting model. It supplies the log-probabilities of the KL anchor and is never updated.",
    ),
    (
        "REINFORCE",
        "rl-09",
        "The plain score-function policy gradient, $\\nabla J = \\mathbb{E}[R \\, \\nabla \\log \\pi(y)]$: "
        "unbiased, high variance, the ancestor of every algorithm in the lineage.",
    ),
    (
        "Reward hacking",
        "rl-18",
        "The policy learning whatever the reward function rewards by mistake. Training reward rises while a "
        "strict held-out check stays flat.",
    ),
    (
        "Reward model",
        "rl-15",
        "A network that maps a prompt and an answer to a score, trained on human preference pairs; it stands in "
        "for a verifier where no program can check the answer.",
    ),
    (
        "RLHF",
        "rl-15",
        "Reinforcement learning from human feedback: SFT, then a reward model fitted to preferences, then RL "
        "against that model with a KL anchor.",
    ),
    (
        "RLOO",
        "rl-12",
        "REINFORCE leave-one-out: each response's baseline is the mean reward of the other $K-1$ samples of its "
        "prompt, which makes the estimator unbiased.",
    ),
    (
        "RLVR",
        "gpt-06",
        "Reinforcement learning with verifiable rewards: the reward comes from a program that checks the "
        "answer (a number, a unit test), not from a learned model.",
    ),
    (
        "Rollout",
        "rl-02",
        "Sampling responses from the current policy, with their behaviour log-probabilities; usually most of "
        "the time of an RL step.",
    ),
    (
        "Speculative decoding",
        "rl-21",
        "A small draft model proposes several tokens and the large model checks them in one forward; accepted "
        "tokens are free, and the sampled distribution is unchanged.",
    ),
    (
        "Staleness",
        "rl-22c",
        "How many policy versions behind the trainer a sample's weights were. Async pipelining trades it for "
        "throughput, and the importance ratio has to correct for it.",
    ),
    (
        "Stragglers (the long tail)",
        "rl-22b",
        "The few longest responses that a synchronous step waits for. Lengths are long-tailed, so the maximum "
        "of many samples, not the mean, sets the rollout time.",
    ),
    (
        "Temperature",
        "rl-02",
        "The divisor of the logits before sampling. The trainer must use the same one, or the sampler's and the "
        "trainer's log-probabilities disagree.",
    ),
    (
        "TIS (truncated importance sampling)",
        "rl-27",
        "Weighting a stale sample's tokens by $\\min(\\pi_{now}/\\pi_{old}, C)$: the ratio corrects the "
        "off-policy bias and the cap $C$ keeps one unlikely token from dominating the batch.",
    ),
    (
        "Tool mask",
        "rl-08",
        "`response_mask = 0` on the tokens the environment inserted into an episode (tool output), so the policy "
        "is never trained to write observations itself.",
    ),
    (
        "Verifier",
        "rl-18",
        "A function from a prompt and a response to a reward, such as the last integer checked against the gold "
        "answer. Whatever it rewards, the policy will find.",
    ),
    (
        "Weight sync",
        "rl-06",
        "Handing the trainer's new weights to the sampler after a step, with a version number: a no-op when both "
        "share one module, a copy or a broadcast otherwise.",
    ),
]


def anchor(term: str) -> str:
    return "g-" + markdown.slug(term)


def html(prefix: str) -> str:
    items = []
    for term, lesson_id, text in sorted(TERMS, key=lambda t: t[0].lower()):
        ls = content.by_id(lesson_id)
        items.append(
            f'<dt id="{anchor(term)}">{esc(term)}</dt><dd>{markdown.render(text)[0]}'
            f'<a class="see" href="{prefix}lessons/{ls.id}.html">→ lesson {esc(ls.number)}: {esc(ls.title)}</a></dd>'
        )
    return f'<dl class="glossary">{"".join(items)}</dl>'
