"""What the decode loop and the drafters may do with a cache, whatever the cache holds.

A cache holds the model state for positions ``[0, length)`` of one token log (``tokens``). Every
forward appends positions (the layers write them, then ``commit`` records their ids), and every
rollback is one call, ``truncate(n)``: a rejected draft, a cancelled round and prefix reuse across
requests all cut the log back to a prefix. Speculation is only lossless if that cut leaves the cache
exactly as if the dropped positions had never been evaluated, so a cache kind whose state is not a
per-position log (a recurrent layer's running state) must implement ``truncate`` with whatever it takes
(snapshots at the lengths the loop can return to), not approximate it.
"""

from __future__ import annotations

from typing import Protocol, Sequence


class SequenceCache(Protocol):
    capacity: int  # positions the cache can hold (the request's num_ctx at most)
    length: int  # valid positions
    tokens: list[int]  # the token id at each valid position
    # the most bytes of snapshots (states kept only to roll back or resume) held since the last
    # ``reset_snapshot_peak``; 0 for a cache that rolls back by its length alone
    snapshot_peak: int

    def check_room(self, n: int) -> None:
        """Raise ``ContextOverflowError`` if ``n`` more positions do not fit (before anything is written)."""

    def commit(self, tokens: Sequence[int]) -> None:
        """Make the positions just written valid and record their token ids."""

    def truncate(self, n: int) -> None:
        """Drop every position ``>= n`` (the one rollback operation)."""

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """Length of the longest common prefix of the cached ids and ``tokens``."""

    def reuse_prefix(self, new_tokens: Sequence[int], *, leave_last: bool = True) -> int:
        """Keep the longest common prefix with ``new_tokens`` (at most all but the last), return its length."""

    def reset(self) -> None:
        """Drop every position."""

    def nbytes(self) -> int:
        """Memory held, in bytes."""

    def reset_snapshot_peak(self) -> None:
        """Start measuring ``snapshot_peak`` afresh (from what the cache holds now)."""
