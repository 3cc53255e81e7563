"""Server throughput at C concurrent clients vs the in-process engine, on the same model, side by side.

    python benchmarks/serve_throughput.py [--clients 32] [--max-tokens 48] [--rounds 3] [--init RUN]
        [--out benchmarks/results/serve_throughput.json]

In-process: one `Engine.generate` call on C prompts, every completion `max_tokens` long
(ignore_eos), repeated `--requests` times. Served: `posttrain serve`'s app on 127.0.0.1 (the same
engine object), C clients in a separate process (asyncio + httpx, one connection each), each
sending `--requests` chat requests back to back with the same length cap and ignore_eos. Both
count completion tokens over wall time. The rounds interleave A and B so a change in the
machine's load hits both; `ratio` is the median of the rounds' served / in-process ratios (each a
side-by-side pair), and the JSON holds every round, the medians and the load average.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's posttrain


def clients(url: str, n: int, requests: int, max_tokens: int, queue) -> None:
    """C concurrent clients in their own process: (completion tokens, wall seconds, failures)."""
    import asyncio

    import httpx

    async def one(c: int, client: httpx.AsyncClient):
        tokens = fails = 0
        for r in range(requests):
            body = {
                "model": "bench",
                "messages": [{"role": "user", "content": f"{c}+{r}"}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "temperature": 1.0,
            }
            resp = await client.post(url + "/chat/completions", json=body)
            if resp.status_code != 200:
                fails += 1
                continue
            tokens += resp.json()["usage"]["completion_tokens"]
        return tokens, fails

    async def main():
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            await asyncio.gather(*(client.get(url + "/models") for _ in range(n)))  # n connections open before
            await asyncio.gather(*(client.get(url + "/models") for _ in range(n)))  # the clock starts
            t0 = time.perf_counter()
            out = await asyncio.gather(*(one(c, client) for c in range(n)))
            return sum(t for t, _ in out), time.perf_counter() - t0, sum(f for _, f in out)

    queue.put(asyncio.run(main()))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=4, help="requests per client per round")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--preset", default="micro", help="gpt_mini size when no --init is given (random weights)")
    p.add_argument("--init", default="", help="a run or checkpoint to serve instead")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="benchmarks/results/serve_throughput.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from posttrain import checkpoint
    from posttrain.framework.rollout import Engine, SamplingParams
    from posttrain.models.gpt_mini import GPTMini, ModelConfig
    from posttrain.models.tokenizer import CharTokenizer
    from posttrain.serve.app import create_app
    from posttrain.serve.batcher import Batcher
    from posttrain.serve.server import Server

    if args.init:
        model, tok, _ = checkpoint.load_model(args.init)
    else:
        tok = CharTokenizer()
        torch.manual_seed(0)
        model = GPTMini(ModelConfig(preset=args.preset).resolved(tok.vocab_size))
    model.eval()
    engine = Engine(model, tok, max_slots=max(args.clients, 1))
    batcher = Batcher(engine)
    server = Server(create_app(batcher, tok, "bench", engine.max_len)).start()
    prompts = [tok.encode(tok.chat_prompt(f"{c}+{r}")) for r in range(args.requests) for c in range(args.clients)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_tokens, ignore_eos=True)
    engine.generate(prompts[: args.clients], 1, sampling)  # warm-up
    ctx = mp.get_context("spawn")
    rounds, load = [], {"start": os.getloadavg()}
    try:
        for r in range(args.rounds):
            t0, tokens = time.perf_counter(), 0
            for i in range(args.requests):  # A: in-process, C prompts a call
                out = engine.generate(prompts[i * args.clients : (i + 1) * args.clients], 1, sampling, step=r * 100 + i)
                tokens += sum(len(s.response_ids) for s in out)
            a = tokens / (time.perf_counter() - t0)
            q = ctx.Queue()  # B: C HTTP clients, another process
            proc = ctx.Process(target=clients, args=(server.url, args.clients, args.requests, args.max_tokens, q))
            calls = batcher.stats["serve/calls"]
            proc.start()
            served_tokens, wall, fails = q.get(timeout=600)
            proc.join(timeout=60)
            b = served_tokens / wall
            rounds.append(
                {
                    "in_process_tokens_per_s": a,
                    "served_tokens_per_s": b,
                    "served_failures": fails,
                    "engine_calls": batcher.stats["serve/calls"] - calls,
                    "requests": args.clients * args.requests,
                    "load_avg_1m": os.getloadavg()[0],
                }
            )
            print(
                f"round {r}: in-process {a:,.0f} tok/s   served {b:,.0f} tok/s   ratio {b / a:.2f}   "
                f"engine calls {rounds[-1]['engine_calls']} for {args.clients * args.requests} requests",
                flush=True,
            )
    finally:
        server.close()
        batcher.close()
    load["end"] = os.getloadavg()
    med_a = statistics.median(x["in_process_tokens_per_s"] for x in rounds)
    med_b = statistics.median(x["served_tokens_per_s"] for x in rounds)
    result = {
        "benchmark": "serve_throughput",
        "clients": args.clients,
        "requests_per_client": args.requests,
        "max_tokens": args.max_tokens,
        "model": args.init or f"gpt_mini {args.preset} (random weights)",
        "params": model.num_params(),
        "threads": args.threads,
        "cpu_count": os.cpu_count(),
        "in_process_tokens_per_s": med_a,
        "served_tokens_per_s": med_b,
        "ratio_of_medians": med_b / med_a,
        "ratio": statistics.median(x["served_tokens_per_s"] / x["in_process_tokens_per_s"] for x in rounds),
        "target_ratio": 0.7,
        "rounds": rounds,
        "load_avg": load,
        "command": "python benchmarks/serve_throughput.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(
        f"served / in-process: median of the paired rounds {result['ratio']:.2f}, of the medians "
        f"{med_b:,.0f} / {med_a:,.0f} tok/s = {med_b / med_a:.2f} (target 0.70) -> {args.out}"
    )
    return result


if __name__ == "__main__":
    main()
