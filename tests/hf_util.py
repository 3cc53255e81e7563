"""Helpers shared by the Hugging Face tests (test_hf.py, test_decode_families.py)."""

import torch


def plain_logprobs(hf, samples, temperature=1.0):
    """log softmax(logits / T) of each sample's response tokens under one plain transformers
    forward over the right-padded batch (pads come after every real token: causal attention
    never sees them)."""
    seqs = [s.prompt_ids + s.response_ids for s in samples]
    ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
    for i, q in enumerate(seqs):
        ids[i, : len(q)] = torch.tensor(q)
    with torch.no_grad():
        logp = torch.log_softmax(hf(input_ids=ids).logits.float() / temperature, -1)  # [B, T, V]
    out = []
    for i, s in enumerate(samples):
        P, L = len(s.prompt_ids), len(s.response_ids)
        out.append(logp[i, P - 1 : P + L - 1].gather(-1, ids[i, P : P + L, None])[:, 0])  # [L]
    return out
