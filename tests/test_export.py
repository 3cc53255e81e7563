"""gpt_mini → Hugging Face LlamaForCausalLM and back (posttrain/models/export.py).

The reference is an independent implementation: transformers' own Llama, loaded from the
exported directory with `from_pretrained`, must give the same logits (fp32, ≤1e-5) and
the same greedy continuations as gpt_mini with its KV cache.
"""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from posttrain import UsageError  # noqa: E402
from posttrain.models.export import (  # noqa: E402
    export_hf,
    from_hf_state_dict,
    import_hf,
    to_hf_config,
    to_hf_model,
    to_hf_state_dict,
)
from posttrain.models.gpt_mini import KVCache, ModelConfig, build_model  # noqa: E402
from posttrain.models.tokenizer import CharTokenizer  # noqa: E402

TOK = CharTokenizer()
VARIANTS = {
    "nano": dict(preset="nano"),
    "micro": dict(preset="micro"),
    "nano-gqa": dict(preset="nano", n_kv_heads=2),
    "nano-tied": dict(preset="nano", tie_embeddings=True, rope_theta=500.0),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These models are tiny: extra threads only contend (10x slower on a busy 2-core box)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@torch.no_grad()
def _model(name):
    """A random model with weights 5× the usual init: sharper attention and logits, so greedy
    continuations vary instead of repeating one token, and the comparison is harder."""
    torch.manual_seed(sum(map(ord, name)) + 1)  # +1: a varied greedy continuation with the 92-char vocabulary
    model = build_model(ModelConfig(**VARIANTS[name]), TOK.vocab_size).eval()
    for p in model.parameters():
        if p.dim() == 2:
            p.mul_(5.0)
    return model


@pytest.fixture(scope="module", params=list(VARIANTS))
def exported(request, tmp_path_factory):
    """(gpt_mini model, export directory, HF model loaded from it) per variant."""
    model = _model(request.param)
    out = export_hf(model, TOK, tmp_path_factory.mktemp(request.param) / "hf")
    hf = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    return model, out, hf


def _ids(batch=2, length=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TOK.vocab_size, (batch, length), generator=g)


# ---- (a) logits -----------------------------------------------------------------------------


@torch.no_grad()
def test_hf_from_pretrained_gives_same_logits(exported):
    model, out, hf = exported
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.dtype == torch.float32
    c = model.config
    assert (hf.config.num_hidden_layers, hf.config.num_attention_heads, hf.config.num_key_value_heads) == (
        c.n_layers,
        c.n_heads,
        c.n_kv_heads,
    )
    if c.tie_embeddings:  # written once, tied again by transformers
        assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    x = _ids()
    ours, theirs = model(x), hf(x).logits
    assert theirs.shape == ours.shape == (2, 48, TOK.vocab_size)
    # two implementations in fp32: ≤1e-5 under MKL's AVX-512 path, 1.5e-5 under its AVX2 path (an
    # AVX2-only CPU); a wrong weight or layout is off by O(1)
    assert (ours - theirs).abs().max().item() <= 3e-5


@torch.no_grad()
def test_in_memory_hf_model_matches():
    model = _model("nano-gqa")
    hf = to_hf_model(model, TOK)
    assert not hf.training
    cfg = to_hf_config(model.config, TOK)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.num_key_value_heads) == (128, 344, 32, 2)
    assert (cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id) == (TOK.eot_id, TOK.pad_id, None)
    x = _ids(seed=1)
    assert (hf(x).logits - model(x)).abs().max().item() <= 1e-5


def test_state_dict_split_layout():
    model = _model("nano-gqa")
    sd = to_hf_state_dict(model)
    qkv = model.blocks[1].attn.qkv.weight
    assert sd["model.layers.1.self_attn.q_proj.weight"].shape == (128, 128)
    assert sd["model.layers.1.self_attn.k_proj.weight"].shape == (64, 128)  # 2 kv heads × 32
    assert torch.equal(sd["model.layers.1.self_attn.v_proj.weight"], qkv[192:])
    gate_up = model.blocks[2].mlp.gate_up.weight
    assert torch.equal(sd["model.layers.2.mlp.gate_proj.weight"], gate_up[:344])
    assert torch.equal(sd["model.layers.2.mlp.up_proj.weight"], gate_up[344:])
    assert "lm_head.weight" in sd and "lm_head.weight" not in to_hf_state_dict(_model("nano-tied"))


# ---- (b) tokenizer --------------------------------------------------------------------------


def test_auto_tokenizer_matches_char_tokenizer(exported):
    _, out, _ = exported
    hf_tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    text = "<3+4+5>{3+4=7;7+5=12}12#"
    ids = hf_tok.encode(text)
    assert ids == TOK.encode(text)
    assert hf_tok.decode(ids) == text
    plain = "let me think... 12 is (3 + 4) * 2?\n"
    assert hf_tok.encode(plain) == TOK.encode(plain) and hf_tok.decode(TOK.encode(plain)) == plain
    assert (hf_tok.eos_token, hf_tok.pad_token, hf_tok.bos_token) == ("#", "_", None)
    assert (hf_tok.eos_token_id, hf_tok.pad_token_id) == (TOK.eot_id, TOK.pad_id)


def test_skip_special_tokens_keeps_the_reasoning_and_the_tool_calls(exported):
    """`decode(..., skip_special_tokens=True)` (what `pipeline` does) drops padding, end-of-turn and
    the role markers only: the think and tool delimiters are what the model said (as Qwen3's
    <think> and <tool_call>, added tokens that are not special)."""
    _, out, _ = exported
    hf_tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    for text, shown in [("<12+10>{12+10=22}22#__", "12+10{12+10=22}22"), ("<5+6>⟦5+6⟧⟨11⟩11#", "5+6⟦5+6⟧⟨11⟩11")]:
        ids = hf_tok(text)["input_ids"]
        assert ids == TOK.encode(text)  # every marker is still one token
        assert hf_tok.decode(ids) == text
        assert hf_tok.decode(ids, skip_special_tokens=True) == shown
    added = {t.content: t.special for t in hf_tok.added_tokens_decoder.values()}
    assert added == {
        "_": True,
        "#": True,
        "<": True,
        ">": True,
        "{": False,
        "}": False,
        "⟦": False,
        "⟧": False,
        "⟨": False,
        "⟩": False,
    }
    with_system = CharTokenizer(TOK.chars + "§").to_hf_json()["added_tokens"]  # data with system turns
    assert [t["special"] for t in with_system if t["content"] == "§"] == [True]  # a role marker, like < and >


def test_chat_template(exported):
    _, out, _ = exported
    hf_tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    user = [{"role": "user", "content": "3+4"}]
    render = hf_tok.apply_chat_template
    assert render(user, add_generation_prompt=True, tokenize=False) == "<3+4>" == TOK.chat_prompt("3+4")
    assert render(user, add_generation_prompt=False, tokenize=False) == "<3+4"  # `>` opens the reply
    convo = user + [{"role": "assistant", "content": "{3+4=7}7"}, {"role": "user", "content": "1+1"}]
    assert render(convo, add_generation_prompt=True, tokenize=False) == "<3+4>{3+4=7}7#<1+1>"
    assert render(convo[:2], tokenize=False) == TOK.chat_prompt("3+4") + TOK.chat_response("{3+4=7}7")
    ids = render(user, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert list(ids) == TOK.encode("<3+4>")


# ---- (c) import -----------------------------------------------------------------------------


@torch.no_grad()
def test_import_round_trips_exactly(exported):
    model, out, _ = exported
    back, tok = import_hf(out)
    assert tok.chars == TOK.chars
    assert back.config.tie_embeddings == model.config.tie_embeddings
    assert back.config.rope_theta == model.config.rope_theta
    ours, theirs = model.state_dict(), back.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    if model.config.tie_embeddings:
        assert back.head.weight is back.embed.weight
    x = _ids(seed=2)
    assert torch.equal(model(x), back(x))


def test_from_hf_state_dict_rejects_missing_and_extra_weights():
    model = _model("nano")
    sd = to_hf_state_dict(model)
    with pytest.raises(UsageError, match="lack model.layers.3.mlp.up_proj.weight"):
        from_hf_state_dict({k: v for k, v in sd.items() if "layers.3.mlp.up" not in k}, model.config)
    with pytest.raises(UsageError, match="do(es)? not use"):
        from_hf_state_dict(sd | {"model.layers.9.mlp.up_proj.weight": sd["model.norm.weight"]}, model.config)


def test_import_refuses_rope_scaling(tmp_path):
    out = export_hf(_model("nano"), TOK, tmp_path / "hf")
    cfg = json.loads((out / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match="rope_scaling"):
        import_hf(out)


def test_export_replaces_previous_export_only(tmp_path):
    out = tmp_path / "hf"
    export_hf(_model("nano"), TOK, out)
    tied = _model("nano-tied")
    export_hf(tied, TOK, out)  # a previous export is replaced whole
    assert import_hf(out)[0].config.tie_embeddings
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no .tmp / .old left
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="not an HF export"):
        export_hf(tied, TOK, other)
    assert (other / "keep.txt").read_text() == "mine"


# ---- (d) greedy decoding --------------------------------------------------------------------


@torch.no_grad()
def _greedy_gpt_mini(model, prompt_ids, n_new):
    """Greedy decoding through gpt_mini's KVCache: prefill, then one token per forward."""
    cache = KVCache(model.config, rows=1)
    x = torch.tensor([prompt_ids])
    out = []
    for _ in range(n_new):
        cache.begin(x.shape[1])
        nxt = model(x, cache)[:, -1].argmax(-1)  # [1]
        out.append(int(nxt))
        if out[-1] == TOK.eot_id:
            break
        x = nxt[:, None]  # [1, 1]
    return out


@pytest.mark.parametrize("prompt", ["<3+4+5>", "<12*3-7>{"])
@torch.no_grad()
def test_hf_generate_matches_gpt_mini_greedy(exported, prompt):
    model, _, hf = exported
    ids = TOK.encode(prompt)
    ours = _greedy_gpt_mini(model, ids, 10)
    x = torch.tensor([ids])
    gen = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=10, do_sample=False)
    theirs = gen[0, len(ids) :].tolist()
    assert len(ours) >= 1 and theirs == ours
    if len(ours) == 10:  # no early end of turn: a varied continuation
        assert len(set(ours)) >= 3
