"""What the one-token decode step (models/decode.py) reads from a model, family by family.

    weights = weights_of(model)          # None where why_not(model) says why, in one line
    w = weights.current()                # w.layers: one `Layer` per block; w.embed, w.norm, w.head

The step computes one function for every family it takes: pre-norm blocks with RMSNorm,
grouped-query attention with rotary positions over the whole head, a SwiGLU MLP. What differs
between families is data, so it lives here, in the weights the step is handed:

| model class | what it adds to a plain Llama | read as |
|---|---|---|
| `LlamaForCausalLM` (Llama 2/3.x, SmolLM 1/2, TinyLlama, R1-Distill-Llama) | `attention_bias`, `mlp_bias`, any static rope type (llama3, yarn, linear) | biases; cos/sin from its own rotary module |
| `MistralForCausalLM` | nothing (a binding sliding window is refused at load, models/hf.py) | |
| `Qwen2ForCausalLM` (Qwen2/2.5, R1-Distill-Qwen) | q/k/v biases | `Layer.qkv_bias` |
| `Qwen3ForCausalLM` (dense) | an RMSNorm over each head of q and k, before rotary | `Layer.qk_norm` |
| `GraniteForCausalLM` | embedding, residual, attention and logit multipliers | four scalars |
| `Phi3ForCausalLM` | q/k/v and gate/up already fused | read as they are |
| `SmolLM3ForCausalLM` | no rotary on every 4th layer (NoPE) | `Layer.rotary` |

The rotary tables are the model's own: its rotary module is called once on positions
[0, max_position_embeddings), so every rope type transformers computes statically comes with
its scaling (rope types that recompute frequencies by sequence length, `dynamic` and
`longrope`, are left to the model's forward). q/k/v and gate/up are fused into copies, re-fused
when a source tensor changes in place (its `_version` moves: the optimizer's step) and re-listed
at every `refresh` (a parameter replaced by a new tensor). Only plain `nn.Linear` layers: a
LoRA-wrapped or patched layer, another class or another activation gets None from `weights_of`,
`why_not` says why in one line, and the engine decodes through `model.forward`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn

from posttrain.models.gpt_mini import GPTMini
from posttrain.models.hf import HFCausalLM


class Layer(NamedTuple):
    """One block as the decode step reads it; None = the family has no such tensor."""

    attn_norm: torch.Tensor  # [d]
    qkv: torch.Tensor  # [(H + 2·Hkv)·hd, d]: q, k, v stacked
    qkv_bias: torch.Tensor | None  # [(H + 2·Hkv)·hd]
    qk_norm: torch.Tensor | None  # [H + Hkv, hd]: the per-head RMSNorm weights of q, then k
    o: torch.Tensor  # [d, H·hd]
    o_bias: torch.Tensor | None
    mlp_norm: torch.Tensor  # [d]
    gate_up: torch.Tensor  # [2·ff, d]: gate, then up
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor  # [d, ff]
    down_bias: torch.Tensor | None
    rotary: bool  # False: a NoPE layer


class Weights:
    """What the decode step reads: `layers`, `embed`, `norm`, `head`, `eps`, `rope` = (cos, sin)
    tables [Tmax, hd], the attention `scale`, and three multipliers (None = 1)."""

    layers: list[Layer]
    embed: torch.Tensor
    norm: torch.Tensor
    head: torch.Tensor
    eps: float
    rope: tuple[torch.Tensor, torch.Tensor]
    scale: float
    embed_scale: float | None = None
    residual_scale: float | None = None
    logit_divisor: float | None = None

    def current(self) -> Weights:
        return self

    def refresh(self) -> None:
        self.current()


class GPTMiniWeights(Weights):
    """gpt_mini's own parameters (already fused: nothing to copy), listed at each refresh and
    used live: the trainer's in-place updates are seen at once. Listing them through the
    modules' __getattr__ at every step cost ~4% of a step at batch 8."""

    def __init__(self, model: GPTMini):
        c = model.config
        self.model, self.eps, self.rope = model, c.norm_eps, (model.rope_cos, model.rope_sin)
        self.scale = c.head_dim**-0.5
        self.refresh()

    def refresh(self) -> None:
        m = self.model
        self.layers = [
            Layer(
                b.attn_norm.weight,
                b.attn.qkv.weight,
                None,
                None,
                b.attn.o.weight,
                None,
                b.mlp_norm.weight,
                b.mlp.gate_up.weight,
                None,
                b.mlp.down.weight,
                None,
                True,
            )
            for b in m.blocks
        ]
        self.embed, self.norm, self.head = m.embed.weight, m.norm.weight, m.head.weight


def _gpt_mini_why(model: GPTMini) -> str:
    mods = {"head": model.head}
    for i, b in enumerate(model.blocks):
        mods |= {f"blocks.{i}.attn.qkv": b.attn.qkv, f"blocks.{i}.attn.o": b.attn.o}
        mods |= {f"blocks.{i}.mlp.gate_up": b.mlp.gate_up, f"blocks.{i}.mlp.down": b.mlp.down}
    for name, mod in mods.items():
        if type(mod) is not nn.Linear:
            return f"{name} is a {type(mod).__name__} (an adapter or a patch), not a plain nn.Linear"
    return ""


@dataclass(frozen=True)
class Family:
    """Where a Llama-like HF class keeps its projections (module names under a block)."""

    qkv: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")  # under self_attn; one name = already fused
    gate_up: tuple[str, ...] = ("gate_proj", "up_proj")  # under mlp
    qk_norm: bool = False  # q_norm / k_norm over each head (Qwen3)


FAMILIES = {
    "LlamaForCausalLM": Family(),
    "MistralForCausalLM": Family(),
    "Qwen2ForCausalLM": Family(),
    "Qwen3ForCausalLM": Family(qk_norm=True),
    "GraniteForCausalLM": Family(),
    "Phi3ForCausalLM": Family(qkv=("qkv_proj",), gate_up=("gate_up_proj",)),
    "SmolLM3ForCausalLM": Family(),
}
DYNAMIC_ROPE = ("dynamic", "longrope")  # frequencies that depend on the sequence's length


def _linears(layer, fam: Family) -> list[tuple[str, nn.Module]]:
    a, m = layer.self_attn, layer.mlp
    attn = [(f"self_attn.{n}", getattr(a, n, None)) for n in (*fam.qkv, "o_proj")]
    return attn + [(f"mlp.{n}", getattr(m, n, None)) for n in (*fam.gate_up, "down_proj")]


def _norms(layer, fam: Family) -> list[tuple[str, nn.Module]]:
    names = ["input_layernorm", "post_attention_layernorm"]
    mods = [getattr(layer, n, None) for n in names]
    if fam.qk_norm:
        names += ["self_attn.q_norm", "self_attn.k_norm"]
        mods += [getattr(layer.self_attn, "q_norm", None), getattr(layer.self_attn, "k_norm", None)]
    return list(zip(names, mods))


def _hf_why(model: HFCausalLM) -> str:
    hf = model.hf
    name, c = type(hf).__name__, hf.config
    fam = FAMILIES.get(name)
    if fam is None:
        return f"no fast decoder for this class; there is one for {', '.join(f.removesuffix('ForCausalLM') for f in FAMILIES)}"
    if c.hidden_act != "silu":
        return f"hidden_act={c.hidden_act!r}; the fast path computes SwiGLU with SiLU"
    rot = getattr(hf.model, "rotary_emb", None)
    rope_type = getattr(rot, "rope_type", None)
    if rot is None or not isinstance(rope_type, str):
        return "no single rotary embedding module at model.rotary_emb"
    if rope_type in DYNAMIC_ROPE:
        return f"rope_type {rope_type!r} changes its frequencies with the sequence length"
    if 2 * rot.inv_freq.numel() != model.config.head_dim:
        return f"partial rotary ({2 * rot.inv_freq.numel()} of {model.config.head_dim} head dims)"
    if len(hf.model.layers) != c.num_hidden_layers:
        return "the model's layers do not match config.num_hidden_layers"
    if type(hf.lm_head) is not nn.Linear:
        return f"lm_head is a {type(hf.lm_head).__name__}, not a plain nn.Linear"
    for i, layer in enumerate(hf.model.layers):
        for part, mod in _linears(layer, fam):
            if type(mod) is not nn.Linear:
                return f"layers.{i}.{part} is a {type(mod).__name__} (an adapter or a patch), not a plain nn.Linear"
        for part, mod in _norms(layer, fam):
            if not type(mod).__name__.endswith("RMSNorm") or getattr(mod, "variance_epsilon", None) != c.rms_norm_eps:
                return f"layers.{i}.{part} is not the family's RMSNorm"
    return ""


def rope_table(rot: nn.Module, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, hd] as the model's own rotary module computes them (its scaling too)."""
    pos = torch.arange(length, device=device)[None]  # [1, T]
    x = torch.zeros((), device=device)  # only its dtype (fp32) and device are read
    with torch.autocast(torch.device(device).type, enabled=False):
        cos, sin = rot(x, pos)  # [1, T, hd] each
    return cos[0].float(), sin[0].float()


class HFWeights(Weights):
    """A Llama-like HF model's weights, with q/k/v and gate/up fused into copies, re-fused when
    any source tensor changes in place (its `_version` moves) and re-listed at every refresh."""

    def __init__(self, model: HFCausalLM):
        hf = self.hf = model.hf
        c, s = hf.config, model.config
        self.fam = FAMILIES[type(hf).__name__]
        self.H, self.Hkv, self.hd = s.n_heads, s.n_kv_heads, s.head_dim
        self.eps = c.rms_norm_eps
        self.rope = rope_table(hf.model.rotary_emb, c.max_position_embeddings, hf.lm_head.weight.device)
        self.scale = float(getattr(c, "attention_multiplier", None) or s.head_dim**-0.5)  # Granite's multiplier
        self.embed_scale = _unless_one(getattr(c, "embedding_multiplier", None))
        self.residual_scale = _unless_one(getattr(c, "residual_multiplier", None))
        self.logit_divisor = _unless_one(getattr(c, "logits_scaling", None))
        rope_layers = getattr(c, "no_rope_layers", None)  # SmolLM3: 1 = rotary, 0 = NoPE
        self.rotary = [bool(r) for r in rope_layers] if rope_layers else [True] * c.num_hidden_layers
        self._seen: list | None = None
        self.refresh()

    def refresh(self) -> None:
        self._blocks = [
            (*(m for _, m in _norms(layer, self.fam)), *(m for _, m in _linears(layer, self.fam)))
            for layer in self.hf.model.layers
        ]
        m = self.hf.model
        self._sources = [t for b in self._blocks for mod in b for t in (mod.weight, getattr(mod, "bias", None))] + [
            m.embed_tokens.weight,
            m.norm.weight,
            self.hf.lm_head.weight,
        ]
        self.current()

    def current(self) -> HFWeights:
        seen = [(id(t), t._version) for t in self._sources if t is not None]
        if seen != self._seen:  # changed since the last fusion
            with torch.no_grad():
                self._fuse()
            self._seen = seen
        return self

    def _fuse(self) -> None:
        """(Re-)fuse q/k/v and gate/up. A re-fusion writes into the copies it made before (same
        shapes): their addresses stay, so CUDA graphs captured over them read the new weights."""
        nq, nlin = len(self.fam.qkv), len(self.fam.qkv) + 1 + len(self.fam.gate_up) + 1
        before = getattr(self, "layers", None)
        self.layers = []
        for i, block in enumerate(self._blocks):
            old = before[i] if before is not None and len(before) == len(self._blocks) else None
            an, mn, *qk_norms = block[: len(block) - nlin]
            lin = block[len(block) - nlin :]
            qkv, o, gate_up, down = lin[:nq], lin[nq], lin[nq + 1 : -1], lin[-1]
            qk = None
            if qk_norms:  # [H + Hkv, hd]: each q head's weight, then each k head's
                qn, kn = (m.weight.detach() for m in qk_norms)
                qk = _cat([qn.expand(self.H, self.hd), kn.expand(self.Hkv, self.hd)], old and old.qk_norm)
            self.layers.append(
                Layer(
                    an.weight.detach(),
                    _cat_w(qkv, old and old.qkv),
                    _cat_b(qkv, old and old.qkv_bias),
                    qk,
                    o.weight.detach(),
                    _bias(o),
                    mn.weight.detach(),
                    _cat_w(gate_up, old and old.gate_up),
                    _cat_b(gate_up, old and old.gate_up_bias),
                    down.weight.detach(),
                    _bias(down),
                    self.rotary[i],
                )
            )
        m = self.hf.model
        self.embed, self.norm, self.head = (
            t.detach() for t in (m.embed_tokens.weight, m.norm.weight, self.hf.lm_head.weight)
        )


def _unless_one(v) -> float | None:
    return None if v is None or float(v) == 1.0 else float(v)


def _bias(mod: nn.Linear) -> torch.Tensor | None:
    return None if mod.bias is None else mod.bias.detach()


def _cat(parts: list[torch.Tensor], into: torch.Tensor | None) -> torch.Tensor:
    """torch.cat of `parts`, written into `into` (an earlier fusion's copy) when it fits."""
    n, p = sum(p.shape[0] for p in parts), parts[0]
    fits = into is not None and into.shape == (n, *p.shape[1:]) and (into.dtype, into.device) == (p.dtype, p.device)
    # a copy made under inference_mode (inside generate) can only be written under it
    if fits and not (into.is_inference() and not torch.is_inference_mode_enabled()):  # type: ignore[union-attr]
        return torch.cat(parts, out=into)
    return torch.cat(parts)


def _cat_w(mods, into: torch.Tensor | None = None) -> torch.Tensor:
    return mods[0].weight.detach() if len(mods) == 1 else _cat([m.weight.detach() for m in mods], into)


def _cat_b(mods, into: torch.Tensor | None = None) -> torch.Tensor | None:
    """The stacked bias, zeros for a member without one; None when none has a bias."""
    if all(m.bias is None for m in mods):
        return None
    if len(mods) == 1:
        return mods[0].bias.detach()
    return _cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features) for m in mods], into)


def why_not(model) -> str:
    """One line on why the fast path cannot take `model`; "" when it can."""
    if type(model) is GPTMini:
        return _gpt_mini_why(model)
    if isinstance(model, HFCausalLM):
        return _hf_why(model)
    return f"{type(model).__name__} is neither a gpt_mini nor a Hugging Face causal LM"


def weights_of(model) -> Weights | None:
    """The decode step's view of `model`, or None where `why_not` says why."""
    if why_not(model):
        return None
    return GPTMiniWeights(model) if type(model) is GPTMini else HFWeights(model)


def class_name(model) -> str:
    """The class a user knows the model by: the HF class behind an HFCausalLM."""
    return type(getattr(model, "hf", model)).__name__
