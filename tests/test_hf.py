"""Hugging Face causal LMs as posttrain models (posttrain/models/hf.py).

Tiny random LlamaForCausalLM and Qwen2ForCausalLM directories with a locally built character
tokenizer (no downloads). The reference is transformers itself: each directory is also loaded
independently with `AutoModelForCausalLM.from_pretrained`.
"""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from hf_util import plain_logprobs  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from posttrain import UsageError, checkpoint  # noqa: E402
from posttrain.config import RLConfig, SFTConfig, load_config  # noqa: E402
from posttrain.framework.rollout import Engine, SamplingParams  # noqa: E402
from posttrain.models.hf import check_cache_path, load_hf, write_tiny  # noqa: E402
from posttrain.models.tokenizer import CharTokenizer  # noqa: E402

ARCHS = ("llama", "qwen2")
# single-digit answers: a random model's last integer is right often enough for GRPO to have signal
EASY = ["task.min_terms=1", "task.max_terms=1", "task.max_value=9"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {a: write_tiny(root / a, a, seed=i) for i, a in enumerate(ARCHS)}


@pytest.mark.parametrize("arch", ARCHS)
def test_engine_logprobs_match_transformers(dirs, arch):
    """Shared-prompt prefill, continuous batching (5 slots for 12 samples, GQA) through the KV
    cache bridge: every recorded behaviour logprob equals a plain transformers forward."""
    model, tok = load_hf(dirs[arch])
    reference = AutoModelForCausalLM.from_pretrained(dirs[arch], local_files_only=True).eval()
    prompts = [tok.encode(tok.chat_prompt(q)) for q in ("3+4", "12+5+6", "1+1+1+1+1+1")]
    for temperature in (1.0, 0.7):
        samples = Engine(model, tok, max_slots=5).generate(
            prompts, 4, SamplingParams(temperature=temperature, max_new_tokens=12), seed=3
        )
        assert len(samples) == 12 and sum(len(s.response_ids) for s in samples) > 40
        for s, want in zip(samples, plain_logprobs(reference, samples, temperature)):
            assert torch.allclose(torch.tensor(s.response_logprobs), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_decodes_through_the_fused_fast_path_and_follows_weight_updates(dirs, arch):
    """Llama and Qwen2 take models/decode.py (q/k/v and gate/up fused into copies). Fast and
    generic paths sample the same tokens, also after an in-place update of the weights (the
    optimizer's), which the fused copies must follow."""
    from posttrain.models.decode import Decoder

    model, tok = load_hf(dirs[arch])
    assert Decoder.for_model(model) is not None
    prompts = [tok.encode(tok.chat_prompt(q)) for q in ("3+4", "12+5+6")]
    sp = SamplingParams(temperature=1.0, max_new_tokens=12)
    eng = Engine(model, tok, max_slots=3)

    def both():
        eng.fast_decode = True
        fast = eng.generate(prompts, 3, sp, seed=1)
        eng.fast_decode = False
        slow = eng.generate(prompts, 3, sp, seed=1)
        assert [s.response_ids for s in fast] == [s.response_ids for s in slow]
        assert (
            max(abs(a - b) for f, s in zip(fast, slow) for a, b in zip(f.response_logprobs, s.response_logprobs)) < 1e-5
        )
        return fast

    before = both()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("k_proj.weight", "up_proj.weight")):
                p.mul_(3.0)  # in place, as AdamW
    after = both()
    assert [s.response_logprobs for s in after] != [s.response_logprobs for s in before]


def test_greedy_equals_transformers_generate(dirs):
    model, tok = load_hf(dirs["llama"])
    reference = AutoModelForCausalLM.from_pretrained(dirs["llama"], local_files_only=True).eval()
    prompt = tok.encode(tok.chat_prompt("7+8+9"))
    s = Engine(model, tok).generate([prompt], 1, SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True))[0]
    out = reference.generate(
        torch.tensor([prompt]), max_new_tokens=10, min_new_tokens=10, do_sample=False, pad_token_id=tok.pad_id
    )
    assert s.response_ids == out[0, len(prompt) :].tolist()


def test_tokenizer_adapter_uses_the_chat_template(dirs):
    _, tok = load_hf(dirs["qwen2"])
    ours = CharTokenizer()
    assert tok.chat_prompt("3+4") == ours.chat_prompt("3+4") == "<3+4>"  # rendered by the Jinja template
    assert tok.chat_response("{3+4=7}7") == ours.chat_response("{3+4=7}7") == "{3+4=7}7#"
    text = "<12+5>{12+5=17}17#"
    assert tok.encode(text) == ours.encode(text) and tok.decode(tok.encode(text)) == text
    assert (tok.eot_id, tok.pad_id, tok.vocab_size) == (ours.eot_id, ours.pad_id, ours.vocab_size)


def test_heads_read_hf_hidden_states(dirs):
    """Critic and reward-model trunks: hidden() is the final normed state whose head gives the logits."""
    from posttrain.models.heads import ActorCritic
    from posttrain.reward_models.reward_model import RewardModel

    model, _ = load_hf(dirs["qwen2"])
    ids = torch.tensor([[1, 9, 16, 10, 2], [1, 12, 13, 2, 0]])
    with torch.no_grad():
        assert torch.allclose(model.head(model.hidden(ids)), model(ids), atol=1e-6)
        ac = ActorCritic(model, "separate")
        h, values = ac.hidden_and_values(ids)
        assert ac.critic_trunk.head is None and torch.equal(model.head(h), model(ids)) and values.shape == (2, 5)
        assert RewardModel(model)(ids, torch.tensor([[1.0] * 5, [1.0] * 4 + [0.0]])).shape == (2,)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.slow
def test_grpo_end_to_end_and_checkpoint_reloads_in_transformers(dirs, arch, tmp_path):
    from posttrain.recipes import rl

    cfg = load_config(
        RLConfig,
        None,
        [
            f"init={dirs[arch]}",
            f"out={tmp_path}/rl",
            "steps=2",
            "prompts_per_step=4",
            "samples_per_prompt=6",
            "max_new_tokens=8",
            "eval_problems=4",
            "eval_samples=2",
            "optim.lr=1e-3",
            "log_every=1",
            "device=cpu",  # sampler = trainer to 1e-5: the CPU's fp32
            *EASY,
        ],
    )
    rl.run(cfg)
    rows = [json.loads(line) for line in open(tmp_path / "rl" / "metrics.jsonl")][1:]
    assert all(torch.isfinite(torch.tensor(float(v))) for r in rows for v in r.values() if isinstance(v, (int, float)))
    for r in rows:  # one update per batch: strictly on-policy, ratio 1
        assert abs(r["ratio/mean"] - 1) < 1e-5 and r["mismatch/logprob_abs"] < 1e-5
    assert max(r["reward/mean"] for r in rows) > 0 and max(r["grad/norm"] for r in rows) > 0
    ckpt = checkpoint.latest(tmp_path / "rl")
    trained = AutoModelForCausalLM.from_pretrained(ckpt, local_files_only=True).eval()
    start = AutoModelForCausalLM.from_pretrained(dirs[arch], local_files_only=True).eval()
    moved = [n for n, p in trained.named_parameters() if not torch.equal(p, start.get_parameter(n))]
    assert len(moved) == len(list(trained.parameters()))  # every tensor was updated
    ours, _, _ = checkpoint.load_model(ckpt)
    ids = torch.tensor([[1, 9, 16, 10, 2, 14]])
    with torch.no_grad():
        assert torch.allclose(ours(ids), trained(input_ids=ids).logits, atol=1e-5)


def test_sft_from_hf_dir_and_resume(dirs, tmp_path):
    """`init=HF_DIR` in sft; --resume of an HF run continues from its HF checkpoint to the same
    weights; `posttrain export` of the run writes a directory transformers opens."""
    from posttrain.recipes import sft

    args = [f"init={dirs['llama']}", "batch_size=4", "num_problems=50", "eval_problems=2", "optim.lr=1e-3", *EASY]
    args.append("device=cpu")  # the resumed weights to 1e-6: the CPU's fp32
    sft.run(load_config(SFTConfig, None, [f"out={tmp_path}/a", "steps=3", *args]))
    sft.run(load_config(SFTConfig, None, [f"out={tmp_path}/b", "steps=2", *args]))
    sft.run(load_config(SFTConfig, None, [f"out={tmp_path}/b", "steps=3", *args]), resume=True)
    a, _, _ = checkpoint.load_model(tmp_path / "a")
    b, _, _ = checkpoint.load_model(tmp_path / "b")
    start, _ = load_hf(dirs["llama"])
    sa, sb, s0 = a.state_dict(), b.state_dict(), start.state_dict()
    assert all(torch.allclose(sa[k], sb[k], atol=1e-6) for k in sa)
    assert not all(torch.equal(sa[k], s0[k]) for k in sa)
    from posttrain.cli import main  # `posttrain export` of an HF run: an HF directory again

    assert main(["export", str(tmp_path / "a"), "--format", "hf", str(tmp_path / "exported")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported", local_files_only=True).eval()
    ids = torch.tensor([[1, 9, 16, 10, 2]])
    with torch.no_grad():
        assert torch.allclose(exported(input_ids=ids).logits, a(ids), atol=1e-6)


def test_bf16_autocast_path_runs_on_cpu(dirs, tmp_path):
    """dtype=bfloat16 takes the CUDA precision path (autocast over fp32 master weights) on the CPU:
    sampler and trainer both compute in bf16, so they still agree closely; weights stay fp32."""
    from posttrain.recipes import rl

    cfg = load_config(
        RLConfig,
        None,
        [
            f"init={dirs['llama']}",
            f"out={tmp_path}/rl",
            "steps=1",
            "prompts_per_step=2",
            "samples_per_prompt=4",
            "max_new_tokens=6",
            "eval_problems=2",
            "eval_samples=1",
            "dtype=bfloat16",
            "device=cpu",  # the CUDA precision path, on the CPU (what this test is about)
            "grad_checkpointing=true",
            *EASY,
        ],
    )
    rl.run(cfg)
    row = [json.loads(line) for line in open(tmp_path / "rl" / "metrics.jsonl")][-1]
    # bf16 on both sides: they agree closely (exactly 0 when the two passes round the same way, which
    # depends on the thread count's reduction order: not asserted either way)
    assert 0 <= row["mismatch/logprob_abs"] < 1e-2 and abs(row["ratio/mean"] - 1) < 1e-2
    model, _, _ = checkpoint.load_model(tmp_path / "rl")
    assert {p.dtype for p in model.parameters()} == {torch.float32}


@pytest.mark.parametrize("which", ["gpt_mini", "hf"])
def test_grad_checkpointing_gives_the_same_gradient(dirs, nano, which):
    model = nano if which == "gpt_mini" else load_hf(dirs["qwen2"])[0]
    ids = torch.randint(1, 50, (3, 20), generator=torch.Generator().manual_seed(0))
    grads = []
    for on in (False, True):
        model.grad_checkpointing = on
        model.train().zero_grad()
        torch.log_softmax(model(ids), -1)[:, :-1].gather(-1, ids[:, 1:, None]).mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    model.grad_checkpointing = False
    assert all(torch.allclose(grads[0][n], grads[1][n], atol=1e-6, rtol=1e-5) for n in grads[0])


def test_bad_directories_are_one_line_errors(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UsageError, match="not a loadable Hugging Face"):
        checkpoint.load_model(tmp_path)
    with pytest.raises(UsageError, match="lora needs a Hugging Face model"):
        from posttrain.models.gpt_mini import GPTMini, ModelConfig
        from posttrain.models.lora import LoraConfig, apply_lora

        apply_lora(GPTMini(ModelConfig().resolved(58)), LoraConfig(r=4))


def test_an_architecture_that_bypasses_the_cache_is_refused(dirs):
    model, _ = load_hf(dirs["llama"])
    for layer in model.hf.model.layers:  # simulate attention that never reads the cache
        layer.self_attn.forward = lambda *a, _f=layer.self_attn.forward, **k: _f(
            *a, **{**k, **dict.fromkeys({"past_key_values", "cache"} & k.keys())}
        )
    with pytest.raises(UsageError, match="LlamaForCausalLM: the posttrain engine cannot decode it"):
        check_cache_path(model)
