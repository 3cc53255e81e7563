"""Logprobs from hidden states in token chunks (framework/logprobs.py, issue 31): the same values and
gradients as today's whole-logits path, for every reader of a model's logits, and less memory.

"Today's path" is `logits_logprobs(model(ids), ...)`: the model's whole [B, T, V] logits, then
log-softmax and entropy over them, exactly what every stage computed before issue 31. A small
`LOGIT_CHUNK_ELEMENTS` makes the chunked path run on small models; the chunk sizes chosen leave
remainders, so uneven splits are covered too. Bit-for-bit claims run on one thread: with more, the
BLAS may cut a big product's rows between threads differently from a chunk's (a last-bit change,
as between any two batch shapes), which the 1e-6 checks cover. They also need a BLAS whose product
rows keep their bits whatever the batch's row count: MKL's AVX-512 path does on one thread, its AVX2
path does not promise it (an AVX2-only CPU, or MKL_ENABLE_INSTRUCTIONS=AVX2 here, changes a last bit).
`EXACT` probes that once; where it is False, `_same` holds the values within a few float32 ulps.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import posttrain.framework.logprobs as L
from posttrain.framework.batch import collate_samples
from posttrain.framework.critic import logprobs_and_values
from posttrain.framework.reference import Reference, score_logprobs
from posttrain.framework.rollout import Engine, SamplingParams
from posttrain.models.gpt_mini import GPTMini, ModelConfig
from posttrain.models.heads import ActorCritic, lm_parts
from posttrain.preference.distill import distill_loss_fn
from posttrain.runtime import Runtime

ROOT = Path(__file__).resolve().parents[1]


def _model(vocab=300, seed=0):
    torch.manual_seed(seed)
    return GPTMini(ModelConfig(preset="nano", vocab_size=vocab).resolved())


def _rows_keep_their_bits() -> bool:
    """Whether one thread's float32 product gives a row the same bits in a chunk as in the whole batch,
    for the even splits hidden_token_stats makes of 12..69 rows into chunks of 8, 9, 16 or 40 (of at
    least 6 rows each: MKL's AVX-512 path computes 4 or 5 rows of width 128 on another path), at the
    head's shapes here (width 128 or 64, vocab 300). MKL's AVX2 path fails it at most splits."""
    threads, g = torch.get_num_threads(), torch.Generator().manual_seed(0)
    torch.set_num_threads(1)
    try:
        for d in (128, 64):
            w = torch.randn(300, d, generator=g)
            for rows in range(12, 70):
                x = torch.randn(rows, d, generator=g)
                for chunk in (8, 9, 16, 40):
                    n = -(-rows // chunk)
                    sizes = [rows // n + (i < rows % n) for i in range(n)]
                    parts = torch.cat([c @ w.T for c in x.split(sizes)])
                    if min(sizes) >= 6 and not torch.equal(parts, x @ w.T):
                        return False
        return True
    finally:
        torch.set_num_threads(threads)


EXACT = _rows_keep_their_bits()


def _same(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-6) -> bool:
    """Bit for bit where the BLAS allows it (EXACT); else within rel·max(1, max|a|), ~8 float32 ulps of
    the values' scale: under MKL's AVX2 path the logprobs measured 1 ulp apart, the entropy (a sum over
    the vocabulary) up to 5."""
    if EXACT:
        return torch.equal(a, b)
    return a.shape == b.shape and float((a - b).abs().max()) <= rel * max(1.0, float(a.abs().max()))


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _close(a: dict, b: dict, tol=1e-5):
    """Every gradient within tol of the other, relative to its largest entry (at least 1)."""
    assert a.keys() == b.keys() and a
    for k in a:
        err, scale = float((a[k] - b[k]).abs().max()), max(1.0, float(a[k].abs().max()))
        assert err <= tol * scale, (k, err, scale)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("budget", [300 * 9, 300 * 16, 300 * 40])  # 9, 16, 40 rows a chunk of 3·16 = 48
def test_chunked_logprobs_and_entropy_equal_the_whole_logits_path(monkeypatch, temperature, budget):
    """Values bit for bit (each row is the same matmul row and full-vocabulary log-softmax), and the
    gradients of a loss on logprobs and entropy within 1e-5 (the head's gradient summed by chunk)."""
    torch.set_num_threads(1)  # bit for bit (module docstring)
    model, ids = _model(), torch.randint(0, 300, (3, 17))

    def run(chunked):
        model.zero_grad()
        if chunked:
            with monkeypatch.context() as mp:
                mp.setattr(L, "LOGIT_CHUNK_ELEMENTS", budget)
                lp, ent = L.sequence_logprobs(model, ids, temperature, with_entropy=True)
        else:
            lp, ent = L.logits_logprobs(model(ids), ids, temperature, with_entropy=True)
        (0.7 * lp.sum() + 0.3 * ent.sum()).backward()
        return lp.detach(), ent.detach(), _grads(model)

    calls = []
    spy = L.hidden_token_stats
    monkeypatch.setattr(L, "hidden_token_stats", lambda *a, **k: calls.append(k["chunk"]) or spy(*a, **k))
    (lp, ent, g), (lp_c, ent_c, g_c) = run(False), run(True)
    assert calls == [budget // 300]  # the chunked path ran
    assert _same(lp, lp_c) and _same(ent, ent_c) and (lp[:, 0] == 0).all()
    _close(g, g_c)


def test_one_chunk_is_todays_path_and_rows_are_split_evenly(monkeypatch):
    """A batch whose logits fit one chunk is scored whole (the pipeline's char vocabulary: its
    numbers cannot move); a chunked batch is cut into near-equal parts, never a 1-row tail."""
    model, ids = _model(), torch.randint(0, 300, (2, 9))
    calls = []
    spy = L.hidden_token_stats
    monkeypatch.setattr(L, "hidden_token_stats", lambda *a, **k: calls.append(k["chunk"]) or spy(*a, **k))
    L.sequence_logprobs(model, ids)
    assert calls == []
    sizes = []
    out = L.hidden_token_stats(
        torch.zeros(17, 4), torch.nn.Linear(4, 5), lambda z: (sizes.append(len(z)) or z[:, 0],), chunk=8
    )
    assert sizes == [6, 6, 5] and out[0].shape == (17,)


def test_ppo_critic_forward_reference_and_trainer_agree_with_whole_logits(monkeypatch):
    """PPO's one-forward logprobs + values (ActorCritic.hidden_and_values), the reference's no-grad
    scores and a Reference in fp32: chunked = whole."""
    torch.set_num_threads(1)  # bit for bit (module docstring)
    model, ids = _model(), torch.randint(0, 300, (3, 13))
    ac = ActorCritic(model)
    torch.nn.init.normal_(ac.value_head.proj.weight, std=0.02)
    lp, ent = L.logits_logprobs(model(ids), ids, 0.9, with_entropy=True)
    (lp.sum() + ent.sum() + ac.values(ids).sum()).backward()
    want = _grads(ac)
    ac.zero_grad()
    monkeypatch.setattr(L, "LOGIT_CHUNK_ELEMENTS", 300 * 8)
    lp_c, ent_c, v = logprobs_and_values(ac, ids, 0.9)
    (lp_c.sum() + ent_c.sum() + v.sum()).backward()
    assert _same(lp, lp_c.detach()) and _same(ent, ent_c.detach())
    _close(want, _grads(ac))
    batch = {"input_ids": ids, "loss_mask": torch.ones_like(ids, dtype=torch.float32)}
    batch["attention_mask"] = batch["loss_mask"]
    ref = Reference(model, 0.9)  # no runtime: fp32, as before
    assert next(ref.model.parameters()).dtype == torch.float32
    with torch.no_grad():
        assert _same(ref.score(batch), lp.detach())
        assert _same(score_logprobs(model, batch, 0.9), lp.detach())


@pytest.mark.parametrize("loss", ["rkl", "jsd"])
def test_distillation_loss_chunked_equals_whole(monkeypatch, loss):
    """Student and teacher scored from their hidden states chunk by chunk: loss, metrics and the
    student's gradient as from their whole logits."""
    student, teacher = _model(seed=0), _model(seed=1).requires_grad_(False)
    ids = torch.randint(0, 300, (3, 15))
    mask = torch.zeros(3, 15)
    mask[:, 6:] = 1
    with torch.no_grad():
        old, _ = L.logits_logprobs(student(ids), ids, 0.8)
    from posttrain.framework.batch import RolloutBatch

    mb = RolloutBatch(input_ids=ids, loss_mask=mask, old_logprobs=old * mask, advantages=torch.zeros(3, 15))
    norm = {"tokens": float(mask.sum()), "seqs": 3.0}
    fn = distill_loss_fn(teacher, loss, beta=0.3, temperature=0.8)

    def run():
        student.zero_grad()
        total, metrics = fn(student, mb, norm)
        total.backward()
        return float(total.detach()), metrics, _grads(student)

    whole = run()
    monkeypatch.setattr(L, "LOGIT_CHUNK_ELEMENTS", 300 * 9)
    chunked = run()
    assert whole[0] == pytest.approx(chunked[0], abs=1e-6, rel=1e-6)
    assert whole[1].keys() == chunked[1].keys()
    for k in whole[1]:
        assert whole[1][k] == pytest.approx(chunked[1][k], abs=1e-6, rel=1e-6), k
    _close(whole[2], chunked[2])


def test_hf_model_scores_through_its_head_unless_its_forward_transforms_the_logits(tmp_path, monkeypatch):
    """A Hugging Face Llama: the chunked logprobs equal its own forward's; a model that scales its
    logits (Cohere's logit_scale, or any forward the probe catches) is scored through its forward."""
    torch.set_num_threads(1)  # bit for bit (module docstring)
    pytest.importorskip("transformers")
    from posttrain.models.hf import check_head, load_hf, write_tiny

    model, _ = load_hf(write_tiny(tmp_path / "m", "llama", vocab_size=300))
    assert model.head_exact and lm_parts(model) is not None
    ids = torch.randint(0, 300, (2, 11))
    want, _ = L.logits_logprobs(model(ids), ids)
    monkeypatch.setattr(L, "LOGIT_CHUNK_ELEMENTS", 300 * 8)
    assert _same(L.sequence_logprobs(model, ids)[0], want)
    forward = type(model.hf).forward

    def scaled(self, *a, **k):
        out = forward(self, *a, **k)
        out.logits = out.logits * 0.5
        return out

    monkeypatch.setattr(type(model.hf), "forward", scaled)
    check_head(model)
    assert not model.head_exact and lm_parts(model) is None
    halved, _ = L.logits_logprobs(model(ids), ids)
    assert _same(L.sequence_logprobs(model, ids)[0], halved)


def test_bf16_reference_and_kv_cache_hold_the_compute_dtype():
    """Under bf16 autocast (CUDA's default; here the CPU's explicit dtype=bfloat16) the reference is a
    bf16 copy scored under that autocast, close to the fp32 policy under the same autocast, and the
    engine's KV caches are bf16: the same samples as with fp32 caches, bit for bit (every matmul
    reads them in bf16 anyway)."""
    model = _model(vocab=64)
    rt = Runtime(torch.device("cpu"), torch.float32, torch.bfloat16)
    ref = Reference(model, 1.0, rt)
    assert {p.dtype for p in ref.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the policy is untouched
    ids = torch.randint(0, 64, (2, 10))
    batch = {"input_ids": ids, "loss_mask": torch.ones(2, 10), "attention_mask": torch.ones(2, 10)}
    with rt.autocast(), torch.no_grad():
        fp32_weights = score_logprobs(model, batch)
    bf16 = ref.score(batch)
    assert bf16.dtype == torch.float32 and (bf16 - fp32_weights).abs().max() < 0.05

    from posttrain.models.tokenizer import CharTokenizer

    tok = CharTokenizer()
    model = GPTMini(ModelConfig(preset="nano", n_layers=1).resolved(tok.vocab_size))
    engine = Engine(model, tok, max_slots=3, runtime=rt)
    assert engine.cache_dtype() == torch.bfloat16
    prompts = [tok.encode(tok.chat_prompt(q)) for q in ("1+2", "30+4")]
    sp = SamplingParams(temperature=1.0, max_new_tokens=6)
    half = engine.generate(prompts, 2, sp, seed=5)
    assert engine._slots is not None and engine._slots.k.dtype == torch.bfloat16
    engine.cache_dtype = lambda: torch.float32  # the caches of before issue 31
    full = engine.generate(prompts, 2, sp, seed=5)
    assert engine._slots.k.dtype == torch.float32
    assert [s.response_ids for s in half] == [s.response_ids for s in full]
    assert [s.response_logprobs for s in half] == [s.response_logprobs for s in full]
    assert Engine(model, tok).cache_dtype() == torch.float32  # no runtime (the CPU's fp32): unchanged


def test_prefill_reads_the_last_positions_through_the_head(monkeypatch):
    """A prefill whose [b, T, V] logits pass a chunk makes logits at the last real positions only:
    the same next-token logits, so the same samples and behaviour logprobs, to a float32 rounding.
    Not bit for bit on every CPU: a BLAS may compute b rows alone on another path than inside the
    b·T rows of the whole product (this CI's CPU gives equal logprobs; the H200 machine's, torch
    2.11+cu130, put one 4.8e-7 apart: issue 43). A position off by one is ~1 apart."""
    torch.set_num_threads(1)
    import posttrain.framework.decode_loop as R
    from posttrain.models.tokenizer import CharTokenizer

    tok = CharTokenizer()
    model = GPTMini(ModelConfig(preset="nano", n_layers=1).resolved(tok.vocab_size))
    prompts = [tok.encode(tok.chat_prompt(q)) for q in ("1+2", "30+4", "5+6+7", "8", "9+9")]
    sp = SamplingParams(temperature=1.0, max_new_tokens=5)
    whole = Engine(model, tok, max_slots=4).generate(prompts, 2, sp, seed=1)
    monkeypatch.setattr(R, "LOGIT_CHUNK_ELEMENTS", 1)
    lean = Engine(model, tok, max_slots=4).generate(prompts, 2, sp, seed=1)
    assert [s.response_ids for s in whole] == [s.response_ids for s in lean]
    got, want = (torch.tensor([x for s in out for x in s.response_logprobs]) for out in (lean, whole))
    assert torch.allclose(got, want, rtol=1e-6, atol=0)


def test_trainer_loss_keeps_the_mismatch_of_the_sampler(monkeypatch):
    """policy_loss_fn on a rollout: chunked trainer logprobs equal the whole path's to the bit, so
    `mismatch/logprob_abs` is unchanged (what the sampler recorded against the same trainer values)."""
    torch.set_num_threads(1)  # bit for bit (module docstring)
    from posttrain import algorithms
    from posttrain.algorithms.core import batch_norm
    from posttrain.framework.trainer import policy_loss_fn
    from posttrain.models.tokenizer import CharTokenizer

    tok = CharTokenizer()
    model = GPTMini(ModelConfig(preset="nano").resolved(tok.vocab_size))
    samples = Engine(model, tok, max_slots=8).generate(
        [tok.encode(tok.chat_prompt(q)) for q in ("12+3", "4+56")], 4, SamplingParams(max_new_tokens=8), seed=2
    )
    for i, s in enumerate(samples):
        s.reward = float(i % 3)
    batch = collate_samples(samples, tok.pad_id)
    algo = algorithms.get("grpo")
    cfg = algo.Config(kl_coef=0.0)
    adv = algo.advantages(batch.rewards, batch.group_index, cfg)
    import dataclasses

    batch = dataclasses.replace(batch, advantages=adv[:, None] * batch.loss_mask)
    norm = batch_norm(batch.loss_mask, batch.loss_mask.shape[1])
    fn = policy_loss_fn(algo, cfg, 1.0)
    _, whole = fn(model, batch, norm)
    monkeypatch.setattr(L, "LOGIT_CHUNK_ELEMENTS", tok.vocab_size * 8)
    _, chunked = fn(model, batch, norm)
    tol = 0.0 if EXACT else 1e-6  # both are means of the values _same compares (module docstring)
    assert abs(chunked["mismatch/logprob_abs"] - whole["mismatch/logprob_abs"]) <= tol
    assert whole["mismatch/logprob_abs"] < 1e-6
    assert abs(chunked["entropy"] - whole["entropy"]) <= tol * max(1.0, abs(whole["entropy"]))


CHILD = r"""
import sys, torch
import posttrain.framework.logprobs as L
from posttrain.models.gpt_mini import GPTMini, ModelConfig
V, B, T, chunk = (int(x) for x in sys.argv[1:5])
L.LOGIT_CHUNK_ELEMENTS = chunk  # the shapes scaled down together: a chunk, the batch, its logits
torch.manual_seed(0)
model = GPTMini(ModelConfig(d_model=32, n_layers=1, n_heads=1, d_ff=64, vocab_size=V, max_seq_len=T).resolved())
ids = torch.randint(0, V, (B, T))
def step():
    model.zero_grad(set_to_none=True)
    lp, ent = L.sequence_logprobs(model, ids, 1.0, with_entropy=True)
    (lp.sum() + ent.sum()).backward()
step()  # the gradients exist from here on, as in a training run
rss = int(open("/proc/self/statm").read().split()[1]) * 4096
open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) from here: not ru_maxrss, which holds
step()  # the launching process's peak (vfork + exec) and this one's since its start
print(int(next(x for x in open("/proc/self/status") if x.startswith("VmHWM:")).split()[1]) * 1024 - rss)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm and VmHWM")
def test_a_training_step_never_holds_one_fp32_copy_of_the_logits():
    """The gain where CI runs: the peak resident memory a step of logprobs + entropy + backward adds,
    in a fresh process, stays below ONE fp32 [tokens × vocab] logits tensor (4,096 × 16,384: 256 MiB),
    which the whole-logits path of before issue 31 held 7 times over (1,796 MiB measured for this
    step at 7de35f4; 60 MiB after). Chunks of 2**21 entries (8 MiB; 2**24 in production, with the
    batch and vocabulary scaled down alike) leave ~7 chunk copies and the head's gradient (2 MiB)."""
    V, B, T, chunk = 16384, 8, 512, 2**21
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    args = [sys.executable, "-c", CHILD, str(V), str(B), str(T), str(chunk)]
    added = int(subprocess.run(args, capture_output=True, text=True, env=env, check=True).stdout.split()[-1])
    logits_fp32 = B * T * V * 4
    assert added < logits_fp32, f"step added {added / 2**20:.0f} MiB; one fp32 logits copy is {logits_fp32 / 2**20:.0f}"
