"""Preallocated KV cache whose state is a single integer length (a ``SequenceCache``).

Layout: one key and one value buffer for all layers, ``k[layer]`` is ``[n_kv_heads, capacity, head_dim]``
in the model's compute dtype. Positions ``[0, length)`` are valid; everything at or past ``length`` is stale
and never read.

Design choices that speculation relies on (docs/speculation.md, "State that must stay consistent"):

* **Truncation is a length.** ``truncate(n)`` only sets ``length`` (and trims the token log); no tensor is
  touched, so rejecting a draft costs nothing and no copies are ever needed.
* **Sliding-window layers keep full-length buffers.** Every layer, local or global, stores every position
  up to ``capacity``; the window is applied by the model purely through the attention mask (and by slicing
  the keys to the last ``window + n - 1`` positions, so a local layer's attention still costs O(window)).
  This is exact under any pattern of commit/truncate, including truncation far back for prefix reuse, at
  the price of memory = full context for the local layers too. (A ring buffer of ``window + max verify
  width`` slots would save memory but loses positions that a deeper truncation, e.g. prefix reuse, needs.)
* **Prefix reuse.** The cache records the token ids it holds (``tokens``), so a new request can keep the
  longest common prefix with ``reuse_prefix(new_tokens)``.
"""

from __future__ import annotations

from typing import Sequence

import torch

from engine.ops.memory import empty_on_huge_pages, first_page_positions


class ContextOverflowError(RuntimeError):
    """Appending would exceed the cache capacity (the request's num_ctx)."""


class KVCache:
    def __init__(
        self,
        n_layer: int,
        n_head_kv: int,
        head_dim: int,
        capacity: int,
        *,
        v_head_dim: int | None = None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        if capacity <= 0:
            raise ValueError(f"KV cache capacity must be positive, got {capacity}")
        self.n_layer = n_layer
        self.n_head_kv = n_head_kv
        self.head_dim = head_dim
        self.v_head_dim = v_head_dim or head_dim
        self.capacity = int(capacity)
        self.device = torch.device(device)
        self.dtype = dtype
        # Uninitialised: pages are only touched when written; stale slots are never read. On 2 MB pages where
        # the kernel has them (every step reads the cached positions: engine.ops.memory.empty_on_huge_pages).
        # A loaded model's slots are made resident ahead of their first write (engine.runtime, first_write_views).
        self.k = empty_on_huge_pages((n_layer, n_head_kv, self.capacity, head_dim), dtype, self.device)
        self.v = empty_on_huge_pages((n_layer, n_head_kv, self.capacity, self.v_head_dim), dtype, self.device)
        self.length = 0
        self.tokens: list[int] = []

    def first_write_views(self) -> list[torch.Tensor]:
        """What a first forward makes resident of the buffers allocated with the cache: each (layer, head) run's
        positions up to the end of its first 2 MB page (engine.ops.memory.prefault_writable does it ahead)."""
        return [first_page_positions(t) for t in (self.k, self.v)]

    @classmethod
    def new(cls, config, capacity: int | None = None, device: torch.device | str = "cpu",
            dtype: torch.dtype = torch.float32) -> "KVCache":
        """A cache for a ``ModelConfig``; ``capacity`` defaults to the model's context length."""
        return cls(config.n_layer, config.n_head_kv, config.head_dim, capacity or config.context_length,
                   v_head_dim=config.v_head_dim, device=device, dtype=dtype)

    # -- state ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.length

    @property
    def free(self) -> int:
        return self.capacity - self.length

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    # Rollback snapshots: a KV cache rolls back by its length and keeps none; a cache that does keep
    # states to restore (engine.cache.recurrent) reports the most it held since the last reset.
    snapshot_peak: int = 0

    def reset_snapshot_peak(self) -> None:
        self.snapshot_peak = 0

    def truncate(self, n: int) -> None:
        """Drop every position >= n. O(1): only the length (and the token log) changes."""
        if n < 0 or n > self.length:
            raise ValueError(f"cannot truncate a KV cache of length {self.length} to {n}")
        self.length = n
        del self.tokens[n:]

    def reset(self) -> None:
        self.truncate(0)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """Length of the longest common prefix of the cached token ids and ``tokens``."""
        n = min(len(tokens), self.length)
        cached = self.tokens
        if cached[:n] == list(tokens[:n]):  # the usual case (every decode step asks), compared at C speed
            return n
        i = 0
        while i < n and cached[i] == tokens[i]:
            i += 1
        return i

    def adopt_prefix(self, other: "KVCache", n: int) -> None:
        """Hold ``other``'s first ``n`` positions (keys, values and token ids) instead of anything of its own: a
        prompt that starts as another sequence's did (a shared system prompt) is not evaluated again. The
        caller makes sure ``other`` is not being written meanwhile (engine.batching)."""
        if n > other.length or n > self.capacity or other.k.shape[:2] != self.k.shape[:2] or \
                other.k.shape[3] != self.k.shape[3] or other.v.shape[3] != self.v.shape[3]:
            raise ValueError("cannot adopt a prefix from a cache of another shape or a shorter one")
        tokens = list(other.tokens[:n])
        if len(tokens) != n:  # ``other`` is being cut back meanwhile: its keys would not be the ones copied
            raise ValueError(f"cannot adopt {n} positions from a cache whose token log holds {len(tokens)}")
        self.k[:, :, :n].copy_(other.k[:, :, :n])
        self.v[:, :, :n].copy_(other.v[:, :, :n])
        self.length = n
        self.tokens = tokens

    def reuse_prefix(self, new_tokens: Sequence[int], *, leave_last: bool = True) -> int:
        """Keep the longest common prefix with ``new_tokens``, truncate the rest, return how many are kept.

        With ``leave_last`` (default) at most ``len(new_tokens) - 1`` positions are kept, so the caller
        always has at least one token left to forward and gets logits for the last prompt position.
        """
        n = self.common_prefix(new_tokens)
        if leave_last and new_tokens and n >= len(new_tokens):
            n = len(new_tokens) - 1
        self.truncate(n)
        return n

    # -- writes (used by the model's forward) -----------------------------------------------
    def check_room(self, n: int) -> None:
        if self.length + n > self.capacity:
            raise ContextOverflowError(
                f"context overflow: {self.length} cached + {n} new positions exceed the context size "
                f"{self.capacity} (num_ctx)")

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor, key_start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k``/``v`` ([n_kv_heads, n, head_dim]) of one layer at positions ``[length, length + n)``.

        Returns views of the keys and values at positions ``[key_start, length + n)``. ``length`` itself is
        only advanced by ``commit`` once every layer has been written.
        """
        n = k.shape[1]
        end = self.length + n
        if end > self.capacity:
            self.check_room(n)
        self.k[layer, :, self.length:end] = k
        self.v[layer, :, self.length:end] = v
        return self.k[layer, :, key_start:end], self.v[layer, :, key_start:end]

    def read(self, layer: int, key_start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of one layer's keys and values at positions ``[key_start, end)``, written earlier (in
        this forward too, before ``commit``), without writing anything."""
        return self.k[layer, :, key_start:end], self.v[layer, :, key_start:end]

    def commit(self, tokens: Sequence[int]) -> None:
        """Advance the length over the positions just written by ``store`` and record their token ids."""
        n = len(tokens)
        self.check_room(n)
        self.length += n
        self.tokens.extend(int(t) for t in tokens)

    def keys(self, layer: int) -> torch.Tensor:
        """Valid keys of one layer, [n_kv_heads, length, head_dim] (a view)."""
        return self.k[layer, :, : self.length]

    def values(self, layer: int) -> torch.Tensor:
        return self.v[layer, :, : self.length]

    def __repr__(self) -> str:
        return (f"KVCache(length={self.length}, capacity={self.capacity}, layers={self.n_layer}, "
                f"kv_heads={self.n_head_kv}, head_dim={self.head_dim}, dtype={self.dtype}, device={self.device})")
