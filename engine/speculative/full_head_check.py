"""A chain drafted with a pruned head, corrected to what the full head would have drafted.

A pruned head (``draft_vocab``, ``engine.models.pruned_head``) scores only the tokens a reference text
uses most. Where the text leaves them (a rare word of prose, another language), the drafter proposes
the best kept token while the full head, and so the target, would pick another one: the round is lost.
This module takes the chain the pruned head drafted and the full head's logits for the same positions
(the rest of the vocabulary scored for all of them in one matmul, ``PrunedHead.complete``) and walks
it as speculative sampling walks a draft against a target, with the pruned drafter as the draft and
the full-vocabulary drafter as the target:

* greedy: a position whose full-head argmax differs is replaced by that argmax, and the chain ends
  there (later drafts were conditioned on the wrong token);
* sampled: draft ``d`` drawn from ``q_pruned`` is kept with probability ``min(1, q_full(d) /
  q_pruned(d))``, else replaced by a draw from the normalised residual ``max(0, q_full - q_pruned)``
  (the full head's mass on the tokens the pruned head could not score) and the chain ends. Each kept
  or replacing token is then distributed exactly as ``q_full``, which the proposal reports as its
  ``q``: the target's acceptance sees the full-vocabulary drafter, and stays lossless.

The drafts that come out are the full-vocabulary drafter's, up to the kernels' numerics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import Tensor

from engine.sampling.sampler import process, sample_from_probs
from engine.speculative.drafter import DraftContext, Proposal, TokenAcceptance, confidence, fit_vocab, stack


@dataclass
class CheckPrice:
    """Whether a chain's check pays for itself on the text at hand.

    The check costs a read of the rows the head does not score, a few milliseconds a round whatever it finds,
    and it gains only where the target's token is one of those rows. How often that is shows for free in what is committed (tokens the head had not scored,
    ``observe_committed``): measured on the Qwen2.5-Coder pair, the check corrected 10-52 % of the drafts on
    prose, French and Chinese and 0-4 % on code, lists and edits (docs/bench/speculation-defaults.md). What a
    correction gains is one token: at the first draft whose target token the head could not score, the
    unchecked chain is rejected and the target emits that token itself, while the corrected chain ends with it
    (drafted by the full head, accepted as often as the drafter's drafts are: ``a``) and the target adds the next.
    Draft j is reached when the j - 1 before it are accepted, so a chain of ``k`` drafts is checked when
    ``rate * (a + a^2 + ... + a^k) * token_seconds > cost``. A drafter that is nearly always right
    (``always_above``: a model drafting for itself) is always checked, so that it keeps every draft the full
    head would make."""

    always_above: float = 0.95
    # Unscored tokens among the committed ones: a decayed rate (``decay`` per token), reset by each request to
    # ``prior`` worth ``prior_weight`` tokens (the text's own rate is soon known; carried over, a code request after
    # a Chinese one would check its first hundred rounds for nothing)
    prior: float = 0.1
    prior_weight: float = 8.0
    decay: float = 0.98
    unscored: float = 0.0
    seen: float = 0.0
    # taken to be good until the drafter has drafted (the same prior as a copy's rival: engine.speculative.copy_first)
    acceptance: TokenAcceptance = field(default_factory=lambda: TokenAcceptance(prior=1.0))
    cost: float | None = None  # the last checks' time, seconds (the lowest of the last few)
    _costs: list[float] = field(default_factory=list)

    def begin_request(self) -> None:
        self.unscored = self.seen = 0.0

    @property
    def rate(self) -> float:
        return (self.prior * self.prior_weight + self.unscored) / (self.prior_weight + self.seen)

    def observe_committed(self, tokens: int, unscored: int) -> None:
        """``tokens`` committed, of which ``unscored`` were tokens the head did not score."""
        for i in range(tokens):
            self.unscored = self.decay * self.unscored + (1.0 if i < unscored else 0.0)
            self.seen = self.decay * self.seen + 1.0

    def observe_round(self, drafted: Sequence[int], committed: Sequence[int]) -> None:
        self.acceptance.check(drafted, committed)

    def observe_check(self, seconds: float) -> None:
        self._costs = (self._costs + [seconds])[-8:]
        self.cost = min(self._costs)  # noise only ever adds time

    def worth(self, k: int, token_seconds: float | None) -> bool:
        """Whether to check a chain of ``k`` drafts when a target step costs ``token_seconds``."""
        if token_seconds is None or self.cost is None or k <= 0:
            return True  # nothing to price with (a fixed depth), or the check not timed yet
        a = self.acceptance.estimate
        if a >= self.always_above:
            return True
        gained = sum(a ** j for j in range(1, k + 1))  # tokens a correction at each reachable draft gains
        return self.rate * gained * token_seconds > self.cost


def correct_chain(prop: Proposal, full_logits: Tensor, history: list[int], ctx: DraftContext,
                  vocab_size: int) -> tuple[Proposal, int]:
    """``prop`` drafted from pruned logits; ``full_logits`` [>= len(prop.tokens), V] the full head's
    logits at the same positions. Returns the corrected proposal and how many positions were replaced
    (0 or 1: the chain ends at a replacement)."""
    tokens: list[int] = []
    qs: list[Tensor | None] = []
    confs: list[float] = []
    for j, drafted in enumerate(prop.tokens):
        row = fit_vocab(full_logits[j:j + 1], vocab_size)
        dist = process(row, history + tokens, (), ctx.sampling)
        if dist.greedy:
            best = int(dist.argmax()[0])
            if best != drafted:
                tokens.append(best)
                qs.append(None)
                confs.append(confidence(row))
                return _proposal(prop, tokens, qs, confs), 1
            tokens.append(drafted)
            qs.append(None)
            confs.append(prop.confidences[j] if j < len(prop.confidences) else confidence(row))
            continue
        q_full = dist.probs[0]
        q_pruned = prop.q[j]
        u = float(torch.rand((), generator=ctx.generator))
        p_keep = float(q_full[drafted]) / max(float(q_pruned[drafted]), 1e-30)
        if u < p_keep:
            tokens.append(drafted)
            qs.append(q_full)
            confs.append(prop.confidences[j] if j < len(prop.confidences) else confidence(row))
            continue
        residual = (q_full - q_pruned).clamp_(min=0)
        total = float(residual.sum())
        # a residual with no mass only arises from rounding (p_keep < 1 by a hair): keep the draft
        replacement = drafted if total <= 0 else \
            sample_from_probs(residual / total, float(torch.rand((), generator=ctx.generator)))
        tokens.append(int(replacement))
        qs.append(q_full)
        confs.append(confidence(row))
        return _proposal(prop, tokens, qs, confs), int(replacement != drafted)
    return _proposal(prop, tokens, qs, confs), 0


def _proposal(prop: Proposal, tokens: list[int], qs: list[Tensor | None], confs: list[float]) -> Proposal:
    return Proposal(tokens, stack(qs), confs, prop.catchup_seconds, prop.catchup_tokens)
