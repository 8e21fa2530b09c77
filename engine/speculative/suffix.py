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


class SuffixDrafter(Drafter):
    kind = "suffix"
    sources = ("copy", "suffix", "suffix-short", "lookup")

    def __init__(self, outputs: SuffixCache, context: NgramDrafter, *, long_match: int = LONG_MATCH,
                 lookahead: int = LOOKAHEAD):
        super().__init__()
        self.outputs = outputs
        self.context = context
        self.long_match = long_match
        self.lookahead = lookahead
        self.suffix_rounds = 0  # rounds drafted from the outputs (this request)
        self._source: str | None = None
        self._match: SuffixMatch | None = None

    def begin(self, tokens: Sequence[int]) -> None:
        super().begin(tokens)
        self.context.begin(tokens)
        self._source, self._match = None, None
        self.suffix_rounds = 0

    def commit(self, tokens_committed: Sequence[int], n_total: int, target: TargetOutput | None = None) -> None:
        self._source, self._match = None, None  # the evidence changes with every committed token
        super().commit(tokens_committed, n_total, target)
        self.context.commit(tokens_committed, n_total, target)

    def outputs_match(self) -> SuffixMatch | None:
        """What the outputs continue the log with now (looked up once per round)."""
        if self._match is None:
            self._match = self.outputs.match(self.tokens, self.lookahead)
        return self._match

    def round_source(self) -> str:
        if self._source is None:
            if self.context.round_source() == "copy":
                self._source = "copy"
            else:
                found = self.outputs_match()
                if found is None or not found.tokens:
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
            found = self.outputs_match()
            self.suffix_rounds += 1
            return Proposal(found.tokens[:k], None, found.probabilities[:k])
        return self.context.propose(k, ctx)

    def reset(self) -> None:
        self._source, self._match = None, None
        super().reset()
        self.context.reset()
