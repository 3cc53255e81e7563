"""The `posttrain` command: one sub-command per stage (docs/architecture.md §7).

    posttrain pipeline [CONFIG] [key=value ...]
    posttrain pretrain|sft|rm|dpo|rl|distill CONFIG [key=value ...] [--resume RUN_DIR]
    posttrain rl CONFIG scale.gpus=N ...         N ranks, one GPU each (torchrun --nproc-per-node N -m posttrain rl ...)
    posttrain eval RUN_OR_CHECKPOINT [--k 1,8] [--rm RM_RUN]
    posttrain serve RUN_OR_MODEL [--port 8000] [--host 127.0.0.1]
    posttrain export CHECKPOINT --format hf OUT_DIR
    posttrain report RUN_DIR [--out FILE.html]
    posttrain bench train|rollout|step|algorithms|claims|trl|search|precision|prm|overopt [--out FILE.json]
    posttrain memory MODEL --algo grpo [--gpu h100] [--gpus N --lora R ...] [--json]
    posttrain lessons [--port N] [--export DIR]
    posttrain demo ALGO [key=value ...]
    posttrain --version

A usage mistake (unknown key, wrong type, missing file, unreadable checkpoint) prints one
line naming the problem and the fix, and exits with code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import sys
from pathlib import Path

from posttrain.errors import TrainingHalted, UsageError

STAGES = {  # name -> (config class path, recipe module)
    "pretrain": ("posttrain.config:PretrainConfig", "posttrain.recipes.pretrain"),
    "sft": ("posttrain.config:SFTConfig", "posttrain.recipes.sft"),
    "rm": ("posttrain.config:RMConfig", "posttrain.recipes.rm"),
    "dpo": ("posttrain.config:DPOConfig", "posttrain.recipes.dpo"),
    "rl": ("posttrain.config:RLConfig", "posttrain.recipes.rl"),
    "distill": ("posttrain.config:DistillConfig", "posttrain.recipes.distill"),
    "pipeline": ("posttrain.recipes.pipeline:PipelineConfig", "posttrain.recipes.pipeline"),
}
BENCHES = {
    "train": "posttrain.bench.train",
    "rollout": "posttrain.bench.rollout",
    "step": "posttrain.bench.step",
    "algorithms": "posttrain.bench.algorithms",
    "claims": "posttrain.bench.claims",
    "trl": "posttrain.bench.trl",
    "search": "posttrain.bench.search",
    "precision": "posttrain.bench.precision",
    "prm": "posttrain.bench.prm",
    "overopt": "posttrain.bench.overopt",
}


def _load(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def _split_config(args) -> tuple[str | None, list[str]]:
    """`posttrain sft steps=10` has no config file: a first argument with '=' is an override."""
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config and not Path(config).exists():
        overrides.insert(0, config)
        config = None
    return config, overrides


def _require(module: str, what: str, extra: str) -> None:
    """A missing optional dependency is one line naming the extra, before any work."""
    if importlib.util.find_spec(module) is None:
        raise UsageError(f"{what} need {module}: pip install 'posttrain[{extra}]'")


def run_stage(stage: str, args) -> int:
    from posttrain.config import load_config
    from posttrain.distributed import launch  # entry: the CLI loads torch only when a command runs

    cls_path, module = STAGES[stage]
    config, overrides = _split_config(args)
    if args.resume and config is None and Path(args.resume, "config.yaml").exists():
        config = str(Path(args.resume, "config.yaml"))
    if args.preset:
        config = args.preset
    if args.resume:
        overrides.append(f"out={args.resume}")
    cfg = load_config(_load(cls_path), config, overrides)
    if args.help is not None:
        from posttrain.config_help import stage_help

        print(stage_help(stage, cfg, args.help))
        return 0
    gpus = getattr(getattr(cfg, "scale", None), "gpus", 1)
    if gpus > 1 and not launch.launched():  # scale.gpus=N: the same command on N ranks, through torchrun
        return launch.relaunch(args.argv, gpus, stage)
    out = Path(getattr(cfg, "out", "") or f"runs/{stage}")
    fresh = not out.exists()
    try:
        importlib.import_module(module).run(cfg, resume=bool(args.resume))
        launch.leave()
        return 0
    except UsageError:  # refused before any work: leave no half-made run directory behind
        if fresh and out.is_dir() and not any(out.rglob("step_*")):
            import shutil

            shutil.rmtree(out, ignore_errors=True)
        raise
    except TrainingHalted as e:
        from posttrain.framework.card import OutOfMemory  # entry: the CLI loads torch only when a command runs

        if isinstance(e, OutOfMemory):  # before the step loop too (DPO's reference): say how to go on
            raise e.in_run(out) from None
        raise


def run_eval(args) -> None:
    import json

    import yaml

    from posttrain import checkpoint, runtime
    from posttrain.config import SamplerConfig, build
    from posttrain.eval import evaluate, format_per_k
    from posttrain.framework.backends import make_engine
    from posttrain.tasks import config_class, make
    from posttrain.tasks.pool import pool_for

    rt = runtime.resolve(args.device)  # device=cuda without a GPU: one line before any work
    sampler = SamplerConfig(backend=args.backend)
    device = rt.device
    path = checkpoint.resolve(args.checkpoint)  # a hub id: its snapshot; the model loads after the task
    run_cfg = path.parent.parent / "config.yaml"
    saved = (yaml.safe_load(run_cfg.read_text()) or {}) if run_cfg.exists() else {}
    task_cfg: dict = saved.get("task", {}) or {}
    for item in args.overrides:
        key, _, value = item.partition("=")
        if not key.startswith("task."):
            raise UsageError(f"eval override {item!r}: only task.<key>=value is accepted here")
        *parents, leaf = key[5:].split(".")  # task.options.min_digits=1 → task_cfg["options"]["min_digits"]
        node = task_cfg
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = yaml.safe_load(value)
    task = make(build(config_class(task_cfg.get("name", "arithmetic")), task_cfg, "task."))  # bad rows: before
    model, tok, path = checkpoint.load_model(path, device)
    ks = sorted({int(k) for k in args.k.split(",")})
    n = args.n or max(ks)
    items = task.items(args.problems, "test", args.seed)
    scorer = None
    if args.rm:  # best-of-n reranked by a reward model
        from posttrain.reward_models.reward_model import load_scorer

        scorer = load_scorer(args.rm, device)
    engine = make_engine(model, tok, sampler, runtime=rt) if args.backend != "posttrain" else None  # no vLLM: one line
    with pool_for(task, saved) as pool, contextlib.ExitStack() as stack:  # verifier.*: your code in workers
        if engine is not None:
            stack.callback(engine.close)
        res = evaluate(
            model,
            tok,
            task,
            items,
            n=n if n > 1 else 0,
            ks=ks,
            temperature=args.temperature,
            seed=args.seed,
            scorer=scorer,
            pool=pool,
            engine=engine,
        )
    per_k = res.pop("per_k")
    print(f"checkpoint: {path}" + (f"  (sampled by {args.backend})" if engine is not None else ""))
    for k, v in res.items():
        if isinstance(v, float):  # a suspicious accuracy's line (eval.SUSPECT) was printed as it was found
            print(f"{k:24s} {v:.4f}")
    failed = sum(res.get(f"eval/{k}", 0.0) for k in ("errors", "timeouts"))
    if failed:
        print(
            f"warning: the verifier failed on {failed:g} responses (eval/errors, eval/timeouts): they count as "
            "wrong, so the accuracy above is a lower bound",
            file=sys.stderr,
        )
    if set(per_k) != {0}:  # items without a number of terms (other tasks): no table
        print(format_per_k(per_k, "held-out accuracy by number of terms K"))
    if args.out:
        Path(args.out).write_text(json.dumps({"checkpoint": str(path), **res, "per_k": per_k}, indent=1))


def run_export(args) -> None:
    from posttrain import checkpoint
    from posttrain.models.export import export_hf

    if args.format != "hf":
        raise UsageError(f"--format {args.format!r} is unknown; use --format hf")
    model, tok, path = checkpoint.load_model(args.checkpoint)
    if hasattr(model, "hf"):  # already a Hugging Face model (models/hf.py)
        Path(args.out_dir).mkdir(parents=True, exist_ok=True)
        model.save(args.out_dir)
        tok.save(args.out_dir)
        print(f"exported {path} -> {args.out_dir} (Hugging Face {type(model.hf).__name__})")
        return
    export_hf(model, tok, args.out_dir)
    print(f"exported {path} -> {args.out_dir} (Hugging Face LlamaForCausalLM)")


def _version() -> str:
    """posttrain's version and the torch it runs on (read from the installed metadata: no torch import)."""
    from importlib import metadata

    from posttrain import __version__

    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    return f"posttrain {__version__} (torch {torch}, Python {sys.version.split()[0]})"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="posttrain", description="RL post-training for language models.")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", required=True)
    for stage in STAGES:
        s = sub.add_parser(stage, help=f"run the {stage} stage", add_help=False)
        s.add_argument(
            "-h",
            "--help",
            nargs="?",
            const="",
            metavar="TOPIC",
            help="every config key with its value and doc; TOPIC algo|task lists every algorithm's or task's keys",
        )
        s.add_argument("config", nargs="?", help="YAML config file or preset name in configs/")
        s.add_argument("overrides", nargs="*", help="key=value overrides (dotted for sections)")
        s.add_argument("--preset", help="a preset name from configs/")
        s.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    e = sub.add_parser("eval", help="evaluate a checkpoint on held-out problems")
    e.add_argument("checkpoint", help="run directory, checkpoints/step_N, HF directory or hub id org/name[@revision]")
    e.add_argument("overrides", nargs="*", help="task.<key>=value to change the evaluated problems")
    e.add_argument("--k", default="1,8", help="comma-separated k for pass@k (default 1,8)")
    e.add_argument("--n", type=int, default=0, help="samples per problem (default max k)")
    e.add_argument("--problems", type=int, default=500)
    e.add_argument("--temperature", type=float, default=1.0)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--device", default="auto", help="auto (cuda if available) | cpu | cuda | cuda:N")
    e.add_argument(
        "--rm",
        metavar="RM_RUN",
        help="a `posttrain rm` run (or RUN_A,RUN_B: an ensemble, the mean score): adds best@n, the sample it scores highest",
    )
    e.add_argument(
        "--backend",
        default="posttrain",
        choices=["posttrain", "vllm"],
        help="the engine that samples: posttrain (built-in, exact) | vllm (pip install 'posttrain[vllm]')",
    )
    e.add_argument("--out", help="write the results as JSON")
    x = sub.add_parser("export", help="export a checkpoint (Hugging Face directory)")
    x.add_argument("checkpoint")
    x.add_argument("--format", default="hf")
    x.add_argument("out_dir")
    r = sub.add_parser("report", help="write RUN_DIR/report.html: curves, eval table, alarms, audited samples")
    r.add_argument("run_dir")
    r.add_argument("--out", help="HTML file to write (default RUN_DIR/report.html)")
    b = sub.add_parser("bench", help="benchmarks that write JSON")
    b.add_argument("which", choices=sorted(BENCHES))
    b.add_argument("rest", nargs=argparse.REMAINDER)
    m = sub.add_parser("memory", help="memory per GPU for a model and an algorithm; does it fit?", add_help=False)
    m.add_argument("rest", nargs=argparse.REMAINDER, help="MODEL --algo grpo [--gpu h100] (see posttrain memory -h)")
    sv = sub.add_parser(
        "serve", help="an OpenAI-compatible server on a checkpoint or HF model (posttrain[serve])", add_help=False
    )
    sv.add_argument(
        "rest", nargs=argparse.REMAINDER, help="RUN_OR_MODEL [--port 8000] [--host 127.0.0.1] (see posttrain serve -h)"
    )
    les = sub.add_parser("lessons", help="the interactive lessons: a local web app, or a static copy")
    les.add_argument("--port", type=int, default=8000, help="port to serve on (0 = any free port)")
    les.add_argument("--export", metavar="DIR", help="write a static copy with every widget precomputed")
    d = sub.add_parser("demo", help="train one algorithm briefly on the built-in task (30 steps, from the default SFT)")
    d.add_argument("algo", nargs="?", help="an algorithm's name: grpo, ppo, dapo, … (posttrain rl --help algo)")
    d.add_argument("overrides", nargs="*", help="key=value overrides of the grpo_arith preset (e.g. steps=5)")
    return p


def unknown_command(p: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """One line for a first word that is no command: the nearest one and every one (argparse would
    print its usage and a set of choices)."""
    if not argv or argv[0].startswith("-"):
        return None
    # the sub-parsers' names (argparse keeps them on its private action; no public accessor)
    commands = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices
    if argv[0] in commands:
        return None
    import difflib

    close = difflib.get_close_matches(argv[0], list(commands), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    listed = f"commands: {', '.join(commands)}; `posttrain -h` says what each does"
    return f"posttrain: error: unknown command {argv[0]!r}{hint} ({listed})"


def main(argv=None) -> int:
    p = parser()
    bad = unknown_command(p, sys.argv[1:] if argv is None else list(argv))
    if bad:
        print(bad, file=sys.stderr)
        return 2
    args, extra = p.parse_known_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # scale.gpus=N starts the same command on N ranks
    if extra and args.command in ("bench", "memory", "serve"):
        args.rest += extra
    elif extra and all("=" in x and not x.startswith("-") for x in extra) and hasattr(args, "overrides"):
        args.overrides += extra  # key=value given after an --option
    elif extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command in STAGES:
            return run_stage(args.command, args)
        elif args.command == "eval":
            run_eval(args)
        elif args.command == "export":
            run_export(args)
        elif args.command == "report":
            from posttrain.report import write_report

            print(f"report: {write_report(args.run_dir, args.out)}")
        elif args.command == "bench":
            importlib.import_module(BENCHES[args.which]).main(args.rest)
        elif args.command == "memory":
            importlib.import_module("posttrain.sizing.memory_cli").main(args.rest)
        elif args.command == "serve":
            from posttrain.serve.server import main as serve_main

            serve_main(args.rest)
        elif args.command == "demo":
            from posttrain.demo import main as demo_main

            demo_main([args.algo, *args.overrides] if args.algo else [])
        elif args.command == "lessons":
            _require("markdown_it", "the lessons", "lessons")
            from posttrain.lessons.server import main as lessons_main

            lessons_main(args.port, args.export)
    except UsageError as e:
        if _rank() in (None, 0):  # every rank meets the same bad input: one line, from rank 0
            print(f"posttrain {args.command}: error: {e}", file=sys.stderr)
        return 2
    except TrainingHalted as e:
        print(f"posttrain {args.command}: stopped: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if _rank() is None or not _collective_failed(e):
            raise
        print(
            f"posttrain {args.command}: rank {_rank()} stopped: a collective failed, another rank has stopped "
            f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})",
            file=sys.stderr,
        )
        return 1
    except BrokenPipeError:  # `posttrain rl --help | head`: the reader left
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0


def _rank() -> int | None:
    """This process's rank under torchrun, None outside it."""
    import os

    return int(os.environ["RANK"]) if "RANK" in os.environ and "WORLD_SIZE" in os.environ else None


def _collective_failed(e: Exception) -> bool:
    """A collective that failed because a peer is gone (gloo's closed connection, NCCL's abort, a timeout)."""
    import torch.distributed as dist

    text = str(e)
    return isinstance(e, dist.DistError) or any(w in text for w in ("gloo", "NCCL", "Connection closed", "timed out"))


if __name__ == "__main__":
    sys.exit(main())
