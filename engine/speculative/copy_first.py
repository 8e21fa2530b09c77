"""Per-round drafter choice: copy from the context when the copy is certain, else ask the draft model or head.

A code edit or a rewrite repeats long stretches of its prompt. The n-gram drafter's copy cursor knows when the
output is copying (how many of the last tokens agree with the source it follows); then its drafts cost nothing
and are mostly right, while the draft model would spend a forward per token to guess the same tokens. Away
from a copy the n-gram drafter has thin evidence and the model drafts. Both see every committed token, so
either can take the next round. Drafts from the copy are point masses, the model's carry its distribution:
strict acceptance stays lossless round by round whichever drafted.

The round's source is decided before its depth (``round_source``): a copy round costs no drafting and
is mostly accepted, so it pays to draft it deeper than a model round, and the adaptive depth controller
keeps one estimate per source (``engine.speculative.depth.PerSourceDepth``).
"""

from __future__ import annotations

from typing import Sequence

from engine.speculative.drafter import DraftContext, Drafter, Proposal, TargetOutput
from engine.speculative.ngram import NgramDrafter


class CopyFirstDrafter(Drafter):
    """``primary`` (a draft model or MTP head), except in rounds where ``copy`` has strong evidence."""

    def __init__(self, primary: Drafter, copy: NgramDrafter, min_agreement: int = 8):
        super().__init__()
        self.primary, self.copy = primary, copy
        self.kind = f"{primary.kind}+copy"  # what the request reports, and its own adaptive depth state
        self.needs_hidden = primary.needs_hidden
        self.min_agreement = min_agreement  # of the copy's window (8): what "certain" means here
        self.copied_rounds = 0
        self._copy_round: bool | None = None  # the coming round's decision, once made
        self.sources = ("copy", primary.kind)

    def round_source(self) -> str:
        if self._copy_round is None:
            self._copy_round = self.copy.select_source() >= self.min_agreement
        return "copy" if self._copy_round else self.primary.kind

    def prefix_limit(self, tokens: Sequence[int]) -> int:
        return self.primary.prefix_limit(tokens)

    def begin(self, tokens: Sequence[int]) -> None:
        super().begin(tokens)
        self.primary.begin(tokens)
        self.copy.begin(tokens)
        self.copied_rounds = 0
        self._copy_round = None

    def commit(self, tokens_committed: Sequence[int], n_total: int, target: TargetOutput | None = None) -> None:
        self._copy_round = None  # the copy's evidence changes with every committed token
        super().commit(tokens_committed, n_total, target)
        self.primary.commit(tokens_committed, n_total, target)
        self.copy.commit(tokens_committed, n_total, target)

    def propose(self, k: int, ctx: DraftContext) -> Proposal:
        source = self.round_source()  # decided already when the depth controller asked
        self._copy_round = None
        if source == "copy":
            copied = self.copy.copy_from_source(k)
            if copied.tokens:
                self.copied_rounds += 1
                return copied
        return self.primary.propose(k, ctx)

    def reset(self) -> None:
        self._copy_round = None
        super().reset()
        self.primary.reset()
        self.copy.reset()

    def memory_bytes(self) -> int:
        return self.primary.memory_bytes()
