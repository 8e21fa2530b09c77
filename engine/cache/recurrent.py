"""``HybridCache``: the cache of a hybrid model (qwen35), attention K/V beside recurrent layer states.

Attention layers keep ``KVCache``'s rule (rollback = set the length). A recurrent layer's state at the
current length is one (conv, ssm) pair per layer that each forward replaces, so "drop every position >= n"
needs the state as it was at n: the cache keeps it.

* **Records.** A forward stages, per recurrent layer, the state after each of its positions when it runs
  the exact recurrence (decode and verification widths), or only the states after its last two positions
  when it runs the chunked form (prefill). ``commit`` files them by position. They are the tensors the recurrence
  produced anyway, kept by reference: recording copies nothing, and ``truncate(n)`` to a recorded n points
  the current state at them (no copy either). Records serve rollback within a round, so a truncate drops
  every record but the restored one, and at most ``max_records`` of the newest are kept.
* **Checkpoints** serve prefix reuse across requests: the states at the end of each of a prompt's forwards
  and one position before it (the forwards from a ``reuse_prefix``/``reset`` up to the first ``truncate`` or
  single-token forward after them; the position before the end is where a request repeating the prompt
  resumes, as it re-runs its last token for logits) are kept, ``max_checkpoints`` positions at most, the
  oldest dropped first, and like records only while they are within the length. ``reuse_prefix`` keeps the longest common prefix that ends at a
  recorded position (or the current length, or 0): a recurrent state cannot be cut anywhere else.
* ``truncate(n)`` to an n with no recorded state raises ``ValueError``: never an approximation.

A forward that fails before ``commit`` leaves the committed states as they were (staged states are only
adopted by ``commit``).
"""

from __future__ import annotations

from typing import Sequence

import torch

from engine.cache.kv import KVCache

State = tuple[torch.Tensor, torch.Tensor]  # (conv [conv_dim, kernel - 1], ssm [n_v_heads, head_k_dim, head_v_dim])


class HybridCache(KVCache):
    def __init__(self, n_attn_layers: int, n_head_kv: int, head_dim: int, capacity: int, *, n_recurrent: int,
                 conv_shape: tuple[int, int], ssm_shape: tuple[int, int, int], state_dtype: torch.dtype,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 max_records: int = 64, max_checkpoints: int = 8):
        super().__init__(max(n_attn_layers, 1), n_head_kv, head_dim, capacity, device=device, dtype=dtype)
        self.n_recurrent = n_recurrent
        self.conv_shape, self.ssm_shape, self.state_dtype = tuple(conv_shape), tuple(ssm_shape), state_dtype
        self.max_records, self.max_checkpoints = max_records, max_checkpoints
        self.states: list[State] = [self._zero() for _ in range(n_recurrent)]
        self._position_bytes = n_recurrent * sum(t.numel() * t.element_size() for t in self.states[0])
        self._staged: dict[int, dict[int, State]] = {}
        self._records: dict[int, list[State]] = {}  # position -> every recurrent layer's state there
        self._checkpoints: dict[int, list[State]] = {}
        self._in_prompt = True
        self._prompt_forwards = 0  # forwards since the prompt phase began

    @classmethod
    def new(cls, config, capacity: int | None = None, device: torch.device | str = "cpu",
            dtype: torch.dtype = torch.float32) -> "HybridCache":
        r = config.recurrent
        n_rec = sum(r.layers)
        # The delta rule runs in f32 at least (as the reference and llama.cpp do); f64 models keep f64.
        state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        return cls(config.n_layer - n_rec, config.n_head_kv, config.head_dim, capacity or config.context_length,
                   n_recurrent=n_rec, conv_shape=(r.conv_dim, r.conv_kernel - 1),
                   ssm_shape=(r.n_v_heads, r.head_k_dim, r.head_v_dim), state_dtype=state_dtype,
                   device=device, dtype=dtype)

    def _zero(self) -> State:
        return (torch.zeros(self.conv_shape, dtype=self.state_dtype, device=self.device),
                torch.zeros(self.ssm_shape, dtype=self.state_dtype, device=self.device))

    # -- recurrent layers (used by the model's forward) -------------------------------------------
    def recurrent_state(self, slot: int) -> State:
        """Recurrent layer ``slot``'s committed state at ``length``."""
        return self.states[slot]

    def stage(self, slot: int, states: dict[int, State]) -> None:
        """Layer ``slot``'s states after some of this forward's positions, keyed by how many of them they
        follow (always including the forward's width: the new current state); ``commit`` adopts them."""
        self._staged[slot] = states

    def commit(self, tokens: Sequence[int]) -> None:
        n = len(tokens)
        if len(self._staged) != self.n_recurrent:
            staged, self._staged = len(self._staged), {}
            raise RuntimeError(f"{self.n_recurrent} recurrent layers but {staged} staged a state")
        start = self.length
        super().commit(tokens)
        staged = [self._staged[i] for i in range(self.n_recurrent)]
        self._staged.clear()
        self.states = [per[n] for per in staged]
        for j in sorted(set.intersection(*(set(per) for per in staged)) if staged else {n}):
            self._records[start + j] = [per[j] for per in staged]
        while len(self._records) > self.max_records:
            del self._records[min(self._records)]
        if n == 1:  # a decode step: the prompt is evaluated
            self._in_prompt = False
        if self._in_prompt:
            self._prompt_forwards += 1
            for p in (self.length - 1, self.length):
                if p > 0 and p in self._records:
                    self._checkpoints.pop(p, None)
                    self._checkpoints[p] = self._records[p]
            while len(self._checkpoints) > self.max_checkpoints:
                del self._checkpoints[next(iter(self._checkpoints))]
        self.snapshot_peak = max(self.snapshot_peak, self.snapshot_bytes())

    def snapshot_bytes(self) -> int:
        """Bytes of the recorded states and checkpoints beyond the committed state: what speculation and
        prefix reuse cost in memory (references the forwards made anyway, held until a truncate).

        Called after every commit, so counted per position, not per tensor: a record holds every recurrent
        layer's state after one position of one forward (its first layer's ssm tensor names it; a
        checkpoint shares its record's), and every such set has the same size."""
        held = {id(group[0][1]) for group in (*self._records.values(), *self._checkpoints.values())}
        held.discard(id(self.states[0][1]))
        return len(held) * self._position_bytes

    def reset_snapshot_peak(self) -> None:
        self.snapshot_peak = self.snapshot_bytes()

    def has_state_at(self, n: int) -> bool:
        return n == 0 or n == self.length or n in self._records or n in self._checkpoints

    def truncate(self, n: int) -> None:
        """Drop every position >= n, restoring each recurrent layer's state recorded at n (``ValueError``
        if there is none: the state at n cannot be rebuilt without re-running the positions before it)."""
        if n < 0 or n > self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {n}")
        if n != self.length:
            if n == 0:
                self.states = [self._zero() for _ in range(self.n_recurrent)]
            else:
                saved = self._records.get(n) or self._checkpoints.get(n)
                if saved is None:
                    raise ValueError(f"no recurrent state recorded at position {n} (length {self.length}; recorded: "
                                     f"{sorted(set(self._records) | set(self._checkpoints))})")
                self.states = list(saved)
        if self._prompt_forwards:  # a rollback after the prompt's forwards: a round of decoding
            self._in_prompt = False
        super().truncate(n)
        self._records = {n: list(self.states)} if n else {}
        self._checkpoints = {p: s for p, s in self._checkpoints.items() if p <= n}

    def reset(self) -> None:
        self.truncate(0)
        self._checkpoints.clear()
        self._in_prompt, self._prompt_forwards = True, 0

    def reuse_prefix(self, new_tokens: Sequence[int], *, leave_last: bool = True) -> int:
        """The longest common prefix with ``new_tokens`` that ends where a recurrent state is recorded
        (at most all but the last token with ``leave_last``)."""
        n = self.common_prefix(new_tokens)
        if leave_last and new_tokens and n >= len(new_tokens):
            n = len(new_tokens) - 1
        while not self.has_state_at(n):
            n -= 1
        self.truncate(n)
        self._in_prompt, self._prompt_forwards = True, 0
        return n

    def nbytes(self) -> int:
        seen: dict[int, torch.Tensor] = {}
        for group in (self.states, *self._records.values(), *self._checkpoints.values()):
            for pair in group:
                for t in pair:
                    seen[id(t)] = t
        # views of one buffer (conv windows) count their own elements: an upper bound
        return super().nbytes() + sum(t.numel() * t.element_size() for t in seen.values())

    def __repr__(self) -> str:
        return (f"HybridCache(length={self.length}, capacity={self.capacity}, attention layers={self.n_layer}, "
                f"recurrent layers={self.n_recurrent}, records={len(self._records)}, "
                f"checkpoints={sorted(self._checkpoints)}, dtype={self.dtype}, device={self.device})")
