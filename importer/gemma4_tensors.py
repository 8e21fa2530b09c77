"""Gemma 4's tensors and metadata in llama.cpp's GGUF layout (archs ``gemma4`` and ``gemma4-assistant``).

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

This module maps names and shapes and writes metadata only; reading, checking order and writing tensors are
the generic converter's (``hf_to_gguf``).
"""

from __future__ import annotations

import re

import gguf
import numpy as np

from .gemma4_layout import Gemma4Layout

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
