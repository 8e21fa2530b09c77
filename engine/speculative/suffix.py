"""Suffix drafting: drafts from what this model wrote in earlier requests, and from the request's own text.

No weights. Each round takes its drafts from one of two indexes of token text:

* the request's own context (prompt and output so far), through the n-gram drafter (``ngram.py``): its
  copy cursor follows a rewrite of the prompt, its lookups find a repeated phrase;
* the model's earlier outputs (``suffix_cache.SuffixCache``, one per loaded model): the continuation that
  the longest matching suffix of the context was most often followed by, as SuffixDecoding drafts from its
  global tree. A retried question finds its earlier answer from the question itself; an agent's repeated
  tool call, its boilerplate, a sibling session's output are found the same way.

Each round names its source before the depth is chosen, and the adaptive controller prices every
source on its own (``engine.speculative.depth.PerSourceDepth``), so a source that does not pay on the
text at hand drafts nothing and costs only its lookup:

* ``copy``: the context copy is certain (all of the n-gram drafter's last 8 tokens agree): it is the
  cheapest and the output is rewriting its prompt;
* ``suffix``: the outputs match the context's last ``long_match`` tokens or more; such a match is nearly
  always the same text again, and the chain runs as deep as the match allows;
* ``suffix-short``: a shorter match (a common phrase): priced apart, it drafts only where it is right;
* ``lookup``: nothing better: the n-gram drafter's lookup in the context (one-token probes on thin evidence).

Drafts are point masses (``Proposal.q`` None): strict rejection at any temperature stays lossless, and
the relaxed and constrained paths treat them as the n-gram drafter's.
"""

from __future__ import annotations

from typing import Sequence

from engine.speculative.drafter import EMPTY, DraftContext, Drafter, Proposal, TargetOutput
from engine.speculative.ngram import NgramDrafter
from engine.speculative.suffix_cache import SuffixCache, SuffixMatch

#: A match of the outputs at least this long is its own source (``suffix``): at that length it is a repeat.
LONG_MATCH = 8
#: How far ahead a round's match is walked (a round drafts at most the depth its controller picks).
LOOKAHEAD = 64


class RoundLookup:
    """The outputs' continuation of a drafter's log, looked up once per round: the round's source is named from it
    before the depth is chosen, and the round drafts from the same lookup. ``forget`` when the log changes."""

    def __init__(self, outputs: SuffixCache, lookahead: int = LOOKAHEAD):
        self.outputs = outputs
        self.lookahead = lookahead
        self._found: SuffixMatch | None = None
        self._looked = False  # a lookup that found nothing is not repeated within the round either

    def match(self, tokens: Sequence[int]) -> SuffixMatch | None:
        """What the outputs continue ``tokens`` with (None: nothing to draft)."""
        if not self._looked:
            found = self.outputs.match(tokens, self.lookahead)
            self._found = found if found is not None and found.tokens else None
            self._looked = True
        return self._found

    def draft(self, tokens: Sequence[int], k: int) -> Proposal:
        """Up to ``k`` of the continuation, point masses with the path probabilities as confidences."""
        found = self.match(tokens)
        return EMPTY if found is None else Proposal(found.tokens[:k], None, found.probabilities[:k])

    def forget(self) -> None:
        self._found, self._looked = None, False


class SuffixDrafter(Drafter):
    kind = "suffix"
    sources = ("copy", "suffix", "suffix-short", "lookup")

    def __init__(self, outputs: SuffixCache, context: NgramDrafter, *, long_match: int = LONG_MATCH,
                 lookahead: int = LOOKAHEAD):
        super().__init__()
        self.context = context
        self.long_match = long_match
        self.lookup = RoundLookup(outputs, lookahead)
        self._source: str | None = None

    def begin(self, tokens: Sequence[int]) -> None:
        super().begin(tokens)
        self.context.begin(tokens)
        self._source = None
        self.lookup.forget()

    def commit(self, tokens_committed: Sequence[int], n_total: int, target: TargetOutput | None = None) -> None:
        self._source = None  # the evidence changes with every committed token
        self.lookup.forget()
        super().commit(tokens_committed, n_total, target)
        self.context.commit(tokens_committed, n_total, target)

    def round_source(self) -> str:
        if self._source is None:
            if self.context.round_source() == "copy":
                self._source = "copy"
            else:
                found = self.lookup.match(self.tokens)
                if found is None:
                    self._source = "lookup"
                else:
                    self._source = "suffix" if found.length >= self.long_match else "suffix-short"
        return self._source

    def propose(self, k: int, ctx: DraftContext) -> Proposal:
        source = self.round_source()  # decided already when the depth controller asked
        self._source = None
        if k <= 0:
            return EMPTY
        if source.startswith("suffix"):
            return self.lookup.draft(self.tokens, k)
        return self.context.propose(k, ctx)

    def reset(self) -> None:
        self._source = None
        self.lookup.forget()
        super().reset()
        self.context.reset()
