"""Qwen3.5 / Qwen3.6 (``Qwen3_5*`` and ``Qwen3_5Moe*``: archs ``qwen35`` and ``qwen35moe``): the hybrid layout of a
config.json (Gated DeltaNet + gated attention), or a refusal.

What the engine's qwen35/qwen35moe read from a GGUF beyond the common fields: which layers are full attention
(every ``full_attention_interval``-th, 1-based: the engine cannot express another pattern), the DeltaNet
geometry (``ssm.*``), the partial RoPE width and the mRoPE sections, and for MoE the shared expert's width.
Both config spellings are read: transformers 5's ``rope_parameters`` and the older top-level
``partial_rotary_factor`` / ``rope_scaling.mrope_section``. The multimodal checkpoints contribute their text
model only (the vision tower is skipped).

Its tensors: names, value transforms, shapes and metadata, as llama.cpp's converter (and Ollama's
convert_qwen3next.go) write them.

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
from dataclasses import dataclass, replace
from typing import Any, Mapping

import gguf

from ..hf.errors import CreateError
from ..hf.params import ModelParams, moe_params
from ..hf.plan import (EXPERT_RE, ConversionPlan, TensorPlan, file_type, order, out_type, plan_experts,
                       refuse_missing, refuse_quantized_tensor)
from ..hf.safetensors import HFSource
from ..hf.transforms import NegExp, Squeeze, TakeSlice, TileHeads, Transform, out_shape
from .spec import ArchitectureSpec

_LAYER_TYPES = ("linear_attention", "full_attention")


@dataclass(frozen=True)
class Qwen35Layout:
    interval: int  # full_attention_interval: layer i is full attention when (i + 1) % interval == 0
    recurrent: tuple[bool, ...]  # per layer: True = Gated DeltaNet
    conv_kernel: int
    n_k_heads: int  # linear_num_key_heads
    n_v_heads: int  # linear_num_value_heads
    head_k_dim: int
    head_v_dim: int
    rope_dim: int  # rotated dims of each attention head (partial_rotary_factor * head_dim)
    rope_sections: tuple[int, ...]  # mrope_section + [0], or () without mRoPE
    n_ff_shared: int = 0  # MoE: the shared expert's width (0: dense)

    @property
    def conv_channels(self) -> int:
        """q, k and v of the fused projection, which the short conv runs over."""
        return 2 * self.n_k_heads * self.head_k_dim + self.n_v_heads * self.head_v_dim


def _fail(role: str, message: str) -> CreateError:
    return CreateError(f"{role}: {message}")


def _pos_int(cfg: Mapping[str, Any], key: str, role: str, default: Any = None) -> int:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v <= 0:
        raise _fail(role, f"config.json: {key} must be a positive integer (got {v!r})")
    return int(v)


def _interval(cfg: Mapping[str, Any], n_layer: int, role: str) -> int:
    """full_attention_interval, checked against layer_types where both are given."""
    types = cfg.get("layer_types")
    given = cfg.get("full_attention_interval")
    if not isinstance(types, list):
        return _pos_int(cfg, "full_attention_interval", role, 4)
    if len(types) != n_layer:
        raise _fail(role, f"config.json: layer_types lists {len(types)} layers, num_hidden_layers is {n_layer}")
    bad = [t for t in types if t not in _LAYER_TYPES]
    if bad:
        raise _fail(role, f"config.json: layer type {bad[0]!r} is not supported (tandem runs: "
                          f"{', '.join(_LAYER_TYPES)})")
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    interval = int(given) if isinstance(given, int) and given > 0 else (full[0] + 1 if full else n_layer + 1)
    if [i for i in range(n_layer) if (i + 1) % interval == 0] != full:
        raise _fail(role, "config.json: layer_types must put full attention on every "
                          f"{'full_attention_interval-th' if given else 'n-th'} layer (1-based), "
                          f"the only pattern tandem's qwen35 runs; got full attention on layers {full}")
    return interval


def _rope(cfg: Mapping[str, Any], head_dim: int, role: str) -> tuple[int, tuple[int, ...]]:
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    scaling = cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else {}
    # transformers' Qwen3_5TextConfig defaults it to 0.25 (what every released model uses)
    factor = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise _fail(role, f"config.json: partial_rotary_factor must be in (0, 1] (got {factor!r})")
    rope_dim = int(head_dim * factor)
    if rope_dim % 2 or rope_dim == 0:
        raise _fail(role, f"config.json: partial_rotary_factor {factor} rotates {rope_dim} of {head_dim} dims "
                          "(an even, non-zero count is needed)")
    section = params.get("mrope_section", scaling.get("mrope_section"))
    if section is None:
        return rope_dim, ()
    if (not isinstance(section, list) or not 1 <= len(section) <= 4
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in section)):
        raise _fail(role, f"config.json: mrope_section {section!r} is not a list of up to 4 counts")
    if 2 * sum(section) > rope_dim:
        raise _fail(role, f"config.json: mrope_section {section} spans more than the {rope_dim} rotated dims")
    return rope_dim, tuple(section) + (0,) * (4 - len(section))


def read_layout(cfg: Mapping[str, Any], n_layer: int, head_dim: int, moe: bool, role: str) -> Qwen35Layout:
    """The layout of a Qwen3.5 text config (``cfg`` is the text_config of a multimodal checkpoint)."""
    if cfg.get("attention_bias"):
        raise _fail(role, "qwen35 with attention_bias is not supported")
    if moe and (cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step") or 1) != 1):
        raise _fail(role, "qwen35moe with dense layers (mlp_only_layers, decoder_sparse_step > 1) is not supported: "
                          "every layer must be a MoE layer, as llama.cpp's qwen35moe has it")
    interval = _interval(cfg, n_layer, role)
    n_k = _pos_int(cfg, "linear_num_key_heads", role)
    n_v = _pos_int(cfg, "linear_num_value_heads", role)
    if n_v % n_k:
        raise _fail(role, f"config.json: {n_v} linear value heads do not divide over {n_k} key heads")
    rope_dim, sections = _rope(cfg, head_dim, role)
    return Qwen35Layout(
        interval=interval,
        recurrent=tuple((i + 1) % interval != 0 for i in range(n_layer)),
        conv_kernel=_pos_int(cfg, "linear_conv_kernel_dim", role, 4),
        n_k_heads=n_k, n_v_heads=n_v,
        head_k_dim=_pos_int(cfg, "linear_key_head_dim", role),
        head_v_dim=_pos_int(cfg, "linear_value_head_dim", role),
        rope_dim=rope_dim, rope_sections=sections,
        n_ff_shared=_pos_int(cfg, "shared_expert_intermediate_size", role) if moe else 0,
    )


# ------------------------------------------------------------------------------------------------
# tensors and metadata
# ------------------------------------------------------------------------------------------------
ADD_ONE = "add_one"  # a marker among a mapping's steps: stored as 1 + w (TensorPlan.add_one)

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_MTP_LAYER_RE = re.compile(r"^mtp\.layers\.(\d+)\.(.+)$")

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
    lay: Qwen35Layout = p.layout
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
    lay: Qwen35Layout = p.layout
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
    lay: Qwen35Layout = p.layout
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


# ------------------------------------------------------------------------------------------------
# the importer's hooks
# ------------------------------------------------------------------------------------------------
def _text_config(config: Mapping[str, Any], hf_class: str) -> dict[str, Any]:
    if hf_class.endswith("ForConditionalGeneration"):
        return dict(config.get("text_config") or {})
    return dict(config)


def _finish(params: ModelParams, config: Mapping[str, Any], cfg: Mapping[str, Any], role: str) -> ModelParams:
    moe = params.arch == "qwen35moe"
    params = replace(params, layout=read_layout(cfg, params.n_layer, params.head_dim, moe, role))
    return replace(moe_params(params, cfg, role), expert_weights_norm=True) if moe else params


def _plan(source: HFSource, p: ModelParams, texts: dict[str, str]) -> ConversionPlan:
    """``map_tensor``'s names and transforms, each output's shape checked against config.json."""
    role, lay = source.role, p.layout
    texts = {src: text for src, text in texts.items() if not text.startswith(("model.visual.", "visual."))}
    has_mtp = any(is_mtp(t) for t in texts.values())
    n_nextn = 1 if has_mtp else 0
    head_only = has_mtp and "model.embed_tokens.weight" not in texts.values()
    if has_mtp and any(t.startswith("mtp.layers.") and not t.startswith("mtp.layers.0.") for t in texts.values()):
        raise _fail(role, "the MTP head has more than one layer (mtp.layers.1 and on); tandem imports one")
    n_blocks = p.n_layer + n_nextn
    shapes = {f"blk.{b}.{name}": shape for b in range(n_blocks)
              for name, shape in expected_shapes(p, b, head=b >= p.n_layer).items()}
    shapes.update({"token_embd.weight": (p.vocab_size, p.n_embd), "output.weight": (p.vocab_size, p.n_embd),
                   "output_norm.weight": (p.n_embd,)})
    plans: list[TensorPlan] = []
    experts: dict[tuple[int, str], dict[int, str]] = {}
    for src, raw in texts.items():
        if raw == "lm_head.weight" and p.tied_output:
            continue
        text = canonical(raw, p.n_layer)
        if (m := EXPERT_RE.match(text)) is not None:
            experts.setdefault((int(m.group(1)), m.group(3)), {})[int(m.group(2))] = src
            continue
        entry = source.tensors[src]
        refuse_quantized_tensor(src, entry.dtype, role)
        for mapped in map_tensor(text, lay, p.n_layer) or [None]:
            if mapped is None or mapped.name not in shapes:
                raise _fail(role, f"tensor {src} has no counterpart in tandem's {p.arch} model")
            shape = out_shape(mapped.transforms, tuple(entry.shape))
            if shape != shapes[mapped.name]:
                raise _fail(role, f"tensor {src} has shape {list(entry.shape)}, but config.json implies "
                                  f"{list(shapes[mapped.name])} for {mapped.name}")
            kind = "F32" if mapped.name.endswith(F32_ALWAYS) else out_type(entry.dtype, shape)
            plans.append(TensorPlan(src, mapped.name, shape, kind, add_one=mapped.add_one,
                                    transforms=mapped.transforms))
    plans += plan_experts(experts, source, p, role, n_blocks)
    names = [t.name for t in plans]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise _fail(role, f"the safetensors hold {dup} twice (fused and per-expert, or two spellings)")
    refuse_missing(required(p, n_nextn, head_only), set(names), role)
    plans.sort(key=lambda t: order(t.name))
    return ConversionPlan(p, plans, {}, tuple(range(p.n_layer, n_blocks)), head_only, file_type(plans))


_COMMON = dict(tied_default=False,  # transformers' Qwen3_5*Config default to untied
               text_config=_text_config, finish=_finish, plan=_plan, write_params=write_params)
QWEN35 = ArchitectureSpec(
    arch="qwen35", hf_classes=("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"),
    model_types={"qwen3_5_text": "Qwen3_5ForCausalLM", "qwen3_5": "Qwen3_5ForConditionalGeneration"}, **_COMMON)
QWEN35MOE = ArchitectureSpec(
    arch="qwen35moe", hf_classes=("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"),
    model_types={"qwen3_5_moe_text": "Qwen3_5MoeForCausalLM", "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration"},
    n_ff_default=0,  # no dense FFN
    **_COMMON)
SPECS = (QWEN35, QWEN35MOE)
