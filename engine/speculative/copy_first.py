"""Per-round drafter choice: copy from the context when the copy is certain, else ask the draft model or head.

A code edit or a rewrite repeats long stretches of its prompt. The n-gram drafter's copy cursor knows when the
output is copying (how many of the last tokens agree with the source it follows); then its drafts cost nothing
and are mostly right, while the draft model would spend a forward per token to guess the same tokens. Away
from a copy the n-gram drafter has thin evidence and the model drafts. Both see every committed token, so
either can take the next round. Drafts from the copy are point masses, the model's carry its distribution:
strict acceptance stays lossless round by round whichever drafted.

The round's source is decided before its depth (``round_source``): a copy round costs no drafting and
is mostly accepted, so it pays to draft it deeper than a model round, and the adaptive depth controller
keeps one estimate per source (``engine.speculative.depth.PerSourceDepth``). Between certain (all of the
copy's last 8 tokens agree) and no evidence (under 4) lies the weak copy: on a rewrite it is right often
enough to beat the model for free, on code it is not, so that source competes with the model and the
controller takes whichever it expects more tokens a second from.

A copy must also earn its rounds on the text at hand. Where the output only looks like a copy (a
counting list: ``11, 12, 13,`` agrees with ``1, 2, 3,`` token for token in its commas and spaces) its
drafts are mostly wrong, and every round it drafts is lost to the model, which would have been right.
So the copy is checked in the shadow of every round in which it has evidence: what it would have
drafted is compared with what the round committed (free: it is a list lookup), and the draft model's
own drafts with the same. The copy drafts only while its last checked tokens in this request all
agreed, as many of them as ``min_streak`` times the model's estimated per-token acceptance
(``copy_trusted``): beside a good drafter a copy must be right for a long stretch before it replaces it
(a free round that fails costs the model's accepted tokens), beside a poor one a few suffice. On a
rewrite the streak soon is long, on a counting list never. (A per-token estimate compared with the
model's let a copy that agrees for long stretches and then fails draft those failures: a counting
list's copy is right on its commas and spaces.)

With the model's earlier outputs (``outputs``, a ``SuffixCache``: ``draft_suffix``), a round whose context
matches an earlier output over ``LONG_MATCH`` tokens or more has a third source, ``suffix``: the earlier
output's continuation, free like the copy. It competes with the model as the weak copy does (the controller
takes whichever it expects more tokens a second from), and the request reports ``model+suffix``. Under the
adaptive schedule its rounds may run to the suffix drafter's cap (16) while the others keep the request's
(``model_cap``): a retried answer is accepted whole, and 4 deep it gained 3.4x where the suffix drafter alone,
16 deep, gained 3.9x (docs/speculation-measured.md).
"""

from __future__ import annotations

import math
from typing import Sequence

from engine.speculative.drafter import DraftContext, Drafter, Proposal, TargetOutput, TokenAcceptance
from engine.speculative.ngram import NgramDrafter
from engine.speculative.suffix import LONG_MATCH, RoundLookup
from engine.speculative.suffix_cache import SuffixCache, SuffixMatch

#: How far ahead the copy's shadow proposal reaches (a certain copy drafts up to the cap, at most 8 deep).
SHADOW_TOKENS = 8


class CopyFirstDrafter(Drafter):
    """``primary`` (a draft model or MTP head), except in rounds where ``copy`` has strong evidence."""

    def __init__(self, primary: Drafter, copy: NgramDrafter, weak_agreement: int = 4, min_streak: int = 16,
                 outputs: SuffixCache | None = None, model_cap: int | None = None):
        super().__init__()
        self.primary, self.copy = primary, copy
        self.outputs = RoundLookup(outputs) if outputs is not None else None
        # what the request reports, and its own adaptive depth state
        self.kind = f"{primary.kind}+{'copy' if outputs is None else 'suffix'}"
        self.needs_hidden = primary.needs_hidden
        # from here (of the copy's window of 8) up to a certain copy: a weak copy, priced against the model
        self.weak_agreement = weak_agreement
        self.copied_rounds = 0
        self._source: str | None = None  # the coming round's source, once decided
        self.sources = ("copy", "copy-weak", primary.kind) + (("suffix",) if outputs is not None else ())
        self.fallbacks = (("copy-weak", primary.kind),) + \
            ((("suffix", primary.kind),) if outputs is not None else ())
        # ``model_cap``: the request's cap for every source but ``suffix``, whose rounds (a repeat, accepted whole)
        # may go as deep as the loop's cap
        self.source_caps = {} if model_cap is None else \
            {source: model_cap for source in self.sources if source != "suffix"}
        self.min_streak = min_streak
        self._new_request_checks()

    def _new_request_checks(self) -> None:
        self.copy_acceptance = TokenAcceptance()
        # until the model has drafted, take it to be good: the copy must then prove itself at length
        self.model_acceptance = TokenAcceptance(prior=1.0)
        self._shadow: list[int] = []  # what the copy would draft this round (empty: no evidence)
        self._model_drafts: list[int] = []  # what the model drafted this round

    def copy_trusted(self) -> bool:
        """Whether the copy's recent checks say it drafts at least as well as the model."""
        needed = max(2, math.ceil(self.min_streak * self.model_acceptance.estimate))
        return self.copy_acceptance.streak >= needed

    def backlog(self) -> int:
        return self.primary.backlog()  # the copy reads the log as it is

    def round_source(self) -> str:
        if self._source is None:  # what a certain copy is, the n-gram drafter's own round_source says
            certain = self.copy.round_source() == "copy"
            evidence = certain or self.copy.last_agreement >= self.weak_agreement
            self._shadow = list(self.copy.copy_from_source(SHADOW_TOKENS).tokens) if evidence else []
            if evidence and self.copy_trusted():
                self._source = "copy" if certain else "copy-weak"
            elif self._long_match() is not None:
                self._source = "suffix"
            else:
                self._source = self.primary.kind
        return self._source

    def _long_match(self) -> SuffixMatch | None:
        """The outputs' continuation of the log when it matches them over LONG_MATCH tokens or more."""
        found = self.outputs.match(self.tokens) if self.outputs is not None else None
        return found if found is not None and found.length >= LONG_MATCH else None

    def use_source(self, source: str) -> None:
        self._source = source

    def prefix_limit(self, tokens: Sequence[int]) -> int:
        return self.primary.prefix_limit(tokens)

    def begin(self, tokens: Sequence[int]) -> None:
        super().begin(tokens)
        self.primary.begin(tokens)
        self.copy.begin(tokens)
        self.copied_rounds = 0
        self._new_round()
        self._new_request_checks()

    def commit(self, tokens_committed: Sequence[int], n_total: int, target: TargetOutput | None = None) -> None:
        self._new_round()  # the evidence changes with every committed token
        self.copy_acceptance.check(self._shadow, tokens_committed)
        self.model_acceptance.check(self._model_drafts, tokens_committed)
        self._shadow, self._model_drafts = [], []
        super().commit(tokens_committed, n_total, target)
        self.primary.commit(tokens_committed, n_total, target)
        self.copy.commit(tokens_committed, n_total, target)

    def propose(self, k: int, ctx: DraftContext) -> Proposal:
        source = self.round_source()  # decided already when the depth controller asked
        self._source = None
        if source in ("copy", "copy-weak"):
            copied = self.copy.copy_from_source(k)
            if copied.tokens:
                self.copied_rounds += 1
                return copied
        if source == "suffix" and self._long_match() is not None:
            return self.outputs.draft(self.tokens, k)
        proposal = self.primary.propose(k, ctx)
        self._model_drafts = list(proposal.tokens)
        return proposal

    def _new_round(self) -> None:
        self._source = None
        if self.outputs is not None:
            self.outputs.forget()

    def reset(self) -> None:
        self._new_round()
        self._new_request_checks()
        super().reset()
        self.primary.reset()
        self.copy.reset()

    def memory_bytes(self) -> int:
        return self.primary.memory_bytes()
