"""Stop strings: the output never contains them, and text that might start one is held back.

Two small pieces, both pure (no model, no torch):

* ``StopMatcher`` works on text. ``push(text)`` returns the part that is safe to show now and whether
  a stop string was completed. Safe means: it cannot be the beginning of a stop string that the next
  text completes. The held-back tail is the longest suffix of everything pushed so far that is a
  proper prefix of some stop string; it is released when the next text rules the stop out, or by
  ``flush()`` at the end of the generation.
* ``TextStream`` puts a tokenizer's incremental decoder in front of a ``StopMatcher`` and keeps the
  character count each token ends at, so that when a stop string is found the caller knows how many
  tokens are entirely visible (Ollama trims the stop string's tokens from the context and cache the
  same way: a token whose text is cut by the stop is dropped with everything after it).
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str] | None):
        # Empty strings would match everywhere; Ollama ignores them too.
        self.stops: tuple[str, ...] = tuple(s for s in (stops or ()) if s)
        self._held = ""
        self.stopped = False

    @property
    def held(self) -> str:
        """Text pushed but not yet released (a possible start of a stop string)."""
        return self._held

    def push(self, text: str) -> tuple[str, bool]:
        """Feed newly generated text; return ``(text safe to emit, stop string found)``.

        After a stop was found the matcher swallows everything (the generation must end)."""
        if self.stopped:
            return "", True
        if not self.stops:
            return text, False
        buf = self._held + text
        first = -1
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (first < 0 or i < first):
                first = i
        if first >= 0:
            self._held = ""
            self.stopped = True
            return buf[:first], True
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """Release the held text (the generation ended without completing a stop string)."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best


class _IncrementalDecoder(Protocol):
    def push(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


class TextStream:
    """Token ids in, visible text out, with stop strings removed and per-token accounting."""

    def __init__(self, decoder: _IncrementalDecoder, stops: Sequence[str] | None,
                 is_hidden: Callable[[int], bool] | None = None):
        self._decoder = decoder
        self._matcher = StopMatcher(stops)
        self._is_hidden = is_hidden or (lambda _t: False)
        self._ends: list[int] = []  # characters decoded once token i was pushed
        self._decoded = 0
        self._emitted = 0

    @property
    def stopped(self) -> bool:
        return self._matcher.stopped

    def push(self, token_id: int) -> tuple[str, bool]:
        """Decode one token; return the newly visible text and whether a stop string completed."""
        piece = "" if self._is_hidden(token_id) else self._decoder.push(token_id)
        self._decoded += len(piece)
        self._ends.append(self._decoded)
        text, stopped = self._matcher.push(piece)
        self._emitted += len(text)
        return text, stopped

    def finish(self) -> str:
        """End of generation without a stop: release what the decoder and the matcher still hold."""
        if self._matcher.stopped:
            return ""
        tail = self._decoder.flush()
        text, _ = self._matcher.push(tail)
        if self._matcher.stopped:
            self._emitted += len(text)
            return text
        text += self._matcher.flush()
        self._emitted += len(text)
        return text

    def visible_tokens(self) -> int:
        """How many of the pushed tokens have all their text in the emitted output."""
        n = 0
        for end in self._ends:
            if end > self._emitted:
                break
            n += 1
        return n
