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

import torch
from torch import Tensor

from engine.sampling.sampler import process, sample_from_probs
from engine.speculative.drafter import DraftContext, Proposal, confidence, fit_vocab, stack


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
