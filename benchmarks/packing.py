"""Computed ÷ real tokens of a GRPO step, padded against packed micro-batches (issue 33), and the
CPU time of the trainer's step both ways.

    python benchmarks/packing.py [--threads 1] [--repeats 3] [--out benchmarks/results/packing.json]

    python benchmarks/packing.py --device cuda --kernels-only --out benchmarks/results/packing_cuda.json

The step of `posttrain bench step` (issue 33's benchmark: 32 prompts × 8 samples, answers capped
at 256 tokens, prompts of ~64) with a realistic spread of answer lengths instead of a random
model's (which never stops, so every answer sits at the cap): prompts of 40-90 tokens; each group's
mean answer length uniform in [40, 220], its samples normal around it (σ = 30% of the mean),
clipped to [8, 256], so some groups hit the cap and most answers do not. Counted from the lengths
alone, as `split_micro_batches` plans them: the trainer's micro-batches (`optim.micro_batch_tokens`
4096 / 8192 / 32768) and the reference's (16384), padded and packed (rows as wide as the longest
sequence, 1024 tokens, or the whole budget: `optim.packing_width`), with the CPU's price of one
more micro-batch (MICRO_BATCH_COST_TOKENS, 128: many narrow micro-batches, little padding) and with
the fewest micro-batches (a price of 10⁶ tokens: what a GPU, where a token costs ~4 ns at 0.5B and a
micro-batch's launches ~ms, would choose). No model is needed for that.

The timed parts run the trainer's GRPO step (nano gpt_mini, fp32, lr 0) both ways, the same loss
and gradients (tests/test_packing.py): on 8 of those groups (64 sequences), best of `--repeats`,
and benchmarks/train_profile.py's step, padded and packed in turns.

The packed rows' attention, dense mask against flex (optim.packing_attention, models/attention.py):
`attention_pairs_flex_per_real` counts the (query, key) pairs flex computes (the tiles its BlockMask
keeps × 128², a row's last partial tile counted whole) where `attention_pairs_per_real` counts the dense mask's W²; and `attention_kernels`
times the attention alone on one packed trainer micro-batch of this step: padded (causal sdpa over
[b, w]), packed with the dense mask, packed through flex, and on CUDA packed through varlen (Flash
Attention over the rows cut at each sequence, `packed_varlen`). On CUDA (`--device cuda`, `--kernels-only`
to skip the CPU timings): forward and backward at Qwen2.5-0.5B's attention shape (14 heads, 2 kv
heads, 64 wide, bf16), micro_batch_tokens 32768 in rows of 4096, flex compiled; on the CPU: forward
only (torch's flex has no backward there) at nano's shape, rows of 1024, flex eager and compiled.
`first_call_s` holds a compile (less when inductor's on-disk cache already has it).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from posttrain.framework.packing import Packed, sequence_ids  # noqa: E402  (after the path: the repository's posttrain)
from posttrain.models.attention import BLOCK, document_tiles  # noqa: E402


def lengths(prompts: int, samples: int, cap: int = 256, seed: int = 0) -> tuple[list[int], list[int]]:
    """(prompt lengths, answer lengths) of one step, `samples` answers per prompt (module docstring)."""
    g = torch.Generator().manual_seed(seed)
    p_len, a_len = [], []
    for _ in range(prompts):
        p = int(torch.randint(40, 91, (1,), generator=g))
        mean = 40 + 180 * float(torch.rand(1, generator=g))
        for _ in range(samples):
            p_len.append(p)
            a_len.append(int(min(cap, max(8, round(mean * (1 + 0.3 * float(torch.randn(1, generator=g))))))))
    return p_len, a_len


def batch_of(p_len: list[int], a_len: list[int], vocab: int, seed: int = 0):
    """A RolloutBatch with these lengths: random tokens, behaviour logprobs and advantages."""
    from posttrain.framework.batch import RolloutBatch, collate

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(6, vocab, (n,), generator=g).tolist() for n in p_len]
    answers = [torch.randint(6, vocab, (n,), generator=g).tolist() for n in a_len]
    b = collate(prompts, answers, 0)
    mask = b["loss_mask"]
    old = -torch.rand(mask.shape, generator=g) * mask
    adv = torch.randn(len(prompts), 1, generator=g) * mask
    return RolloutBatch(**b, old_logprobs=old, ref_logprobs=old - 0.01 * mask, advantages=adv)


def computed(batch, budget: int, packed: bool, cost: int, width: int = 0) -> dict:
    """The micro-batches `split_micro_batches` plans at this budget and micro-batch price, the
    tokens their forwards compute and the (query, key) pairs their attention computes (a padded
    row causal, w²/2; a packed row's mask dense, W²), both per real token. A micro-batch whose
    sequences share no packed row runs padded (split_micro_batches)."""
    import posttrain.framework.batch as B
    from posttrain.framework.packing import computed_tokens, packed_shape

    kept, B.MICRO_BATCH_COST_TOKENS = B.MICRO_BATCH_COST_TOKENS, cost  # read at call time
    try:
        micro = B.split_micro_batches(batch, budget, 1, packed, width)
    finally:
        B.MICRO_BATCH_COST_TOKENS = kept
    tokens = sum(computed_tokens(B.view(mb)) for mb in micro)
    pairs, flex = 0.0, 0.0
    for mb in micro:
        f = B.view(mb)
        if "pack_index" in f:
            R, W = packed_shape(f["pack_index"])
            pairs += R * W * W
            tiles = document_tiles(sequence_ids(f["pack_index"]))  # the BlockMask's (partial, full)
            flex += int(tiles[0].sum() + tiles[1].sum()) * BLOCK**2
        else:
            pairs += f["attention_mask"].numel() * f["attention_mask"].shape[1] / 2
            flex += f["attention_mask"].numel() * f["attention_mask"].shape[1] / 2
    real = float(batch.attention_mask.sum())
    return {
        "micro_batches": len(micro),
        "computed_tokens": tokens,
        "computed_per_real": tokens / real,
        "attention_pairs_per_real": pairs / real,
        "attention_pairs_flex_per_real": flex / real,
    }


def kernel_times(batch, device: torch.device, repeats: int) -> dict:
    """The attention alone on the first packed trainer micro-batch of the step (module docstring):
    seconds per call, best of `repeats`, and on CUDA the peak memory of each."""
    from torch.nn.attention.flex_attention import flex_attention

    from posttrain.bench import best_of
    from posttrain.framework.batch import split_micro_batches, view
    from posttrain.models.attention import attend

    cuda = device.type == "cuda"
    budget, width, heads, kv, hd = (32768, 4096, 14, 2, 64) if cuda else (4096, 1024, 4, 2, 32)
    dtype = torch.bfloat16 if cuda else torch.float32
    f = next(f for f in map(view, split_micro_batches(batch, budget, 1, True, width)) if "pack_index" in f)
    ids, index = f["input_ids"].to(device), f["pack_index"].to(device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def timed(fn):
        fn()  # warm-up (and compile)
        sync()
        return best_of(lambda: (fn(), sync()), repeats)

    kinds = ("dense", "flex", "varlen") if cuda else ("dense", "flex")  # varlen: Flash Attention, CUDA only
    masks = {kind: Packed.build(ids, index, kind).mask for kind in kinds}
    out: dict = {"device": str(device), "heads": heads, "kv_heads": kv, "head_dim": hd, "dtype": str(dtype)}
    R, W = masks["dense"].shape[0], masks["dense"].shape[-1]
    out["rows_padded"], out["rows_packed"] = list(ids.shape), [R, W]
    out["mask_build_s"] = {k: timed(lambda k=k: Packed.build(ids, index, k)) for k in masks}
    cases = {"padded": (ids.shape, None, attend), "packed_dense": (None, masks["dense"], attend)}
    cases["packed_flex"] = (None, masks["flex"], attend)
    if cuda:  # the rows flattened and cut at each sequence (optim.packing_attention=varlen)
        cases["packed_varlen"] = (None, masks["varlen"], attend)
    if not cuda:  # the CPU's compiled flex, forward only: does it pay against the dense mask?
        compiled = torch.compile(flex_attention)
        cases["packed_flex_compiled"] = (
            None,
            masks["flex"],
            lambda q, k, v, m: compiled(q, k, v, block_mask=m, enable_gqa=True),
        )
    for name, (shape, mask, fn) in cases.items():
        B, T = shape if shape is not None else (R, W)
        q = torch.randn(B, heads, T, hd, device=device, dtype=dtype, requires_grad=cuda)
        k, v = (torch.randn(B, kv, T, hd, device=device, dtype=dtype, requires_grad=cuda) for _ in range(2))

        def call(q=q, k=k, v=v, mask=mask, fn=fn):
            y = fn(q, k, v, mask)
            if cuda:
                y.sum().backward()

        t0 = time.perf_counter()
        call()
        sync()
        first = time.perf_counter() - t0
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        out[name] = {"s": timed(call), "first_call_s": first}
        if cuda:
            out[name]["peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
        print(f"attention {name} on {device}: {out[name]['s'] * 1000:.2f} ms (first call {first:.1f} s)", flush=True)
    return out


def main(argv=None) -> dict:
    from posttrain import algorithms
    from posttrain.bench import best_of, finish, run_header
    from posttrain.config import OptimConfig
    from posttrain.framework.batch import MICRO_BATCH_COST_TOKENS
    from posttrain.framework.trainer import Trainer, policy_loss_fn
    from posttrain.models.gpt_mini import ModelConfig, build_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/packing.json")
    ap.add_argument("--device", default="cpu", help="where the attention kernels are timed: cpu | cuda")
    ap.add_argument("--kernels-only", action="store_true", help="the plans and the attention kernels, no CPU steps")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    result = run_header("packing", a.threads)
    p_len, a_len = lengths(32, 8)
    batch = batch_of(p_len, a_len, 90)
    real = int(batch.attention_mask.sum())
    result["step"] = {
        "sequences": len(a_len),
        "real_tokens": real,
        "answer_tokens_mean": sum(a_len) / len(a_len),
        "answers_at_cap": sum(n == 256 for n in a_len) / len(a_len),
        "one_padded_batch_ratio": batch.attention_mask.numel() / real,
    }
    plans = {}
    for cost in (MICRO_BATCH_COST_TOKENS, 10**6):  # the CPU's price of a micro-batch; a GPU's: the fewest
        for role, budget in (("trainer", 4096), ("trainer", 8192), ("trainer", 32768), ("reference", 16384)):
            row = {"padded": computed(batch, budget, False, cost)}
            for width in (0, 1024, budget):  # rows as wide as the longest sequence, 1024, one row
                row[f"packed_width{width}"] = computed(batch, budget, True, cost, width)
            plans[f"{role}_{budget}_cost{cost}"] = row
            print(
                f"{role} micro_batch_tokens={budget}, a micro-batch costs {cost} tokens: computed ÷ real "
                + ", ".join(
                    f"{m} {r['computed_per_real']:.3f} ({r['micro_batches']}; attention {r['attention_pairs_per_real']:.0f}"
                    f", flex {r['attention_pairs_flex_per_real']:.0f})"
                    for m, r in row.items()
                ),
                flush=True,
            )
    result["computed_per_real"] = plans
    result[f"attention_kernels_{torch.device(a.device).type}"] = kernel_times(batch, torch.device(a.device), a.repeats)
    if a.kernels_only:
        return finish(result, a.out)

    small = batch_of(p_len[:64], a_len[:64], 90, seed=1)  # 8 groups
    torch.manual_seed(0)
    model = build_model(ModelConfig(preset="nano", max_seq_len=384), 90)
    algo = algorithms.get("grpo")
    loss_fn = policy_loss_fn(algo, algo.Config(kl_coef=0.01), 1.0)
    timed = {}
    for mode in ("padded", "packed"):
        trainer = Trainer(copy.deepcopy(model), OptimConfig(lr=0.0, packing=mode == "packed"), 10)
        m = trainer.step(small, loss_fn)  # warm-up
        timed[mode] = {
            "step_s": best_of(lambda t=trainer: t.step(small, loss_fn), a.repeats),
            "computed_tokens": m["train/padded_tokens"],
            "real_tokens": m["train/tokens"],
            "loss": m["loss"],
        }
    timed["speedup"] = timed["padded"]["step_s"] / timed["packed"]["step_s"]
    result["cpu_trainer_step"] = timed
    print(
        f"CPU trainer step, nano, 64 sequences ({timed['padded']['real_tokens']:.0f} real tokens): padded "
        f"{timed['padded']['step_s'] * 1000:.0f} ms ({timed['padded']['computed_tokens']:.0f} computed), packed "
        f"{timed['packed']['step_s'] * 1000:.0f} ms ({timed['packed']['computed_tokens']:.0f}): {timed['speedup']:.2f}x",
        flush=True,
    )
    result["train_profile_step"] = profile_step(a.repeats)
    return finish(result, a.out)


def profile_step(repeats: int, rounds: int = 3) -> dict:
    """benchmarks/train_profile.py's GRPO step (nano, 128 rows of 35-85 tokens), padded and packed
    in turns, `rounds` times best of `repeats`: the lowest of each."""
    from posttrain.bench import best_of, load_script

    tp = load_script(Path(__file__).resolve().parent / "train_profile.py", "posttrain_bench_train_profile")
    steps = {mode: tp.setup(packing=mode == "packed")[0] for mode in ("padded", "packed")}
    metrics = {mode: step() for mode, step in steps.items()}  # warm-up
    times: dict[str, list[float]] = {mode: [] for mode in steps}
    for _ in range(rounds):
        for mode, step in steps.items():
            times[mode].append(best_of(step, repeats))
    out = {
        mode: {
            "step_s": min(times[mode]),
            "computed_tokens": m["train/padded_tokens"],
            "real_tokens": m["train/tokens"],
        }
        for mode, m in metrics.items()
    }
    out["packed_over_padded"] = out["packed"]["step_s"] / out["padded"]["step_s"]
    print(
        f"train_profile's step: padded {out['padded']['step_s'] * 1000:.0f} ms, packed "
        f"{out['packed']['step_s'] * 1000:.0f} ms ({out['packed_over_padded']:.2f}x the time)",
        flush=True,
    )
    return out


if __name__ == "__main__":
    main()
