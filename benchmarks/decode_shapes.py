"""How many step shapes a rollout meets with CUDA's decode settings, counted on the CPU (issue 33): each
(rows, span) shape is one CUDA graph to warm up and capture, which a call paid for every shape it met
until the graphs outlived the call (framework/decode_state.py).

    python benchmarks/decode_shapes.py [--prompts 32] [--samples 8] [--new-tokens 256] [--out FILE.json]

A randomly initialised gpt_mini nano (context 512) decodes `--prompts` × `--samples` samples of up to
`--new-tokens` tokens through 256 slots with CUDA's defaults forced on the CPU (a read-back every 8
steps, rows in buckets of 16, spans in buckets of 64: what decides the shapes; nothing is captured
here), twice: with one stop id besides the end of turn (answers of mixed length, rows retiring) and
with none (every answer to the cap). Counted: the in-window steps (those a graph serves on CUDA) and
their distinct (rows, span) shapes.
"""

from __future__ import annotations

import argparse
import collections

import torch

from posttrain.bench import finish, run_header
from posttrain.framework import decode_loop
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.models.gpt_mini import GPTMini, ModelConfig
from posttrain.models.tokenizer import CharTokenizer


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--out", default="benchmarks/results/decode_shapes.json")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    tok = CharTokenizer()
    torch.manual_seed(0)
    cfg = ModelConfig(preset="nano").resolved(tok.vocab_size)
    cfg.max_seq_len = 512
    model = GPTMini(cfg).eval()
    shapes: collections.Counter = collections.Counter()
    eager = decode_loop.DecodeLoop._step_eager

    def counted(loop, R: int, span: int) -> None:
        shapes[(R, span)] += 1
        eager(loop, R, span)

    decode_loop.DecodeLoop._step_eager = counted  # type: ignore[method-assign]
    engine = Engine(model, tok, max_slots=256)
    engine.decode_window, engine.decode_bucket, engine.decode_span_bucket = 8, 16, 64  # CUDA's
    prompts = [
        tok.encode(tok.chat_prompt(f"what is {i} + {i + 3}, and then some more words?"))[:64] for i in range(a.prompts)
    ]
    res = run_header("decode_shapes", 1, prompts=a.prompts, samples=a.samples, new_tokens=a.new_tokens)
    res["runs"] = []
    for stops, label in (((tok.encode("x")[0],), "one stop id: mixed lengths"), ((), "no stop: all to the cap")):
        shapes.clear()
        sp = SamplingParams(max_new_tokens=a.new_tokens, stop_ids=stops, ignore_eos=not stops)
        lengths = [len(s.response_ids) for s in engine.generate(prompts, a.samples, sp, seed=1)]
        run = {
            "answers": label,
            "mean_length": sum(lengths) / len(lengths),
            "decode_steps": engine.stats["rollout/decode_steps"],
            "in_window_steps": sum(shapes.values()),
            "shapes": len(shapes),
            "shape_list": sorted(shapes),
        }
        res["runs"].append(run)
        print(
            f"{label}: mean length {run['mean_length']:.1f}, {run['in_window_steps']} in-window steps, {run['shapes']} shapes"
        )
    return finish(res, a.out)


if __name__ == "__main__":
    main()
