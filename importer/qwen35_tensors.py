"""qwen35 / qwen35moe (Qwen3.5, Qwen3.6): tensor names, value transforms, shapes and metadata, as llama.cpp's
converter (and Ollama's convert_qwen3next.go) write them.

* Gated DeltaNet layers: ``A_log`` -> ``ssm_a`` = -exp(A_log); ``dt_bias`` -> ``ssm_dt.bias``; the conv kernel
  squeezed to [channels, kernel]; the value heads reordered from grouped-by-key-head to tiled
  (``TileHeads``) in the v rows of ``attn_qkv``, the conv's v channels, ``attn_gate``, ``ssm_alpha``/``ssm_beta``,
  ``ssm_a``/``ssm_dt`` and the columns of ``ssm_out``;
* attention layers: ``q_proj`` (q and the output gate interleaved per head) kept as ``attn_q``;
* every RMSNorm stored as 1 + w (the checkpoint holds the zero-centred w), except the DeltaNet's output norm;
* MoE: per-expert projections stacked (or a fused ``gate_up_proj`` split) into ``ffn_{gate,up,down}_exps``, the
  shared expert as ``ffn_*_shexp``, its gate as ``ffn_gate_inp_shexp``;
* the MTP head (``mtp.*``): ``mtp.layers.i.*`` becomes block N + i (N = num_hidden_layers) with the ordinary
  full-attention and FFN names, ``mtp.fc`` / ``pre_fc_norm_*`` / ``norm`` its ``nextn.*`` tensors;
  ``block_count`` counts the head's block and ``nextn_predict_layers`` says how many there are (llama.cpp's
  convention for qwen35).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import gguf

from .hf_config import ModelParams
from .qwen35_layout import Qwen35Layout
from .tensor_transforms import NegExp, Squeeze, TakeSlice, TileHeads, Transform

ADD_ONE = "add_one"  # a marker among a mapping's steps: stored as 1 + w (TensorPlan.add_one)

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_MTP_LAYER_RE = re.compile(r"^mtp\.layers\.(\d+)\.(.+)$")
EXPERT_RE = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")

# mtp.* outside its layers -> the head block's nextn tensors (True: a norm, stored as 1 + w)
_MTP_TOP = {
    "mtp.fc.weight": ("nextn.eh_proj.weight", False),
    "mtp.pre_fc_norm_embedding.weight": ("nextn.enorm.weight", True),
    "mtp.pre_fc_norm_hidden.weight": ("nextn.hnorm.weight", True),
    "mtp.norm.weight": ("nextn.shared_head_norm.weight", True),
    "mtp.shared_head.norm.weight": ("nextn.shared_head_norm.weight", True),
    "mtp.embed_tokens.weight": ("nextn.embed_tokens.weight", False),
    "mtp.shared_head.head.weight": ("nextn.shared_head_head.weight", False),
}
_NORMS = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
          "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight"}
_PLAIN = {"self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
          "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
          "linear_attn.norm.weight": "ssm_norm.weight",  # the DeltaNet output norm: stored as is
          "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
          "mlp.down_proj.weight": "ffn_down.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
          "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
          "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
          "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
          "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
          "mlp.experts.down_proj": "ffn_down_exps.weight"}
# Kept F32 whatever the checkpoint's dtype, as llama.cpp's converter keeps them (tiny; the conv is summed in f32).
F32_ALWAYS = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight")

_ATTN = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "attn_q_norm.weight",
         "attn_k_norm.weight")
_DELTANET = ("attn_qkv.weight", "attn_gate.weight", "ssm_alpha.weight", "ssm_beta.weight", "ssm_out.weight",
             "ssm_norm.weight", "ssm_conv1d.weight", "ssm_a", "ssm_dt.bias")
_DENSE = ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
_MOE = ("ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
        "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight", "ffn_gate_inp_shexp.weight")
_NEXTN_REQUIRED = ("nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight",
                   "nextn.shared_head_norm.weight")


@dataclass(frozen=True)
class Mapped:
    """One GGUF tensor a source tensor becomes (a fused gate/up source becomes two)."""

    name: str
    transforms: tuple[Transform, ...] = ()
    add_one: bool = False


def canonical(text: str, n_layer: int) -> str:
    """``mtp.layers.i.X`` as the block it becomes (``model.layers.{n_layer + i}.X``); other names unchanged."""
    m = _MTP_LAYER_RE.match(text)
    return f"model.layers.{n_layer + int(m.group(1))}.{m.group(2)}" if m else text


def is_mtp(text: str) -> bool:
    return text.startswith("mtp.")


def map_tensor(text: str, lay: Qwen35Layout, n_layer: int) -> list[Mapped] | None:
    """The GGUF tensor(s) of a (canonical, see ``canonical``) source name; None for a name with no counterpart.
    Per-expert projections (``EXPERT_RE``) are stacked by the caller, not mapped here."""
    if text == "model.embed_tokens.weight":
        return [Mapped("token_embd.weight")]
    if text == "model.norm.weight":
        return [Mapped("output_norm.weight", add_one=True)]
    if text == "lm_head.weight":
        return [Mapped("output.weight")]
    if text in _MTP_TOP:
        name, norm = _MTP_TOP[text]
        return [Mapped(f"blk.{n_layer}.{name}", add_one=norm)]
    m = _LAYER_RE.match(text)
    if not m:
        return None
    p, sub = f"blk.{m.group(1)}.", m.group(2)
    if sub in _NORMS:
        return [Mapped(p + _NORMS[sub], add_one=True)]
    if sub in _PLAIN:
        return [Mapped(p + _PLAIN[sub])]
    if sub == "mlp.experts.gate_up_proj":  # [E, 2F, D]: the gate's rows first
        return [Mapped(p + "ffn_gate_exps.weight", (TakeSlice(1, 0, 2),)),
                Mapped(p + "ffn_up_exps.weight", (TakeSlice(1, 1, 2),))]
    qk = 2 * lay.n_k_heads * lay.head_k_dim

    def tile(axis: int, head_dim: int, offset: int = 0) -> TileHeads:
        return TileHeads(axis, lay.n_k_heads, lay.n_v_heads // lay.n_k_heads, head_dim, offset)

    deltanet: dict[str, tuple[str, tuple[Transform, ...]]] = {
        "linear_attn.in_proj_qkv.weight": ("attn_qkv.weight", (tile(0, lay.head_v_dim, qk),)),
        "linear_attn.conv1d.weight": ("ssm_conv1d.weight", (Squeeze(1), tile(0, lay.head_v_dim, qk))),
        "linear_attn.in_proj_z.weight": ("attn_gate.weight", (tile(0, lay.head_v_dim),)),
        "linear_attn.in_proj_a.weight": ("ssm_alpha.weight", (tile(0, 1),)),
        "linear_attn.in_proj_b.weight": ("ssm_beta.weight", (tile(0, 1),)),
        "linear_attn.out_proj.weight": ("ssm_out.weight", (tile(1, lay.head_v_dim),)),
        "linear_attn.A_log": ("ssm_a", (NegExp(), tile(0, 1))),
        "linear_attn.dt_bias": ("ssm_dt.bias", (tile(0, 1),)),
    }
    if sub in deltanet:
        name, steps = deltanet[sub]
        return [Mapped(p + name, steps)]
    return None


def expected_shapes(p: ModelParams, block: int, head: bool) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor block ``block`` may hold (``head``: the MTP head's block)."""
    lay = p.qwen35
    assert lay is not None
    D, V, hd = p.n_embd, p.vocab_size, p.head_dim
    q, kv = p.n_head * hd, p.n_head_kv * hd
    E, Fe, Fs, F = p.n_expert, p.n_ff_expert, lay.n_ff_shared, p.n_ff
    out: dict[str, tuple[int, ...]] = {"attn_norm.weight": (D,), "post_attention_norm.weight": (D,)}
    if head or not lay.recurrent[block]:
        out.update({"attn_q.weight": (2 * q, D), "attn_k.weight": (kv, D), "attn_v.weight": (kv, D),
                    "attn_output.weight": (D, q), "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,)})
    else:
        C, nv, inner = lay.conv_channels, lay.n_v_heads, lay.n_v_heads * lay.head_v_dim
        out.update({"attn_qkv.weight": (C, D), "attn_gate.weight": (inner, D), "ssm_alpha.weight": (nv, D),
                    "ssm_beta.weight": (nv, D), "ssm_out.weight": (D, inner), "ssm_norm.weight": (lay.head_v_dim,),
                    "ssm_conv1d.weight": (C, lay.conv_kernel), "ssm_a": (nv,), "ssm_dt.bias": (nv,)})
    if E:
        out.update({"ffn_gate_inp.weight": (E, D), "ffn_gate_exps.weight": (E, Fe, D),
                    "ffn_up_exps.weight": (E, Fe, D), "ffn_down_exps.weight": (E, D, Fe),
                    "ffn_gate_shexp.weight": (Fs, D), "ffn_up_shexp.weight": (Fs, D),
                    "ffn_down_shexp.weight": (D, Fs), "ffn_gate_inp_shexp.weight": (1, D)})
    else:
        out.update({"ffn_gate.weight": (F, D), "ffn_up.weight": (F, D), "ffn_down.weight": (D, F)})
    if head:
        out.update({"nextn.eh_proj.weight": (D, 2 * D), "nextn.enorm.weight": (D,), "nextn.hnorm.weight": (D,),
                    "nextn.shared_head_norm.weight": (D,), "nextn.embed_tokens.weight": (V, D),
                    "nextn.shared_head_head.weight": (V, D)})
    return out


def required(p: ModelParams, n_nextn: int, head_only: bool) -> list[str]:
    lay = p.qwen35
    assert lay is not None
    ffn = _MOE if p.n_expert else _DENSE
    names = [f"blk.{b}.{s}" for b in range(p.n_layer, p.n_layer + n_nextn)
             for s in ("attn_norm.weight", "post_attention_norm.weight") + _ATTN + ffn + _NEXTN_REQUIRED]
    if head_only:
        return names
    names += ["token_embd.weight", "output_norm.weight"] + ([] if p.tied_output else ["output.weight"])
    for b in range(p.n_layer):
        mixer = _DELTANET if lay.recurrent[b] else _ATTN
        names += [f"blk.{b}.{s}" for s in ("attn_norm.weight", "post_attention_norm.weight") + mixer + ffn]
    return names


def write_params(w: gguf.GGUFWriter, p: ModelParams, n_nextn: int) -> None:
    """The ``{arch}.*`` metadata the engine's qwen35 / qwen35moe read (after general.file_type)."""
    lay = p.qwen35
    assert lay is not None
    w.add_context_length(p.context_length)
    w.add_embedding_length(p.n_embd)
    w.add_block_count(p.n_layer + n_nextn)  # llama.cpp's qwen35 counts the MTP block
    if n_nextn:
        w.add_nextn_predict_layers(n_nextn)
    if not p.n_expert:  # MoE: no dense FFN, no key (as llama.cpp's converter writes it)
        w.add_feed_forward_length(p.n_ff)
    w.add_head_count(p.n_head)
    w.add_head_count_kv(p.n_head_kv)
    w.add_layer_norm_rms_eps(p.rms_eps)
    w.add_rope_freq_base(p.rope_base)
    w.add_vocab_size(p.vocab_size)
    w.add_key_length(p.head_dim)
    w.add_value_length(p.head_dim)
    w.add_rope_dimension_count(lay.rope_dim)
    if lay.rope_sections:
        w.add_rope_dimension_sections(list(lay.rope_sections))
    if p.rope_scaling and p.rope_scaling.kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(p.rope_scaling.factor)
    w.add_ssm_conv_kernel(lay.conv_kernel)
    w.add_ssm_state_size(lay.head_k_dim)
    w.add_ssm_group_count(lay.n_k_heads)
    w.add_ssm_time_step_rank(lay.n_v_heads)
    w.add_ssm_inner_size(lay.n_v_heads * lay.head_v_dim)
    w.add_full_attention_interval(lay.interval)
    if p.n_expert:
        w.add_expert_count(p.n_expert)
        w.add_expert_used_count(p.n_expert_used)
        w.add_expert_feed_forward_length(p.n_ff_expert)
        w.add_expert_shared_feed_forward_length(lay.n_ff_shared)
