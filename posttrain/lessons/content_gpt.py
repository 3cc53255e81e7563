"""The gpt_mini track: the whole pipeline (pretraining, SFT, chain of thought, DPO, GRPO) on the
tiny model, one lesson a stage. content.LESSONS puts it after the RL track."""

from __future__ import annotations

from posttrain.lessons.content_lesson import ALG, G, Lesson

GPT_LESSONS = [
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
