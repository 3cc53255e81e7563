"""The one collate function: samples → a padded `RolloutBatch` dict (docs/architecture.md §3).

    input_ids       [B, T]  prompt + response, right-padded
    attention_mask  [B, T]  1 on real tokens
    loss_mask       [B, T]  1 only on policy-generated response tokens (response_mask = 1)
    old_logprobs    [B, T]  behaviour logprobs recorded at sampling, 0 where loss_mask is 0
    rewards, group_index, policy_version   [B]

Alignment: logprobs[:, t] = log π(input_ids[:, t] | input_ids[:, :t]), so response token j
of a sample with prompt length P sits at column P + j with its logprob in the same column.
"""

from __future__ import annotations

import torch


def collate(prompts: list[list[int]], responses: list[list[int]], pad_id: int,
            mask_prompt: bool = True, response_masks: list[list[int]] | None = None) -> dict:
    """Right-padded `input_ids`, `attention_mask` and `loss_mask` [B, T].

    loss_mask[:, t] = 1 when input_ids[:, t] is a token to learn: the response tokens whose
    response_mask is 1 (and, without prompt masking, the prompt after its first token).
    """
    T = max(len(p) + len(r) for p, r in zip(prompts, responses))
    B = len(prompts)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros(B, T)
    loss = torch.zeros(B, T)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        P, n = len(p), len(p) + len(r)
        ids[i, :n] = torch.tensor(p + r, dtype=torch.long)
        attn[i, :n] = 1
        if response_masks is not None:
            loss[i, P:n] = torch.tensor(response_masks[i], dtype=torch.float)
        else:
            loss[i, (P if mask_prompt else 1):n] = 1
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}


def collate_samples(samples, pad_id: int) -> dict:
    batch = collate([s.prompt_ids for s in samples], [s.response_ids for s in samples], pad_id,
                    response_masks=[s.response_mask for s in samples])
    old = torch.zeros_like(batch["loss_mask"])
    for i, s in enumerate(samples):
        P = len(s.prompt_ids)
        old[i, P:P + len(s.response_ids)] = torch.tensor(s.response_logprobs, dtype=torch.float)
    batch["old_logprobs"] = old * batch["loss_mask"]
    batch["rewards"] = torch.tensor([s.reward for s in samples], dtype=torch.float)
    batch["group_index"] = torch.tensor([s.group for s in samples], dtype=torch.long)
    batch["policy_version"] = torch.tensor([s.policy_version for s in samples], dtype=torch.long)
    return batch
