"""A model's decoder blocks as one native call per forward (``engine/ops/kernels/decoder.cpp``).

The native ``DecoderStack`` runs exactly the kernels the Python blocks call, in the same order, so a
forward through it gives bit-identical results; what it removes is the interpreter and dispatch time
between a block's ~25 small ops, during which the matmuls' memory traffic stops. It covers the blocks
most served models have (llama, qwen2, qwen3 and their drafters): pre-norm attention over one uniform
KV cache with optional q/k norms, a SwiGLU FFN, every linear in the qdot format. Anything else (sliding
windows, soft-capping, post norms, MoE or recurrent layers, other weight formats) keeps the Python
blocks: :func:`build_fused_stack` says ``None`` and why is logged at debug level.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Sequence

import torch

from engine.cache.kv import KVCache
from engine.models.layers import Block, FeedForward
from engine.ops.linear import Linear, QDotLinear, SplitLinear

if TYPE_CHECKING:
    from engine.models.config import ModelConfig

log = logging.getLogger("tandem.engine")


class FusedStack:
    """The native stack over a model's blocks; ``forward`` replaces the Python loop over them."""

    def __init__(self, native, first_layer: int = 0):
        self._native = native
        self.first_layer = first_layer  # the model layer (and cache layer) of the stack's first block

    def _layers(self, t: torch.Tensor) -> torch.Tensor:
        """A cache's K or V from the stack's first layer on (a view: the native code indexes from 0)."""
        return t[self.first_layer:] if self.first_layer else t

    def forward(self, x: torch.Tensor, cache: KVCache, start: int,
                rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x [n, D] after every block, causal over the cache; writes the blocks' keys and values at
        ``start ..`` (room checked by the caller, committed by it)."""
        cos, sin = rope
        return self._native.forward(x, self._layers(cache.k), self._layers(cache.v), start, cos, sin)

    def forward_batch(self, x: torch.Tensor, caches: Sequence[KVCache], starts: Sequence[int],
                      lengths: Sequence[int], rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Several sequences' rows ``x`` [N, D] (segment s: ``lengths[s]`` rows at ``starts[s]`` of
        ``caches[s]``), each causal over its own cache; ``rope``: every row's (cos, sin)."""
        cos, sin = rope
        return self._native.forward_batch(x, [self._layers(c.k) for c in caches], [self._layers(c.v) for c in caches],
                                          list(starts),
                                          list(lengths), cos, sin)


def _config_reason(cfg: ModelConfig) -> str | None:
    """Why the config's blocks are not the shape the native stack runs, or None."""
    checks = {
        "recurrent layers": cfg.recurrent is not None,
        "per-layer K/V shapes": not cfg.uniform_kv,
        "sliding-window layers": bool(cfg.sliding_window) or any(cfg.local_layers),
        "attention soft-capping": cfg.attn_softcap is not None,
        "post norms": cfg.post_norms,
        "per-layer inputs": bool(cfg.per_layer_input),
        "an MoE FFN": cfg.moe is not None,
        "an activation other than SiLU": cfg.activation != "silu",
        "a V norm": cfg.v_norm,
        "an attention output gate": cfg.attn_output_gate,
        "partial RoPE": cfg.rope_dim != cfg.head_dim,
    }
    for what, present in checks.items():
        if present:
            return what
    return None


def _parts(lin: Linear) -> list[QDotLinear] | None:
    # A LoRA-adapted linear (engine.ops.lora.LoraLinear) is neither: the native stack would run the base
    # weights alone and drop the adapter, so an adapted model's blocks always run in Python.
    if isinstance(lin, QDotLinear):
        return [lin]
    if isinstance(lin, SplitLinear) and all(isinstance(p, QDotLinear) for p in lin.parts):
        return list(lin.parts)
    return None


def _block_reason(i: int, block: Block) -> str | None:
    attn = block.attn
    if attn.layer != i or attn.kv_layer != i or not attn.owns_kv or attn.v_from_k:
        return f"block {i} shares or moves its cache layer"
    if not isinstance(block.ffn, FeedForward) or block.ffn_norm is None:
        return f"block {i} has another FFN"
    if block.out_scale is not None or block.ple_gate is not None or block.post_attn_norm is not None:
        return f"block {i} has extra inputs or scales"
    for lin in (attn.wqkv, attn.wo, block.ffn.w13, block.ffn.w2):
        if _parts(lin) is None:
            return f"block {i} has a {lin.format} linear"
    return None


def build_fused_stack(cfg: ModelConfig, blocks: Sequence[Block], native_class, first_layer: int = 0) -> FusedStack | None:
    """A ``FusedStack`` over ``blocks`` (the model's layers from ``first_layer`` on) when every one of them is the
    shape it runs, else None."""
    if native_class is None:
        return None
    reason = _config_reason(cfg) or next((r for i, b in enumerate(blocks) if (r := _block_reason(first_layer + i, b))),
                                         None)
    if reason is not None:
        log.debug("blocks run in Python: %s", reason)
        return None
    attn0 = blocks[0].attn
    native = native_class(cfg.n_head, cfg.n_head_kv, cfg.head_dim, float(cfg.rms_eps), cfg.rope_style == "neox",
                          float(attn0.scale))
    for i, block in enumerate(blocks):
        attn = block.attn
        q_norm = None if attn.q_norm is None else attn.q_norm.weight
        k_norm = None if attn.k_norm is None else attn.k_norm.weight
        native.add_layer(block.attn_norm.weight, block.ffn_norm.weight, q_norm, k_norm)
        for which, lin in (("qkv", attn.wqkv), ("o", attn.wo), ("gate_up", block.ffn.w13), ("down", block.ffn.w2)):
            for p in _parts(lin):
                native.add_part(i, which, p.codes, p.scales, p.zeros, p.supers, p.bias, p.bits, p.group, p.offset,
                                p.out_features)
    return FusedStack(native, first_layer)
