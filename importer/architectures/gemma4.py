"""A Gemma 4 text config.json (``Gemma4ForCausalLM``, the text model of ``Gemma4ForConditionalGeneration``, or the
text model of a ``Gemma4AssistantForCausalLM``) read into its per-layer shape, or refused with a reason.

Gemma 4's layers are not all alike, so one set of numbers (``ModelParams``) cannot describe it: sliding and
global layers have their own head size and K/V head count (transformers keeps the global ones in
``per_layer_config``, or derives them from ``global_head_dim`` / ``num_global_key_value_heads`` when a config
predates it), global layers of a K = V model have no ``v_proj``, the last ``num_kv_shared_layers`` layers
have no K/V projections of their own and, with ``use_double_wide_mlp``, a doubled FFN; with ``enable_moe_block``
(the 26B-A4B) every layer also runs a sparse mixture of experts beside its dense FFN. This module resolves all of
that the way transformers' ``Gemma4TextConfig`` does, so the converter only checks tensors against it.

Its tensors and metadata, in llama.cpp's GGUF layout (archs ``gemma4`` and ``gemma4-assistant``).

The layout (what tandem's loader, like llama.cpp's, reads): norms stored as they are (gemma4's RMSNorm
multiplies by w, unlike gemma3's 1 + w); ``layer_scalar`` as ``blk.N.layer_output_scale``; the per-layer
embedding tensors of the E models (``per_layer_token_embd``, ``per_layer_model_proj``, ``per_layer_proj_norm``,
``blk.N.inp_gate`` / ``proj`` / ``post_norm``); the assistant's projections as ``nextn.pre_projection`` /
``nextn.post_projection``; per-layer ``head_count_kv`` and ``feed_forward_length`` arrays where layers differ;
the sliding pattern as one bool per layer; and a ``rope_freqs`` tensor that turns the global layers' RoPE into
transformers' "proportional" one (factor 1 for the rotated frequencies, 1e30, i.e. no rotation, for the rest).

The 26B-A4B's experts (``enable_moe_block``) keep transformers' stacked layout, which is llama.cpp's: the fused
``experts.gate_up_proj`` [n_expert, 2 * n_ff_expert, n_embd] (gate rows first) as ``ffn_gate_up_exps``,
``experts.down_proj`` as ``ffn_down_exps``, the router ``router.proj`` as ``ffn_gate_inp`` with its input scale
``router.scale`` as ``ffn_gate_inp.scale`` and the per-expert scale ``router.per_expert_scale`` as
``ffn_down_exps.scale`` (both stored as they are: the engine folds in the router's 1/sqrt(n_embd)), the branch
norms as ``pre_ffw_norm_2`` / ``post_ffw_norm_1`` / ``post_ffw_norm_2``, and ``expert_*`` metadata.

This module maps names, checks shapes and writes metadata; reading, ordering and writing tensors are the
generic converter's (``importer/hf_to_gguf.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Mapping

import gguf
import numpy as np

from ..hf.errors import CreateError
from ..hf.params import ModelParams, read_int
from ..hf.plan import ConversionPlan, TensorPlan, file_type, order, out_type, refuse_missing, refuse_quantized_tensor
from ..hf.safetensors import HFSource
from .spec import GELU_TANH, ArchitectureSpec

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class Gemma4Layer:
    sliding: bool
    head_dim: int
    n_head_kv: int
    n_ff: int
    kv_shared: bool  # reuses an earlier layer's K/V: no k/v projections, no k_norm
    k_eq_v: bool  # global layer of a K = V model: no v_proj


@dataclass(frozen=True)
class Gemma4Layout:
    layers: tuple[Gemma4Layer, ...]
    sliding_window: int
    n_kv_shared: int
    rope_base: float
    rope_base_swa: float
    head_dim_full: int  # the global layers' head size (rope dimension count, key_length)
    head_dim_swa: int
    rotary_fraction: float  # of the global head that RoPE rotates ("proportional" RoPE)
    rope_factor: float  # proportional RoPE's ``factor``: the rotated frequencies are divided by it
    final_softcap: float | None
    n_embd_per_layer: int  # per-layer embedding width (E models), 0 = none
    vocab_per_layer: int
    embd_out: int = 0  # assistant: the target's width it reads and writes (backbone_hidden_size); 0 = a model
    # the 26B-A4B's experts beside every layer's dense FFN (enable_moe_block); 0 experts = a dense model
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_expert: int = 0


# transformers' Gemma4TextConfig defaults, for a nested text_config that lists only what differs.
_DEFAULTS: Mapping[str, Any] = {
    "vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6, "sliding_window": 512, "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262_144, "tie_word_embeddings": True,
}


def _fail(role: str, message: str) -> CreateError:
    return CreateError(f"{role}: {message}")


def refuse_unsupported(cfg: Mapping[str, Any], role: str) -> None:
    """What tandem's gemma4 model does not run: bidirectional attention, attention biases."""
    if cfg.get("use_bidirectional_attention"):
        raise _fail(role, "gemma4 with use_bidirectional_attention is not supported")
    if cfg.get("attention_bias"):
        raise _fail(role, "gemma4 with attention_bias is not supported")


def _positive(cfg: Mapping[str, Any], key: str, role: str) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise _fail(role, f"config.json: {key} must be a positive integer with enable_moe_block (got {v!r})")
    return v


def _experts(cfg: Mapping[str, Any], role: str, assistant: bool) -> tuple[int, int, int]:
    """(experts, experts per token, one expert's FFN width), all 0 for a dense model. As in transformers, only
    ``enable_moe_block`` builds the experts: ``num_experts`` alone leaves the model dense."""
    if not cfg.get("enable_moe_block"):
        return 0, 0, 0
    if assistant:
        raise _fail(role, "a Gemma 4 assistant with mixture-of-experts layers (enable_moe_block) is not supported")
    n_expert, n_used = _positive(cfg, "num_experts", role), _positive(cfg, "top_k_experts", role)
    if n_used > n_expert:
        raise _fail(role, f"config.json: top_k_experts {n_used} with {n_expert} experts")
    return n_expert, n_used, _positive(cfg, "moe_intermediate_size", role)


def _rope(cfg: Mapping[str, Any], layer_type: str, role: str) -> tuple[float, float, float]:
    """(theta, rotated fraction of the head, frequency divisor) for one layer type."""
    params = cfg.get("rope_parameters") or {}
    entry = params.get(layer_type) if isinstance(params.get(layer_type), dict) else {}
    defaults = {SLIDING: ("default", 10_000.0, 1.0), FULL: ("proportional", 1_000_000.0, 0.25)}[layer_type]
    if not entry:
        entry = {"rope_type": defaults[0], "rope_theta": defaults[1], "partial_rotary_factor": defaults[2]}
    kind = str(entry.get("rope_type") or "default")
    theta = float(entry.get("rope_theta") or defaults[1])
    if layer_type == SLIDING and kind != "default":
        raise _fail(role, f"RoPE {kind!r} on gemma4's sliding layers is not supported")
    if layer_type == FULL and kind not in ("default", "proportional"):
        raise _fail(role, f"RoPE {kind!r} on gemma4's global layers is not supported (tandem runs: proportional)")
    factor = float(entry.get("factor") or 1.0)
    if factor != 1.0 and kind != "proportional":
        raise _fail(role, f"RoPE scaling factors on gemma4's {'sliding' if layer_type == SLIDING else 'global'} "
                          "layers are only supported with proportional RoPE")
    fraction = float(entry.get("partial_rotary_factor", 1.0)) if kind == "proportional" else 1.0
    return theta, fraction, factor


def _layer_types(cfg: Mapping[str, Any], n_layer: int, role: str) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:
        types = [SLIDING if (i + 1) % 6 else FULL for i in range(n_layer)]
    if len(types) != n_layer or any(t not in (SLIDING, FULL) for t in types):
        raise _fail(role, f"config.json: layer_types must list {n_layer} sliding_attention/full_attention entries")
    types = list(types)
    types[-1] = FULL  # as transformers forces it
    return types


def _overrides(cfg: Mapping[str, Any], types: list[str]) -> dict[int, Mapping[str, Any]]:
    """Per-layer overrides of head_dim / num_key_value_heads, as transformers' __post_init__ derives them."""
    given = cfg.get("per_layer_config")
    if isinstance(given, dict):
        return {int(k): v for k, v in given.items() if isinstance(v, dict)}
    over: dict[str, Any] = {"head_dim": cfg.get("global_head_dim", 512)}
    if cfg.get("attention_k_eq_v", True) and cfg.get("num_global_key_value_heads") is not None:
        over["num_key_value_heads"] = cfg["num_global_key_value_heads"]
    return {i: over for i, t in enumerate(types) if t == FULL}


def read_layout(cfg: Mapping[str, Any], n_layer: int, role: str, embd_out: int = 0) -> Gemma4Layout:
    """The per-layer shape of a Gemma 4 text config (already merged with its defaults)."""
    refuse_unsupported(cfg, role)
    types = _layer_types(cfg, n_layer, role)
    over = _overrides(cfg, types)
    shared = int(cfg.get("num_kv_shared_layers") or 0)
    if not 0 <= shared <= n_layer:
        raise _fail(role, f"config.json: num_kv_shared_layers {shared} with {n_layer} layers")
    if shared and shared < n_layer and set(types[:n_layer - shared]) != set(types):
        raise _fail(role, "config.json: a KV-shared layer type has no earlier layer of its type to share from")
    k_eq_v = bool(cfg.get("attention_k_eq_v"))
    base_ff = int(cfg["intermediate_size"])
    layers = []
    for i, t in enumerate(types):
        o = over.get(i, {})
        is_shared = i >= n_layer - shared
        ff = int(o.get("intermediate_size", base_ff * (2 if cfg.get("use_double_wide_mlp") and is_shared else 1)))
        layers.append(Gemma4Layer(sliding=t == SLIDING, head_dim=int(o.get("head_dim", cfg["head_dim"])),
                                  n_head_kv=int(o.get("num_key_value_heads", cfg["num_key_value_heads"])),
                                  n_ff=ff, kv_shared=is_shared, k_eq_v=k_eq_v and t == FULL))
    dims = {t: {layer.head_dim for layer in layers if layer.sliding == (t == SLIDING)} for t in set(types)}
    if any(len(d) != 1 for d in dims.values()):
        raise _fail(role, "config.json: layers of one attention type with different head sizes are not supported")
    theta, _, _ = _rope(cfg, SLIDING, role)
    theta_full, fraction, factor = _rope(cfg, FULL, role)
    head_full = dims.get(FULL, dims.get(SLIDING)).copy().pop()
    head_swa = dims.get(SLIDING, dims.get(FULL)).copy().pop()
    softcap = cfg.get("final_logit_softcapping")
    ple = int(cfg.get("hidden_size_per_layer_input") or 0)
    n_expert, n_used, ff_expert = _experts(cfg, role, assistant=embd_out > 0)
    return Gemma4Layout(
        layers=tuple(layers), sliding_window=int(cfg.get("sliding_window") or 512), n_kv_shared=shared,
        rope_base=theta_full, rope_base_swa=theta, head_dim_full=head_full, head_dim_swa=head_swa,
        rotary_fraction=fraction, rope_factor=factor, final_softcap=float(softcap) if softcap else None, n_embd_per_layer=ple,
        vocab_per_layer=int(cfg.get("vocab_size_per_layer_input") or 0) if ple else 0, embd_out=embd_out,
        n_expert=n_expert, n_expert_used=n_used, n_ff_expert=ff_expert)


# ------------------------------------------------------------------------------------------------
# tensors and metadata
# ------------------------------------------------------------------------------------------------
_LAYER = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "per_layer_input_gate": "inp_gate", "per_layer_projection": "proj", "post_per_layer_input_norm": "post_norm",
    "pre_feedforward_layernorm_2": "pre_ffw_norm_2", "post_feedforward_layernorm_1": "post_ffw_norm_1",
    "post_feedforward_layernorm_2": "post_ffw_norm_2", "router.proj": "ffn_gate_inp",
}
# layer tensors whose transformers name has no ``.weight`` suffix
_LAYER_EXACT = {
    "layer_scalar": "layer_output_scale.weight", "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight", "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
}
_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
    "pre_projection.weight": "nextn.pre_projection.weight",
    "post_projection.weight": "nextn.post_projection.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# The assistant's centroid "ordered embeddings" pick which vocabulary rows to score, a shortcut over the tied
# embedding: tandem scores every row (drafts are verified by the target either way), so they are not stored.
SKIPPED = ("masked_embedding.",)


def gguf_name(name: str) -> str | None:
    """llama.cpp's name for a (text-model) tensor name; None when gemma4 has no such tensor."""
    if name in _GLOBAL:
        return _GLOBAL[name]
    m = _LAYER_RE.match(name)
    if not m:
        return None
    idx, sub = m.groups()
    if sub in _LAYER_EXACT:
        return f"blk.{idx}.{_LAYER_EXACT[sub]}"
    stem, _, kind = sub.rpartition(".")
    if stem not in _LAYER or kind != "weight":
        return None
    return f"blk.{idx}.{_LAYER[stem]}.weight"


def unused(lay: Gemma4Layout, gname: str) -> bool:
    """K/V weights a layer never uses, should a checkpoint carry them: a KV-shared layer reads an earlier layer's
    K/V, and a K = V layer's values are its keys. Not stored, as transformers never loads them."""
    m = re.match(r"^blk\.(\d+)\.(attn_k|attn_v|attn_k_norm)\.weight$", gname)
    if not m or int(m.group(1)) >= len(lay.layers):
        return False
    layer = lay.layers[int(m.group(1))]
    return layer.kv_shared or (layer.k_eq_v and m.group(2) == "attn_v")


def expected_shapes(lay: Gemma4Layout, n_embd: int, n_head: int, vocab: int, n_layer: int) -> dict[str, tuple]:
    """Every tensor a checkpoint of this layout may hold, with its shape."""
    D, P = n_embd, lay.n_embd_per_layer
    out: dict[str, tuple] = {"token_embd.weight": (vocab, D), "output.weight": (vocab, D), "output_norm.weight": (D,)}
    if P:
        out["per_layer_token_embd.weight"] = (lay.vocab_per_layer, n_layer * P)
        out["per_layer_model_proj.weight"] = (n_layer * P, D)
        out["per_layer_proj_norm.weight"] = (P,)
    if lay.embd_out:
        out["nextn.pre_projection.weight"] = (D, 2 * lay.embd_out)
        out["nextn.post_projection.weight"] = (lay.embd_out, D)
    for i, layer in enumerate(lay.layers):
        hd, q, kv, F = layer.head_dim, n_head * layer.head_dim, layer.n_head_kv * layer.head_dim, layer.n_ff
        b = f"blk.{i}."
        out.update({b + "attn_norm.weight": (D,), b + "attn_q.weight": (q, D), b + "attn_q_norm.weight": (hd,),
                    b + "attn_output.weight": (D, q), b + "post_attention_norm.weight": (D,),
                    b + "ffn_norm.weight": (D,), b + "post_ffw_norm.weight": (D,), b + "ffn_gate.weight": (F, D),
                    b + "ffn_up.weight": (F, D), b + "ffn_down.weight": (D, F),
                    b + "layer_output_scale.weight": (1,)})
        if not layer.kv_shared:
            out.update({b + "attn_k.weight": (kv, D), b + "attn_k_norm.weight": (hd,)})
            if not layer.k_eq_v:
                out[b + "attn_v.weight"] = (kv, D)
        if P:
            out.update({b + "inp_gate.weight": (P, D), b + "proj.weight": (D, P), b + "post_norm.weight": (D,)})
        if lay.n_expert:
            out.update(_expert_shapes(lay, b, D))
    return out


def _expert_shapes(lay: Gemma4Layout, b: str, D: int) -> dict[str, tuple]:
    """One layer's experts, router and branch norms (the 26B-A4B), with their shapes."""
    E, F = lay.n_expert, lay.n_ff_expert
    return {b + "ffn_gate_up_exps.weight": (E, 2 * F, D), b + "ffn_down_exps.weight": (E, D, F),
            b + "ffn_gate_inp.weight": (E, D), b + "ffn_gate_inp.scale": (D,), b + "ffn_down_exps.scale": (E,),
            b + "pre_ffw_norm_2.weight": (D,), b + "post_ffw_norm_1.weight": (D,), b + "post_ffw_norm_2.weight": (D,)}


def required(lay: Gemma4Layout, tied: bool) -> list[str]:
    """The tensors without which the model cannot run (K/V of shared layers and V of K = V layers are absent)."""
    names = ["token_embd.weight", "output_norm.weight"] + ([] if tied else ["output.weight"])
    if lay.n_embd_per_layer:
        names += ["per_layer_token_embd.weight", "per_layer_model_proj.weight", "per_layer_proj_norm.weight"]
    if lay.embd_out:
        names += ["nextn.pre_projection.weight", "nextn.post_projection.weight"]
    for i, layer in enumerate(lay.layers):
        b = f"blk.{i}."
        names += [b + s for s in ("attn_norm.weight", "attn_q.weight", "attn_q_norm.weight", "attn_output.weight",
                                  "post_attention_norm.weight", "ffn_norm.weight", "post_ffw_norm.weight",
                                  "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
                                  "layer_output_scale.weight")]
        if not layer.kv_shared:
            names += [b + "attn_k.weight", b + "attn_k_norm.weight"] + ([] if layer.k_eq_v else [b + "attn_v.weight"])
        if lay.n_expert:
            names += list(_expert_shapes(lay, b, 0))
    return names


def rope_freqs(lay: Gemma4Layout) -> np.ndarray:
    """Per-frequency divisors of the global layers' RoPE: the proportional RoPE's factor (1 unless the config
    scales it) for the rotated ones, 1e30 for the rest. The count of rotated pairs is transformers'
    ``int(fraction * head_dim // 2)``."""
    half = lay.head_dim_full // 2
    n_rot = int(lay.rotary_fraction * lay.head_dim_full // 2)
    return np.array([lay.rope_factor] * n_rot + [1e30] * (half - n_rot), dtype=np.float32)


def write_params(w: gguf.GGUFWriter, lay: Gemma4Layout, *, context: int, n_embd: int, n_head: int,
                 rms_eps: float, vocab: int) -> None:
    """The ``{arch}.*`` metadata llama.cpp's gemma4 / gemma4-assistant loaders read."""
    n = len(lay.layers)
    w.add_context_length(context)
    w.add_embedding_length(n_embd)
    if lay.embd_out:
        w.add_embedding_length_out(lay.embd_out)
    w.add_block_count(n)
    if lay.embd_out:
        w.add_nextn_predict_layers(n)
    ffs = [layer.n_ff for layer in lay.layers]
    w.add_feed_forward_length(ffs if len(set(ffs)) > 1 else ffs[0])
    w.add_head_count(n_head)
    kvs = [layer.n_head_kv for layer in lay.layers]
    # an assistant's layers all read the target's K/V: llama.cpp's files list its head counts per layer
    w.add_head_count_kv(kvs if len(set(kvs)) > 1 or lay.embd_out else kvs[0])
    w.add_layer_norm_rms_eps(rms_eps)
    w.add_key_length(lay.head_dim_full)
    w.add_value_length(lay.head_dim_full)
    w.add_key_length_swa(lay.head_dim_swa)
    w.add_value_length_swa(lay.head_dim_swa)
    w.add_rope_freq_base(lay.rope_base)
    w.add_rope_freq_base_swa(lay.rope_base_swa)
    w.add_rope_dimension_count(lay.head_dim_full)
    w.add_rope_dimension_count_swa(lay.head_dim_swa)
    w.add_sliding_window(lay.sliding_window)
    w.add_sliding_window_pattern([layer.sliding for layer in lay.layers])
    w.add_shared_kv_layers(lay.n_kv_shared)
    if not lay.embd_out:
        w.add_embedding_length_per_layer_input(lay.n_embd_per_layer)
    if lay.final_softcap:
        w.add_final_logit_softcapping(lay.final_softcap)
    if lay.n_expert:  # transformers' router always renormalises its top k: the engine's gemma4 default
        w.add_expert_count(lay.n_expert)
        w.add_expert_used_count(lay.n_expert_used)
        w.add_expert_feed_forward_length(lay.n_ff_expert)
    w.add_vocab_size(vocab)


# ------------------------------------------------------------------------------------------------
# the importer's hooks
# ------------------------------------------------------------------------------------------------
def _text_config(config: Mapping[str, Any], hf_class: str) -> dict[str, Any]:
    if hf_class == "Gemma4ForCausalLM":
        return {**_DEFAULTS, **config}
    return {**_DEFAULTS, **(config.get("text_config") or {})}


def _finish(params: ModelParams, config: Mapping[str, Any], cfg: Mapping[str, Any], role: str) -> ModelParams:
    """gemma4's per-layer shape; an assistant also names the target width it works in
    (``backbone_hidden_size``, written as ``embedding_length_out``)."""
    embd_out = 0
    if params.arch == "gemma4-assistant":
        embd_out = read_int(config, "backbone_hidden_size", role)
        if embd_out == 0:
            raise _fail(role, "config.json: the assistant's backbone_hidden_size (its target's width) is missing")
        if not params.tied_output:
            # llama.cpp's gemma4-assistant, like tandem's, scores through the tied token_embd: an lm_head of its
            # own would be ignored, not run
            raise _fail(role, "a Gemma 4 assistant with its own lm_head (tie_word_embeddings false) is not supported")
    layout = read_layout(cfg, params.n_layer, role, embd_out)
    return replace(params, layout=layout, n_ff=layout.layers[0].n_ff if layout.layers else params.n_ff,
                   n_embd_out=embd_out)


def _plan(source: HFSource, p: ModelParams, texts: dict[str, str]) -> ConversionPlan:
    """Its own names and per-layer shapes, the generic converter's checks; a generated ``rope_freqs``."""
    role, lay = source.role, p.layout
    shapes = expected_shapes(lay, p.n_embd, p.n_head, p.vocab_size, p.n_layer)
    plans: list[TensorPlan] = []
    for src, text in texts.items():
        if text == "lm_head.weight" and p.tied_output:
            continue
        gname = gguf_name(text)
        if gname is not None and unused(lay, gname):
            continue
        if gname is None or gname not in shapes:
            raise _fail(role, f"tensor {src} has no counterpart in tandem's {p.arch} model")
        entry = source.tensors[src]
        refuse_quantized_tensor(src, entry.dtype, role)
        if tuple(entry.shape) != shapes[gname]:
            raise _fail(role, f"tensor {src} has shape {list(entry.shape)}, but config.json implies "
                              f"{list(shapes[gname])}")
        plans.append(TensorPlan(src, gname, tuple(entry.shape), out_type(entry.dtype, entry.shape, gname)))
    refuse_missing(required(lay, p.tied_output), {t.name for t in plans}, role)
    plans.sort(key=lambda t: order(t.name))
    return ConversionPlan(p, plans, {"rope_freqs.weight": rope_freqs(lay)}, (), False, file_type(plans))


def _write_params(w: gguf.GGUFWriter, p: ModelParams, n_nextn: int) -> None:
    write_params(w, p.layout, context=p.context_length, n_embd=p.n_embd, n_head=p.n_head, rms_eps=p.rms_eps,
                 vocab=p.vocab_size)


_COMMON = dict(text_config=_text_config, activations=GELU_TANH, default_activation="gelu_pytorch_tanh",
               rope_layer_type="full_attention",
               rope_kinds=None,  # its "proportional" RoPE is the layout's (a rope_freqs tensor), not a scaling
               finish=_finish, plan=_plan, skip_prefixes=SKIPPED, write_params=_write_params,
               tokenizer_model="gemma4")
GEMMA4 = ArchitectureSpec(
    arch="gemma4", hf_classes=("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"),
    model_types={"gemma4_text": "Gemma4ForCausalLM", "gemma4": "Gemma4ForConditionalGeneration"}, **_COMMON)
GEMMA4_ASSISTANT = ArchitectureSpec(
    arch="gemma4-assistant", hf_classes=("Gemma4AssistantForCausalLM",),
    model_types={"gemma4_assistant": "Gemma4AssistantForCausalLM"}, **_COMMON)
SPECS = (GEMMA4, GEMMA4_ASSISTANT)
