"""What a loaded model wrote before, indexed for drafting: the store behind the suffix drafter (``suffix.py``).

Agents resend growing conversations, retry the same question, rewrite the file they just wrote and run
similar sessions side by side, so text this model generated in an earlier request is often what it is
about to write again. SuffixDecoding (Oliaro et al., NeurIPS 2025) keeps suffix trees over previous
outputs and drafts the continuation the matched suffix was most often followed by. This store answers
the same question with the same counts, without a tree:

* each finished output is kept as one document, preceded by the last ``prompt_tail`` tokens of its
  prompt (so a retried question's answer is found from the question itself, before its first token);
* an index maps every ``key_len``-gram to the places (the most recent ``occurrences``) where it is
  followed by another token of the same document;
* ``match(context)`` looks up the context's last ``key_len`` tokens, extends each place backwards while it
  agrees with the context (up to ``max_match`` tokens) and keeps the places with the longest agreement:
  the occurrences of the deepest matching node of the paper's suffix tree. From there it walks forward,
  each step taking the token most of the remaining places continue with; the running share of places
  that agree (count(child) / count(node), multiplied along the path) is each draft's probability, and
  the walk stops under ``min_probability`` or after ``alpha`` x the match length tokens (the paper's
  ``max_spec_factor``: a 3-token coincidence earns 3 drafts at most, a 40-token match a long chain).

Memory is bounded by ``max_tokens``: past it the oldest documents are dropped whole (first in, first
out: the outputs of the current sessions are the ones that repeat). Dropped documents leave stale index
entries, skipped at lookup and cleared by a rebuild once they outnumber the live ones. Only finished
requests are added (a cancelled one adds nothing: its text is not what the model would have ended
with). One store per loaded model, in memory only: it is gone with the model, and one model's outputs
never draft for another. Thread-safe: every sequence slot of the model reads it, finished requests add.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from engine.contract.protocol import DEFAULT_SUFFIX_TOKENS

_OFFSET_BITS = 32  # an index entry is one int: document serial << 32 | position in the document


@dataclass(frozen=True)
class SuffixMatch:
    """A continuation drafted from previous outputs: ``tokens`` with their path probabilities ``probabilities``
    (non-increasing, 1.0 while every matching place agrees), the length of the matched suffix and how many places
    matched it."""

    tokens: list[int]
    probabilities: list[float]
    length: int
    support: int


class SuffixCache:
    """Recent outputs of one model, looked up by the context's suffix (see the module doc)."""

    def __init__(self, max_tokens: int = DEFAULT_SUFFIX_TOKENS, *, key_len: int = 3, max_match: int = 64,
                 occurrences: int = 32, prompt_tail: int = 64, alpha: float = 1.0,
                 min_probability: float = 0.1):
        if key_len < 1 or max_match < key_len:
            raise ValueError("suffix cache: need 1 <= key_len <= max_match")
        self.max_tokens = max(0, int(max_tokens))
        self.key_len = key_len
        self.max_match = max_match
        self.occurrences = occurrences
        self.prompt_tail = prompt_tail
        self.alpha = alpha
        self.min_probability = min_probability
        self._lock = threading.Lock()
        self._docs: OrderedDict[int, tuple[int, ...]] = OrderedDict()  # serial -> tokens, oldest first
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._serial = 0
        self._tokens = 0  # live tokens (the documents')
        self._stale = 0  # index entries that point into dropped documents

    # -- writing ------------------------------------------------------------------------------
    def add(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """Keep ``output`` (a finished request's generated tokens), after its prompt's last tokens."""
        if not output or self.max_tokens <= 0:
            return
        tail = prompt[max(0, len(prompt) - self.prompt_tail):]  # the last tokens only, not a copy of the prompt
        doc = tuple(int(t) for t in tail) + tuple(int(t) for t in output)
        doc = doc[-self.max_tokens:]  # a document larger than the whole store keeps its end
        with self._lock:
            serial = self._serial
            self._serial += 1
            self._docs[serial] = doc
            self._tokens += len(doc)
            self._index_document(self._index, serial, doc)
            while self._tokens > self.max_tokens and self._docs:
                _, old = self._docs.popitem(last=False)
                self._tokens -= len(old)
                self._stale += max(0, len(old) - self.key_len)
            if self._stale > max(1024, self._tokens):  # the live documents only
                self._index = {}
                for kept, doc in self._docs.items():
                    self._index_document(self._index, kept, doc)
                self._stale = 0

    def _index_document(self, index: dict[tuple[int, ...], list[int]], serial: int, doc: tuple[int, ...]) -> None:
        """Every n-gram of ``doc`` that has a successor in it, as the most recent place of its key."""
        n, cap = self.key_len, self.occurrences
        base = serial << _OFFSET_BITS
        for end in range(n - 1, len(doc) - 1):
            places = index.get(key := doc[end - n + 1:end + 1])
            if places is None:
                index[key] = [base | end]
            else:
                places.append(base | end)
                if len(places) > cap:
                    del places[0]

    def clear(self) -> None:
        with self._lock:
            self._docs.clear()
            self._index = {}
            self._tokens = self._stale = 0

    # -- reading ------------------------------------------------------------------------------
    def match(self, context: Sequence[int], limit: int) -> SuffixMatch | None:
        """Up to ``limit`` tokens the outputs continue ``context`` with (None: no place matches its last
        ``key_len`` tokens)."""
        n = self.key_len
        if limit <= 0 or len(context) < n:
            return None
        key = tuple(int(t) for t in context[-n:])
        with self._lock:
            places = self._index.get(key)
            if not places:
                return None
            docs = self._docs
            found: list[tuple[tuple[int, ...], int]] = []
            best = 0
            back_limit = min(self.max_match, len(context))
            for entry in reversed(places):  # the most recent first
                doc = docs.get(entry >> _OFFSET_BITS)
                if doc is None:
                    continue
                end = entry & ((1 << _OFFSET_BITS) - 1)
                m = n
                while m < back_limit and end - m >= 0 and doc[end - m] == context[-1 - m]:
                    m += 1
                if m > best:
                    best, found = m, [(doc, end)]
                elif m == best:
                    found.append((doc, end))
        if not found:
            return None
        return self._walk(found, best, min(limit, max(1, int(self.alpha * best))))

    def _walk(self, places: list[tuple[tuple[int, ...], int]], length: int, limit: int) -> SuffixMatch:
        """The most frequent path forward from ``places`` (documents are immutable: no lock needed)."""
        support = len(places)
        tokens: list[int] = []
        probabilities: list[float] = []
        probability = 1.0
        for step in range(1, limit + 1):
            counts: dict[int, int] = {}
            for doc, end in places:
                if end + step < len(doc):
                    t = doc[end + step]
                    counts[t] = counts.get(t, 0) + 1
            if not counts:
                break
            token, count = max(counts.items(), key=lambda kv: kv[1])  # ties: the most recent place's token
            probability *= count / len(places)
            if probability < self.min_probability:
                break
            tokens.append(token)
            probabilities.append(probability)
            places = [(doc, end) for doc, end in places if end + step < len(doc) and doc[end + step] == token]
        return SuffixMatch(tokens, probabilities, length, support)

    # -- size ---------------------------------------------------------------------------------
    @property
    def tokens(self) -> int:
        """Tokens kept (the documents', prompt tails included)."""
        return self._tokens

    @property
    def documents(self) -> int:
        return len(self._docs)

    def memory_bytes(self) -> int:
        """An estimate of what the store holds: each kept token as a tuple slot and an index entry (the key tuple,
        its dict slot and its place)."""
        with self._lock:
            entries = sum(len(p) for p in self._index.values())
            return 8 * self._tokens + 40 * entries + (56 + 8 * self.key_len + 64) * len(self._index)
