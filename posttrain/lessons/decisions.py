"""What the lesson site did with each of the course's widget bugs (the index's table)."""

# (lesson, the course's widget bug, decision, why) — the course's widget bugs and
# contradictions, decided here (docs/architecture.md §11)
DECISIONS = [
    (
        "03",
        "the β widget never reaches the reward-hack region (θ stays < 2.2 even at β = 0)",
        "fixed, course kept as an option:",
        "the 'fixed' step size (η = 1) lets β = 0 run into the hack; 'course' "
        "reproduces the original numbers (β = 0 → θ = 2.14).",
    ),
    (
        "09",
        "the error is measured against (1, 0.4), not E[ĝ], so it has a floor ≈ 0.77 and '0.45/√K' is a constant",
        "fixed, course kept as an option:",
        "the default measures against E[ĝ] and shows σ/√K computed from "
        "samples; 'course' reproduces the floor (0.93 / 0.81 / 0.78 at K = 1 / 4 / 16).",
    ),
    (
        "05",
        "frac_clipped counts every token with ρ outside the band",
        "both shown:",
        "posttrain's clip/frac counts only tokens whose gradient the clip zeroes; the widget also "
        "shows the course's out-of-band share.",
    ),
    (
        "07",
        "the collated batch is (3, 12)",
        "kept ours:",
        "posttrain's template gives (3, 10) for <3+4+5> and "
        "3-token answers; the shape is computed by collate_samples, not typed in.",
    ),
    (
        "11",
        "population std in widgets vs. torch's unbiased std in code",
        "both, as a knob:",
        "posttrain's default is unbiased (TRL/verl); the widgets start on population to match the tables.",
    ),
    (
        "14",
        "GRPO's per-token weight printed as A/|y_i| (0.05) while Dr. GRPO is A/K",
        "kept ours:",
        "core.aggregate also divides by the number of sequences, so GRPO gives 0.025 / 0.00125; "
        "the long/short ratio (5%) is the same.",
    ),
    (
        "17",
        "the beam search uses far fewer step samples than best-of-N (24 vs. 96 at N = 16), yet is "
        "called a fixed budget",
        "fixed, course kept as an option:",
        "'matched' gives the beam the same step budget (it then beats reranking); 'course' keeps K = ceil(N/6B).",
    ),
    (
        "13",
        "the DAPO widget's curves are drawn, not trained: dynamic sampling off leaves ≈34% useful steps, "
        "and the entropy floor is 0.02 with clip-higher off vs 0.20 with it on (Part C row 31)",
        "measured instead:",
        "our ablation trains a tabular policy with dapo.advantages/dapo.loss (16 settings × 3 "
        "seeds). Dynamic sampling off: 16–25% of groups carry signal; clip-higher keeps entropy only slightly "
        "higher (0.115 vs 0.106 at step 150, all other fixes on). The 10× entropy gap is not reproduced.",
    ),
    (
        "16",
        "IPO's target applied to the β-scaled gap",
        "fixed:",
        "IPO's minimum is at h = 1/(2β) on the unscaled log-ratio gap, as in the paper and TRL.",
    ),
    (
        "22a",
        "the widget divides rollout and training time by 4 twice, so it cannot reproduce its own "
        "worked example (32 s, 33k tok/s)",
        "both shown:",
        "the widget's formula is posttrain.sizing.throughput.role_model "
        "as the page computes it (τ_step 12.4 s, 84.7k tok/s, rollout 81%); the worked example is "
        "throughput.step_time on the text's role times (32 s, trainer idle 20 s, 32.8k tok/s).",
    ),
    (
        "22b",
        "the p95 cap is sorted[floor(0.95·K)], the maximum itself for K ≤ 20, so the cap does nothing "
        "at the default K = 16",
        "fixed, course kept as an option:",
        "'fixed' interpolates the 95th percentile; 'course' reproduces the no-op (τ_R 4015 with or without the cap).",
    ),
    (
        "22b",
        "the resample button is a no-op (the generator is reseeded from the knobs)",
        "kept, on purpose:",
        "our widget has no resample button; the lengths are a deterministic function of the knobs, so the "
        "exported copy and the server agree.",
    ),
    (
        "20",
        "the hint says GQA shrinks the cache ~4×",
        "corrected:",
        "the page shows the per-model numbers (4× for the 7B preset, 8× for 70B).",
    ),
    ("G02", "'greedy continue' samples", "fixed:", "temperature 0 is the sampler's real greedy (argmax)."),
    (
        "G03",
        "the index says 'drag the mask boundary'; the widget is a toggle",
        "kept a toggle:",
        "the mask boundary is computed by collate from the template; the toggle and the example pick it.",
    ),
    (
        "G04",
        "the static KPIs disagree with the script's",
        "fixed:",
        "every KPI is computed (the CoT token count from posttrain's own trace).",
    ),
    (
        "G06",
        "'at β = 0 p may cross 1.0'",
        "corrected:",
        "p is a probability, clamped to [0, 1]; it reaches 1 and stays (an absorbing state where every group is dead).",
    ),
    (
        "21",
        "the speculative-decoding bullet says little of the gain survives at T = 1",
        "corrected:",
        "the widget's own measured acceptance falls only from 0.67 to 0.63; the page cites the papers' "
        "2–2.6× at T = 1 and names batch size as what erodes the gain.",
    ),
    (
        "22",
        "an H100 is '80 GB' = 74.5 GiB, used as the card's capacity",
        "kept as a budget:",
        "the card reports 81,559 MiB = 79.6 GiB; the planner still budgets 80·10⁹ bytes, and every widget "
        "labels it the planner's budget, the 5.1 GiB left over a margin.",
    ),
    (
        "25",
        "FP8 cast of 140 GB in 42 ms; K/(1 + K·G/P) labelled a saving",
        "corrected:",
        "the cast reads 140 GB and writes 70 GB (63 ms); the ratio is labelled the course's prompt-token "
        "ratio, next to the all-token ratio K(1 + G/P)/(1 + K·G/P).",
    ),
    (
        "19, 22a, 22c",
        "the disaggregated equation max(sides) + τ_S overlaps an on-policy split; async hides the sync; "
        "every '× colocated' gives the split a second pool of GPUs",
        "fixed:",
        "throughput.step_time names each equation with what it assumes (colocated and the on-policy split "
        "add the terms; one_step_off overlaps on samples one version stale; async puts the weight load on "
        "the sampler, as posttrain's producer does; async_double_buffered hides it), and "
        "compare_topologies sets them side by side on the same GPUs, with the share of a phase that more "
        "GPUs shorten as a parameter.",
    ),
    (
        "22b",
        "the expected longest of K log-normals is exp(σ√(2 ln K) − σ²/2)",
        "fixed, course kept beside it:",
        "√(2 ln K) is the large-K envelope, 30–65% high at K = 4 to 256; throughput.max_of_k integrates "
        "the expectation (K = 16, cv = 1: 3.44, not 5.02) and length/max_of_k_expected uses it; the "
        "course's formula is max_of_k_envelope, shown next to it.",
    ),
    (
        "26",
        "the corner with full verifier coverage and no tolerance for bias (Dr. GRPO) is named DeepSeek-R1",
        "corrected:",
        "R1 ran GRPO with both normalisations Dr. GRPO removes; the GRPO corner is DeepSeek-R1, the Dr. GRPO "
        "corner Oat-Zero (the Dr. GRPO paper).",
    ),
    (
        "21",
        "the scheduling widget is a formula with made-up constants",
        "replaced:",
        "the widget runs posttrain's Engine on a simulated workload and counts its decode steps.",
    ),
]
