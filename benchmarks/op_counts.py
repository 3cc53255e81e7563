"""What one more micro-batch and one more logit chunk cost in ops: the CPU's proxy for a GPU's kernel
launches and host syncs (issue 43), counted, not timed, so the numbers are exact and load-free.

    python benchmarks/op_counts.py --label after                    # this tree
    PYTHONPATH=DIR python benchmarks/op_counts.py --label before    # DIR: `git archive 27cdacc`

On tests/fakegpu.py's device (a CPU tensor behind CUDA's device rules), posttrain.bench.profile.OpCount
(loaded by path, so an older tree is counted by the same counter) counts every aten op and every host
read of a device tensor (`.item()`, `float()`, `.tolist()`, a copy to the CPU, `nonzero`, a bool-mask
index: each a sync on CUDA). Three places, each at two sizes, the difference per unit:

  trainer     Trainer.step of a GRPO batch (gpt_mini nano, 32 rows of 20-60 tokens, kl 0.01 with
              ref_logprobs, the entropy), split into 1 and into 4 micro-batches (by the budget; the
              split's cost of a micro-batch set high, so that it cuts the fewest, as on CUDA):
              per micro-batch = (count(4) − count(1)) / 3, and what a step costs beside them
  reference   score_logprobs of the same batch (no gradient), 1 and 4 micro-batches
  chunks      hidden_logprobs with entropy, forward and backward, over 1,024 hidden rows of a
              151,936-token head made in 4 and in 16 chunks (LOGIT_CHUNK_ELEMENTS patched):
              per chunk = (count(16) − count(4)) / 12

Optional `--packed`: the trainer's micro-batches packed (optim.packing, dense mask) as well.
Writes {label: {...}} into benchmarks/results/op_counts.json (other labels kept), with the load.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, os.environ.get("PYTHONPATH", "").split(":")[0] or str(HERE.parent))


def _load(path: Path, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


OPCOUNT = _load(HERE.parent / "posttrain" / "bench" / "profile.py", "posttrain_bench_profile_counter").OpCount
FAKEGPU = _load(HERE.parent / "tests" / "fakegpu.py", "posttrain_fakegpu")


def grpo_batch(rows: int = 32, vocab: int = 60, seed: int = 0) -> dict:
    """A GRPO batch by hand: prompts of 12 tokens, answers of 8-48 (loss on them), advantages,
    behaviour and reference logprobs."""
    g = torch.Generator().manual_seed(seed)
    lengths = (12 + torch.randint(8, 49, (rows,), generator=g)).tolist()
    T = max(lengths)
    ids = torch.randint(1, vocab, (rows, T), generator=g)
    attn, loss = torch.zeros(rows, T), torch.zeros(rows, T)
    for i, n in enumerate(lengths):
        attn[i, :n] = 1
        loss[i, 12:n] = 1
        ids[i, n:] = 0
    old = -torch.rand(rows, T, generator=g) * loss
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": loss,
        "old_logprobs": old,
        "ref_logprobs": old - 0.01 * loss,
        "advantages": torch.randn(rows, 1, generator=g) * loss,
        "rewards": torch.rand(rows, generator=g),
        "group_index": torch.arange(rows) // 4,
    }


def counted(fn) -> dict:
    with OPCOUNT() as c:
        fn()
    return {**c.total(), "sync_ops": dict(sorted(c.syncs.items())), "by_op": dict(c.ops.most_common())}


def per_unit(small: dict, big: dict, units: float) -> dict:
    """What one more unit (micro-batch, chunk) adds: totals, syncs by op, and its ops by name."""
    by_op = {k: (big["by_op"].get(k, 0) - small["by_op"].get(k, 0)) / units for k in big["by_op"]}
    syncs = {k: (big["sync_ops"].get(k, 0) - small["sync_ops"].get(k, 0)) / units for k in big["sync_ops"]}
    return {
        "ops": (big["ops"] - small["ops"]) / units,
        "syncs": (big["syncs"] - small["syncs"]) / units,
        "sync_ops": {k: v for k, v in syncs.items() if v},
        "by_op": {k: v for k, v in sorted(by_op.items(), key=lambda kv: -kv[1]) if v},
    }


def fewest_micro_batches(fn):
    """fn() with the split's cost of a micro-batch at 10⁹ tokens (fewest micro-batches, as CUDA's does):
    a budget above the batch is then exactly one micro-batch."""
    import posttrain.framework.batch as B

    kept, B.MICRO_BATCH_COST_TOKENS = B.MICRO_BATCH_COST_TOKENS, 10**9
    try:
        return fn()
    finally:
        B.MICRO_BATCH_COST_TOKENS = kept


def trainer_counts(dev, packed: bool) -> dict:
    from posttrain import algorithms
    from posttrain.config import OptimConfig
    from posttrain.framework.batch import RolloutBatch, split_micro_batches, to_device
    from posttrain.framework.trainer import Trainer, policy_loss_fn
    from posttrain.models.gpt_mini import GPTMini, ModelConfig

    algo = algorithms.get("grpo")
    loss_fn = policy_loss_fn(algo, algo.Config(kl_coef=0.01, entropy_coef=0.001), 1.0)
    batch = to_device(RolloutBatch(**grpo_batch()), dev)
    out = {}
    for label, budget in (("1", 100_000), ("4", 0)):
        torch.manual_seed(0)
        model = GPTMini(ModelConfig(preset="nano").resolved(60)).to(dev)
        if budget == 0:  # the budget that cuts this batch into exactly 4 micro-batches
            budget = next(b for b in range(100, 4000, 10) if len(split_micro_batches(batch, b, packed=packed)) == 4)
        cfg = OptimConfig(lr=1e-4, micro_batch_tokens=budget, packing=packed)
        trainer = Trainer(model, cfg, 10)
        trainer.step(batch, loss_fn)  # the first step allocates the optimizer's state: counted apart
        out[label] = counted(lambda t=trainer: t.step(batch, loss_fn))
        out[label]["micro_batches"] = len(split_micro_batches(batch, budget, packed=packed))
        out[label]["budget"] = budget
    out["per_micro_batch"] = per_unit(out["1"], out["4"], 4 - out["1"]["micro_batches"])
    return out


def reference_counts(dev) -> dict:
    from posttrain.framework.batch import RolloutBatch, split_micro_batches, to_device
    from posttrain.framework.reference import score_logprobs
    from posttrain.models.gpt_mini import GPTMini, ModelConfig

    batch = to_device(RolloutBatch(**grpo_batch()), dev)
    torch.manual_seed(0)
    model = GPTMini(ModelConfig(preset="nano").resolved(60)).to(dev).eval().requires_grad_(False)
    out = {}
    for label, budget in (("1", 100_000), ("4", 0)):
        if budget == 0:
            budget = next(b for b in range(100, 4000, 10) if len(split_micro_batches(batch, b)) == 4)
        out[label] = counted(lambda b=budget: score_logprobs(model, batch, 1.0, b))
        out[label].update(budget=budget, micro_batches=len(split_micro_batches(batch, budget)))
    out["per_micro_batch"] = per_unit(out["1"], out["4"], 4 - out["1"]["micro_batches"])
    return out


def chunk_counts(dev) -> dict:
    import posttrain.framework.logprobs as L

    V, d, N = 151_936, 64, 1024
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(d, V, bias=False).to(dev)
    h0 = torch.randn(2, N // 2 + 1, d, generator=g).to(dev)
    ids = torch.randint(0, V, (2, N // 2 + 1), generator=g).to(dev)
    kept = L.LOGIT_CHUNK_ELEMENTS
    out = {}
    try:
        for n in (4, 16):
            L.LOGIT_CHUNK_ELEMENTS = V * (N // n)  # chunks of N / n rows

            def run():
                h = h0.clone().requires_grad_(True)
                lp, ent = L.hidden_logprobs(h, head, ids, 1.0, with_entropy=True)
                (lp.sum() + ent.sum()).backward()

            out[str(n)] = counted(run)
    finally:
        L.LOGIT_CHUNK_ELEMENTS = kept
    out["per_chunk"] = per_unit(out["4"], out["16"], 12)
    return out


def main(argv=None) -> dict:
    from posttrain.bench import update_json

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--label", default="after", help="the key of this tree's counts in the JSON")
    p.add_argument("--packed", action="store_true", help="also count the trainer's packed micro-batches")
    p.add_argument("--out", default=str(HERE / "results" / "op_counts.json"))
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    dev = FAKEGPU.install()
    import posttrain

    res = {
        "tree": str(Path(posttrain.__file__).resolve().parents[1]),
        "torch": torch.__version__,
        "load_avg": os.getloadavg(),
        "trainer": fewest_micro_batches(lambda: trainer_counts(dev, False)),
        "reference": fewest_micro_batches(lambda: reference_counts(dev)),
        "chunks": chunk_counts(dev),
    }
    if a.packed:
        res["trainer_packed"] = fewest_micro_batches(lambda: trainer_counts(dev, True))
    update_json(a.out, lambda obj: {**obj, a.label: res})
    for k in ("trainer", "reference", "trainer_packed"):
        if k in res:
            one = {x: y for x, y in res[k]["per_micro_batch"].items() if x != "by_op"}
            print(f"{a.label} {k}: per micro-batch {one}")
    print(f"{a.label} chunks: per chunk { {x: y for x, y in res['chunks']['per_chunk'].items() if x != 'by_op'} }")
    print(f"wrote {a.out}")
    return res


if __name__ == "__main__":
    main()
