"""Gemma 3 (``Gemma3ForCausalLM``, and the text model of ``Gemma3ForConditionalGeneration``: its vision tower is
skipped): the plain decoder with q/k norms, extra post-attention / post-FFN norms stored as 1 + w (the engine
uses GGUF norm weights as they are), sliding-window and global layers with RoPE bases of their own, an attention
scale from ``query_pre_attn_scalar`` and a final logit soft-cap."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

import gguf

from ..hf.errors import fail
from ..hf.params import ModelParams, rope_entry, rope_scaling
from .llama import BLOCK_TENSORS
from .spec import GELU_TANH, ArchitectureSpec

# transformers' Gemma3TextConfig defaults: the text_config of a multimodal gemma3 lists only what
# differs from them.
_DEFAULTS: Mapping[str, Any] = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "sliding_window": 4096,
    "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
}


@dataclass(frozen=True)
class Gemma3Layout:
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()  # per layer: True = sliding-window attention
    rope_base_local: float | None = None
    attn_scale: float | None = None  # set when query_pre_attn_scalar differs from head_dim
    final_softcap: float | None = None


def _text_config(config: Mapping[str, Any], hf_class: str) -> dict[str, Any]:
    if hf_class == "Gemma3ForConditionalGeneration":
        return {**_DEFAULTS, **(config.get("text_config") or {})}
    return {**_DEFAULTS, **config}


def _layers(cfg: Mapping[str, Any], n_layer: int, role: str) -> tuple[bool, ...]:
    types = cfg.get("layer_types")
    if isinstance(types, list):
        if len(types) != n_layer:
            raise fail(role, f"config.json: layer_types lists {len(types)} layers, num_hidden_layers is {n_layer}")
        return tuple(t == "sliding_attention" for t in types)
    period = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
    return tuple((i + 1) % period != 0 for i in range(n_layer))


def _finish(params: ModelParams, config: Mapping[str, Any], cfg: Mapping[str, Any], role: str) -> ModelParams:
    local_entry, local_theta = rope_entry(cfg, "sliding_attention")
    if rope_scaling(local_entry, "gemma3", GEMMA3.rope_kinds or (), role) is not None:
        raise fail(role, "RoPE scaling on gemma3's sliding-window layers is not supported")
    scalar = cfg.get("query_pre_attn_scalar")
    attn_scale = None
    if scalar and float(scalar) != params.head_dim:
        attn_scale = 1.0 / math.sqrt(float(scalar))
    window = cfg.get("sliding_window")
    softcap = cfg.get("final_logit_softcapping")
    return replace(params, layout=Gemma3Layout(
        sliding_window=int(window) if window else None,
        sliding_layers=_layers(cfg, params.n_layer, role) if window else (),
        rope_base_local=float(local_theta if local_theta is not None else 10_000.0),
        attn_scale=attn_scale,
        final_softcap=float(softcap) if softcap else None,
    ))


def _write_extra(w: gguf.GGUFWriter, p: ModelParams) -> None:
    lay: Gemma3Layout = p.layout
    if lay.sliding_window:
        w.add_sliding_window(lay.sliding_window)
        w.add_sliding_window_pattern(list(lay.sliding_layers))
    if lay.rope_base_local is not None:
        w.add_rope_freq_base_swa(lay.rope_base_local)
    if lay.attn_scale is not None:
        w.add_attention_scale(lay.attn_scale)
    if lay.final_softcap is not None:
        w.add_final_logit_softcapping(lay.final_softcap)


GEMMA3 = ArchitectureSpec(
    arch="gemma3", hf_classes=("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
    model_types={"gemma3_text": "Gemma3ForCausalLM", "gemma3": "Gemma3ForConditionalGeneration"},
    text_config=_text_config, activations=GELU_TANH, default_activation="gelu_pytorch_tanh",
    rope_layer_type="full_attention", finish=_finish,
    name_map=gguf.MODEL_ARCH.GEMMA3,
    block_tensors=BLOCK_TENSORS + ("attn_q_norm.weight", "attn_k_norm.weight", "post_attention_norm.weight",
                                   "post_ffw_norm.weight"),
    norms_add_one=True, writes_head_dim=True, write_extra=_write_extra,
)
SPECS = (GEMMA3,)
