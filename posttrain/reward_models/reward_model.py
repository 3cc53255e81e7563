"""The reward model: a gpt_mini trunk and a scalar head read at the last real token of each
row, trained on preference pairs with the Bradley–Terry loss (or, as an ORM, on verifier labels).

    r(x, y) = w·h_last + b        h_last = trunk.hidden(prompt ⊕ response ⊕ EOT) at the last real token

    bt   −log σ(r_w − r_l − m) + η·(r_w + r_l)²     per pair; m = margin_coef × the pair's margin,
                                                    η = center_coef (Eisenstein et al. 2023, 2312.09244)
    orm  BCE(σ(r), label)                           per response; label 1 = verified correct, 0 = wrong

Both are averaged over the whole batch by the recipe (recipes/rm.py), pairs for bt, responses
for orm. The trunk stays a plain GPTMini, so it is saved as `model.safetensors` like every
stage's model; the head is a second file beside it, `reward_head.safetensors` (and, for
resuming, in trainer.pt's extra state). `load_reward_model` reads both back;
`RewardModelScorer` wraps a frozen RM as a reward function over (prompt, response) texts.

Deviations from TRL's RewardTrainer (`AutoModelForSequenceClassification`, num_labels=1):
1. The score is read at the last position whose attention_mask is 1, not at the last
   non-pad token id, so left or right padding both work.
2. The head has a bias (TRL's Llama score head has none). BT ignores it (only r_w − r_l and
   the centring see it); the ORM needs it for its decision threshold.
3. The data's `margin` is scaled by `margin_coef` (1 = TRL, which subtracts it as it is).
4. `orm` is not in TRL: it treats each pair as two labelled responses (chosen 1, rejected 0),
   which for the task's verifier-labelled pairs are the verifier's own labels.
5. Ties count half in `pairwise_accuracy` (TRL's `compute_accuracy` counts a tie as correct
   and warns).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from posttrain import checkpoint
from posttrain.errors import UsageError
from posttrain.framework.batch import collate
from posttrain.models.gpt_mini import GPTMini

HEAD_FILE = "reward_head.safetensors"


class RewardModel(nn.Module):
    """A trunk with `.hidden(ids)` (GPTMini) and a Linear(d_model, 1) score head.

    The trunk keeps its LM head so it stays a loadable GPTMini; that head gets no gradient.
    The score head starts like Hugging Face's (weight ~ N(0, 0.02), bias 0): small random
    scores, so accuracy starts near chance and the trunk gets a gradient from step one.
    """

    def __init__(self, trunk: GPTMini):
        super().__init__()
        p = next(trunk.parameters())
        self.trunk = trunk
        self.head = nn.Linear(trunk.config.d_model, 1).to(device=p.device, dtype=p.dtype)
        nn.init.normal_(self.head.weight, 0.0, 0.02)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Scores [B] of rows [B, T]."""
        h = self.trunk.hidden(input_ids)  # [B, T, d]
        last = last_token_index(attention_mask)  # [B]
        h_last = h[torch.arange(h.shape[0], device=h.device), last]  # [B, d]  ← the one position scored
        return self.head(h_last).squeeze(-1).float()  # [B]


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index [B] of the last position whose mask is 1 (right or left padding)."""
    T = attention_mask.shape[1]
    return T - 1 - attention_mask.flip(-1).argmax(-1)  # first 1 from the right


# ---- losses and metrics (pure functions of scores) ------------------------------------------


def bradley_terry_loss(
    r_chosen: torch.Tensor, r_rejected: torch.Tensor, margin: torch.Tensor | None = None, center_coef: float = 0.0
) -> torch.Tensor:
    """Per-pair losses [P]: −log σ(r_w − r_l − m) + η·(r_w + r_l)². The caller takes the mean."""
    delta = r_chosen - r_rejected  # [P]
    if margin is not None:
        delta = delta - margin  # Llama 2: a pair rated "much better" must win by m
    loss = -F.logsigmoid(delta)  # stable for large |Δ|
    if center_coef:
        loss = (
            loss + center_coef * (r_chosen + r_rejected) ** 2
        )  # pins the scores' offset near 0 (BT alone is shift-free)
    return loss


def orm_loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-response losses [N]: binary cross-entropy of σ(score) against a 0/1 verifier label."""
    return F.binary_cross_entropy_with_logits(scores, labels.to(scores.dtype), reduction="none")


def pairwise_accuracy(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> float:
    """Fraction of pairs scored chosen > rejected; a tie counts half."""
    return float(((r_chosen > r_rejected).float() + 0.5 * (r_chosen == r_rejected).float()).mean())


def pair_metrics(r_chosen: torch.Tensor, r_rejected: torch.Tensor, prefix: str = "rm/") -> dict:
    r_w, r_l = r_chosen.detach(), r_rejected.detach()
    return {
        f"{prefix}accuracy": pairwise_accuracy(r_w, r_l),
        f"{prefix}margin": float((r_w - r_l).mean()),
        f"{prefix}chosen": float(r_w.mean()),
        f"{prefix}rejected": float(r_l.mean()),
    }


# ---- scoring ---------------------------------------------------------------------------------


@torch.no_grad()
def score_batches(
    rm: RewardModel, prompts: list[list[int]], responses: list[list[int]], pad_id: int, batch_rows: int = 64
) -> torch.Tensor:
    """Scores [N] of token rows prompt ⊕ response, `batch_rows` at a time, in eval mode."""
    was_training = rm.training
    rm.eval()
    device = next(rm.parameters()).device
    out = []
    for a in range(0, len(prompts), batch_rows):
        b = collate(prompts[a : a + batch_rows], responses[a : a + batch_rows], pad_id)
        out.append(rm(b["input_ids"].to(device), b["attention_mask"].to(device)).cpu())
    rm.train(was_training)
    return torch.cat(out) if out else torch.zeros(0)


def score_pairs(rm: RewardModel, encoded, pad_id: int, batch_pairs: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """(r_chosen [P], r_rejected [P]) of encoded pairs (preference/data.encode_pairs)."""
    prompts = [p for p, _, _ in encoded for _ in (0, 1)]
    responses = [x for _, c, r in encoded for x in (c, r)]
    r = score_batches(rm, prompts, responses, pad_id, 2 * batch_pairs)  # [2P] interleaved
    return r[0::2], r[1::2]


class RewardModelScorer:
    """A frozen RM as a reward: `score(prompts, responses) -> list[float]`.

    Texts are as in preference pairs: the question, and the response with or without its
    end-of-turn token (a sample's decoded text has it when the response stopped). The chat
    template and one EOT are added here, as in training, so a truncated response is scored as
    if it had ended. Frozen by construction: no parameter requires grad.
    """

    def __init__(self, rm: RewardModel, tok, batch_size: int = 64):
        self.rm, self.tok, self.batch_size = rm.requires_grad_(False).eval(), tok, batch_size

    @classmethod
    def from_checkpoint(cls, path: str | Path, device="cpu", batch_size: int = 64) -> RewardModelScorer:
        rm, tok, _ = load_reward_model(path, device)
        return cls(rm, tok, batch_size)

    def score(self, prompts: list[str], responses: list[str]) -> list[float]:
        if len(prompts) != len(responses):
            raise UsageError(
                f"score: {len(prompts)} prompts but {len(responses)} responses; give one prompt per response"
            )
        p = [self.tok.encode(self.tok.chat_prompt(x)) for x in prompts]
        eot = self.tok.decode([self.tok.eot_id])
        r = [self.tok.encode(self.tok.chat_response(y.removesuffix(eot))) for y in responses]
        return score_batches(self.rm, p, r, self.tok.pad_id, self.batch_size).tolist()


class EnsembleScorer:
    """Several frozen RMs as one reward: the mean of their scores (Coste et al. 2023, "Reward
    model ensembles help mitigate overoptimization"). Members trained on different pairs err
    on different pairs, so the mean ranks held-out pairs better than either member, and a
    policy has to fool all of them at once. Members share the centred scale (`center_coef`),
    so their raw scores are averaged."""

    def __init__(self, members: list[RewardModelScorer]):
        self.members = members

    def score(self, prompts: list[str], responses: list[str]) -> list[float]:
        per_member = [m.score(prompts, responses) for m in self.members]
        return [sum(col) / len(col) for col in zip(*per_member)]


def load_scorer(spec: str | Path, device="cpu", batch_size: int = 64):
    """`runs/rm` (one RM) or `runs/rm_a,runs/rm_b` (an ensemble of those RMs)."""
    paths = [p for p in str(spec).split(",") if p]
    if len(paths) == 1:
        return RewardModelScorer.from_checkpoint(paths[0], device, batch_size)
    return EnsembleScorer([RewardModelScorer.from_checkpoint(p, device, batch_size) for p in paths])


# ---- saving and loading ----------------------------------------------------------------------


def head_state(rm: RewardModel) -> dict:
    return {k: v.detach().contiguous().cpu() for k, v in rm.head.state_dict().items()}


def save_head(rm: RewardModel, ckpt_dir: str | Path) -> Path:
    """Write `reward_head.safetensors` into a checkpoint directory atomically (tmp, fsync, rename)."""
    final = Path(ckpt_dir, HEAD_FILE)
    tmp = final.with_name(final.name + ".tmp")
    save_file(head_state(rm), str(tmp))
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    return final


def load_reward_model(path: str | Path, device="cpu"):
    """(RewardModel, tokenizer, checkpoint dir) from an rm run directory or its checkpoints/step_N."""
    trunk, tok, ckpt = checkpoint.load_model(path, device)
    rm = RewardModel(trunk)
    if (ckpt / HEAD_FILE).exists():
        state = load_file(str(ckpt / HEAD_FILE))
    elif (ckpt / "trainer.pt").exists():  # a checkpoint saved mid-run
        state = checkpoint.load_trainer_state(ckpt).get("extra", {}).get("reward_head")
    else:
        state = None
    if state is None:
        raise UsageError(
            f"checkpoint {str(ckpt)!r} holds no reward head ({HEAD_FILE}); point to a run of `posttrain rm`"
        )
    try:
        rm.head.load_state_dict(state)
    except RuntimeError as e:
        raise UsageError(
            f"{ckpt / HEAD_FILE}: reward head does not fit the trunk "
            f"({str(e).splitlines()[-1].strip()[:120]}); the checkpoint is damaged or mixed"
        ) from None
    return rm.to(device), tok, ckpt
