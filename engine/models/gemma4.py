"""gemma4 (text models: E2B/E4B-style with per-layer embeddings and KV sharing, 31B-style, and the 26B-A4B
mixture of experts).

What differs from gemma3, as llama.cpp's converter writes the GGUF and its gemma4 graph reads it
(transformers' ``Gemma4TextModel`` is the same computation):
* RMSNorm weights are stored as they are used (gemma4's norm multiplies by w, not 1 + w);
* sliding and global layers have different head sizes (``attention.key_length_swa`` and
  ``attention.key_length``), and ``attention.head_count_kv`` may be one entry per layer;
* global layers rotate with ``rope.freq_base`` and the ``rope_freqs`` factors (transformers'
  "proportional" RoPE: the unrotated frequencies are stored as 1e30 divisors); sliding layers use
  ``rope.freq_base_swa`` and no factors;
* q and k get per-head RMSNorms with weights, v a weightless one; the query scale is 1 (the norms
  already fix the logits' scale);
* a layer without ``attn_v`` uses its (un-normed) K projection as V;
* the last ``attention.shared_kv_layers`` layers compute no K/V: each attends the cache entries of the
  last earlier layer of its own kind (sliding or global);
* ``feed_forward_length`` may be per layer (the FFN width is taken from the weights);
* E models add a per-layer embedding input (``embedding_length_per_layer_input``) to every block, and
  every block's output is multiplied by its ``layer_output_scale``;
* final logit soft-capping when the metadata has it;
* the 26B-A4B (``expert_count`` > 0) runs a sparse MoE beside every layer's dense FFN
  (``MoEConfig.dense_branch``, built by ``engine.models.gemma4_moe``): ``expert_used_count`` of
  ``expert_count`` GeGLU experts of width ``expert_feed_forward_length``, softmax top-k renormalised
  (transformers' router always renormalises), scaled per expert.
"""

from __future__ import annotations

from dataclasses import replace

from engine.contract.gguf import GGUFFile
from engine.models.config import (
    ModelConfig,
    MoEConfig,
    UnsupportedModelError,
    WeightLayout,
    base_config,
    moe_config,
    per_layer_ints,
)
from engine.models.gemma3 import DEFAULT_LOCAL_BASE, gemma_block, local_layers


def kv_sources(flags: tuple[bool, ...], n_shared: int, path: str) -> tuple[int, ...]:
    """Per layer, the layer whose K/V it attends: itself, or for the last ``n_shared`` layers the last
    non-shared layer of the same kind."""
    n_layer = len(flags)
    first_shared = n_layer - n_shared
    if n_shared <= 0:
        return tuple(range(n_layer))
    if first_shared <= 0:
        raise UnsupportedModelError(f"{path}: all {n_layer} layers share K/V; none computes it")
    sources = list(range(first_shared))
    for i in range(first_shared, n_layer):
        same = [j for j in range(first_shared) if flags[j] == flags[i]]
        if not same:
            raise UnsupportedModelError(f"{path}: shared layer {i} has no earlier layer of its kind to read K/V from")
        sources.append(same[-1])
    return tuple(sources)


def read_config(f: GGUFFile, layout: WeightLayout) -> ModelConfig:
    path = f.path
    cfg = attention_config(f, base_config(f, layout, per_layer_arrays=True))
    n_head_kv = per_layer_ints(f.arch_key("attention.head_count_kv", cfg.n_head), cfg.n_layer,
                               "attention.head_count_kv", path)
    shared = int(f.arch_key("attention.shared_kv_layers", 0) or 0)
    flags = cfg.local_layers or (False,) * cfg.n_layer
    return replace(
        cfg,
        layer_n_head_kv=n_head_kv,
        kv_source=kv_sources(flags, shared, path),
        per_layer_input=int(f.arch_key("embedding_length_per_layer_input", 0) or 0),
        moe=moe(f),
    )


def moe(f: GGUFFile) -> MoEConfig | None:
    """The 26B-A4B's experts, or None for a dense model. A file with a router tensor but no expert metadata
    is refused by ``moe_config`` rather than run without its experts (wrong output, not an error)."""
    if not int(f.arch_key("expert_count", 0) or 0) and "blk.0.ffn_gate_inp.weight" not in f.tensors:
        return None
    return replace(moe_config(f, normalize_weights=True), dense_branch=True)


def attention_config(f: GGUFFile, cfg: ModelConfig) -> ModelConfig:
    """The fields a gemma4 target and its assistant share: layer kinds, head sizes, RoPE, norms, scales."""
    path = f.path
    n = cfg.n_layer
    window = f.arch_key("attention.sliding_window")
    window = int(window) if window else None
    flags = local_layers(n, f.arch_key("attention.sliding_window_pattern"), default=0, path=path) if window else (False,) * n

    head_full = cfg.head_dim
    head_swa = int(f.arch_key("attention.key_length_swa", head_full))
    if int(f.arch_key("attention.value_length_swa", head_swa)) != head_swa:
        raise UnsupportedModelError(f"{path}: key_length_swa != value_length_swa is not supported")
    rope_swa = int(f.arch_key("rope.dimension_count_swa", head_swa))
    if rope_swa != head_swa:
        raise UnsupportedModelError(f"{path}: partial RoPE on sliding layers (rope.dimension_count_swa {rope_swa} "
                                    f"< {head_swa}) is not supported")
    head_dims = tuple(head_swa if local else head_full for local in flags)
    return replace(
        cfg,
        **gemma_block(cfg),
        v_norm=True,
        attn_scale=1.0,
        attn_softcap=None,
        sliding_window=window,
        local_layers=flags if window else (),
        rope_base_local=float(f.arch_key("rope.freq_base_swa", DEFAULT_LOCAL_BASE)),
        rope_dim_local=head_swa,
        rope_freqs_local=False,
        layer_head_dim=head_dims,
    )
