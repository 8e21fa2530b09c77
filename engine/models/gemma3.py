"""gemma3 (text models, e.g. gemma-3-270m).

Deviations from the shared block:
* embeddings multiplied by sqrt(n_embd) (in the compute dtype, as the reference does);
* RMSNorm weights are used as stored: the GGUF already holds 1 + w;
* per-head q/k RMSNorm; norms after attention and after the FFN (before each residual add);
* GeGLU with the tanh approximation of GELU;
* query scale 1/sqrt(head_dim) (what llama.cpp uses; the GGUF carries no query_pre_attn_scalar), except
  the 27B model, whose scale is 1/sqrt(n_embd / n_head) (llama.cpp special-cases it by layer count);
* sliding-window layers: layer i is global iff (i + 1) % 6 == 0 unless the GGUF carries
  ``gemma3.attention.sliding_window_pattern`` (a period, or a per-layer bool array: True = sliding);
  local layers use their own RoPE base (``gemma3.rope.freq_base_swa``, default 10 000) and no linear
  RoPE scaling; global layers use ``rope.freq_base`` (1e6 in released models) and the scaling if any;
* final logit soft-capping when the metadata has it. Attention logit soft-capping is a gemma2 feature:
  gemma3 ignores ``attn_logit_softcapping`` even if present (transformers' Gemma3Attention never
  applies it, and neither does llama.cpp's gemma3 graph).
"""

from __future__ import annotations

import math
from dataclasses import replace

from engine.contract.gguf import GGUFFile
from engine.models.config import (
    ModelConfig,
    UnsupportedModelError,
    WeightLayout,
    base_config,
)

DEFAULT_PATTERN = 6
DEFAULT_LOCAL_BASE = 10000.0


def local_layers(n_layer: int, pattern, *, default: int = DEFAULT_PATTERN, path: str = "") -> tuple[bool, ...]:
    """``attention.sliding_window_pattern``: one bool per layer (True = sliding), or a period (every
    ``period``-th layer is global; 0 = none slides); ``default`` when the file has none."""
    if pattern is None:
        pattern = default
    if isinstance(pattern, (list, tuple)) or hasattr(pattern, "shape"):
        flags = tuple(bool(p) for p in pattern)
        if len(flags) != n_layer:
            where = f"{path}: " if path else ""
            raise UnsupportedModelError(f"{where}sliding_window_pattern has {len(flags)} entries for {n_layer} layers")
        return flags
    period = int(pattern)
    if period <= 0:
        return (False,) * n_layer
    return tuple((i + 1) % period != 0 for i in range(n_layer))


def gemma_block(cfg: ModelConfig) -> dict:
    """What every Gemma generation's block has in common: NEOX RoPE, GeGLU with the tanh GELU, embeddings
    scaled by sqrt(n_embd), norms after attention and after the FFN, per-head q/k norms."""
    return dict(rope_style="neox", activation="gelu_tanh", embed_scale=math.sqrt(cfg.n_embd), post_norms=True,
                qk_norm=True)


def read_config(f: GGUFFile, layout: WeightLayout) -> ModelConfig:
    cfg = base_config(f, layout)
    window = f.arch_key("attention.sliding_window")
    window = int(window) if window else None
    flags = local_layers(cfg.n_layer, f.arch_key("attention.sliding_window_pattern")) if window else ()
    attn_scale = cfg.attn_scale
    if not attn_scale and cfg.n_layer == 62:  # gemma-3-27b: query_pre_attn_scalar = n_embd / n_head
        attn_scale = 1.0 / math.sqrt(cfg.n_embd / cfg.n_head)
    return replace(
        cfg,
        **gemma_block(cfg),
        sliding_window=window,
        local_layers=flags,
        rope_base_local=float(f.arch_key("rope.freq_base_swa", DEFAULT_LOCAL_BASE)),
        attn_scale=attn_scale,
        attn_softcap=None,
    )
