"""A KV cache whose layers have their own shapes, and whose entries some layers share (gemma4).

Gemma 4's sliding and global layers differ in head size and K/V head count, and its last layers
compute no K/V at all: each reads the entries of an earlier layer. One preallocated tensor for all
layers (``KVCache``) cannot hold that, so this cache keeps one key and one value buffer per layer that
stores, ``[n_kv_heads, capacity, head_dim]`` each, and none for a layer that only reads.

Everything else is ``KVCache``'s: the state is one length and the token log, ``truncate`` only sets the
length (rollback costs nothing, whatever the layers hold), and sliding-window layers keep full-length
buffers, the window being the model's mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from engine.cache.kv import KVCache
from engine.ops.memory import empty_on_huge_pages, first_page_positions


@dataclass(frozen=True)
class LayerShape:
    """One cache layer: K/V heads and head size; ``source`` is the layer whose entries it reads
    (itself when it stores its own)."""

    n_head_kv: int
    head_dim: int
    source: int


class LayeredKVCache(KVCache):
    def __init__(self, layers: Sequence[LayerShape], capacity: int, *, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32):
        if capacity <= 0:
            raise ValueError(f"KV cache capacity must be positive, got {capacity}")
        for i, s in enumerate(layers):
            if s.source > i or layers[s.source].source != s.source:
                raise ValueError(f"layer {i} reads layer {s.source}, which does not store its own entries")
        self.layers = tuple(layers)
        self.n_layer = len(layers)
        self.n_head_kv = max(s.n_head_kv for s in layers)
        self.head_dim = max(s.head_dim for s in layers)
        self.v_head_dim = self.head_dim
        self.capacity = int(capacity)
        self.device = torch.device(device)
        self.dtype = dtype
        # Uninitialised, on 2 MB pages where the kernel has them (KVCache's allocation).
        self.k_layers: list[torch.Tensor | None] = []
        self.v_layers: list[torch.Tensor | None] = []
        for i, s in enumerate(layers):
            own = s.source == i
            shape = (s.n_head_kv, self.capacity, s.head_dim)
            self.k_layers.append(empty_on_huge_pages(shape, dtype, self.device) if own else None)
            self.v_layers.append(empty_on_huge_pages(shape, dtype, self.device) if own else None)
        self.length = 0
        self.tokens: list[int] = []

    def first_write_views(self) -> list[torch.Tensor]:
        return [first_page_positions(t) for t in (*self.k_layers, *self.v_layers) if t is not None]

    @classmethod
    def new(cls, config, capacity: int | None = None, device: torch.device | str = "cpu",
            dtype: torch.dtype = torch.float32) -> "LayeredKVCache":
        """A cache for a ``ModelConfig`` with per-layer geometry (``head_dim_of``, ``n_head_kv_of``, ``kv_layer``)."""
        shapes = [LayerShape(config.n_head_kv_of(i), config.head_dim_of(i), config.kv_layer(i))
                  for i in range(config.n_layer)]
        return cls(shapes, capacity or config.context_length, device=device, dtype=dtype)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k_layers + self.v_layers if t is not None)

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor, key_start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        if self.layers[layer].source != layer:
            raise ValueError(f"layer {layer} reads layer {self.layers[layer].source}'s entries and stores none")
        n = k.shape[1]
        end = self.length + n
        if end > self.capacity:
            self.check_room(n)
        kb, vb = self.k_layers[layer], self.v_layers[layer]
        kb[:, self.length:end] = k
        vb[:, self.length:end] = v
        return kb[:, key_start:end], vb[:, key_start:end]

    def read(self, layer: int, key_start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        src = self.layers[layer].source
        return self.k_layers[src][:, key_start:end], self.v_layers[src][:, key_start:end]

    def keys(self, layer: int) -> torch.Tensor:
        return self.k_layers[self.layers[layer].source][:, : self.length]

    def values(self, layer: int) -> torch.Tensor:
        return self.v_layers[self.layers[layer].source][:, : self.length]

    def __repr__(self) -> str:
        own = sum(1 for i, s in enumerate(self.layers) if s.source == i)
        return (f"LayeredKVCache(length={self.length}, capacity={self.capacity}, layers={self.n_layer} "
                f"({own} storing), dtype={self.dtype}, device={self.device})")
