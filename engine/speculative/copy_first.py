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
"""

from __future__ import annotations

from typing import Sequence

from engine.speculative.drafter import DraftContext, Drafter, Proposal, TargetOutput
from engine.speculative.ngram import NgramDrafter


class CopyFirstDrafter(Drafter):
    """``primary`` (a draft model or MTP head), except in rounds where ``copy`` has strong evidence."""

    def __init__(self, primary: Drafter, copy: NgramDrafter, weak_agreement: int = 4):
        super().__init__()
        self.primary, self.copy = primary, copy
        self.kind = f"{primary.kind}+copy"  # what the request reports, and its own adaptive depth state
        self.needs_hidden = primary.needs_hidden
        # from here (of the copy's window of 8) up to a certain copy: a weak copy, priced against the model
        self.weak_agreement = weak_agreement
        self.copied_rounds = 0
        self._source: str | None = None  # the coming round's source, once decided
        self.sources = ("copy", "copy-weak", primary.kind)
        self.fallbacks = (("copy-weak", primary.kind),)

    def round_source(self) -> str:
        if self._source is None:  # what a certain copy is, the n-gram drafter's own round_source says
            certain = self.copy.round_source() == "copy"
            self._source = "copy" if certain else \
                "copy-weak" if self.copy.last_agreement >= self.weak_agreement else self.primary.kind
        return self._source

    def use_source(self, source: str) -> None:
        self._source = source

    def prefix_limit(self, tokens: Sequence[int]) -> int:
        return self.primary.prefix_limit(tokens)

    def begin(self, tokens: Sequence[int]) -> None:
        super().begin(tokens)
        self.primary.begin(tokens)
        self.copy.begin(tokens)
        self.copied_rounds = 0
        self._source = None

    def commit(self, tokens_committed: Sequence[int], n_total: int, target: TargetOutput | None = None) -> None:
        self._source = None  # the copy's evidence changes with every committed token
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
        return self.primary.propose(k, ctx)

    def reset(self) -> None:
        self._source = None
        super().reset()
        self.primary.reset()
        self.copy.reset()

    def memory_bytes(self) -> int:
        return self.primary.memory_bytes()
