"""Prompt-lookup (n-gram) drafting: no weights, proposals copied from the request's own text."""

from __future__ import annotations

from typing import Sequence

from engine.speculative.drafter import (
    EMPTY,
    DraftContext,
    Drafter,
    Proposal,
    TargetOutput,
)


class NgramDrafter(Drafter):
    """Prompt lookup with a copy cursor: continue the earlier text the output is copying.

    Two kinds of candidate source are weighed each round:

    * **suffix matches**: for each n in n_max..n_min an index maps an n-gram to the last position
      where it ended *with a successor already in the log*, found in O(n_max);
    * **the copy cursor**: the source position the previous rounds were copying from, advanced one
      position per committed token. It keeps a copy going through an edit the suffix lookup cannot
      see past: after ``acc`` replaced ``total`` on a copied line, the most recent ``acc`` is
      somewhere else entirely, but the cursor still points just after ``total`` in the original.

    The suffix match is the default (the longest, then the most recent); the cursor replaces it when
    more of the last ``window`` tokens agree with the tokens up to the cursor than with those up to
    the match (renames counted as agreement), and at least ``cursor_agreement`` do. Edits are learned as
    **renames**: when the output puts token b where the source had token a and the next token
    realigns with the source, later copies of a are drafted as b; a rename the target then refuses
    is forgotten. Renames and the cursor live for one request (``begin`` with a log that is not an
    extension clears them).

    A source with thin evidence (few of the last ``window`` tokens agree) gets a one-token draft.
    The continuation may run into the suffix itself, which makes a periodic text propose whole
    periods (``a b a b`` -> ``a b a b ...``). Drafts are point masses.

    Each round names its source before the depth is chosen (``round_source``): ``copy`` when all of
    the last ``window`` tokens agree with it, ``lookup`` otherwise. The adaptive schedule prices the
    two apart (``engine.speculative.depth.PerSourceDepth``): a certain copy is accepted whole on a
    rewrite and on the stretches of code that repeat, while lookups in free text mostly are not, and
    one estimate over both kept a rewrite's rounds shallow for its first dozen rounds after a code or
    prose request had taught it the lookups' acceptance.
    """

    kind = "ngram"
    sources = ("copy", "lookup")

    def __init__(self, n_max: int = 3, n_min: int = 1, window: int = 8, cursor_agreement: int = 6,
                 probe_below: int = 3):
        super().__init__()
        self.n_max = n_max
        self.n_min = n_min
        self.window = window
        # A source whose last ``window`` tokens agree with ours on fewer than ``probe_below`` is a
        # coincidence more often than a copy: draft one token from it, not k. On free text a deep
        # draft from such a source is mostly rejected and costs verification width; a real copy
        # agrees on far more and is untouched (docs/measurements.md, "N-gram drafter").
        self.probe_below = probe_below
        # The cursor must agree on this many of the last ``window`` tokens to be used at all, and
        # beat the suffix match's agreement: outside a copy it would keep drafting a stale source
        # (docs/measurements.md, "N-gram drafter").
        self.cursor_agreement = cursor_agreement
        self._index: list[dict[tuple[int, ...], int]] = [{} for _ in range(n_max + 1)]
        self.last_agreement = 0  # of the last proposal's source: how many of the last window tokens agree
        self._clear_alignment()

    def _clear_alignment(self) -> None:
        self._cursor: int | None = None  # source position aligned with the last log token
        self._renames: dict[int, int] = {}  # source token -> the token the output writes instead
        self._pending: tuple[int, int, int] | None = None  # (source pos, source token, written token)
        self._round: str | None = None  # the coming round's source, once round_source named it

    def begin(self, tokens: Sequence[int]) -> None:
        tokens = list(tokens)
        n = len(self.tokens)
        self._clear_alignment()
        if len(tokens) >= n and tokens[:n] == self.tokens:
            self._extend(tokens[n:])
        else:
            self.tokens = []
            self._index = [{} for _ in range(self.n_max + 1)]
            self._extend(tokens)

    def commit(self, tokens_committed: Sequence[int], n_total: int, target: TargetOutput | None = None) -> None:
        self._round = None  # the evidence changes with every committed token
        n_before = len(self.tokens)
        self._extend(tokens_committed)
        if self._cursor is not None:
            self._follow(n_before)
        if len(self.tokens) != n_total:
            raise RuntimeError(f"ngram drafter out of sync: {len(self.tokens)} != {n_total}")

    def _extend(self, new: Sequence[int]) -> None:
        toks = self.tokens
        for t in new:
            toks.append(int(t))
            p = len(toks) - 1  # the n-grams ending at p - 1 now have a successor
            for n in range(1, self.n_max + 1):
                if p - n < 0:
                    break
                self._index[n][tuple(toks[p - n:p])] = p - 1

    # -- alignment -----------------------------------------------------------------------------
    def _follow(self, start: int) -> None:
        """Advance the cursor over the tokens committed from ``start`` on, learning and forgetting
        renames. (A source position is always earlier than the token it is compared with.)"""
        toks, cursor = self.tokens, self._cursor
        aligned = toks[start - 1] == self._renamed(toks[cursor])  # before the run
        for t in toks[start:]:
            cursor += 1
            src = toks[cursor]
            if self._pending is not None:
                pos, a, b = self._pending
                self._pending = None
                if pos == cursor - 1 and t == self._renamed(src):
                    self._renames[a] = b  # the copy went on after the edit: a real rename
            if t == src:
                self._renames.pop(src, None)  # the target kept the source token after all
            elif t != self._renames.get(src) and aligned:
                self._pending = (cursor, src, int(t))  # an edit inside a copy, maybe a rename
            aligned = t == self._renamed(src)
        self._cursor = cursor

    def _renamed(self, token: int) -> int:
        return self._renames.get(token, token)

    def _score(self, source: int) -> int:
        """How many of the last ``window`` tokens agree (renames included) with those ending at ``source``."""
        toks, last = self.tokens, len(self.tokens) - 1
        return sum(1 for i in range(min(self.window, source + 1))
                   if toks[last - i] == self._renamed(toks[source - i]))

    def select_source(self) -> int:
        """Choose the source the next proposal copies from (the longest suffix match, or the cursor
        when it agrees better) and return its agreement (``last_agreement``): how sure a copy is."""
        toks = self.tokens
        L = len(toks)
        source = None  # the longest suffix match (the most recent of that length)
        for n in range(min(self.n_max, L), self.n_min - 1, -1):
            source = self._index[n].get(tuple(toks[L - n:]))
            if source is not None:
                break
        score = -1 if source is None else self._score(source)
        cursor = self._cursor
        if cursor is not None and cursor < L - 1 and cursor != source:
            cursor_score = self._score(cursor)
            if cursor_score >= self.cursor_agreement and cursor_score > score:
                source, score = cursor, cursor_score
        self.last_agreement = max(score, 0)  # how sure this round's source is (engine.speculative.copy_first)
        self._cursor = source
        return self.last_agreement

    def round_source(self) -> str:
        if self._round is None:
            self._round = "copy" if self.select_source() >= self.window else "lookup"
        return self._round

    def propose(self, k: int, ctx: DraftContext) -> Proposal:
        decided, self._round = self._round, None
        if k <= 0 or not self.tokens:
            return EMPTY
        if decided is None:  # a fixed schedule does not ask round_source first
            self.select_source()
        return self.copy_from_source(k)

    def copy_from_source(self, k: int) -> Proposal:
        """Up to ``k`` tokens copied from the source ``select_source`` chose (none without one)."""
        toks, source = self.tokens, self._cursor
        L = len(toks)
        if k <= 0 or source is None:
            return EMPTY
        if self.last_agreement < self.probe_below:
            k = 1  # thin evidence: a one-token probe costs next to nothing to verify
        out: list[int] = []
        for i in range(k):
            j = source + 1 + i
            out.append(self._renamed(toks[j]) if j < L else out[j - L])
        return Proposal(out, None, [1.0] * len(out))

    def reset(self) -> None:
        self.begin([])

    def fork(self, target_cache) -> "NgramDrafter":
        return NgramDrafter(self.n_max, self.n_min, self.window, self.cursor_agreement, self.probe_below)
