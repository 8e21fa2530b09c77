"""Speculative-decoding acceptance rules as pure functions (docs/speculation.md, "Acceptance rules").

A round: the drafter proposed ``drafts = d_1..d_k`` (drawn from ``q_1..q_k``, or deterministically);
one batched target forward over ``[t_last, d_1..d_k]`` gave, after ``engine.sampling.sampler.process``, the
filtered target distributions ``p_1..p_{k+1}``. A rule keeps a leading run ``d_1..d_a`` and emits one
more token, so a round always commits ``a + 1`` tokens (``AcceptResult.tokens``).

Rules
-----
* ``strict_accept`` (default, lossless; Leviathan et al. 2023, Chen et al. 2023, as vLLM's rejection
  sampler): accept ``d_i`` iff ``u_i * q_i(d_i) < p_i(d_i)``, i.e. with probability
  ``min(1, p_i(d_i) / q_i(d_i))``. On the first rejection emit a draw from
  ``normalise(max(0, p_i - q_i))``; after ``k`` acceptances emit a bonus draw from ``p_{k+1}``.
  ``q = None`` means a point-mass drafter (greedy / n-gram): ``q_i(d_i) = 1``, so the draft is
  accepted with probability ``p_i(d_i)`` and the residual is ``p_i`` without ``d_i``.
* ``match_accept`` (llama.cpp): draw ``x_i ~ p_i``; accept iff ``x_i == d_i``; on mismatch emit
  ``x_i``. Also lossless, but accepts with probability ``sum p q`` instead of ``sum min(p, q)``.
* ``relaxed_accept`` (lossy, the seed guide's top-N): accept if the strict test passes, or if ``d_i``
  is a candidate of the filtered ``p_i`` (``p_i(d_i) > 0``) whose rank -- the number of candidates
  with strictly higher probability -- is ``< top_n``. Rejections emit as the strict rule does.
  ``relaxed`` (one flag per drafted position, e.g. "inside the reasoning block") limits the rank test
  to the flagged positions; the others are decided by the strict test alone.

Generator contract
------------------
Every rule draws exactly ``k + 1`` float64 uniforms per round, all up front, in one
``draw_uniforms(generator, k + 1)`` call, whatever the outcome:
``u[i]`` (``i < k``) decides drafted position ``i`` (strict/relaxed: the acceptance test; match: the
target's independent sample ``x_i``); ``u[k]`` draws the emitted token (residual or bonus; match
uses it only for the bonus). Uniforms of positions after a rejection are drawn and discarded. So the
generator state after a round depends only on ``k``, never on the logits, and ``relaxed_accept`` with
``top_n = 0`` is bit-for-bit ``strict_accept``. A round with ``k = 0`` consumes one uniform and draws
exactly what ``Distribution.sample`` draws, i.e. speculation off == plain decoding. (Drawing only
the ``a + 1`` uniforms a round actually reads would make ``match_accept`` reproduce plain decoding
token for token at any temperature; the fixed count was preferred so that the generator's position
never depends on the logits.)

Robustness: ``p_i(d_i) = 0`` is always rejected (never divided by). ``q_i(d_i) = 0`` means the draft
was not drawn from ``q_i`` (a drafter bug); it is rejected and the emitted token is drawn from
``p_i`` itself, because the residual formula is only correct for drafts that came from ``q_i``.
A residual that is all zero (``p == q`` up to rounding) falls back to ``p_i``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch
from torch import Tensor

from engine.sampling.sampler import Distribution, draw_uniforms, sample_from_probs

__all__ = [
    "Decision",
    "AcceptResult",
    "residual_distribution",
    "strict_accept",
    "strict_accept_from_uniforms",
    "match_accept",
    "match_accept_from_uniforms",
    "relaxed_accept",
    "relaxed_accept_from_uniforms",
]

DecisionKind = Literal["accept-strict", "accept-rank", "accept-match", "reject"]


@dataclass(frozen=True)
class Decision:
    """What happened at one drafted position: one line of the verification trace."""

    position: int  # 0-based index of the draft within the round
    draft_token: int
    # Strict / relaxed: the target's argmax (ties -> lowest id; no extra generator draw).
    # Match: the target's own independent sample x_i that the draft was compared with.
    target_token: int
    draft_rank: int  # candidates of p_i with strictly higher probability; -1 if p_i(d_i) == 0
    draft_prob: float  # p_i(d_i)
    draft_q: float  # q_i(d_i); 1.0 for a point-mass drafter
    pool_size: int  # nonzero entries of p_i (candidates left by top-k/top-p/min-p)
    decision: DecisionKind
    emitted_token: int  # the draft if accepted, else the token emitted in its place

    @property
    def accepted(self) -> bool:
        return self.decision != "reject"

    @property
    def strict_probability(self) -> float:
        """The probability that strict rejection sampling accepts this draft: min(1, p/q)."""
        return min(1.0, self.draft_prob / self.draft_q) if self.draft_q > 0 else 0.0

    @property
    def match_probability(self) -> float:
        """The probability that the exact-match rule accepts it: the target samples the draft, p."""
        return self.draft_prob


@dataclass(frozen=True)
class AcceptResult:
    n_accepted: int
    next_token: int  # residual sample on rejection, bonus sample on full acceptance
    decisions: list[Decision]  # one per evaluated position: min(n_accepted + 1, k) entries
    tokens: list[int]  # the a + 1 tokens this round commits: drafts[:a] + [next_token]


# ----------------------------------------------------------------------------------------------
# Shared pieces
# ----------------------------------------------------------------------------------------------


def residual_distribution(p: Tensor, q: Tensor | None, draft: int | None) -> Tensor:
    """``normalise(max(0, p - q))`` in float64; ``q = None`` is a point mass on ``draft``.

    ``p`` and ``q`` are aligned 1-D vectors: whole vocabulary rows, or (as the rules use it) the
    target's support with ``q`` gathered at the same ids, ``draft`` then being a position in it
    (``None`` if the draft is not in the support). Falls back to ``p`` (normalised) when the
    residual has no mass, i.e. ``p == q``: rejection is then impossible in exact arithmetic, so any
    distribution is correct, and ``p`` is the natural one.
    """
    p64 = p.to(torch.float64)
    if q is None:
        r = p64.clone()
        if draft is not None:
            r[draft] = 0.0  # max(0, p - onehot(draft)): p(draft) - 1 <= 0
    else:
        r = torch.clamp(p64 - q.to(device=p.device, dtype=torch.float64), min=0.0)
    total = r.sum()
    if not bool(total > 0):
        return p64 / p64.sum()
    return r / total


@dataclass(frozen=True)
class _Round:
    """A round's target rows reduced to their supports (nonzero entries, ascending id, CPU float64)
    plus the per-draft scalars of the trace. Built with one pass over the dense rows: everything
    after that costs O(support), not O(vocab)."""

    ids: list[Tensor]
    vals: list[Tensor]
    p_draft: list[float]
    q_draft: list[float]
    rank: list[int]
    pool: list[int]
    argmax: list[int]


Target = Tensor | Distribution  # p: dense rows [k+1, vocab], or the sampler's sparse candidates


def _check(p: Target, q: Tensor | None, drafts: Tensor | Sequence[int]) -> tuple[Tensor, int]:
    d = torch.as_tensor(drafts, dtype=torch.int64).reshape(-1).cpu()
    k = d.numel()
    shape = (p.n, p.vocab_size) if isinstance(p, Distribution) else tuple(p.shape)
    if len(shape) != 2 or shape[0] != k + 1:
        raise ValueError(f"p must be [k+1, vocab] = [{k + 1}, V], got {shape}")
    if q is not None and (q.dim() != 2 or q.shape[0] < k or q.shape[1] != shape[1]):
        raise ValueError(f"q must be [k, vocab] = [{k}, {shape[1]}], got {tuple(q.shape)}")
    return d, k


def _support(p: Target) -> tuple[Tensor, Tensor, Tensor]:
    """The nonzero entries of p's rows as (row, token id, probability): CPU, row-major with ids
    ascending within a row, probabilities in float64. From a ``Distribution`` only its candidates are
    read (a greedy row has one): materialising ``[k+1, vocab]`` only to scan it was most of a greedy
    round's acceptance time (docs/measurements.md)."""
    if isinstance(p, Distribution):
        nz = torch.nonzero(p.cand_probs)  # row-major; candidate ids ascend within each row
        at = (nz[:, 0], nz[:, 1])
        return nz[:, 0].cpu(), p.cand_ids[at].cpu(), p.cand_probs[at].to(device="cpu", dtype=torch.float64)
    nz = torch.nonzero(p)  # row-major, so ids ascend within each row
    vals = p[nz[:, 0], nz[:, 1]].to(device="cpu", dtype=torch.float64)
    nz = nz.cpu()
    return nz[:, 0], nz[:, 1], vals


def _round(p: Target, q: Tensor | None, d: Tensor, k: int) -> _Round:
    rows, cols, vals = _support(p)
    counts = torch.bincount(rows, minlength=k + 1)
    if bool((counts == 0).any()):
        raise ValueError("every target row needs some probability mass")
    bounds = [0] + torch.cumsum(counts, 0).tolist()
    ids = [cols[bounds[i]: bounds[i + 1]] for i in range(k + 1)]
    row_vals = [vals[bounds[i]: bounds[i + 1]] for i in range(k + 1)]
    if k == 0:
        return _Round(ids, row_vals, [], [], [], [], [])

    # Per-draft scalars, vectorised over the support entries of rows 0..k-1.
    sel = rows < k
    r, c, v = rows[sel], cols[sel], vals[sel]
    p_d = torch.zeros(k, dtype=torch.float64).index_add_(0, r, torch.where(c == d[r], v, torch.zeros_like(v)))
    rank = torch.zeros(k, dtype=torch.int64).index_add_(0, r, (v > p_d[r]).long())
    rank = torch.where(p_d > 0, rank, torch.full_like(rank, -1))
    row_max = torch.zeros(k, dtype=torch.float64).scatter_reduce_(0, r, v, "amax", include_self=False)
    is_max = v == row_max[r]
    big = torch.iinfo(torch.int64).max
    amax = torch.full((k,), big, dtype=torch.int64).scatter_reduce_(0, r[is_max], c[is_max], "amin")
    q_d = _draft_q(q, d, k)
    return _Round(ids, row_vals, p_d.tolist(), q_d, rank.tolist(), counts[:k].tolist(), amax.tolist())


def _point_masses(p: Target) -> tuple[list[int], list[float]] | None:
    """Each row's one token and its probability when every row of ``p`` is a point mass (greedy
    decoding, constrained or not), else None."""
    if not isinstance(p, Distribution) or not p.greedy or p.cand_ids.shape[1] != 1:
        return None
    probs = p.cand_probs[:, 0].tolist()
    if not all(v > 0 for v in probs):
        return None  # the general path reports a row without mass
    return p.cand_ids[:, 0].tolist(), probs


def _point_mass_round(best: list[int], probs: list[float], q_d: list[float], dl: list[int],
                      accepted: DecisionKind) -> AcceptResult:
    """A round whose target rows are point masses: draft i stays iff it is row i's token (p = 1
    there, 0 everywhere else, so no uniform can change that and a relaxed rank can only be 0 when
    the strict test passed), and the first row that differs, or the bonus row, gives the next
    token. The general path's result and trace, without reducing the rows to their supports: that
    took more time than the rest of a greedy step outside the forward."""
    decisions: list[Decision] = []
    for i, d in enumerate(dl):
        hit = d == best[i]
        decisions.append(Decision(i, d, best[i], 0 if hit else -1, probs[i] if hit else 0.0, q_d[i], 1,
                                  accepted if hit else "reject", d if hit else best[i]))
        if not hit:
            return _finish(dl, decisions, best[i])
    return _finish(dl, decisions, best[len(dl)])


def _draft_q(q: Tensor | None, d: Tensor, k: int) -> list[float]:
    if q is None:
        return [1.0] * k
    return q[torch.arange(k, device=q.device), d.to(q.device)].double().tolist()


def _depth(drafts: Tensor | Sequence[int]) -> int:
    return int(torch.as_tensor(drafts).numel())


def _strict_test(u: float, p_d: float, q_d: float) -> bool:
    """Accept with probability min(1, p/q) without dividing: u * q < p (p == 0 -> never)."""
    return q_d > 0.0 and u * q_d < p_d


def _emit_on_reject(rd: _Round, q: Tensor | None, i: int, draft: int, u: float) -> int:
    ids, vals = rd.ids[i], rd.vals[i]
    if rd.q_draft[i] <= 0.0:
        return sample_from_probs(vals, u, ids)  # drafter bug: d_i was not drawn from q_i
    if q is None:
        hit = torch.nonzero(ids == draft).reshape(-1)
        residual = residual_distribution(vals, None, int(hit[0]) if hit.numel() else None)
    else:
        # max(0, p - q) is zero off p's support, so q is only needed at those ids.
        residual = residual_distribution(vals, q[i, ids.to(q.device)], None)
    return sample_from_probs(residual, u, ids)


def _finish(drafts: list[int], decisions: list[Decision], next_token: int) -> AcceptResult:
    a = sum(1 for dec in decisions if dec.accepted)
    return AcceptResult(a, next_token, decisions, drafts[:a] + [next_token])


# ----------------------------------------------------------------------------------------------
# Rules (explicit-uniform cores + generator wrappers)
# ----------------------------------------------------------------------------------------------


def relaxed_accept_from_uniforms(
    p: Target, q: Tensor | None, drafts: Tensor | Sequence[int], u: Sequence[float], top_n: int,
    relaxed: Sequence[bool] | None = None,
) -> AcceptResult:
    """Strict rule, plus rank acceptance when ``top_n > 0`` (at the positions ``relaxed`` flags, all
    when None); ``u`` holds the round's k+1 uniforms."""
    d, k = _check(p, q, drafts)
    if len(u) != k + 1:
        raise ValueError(f"a round of depth {k} takes {k + 1} uniforms, got {len(u)}")
    if relaxed is not None and len(relaxed) < k:
        raise ValueError(f"relaxed needs a flag for each of the {k} drafted positions, got {len(relaxed)}")
    masses = _point_masses(p)
    if masses is not None:
        q_d = _draft_q(q, d, k)
        if all(v > 0 for v in q_d):  # (q(d) = 0, a drafter's bug, rejects even the target's token)
            return _point_mass_round(*masses, q_d, d.tolist(), "accept-strict")
    s, dl = _round(p, q, d, k), d.tolist()
    decisions: list[Decision] = []
    for i in range(k):
        if _strict_test(u[i], s.p_draft[i], s.q_draft[i]):
            kind: DecisionKind = "accept-strict"
        elif top_n > 0 and (relaxed is None or relaxed[i]) and 0 <= s.rank[i] < top_n:  # rank -1: filtered out
            kind = "accept-rank"
        else:
            kind = "reject"
        emitted = dl[i]
        if kind == "reject":
            emitted = _emit_on_reject(s, q, i, dl[i], u[k])
        decisions.append(
            Decision(i, dl[i], s.argmax[i], s.rank[i], s.p_draft[i], s.q_draft[i], s.pool[i], kind, emitted)
        )
        if kind == "reject":
            return _finish(dl, decisions, emitted)
    return _finish(dl, decisions, sample_from_probs(s.vals[k], u[k], s.ids[k]))  # bonus from p_{k+1}


def strict_accept_from_uniforms(
    p: Target, q: Tensor | None, drafts: Tensor | Sequence[int], u: Sequence[float]
) -> AcceptResult:
    return relaxed_accept_from_uniforms(p, q, drafts, u, top_n=0)


def match_accept_from_uniforms(
    p: Target, q: Tensor | None, drafts: Tensor | Sequence[int], u: Sequence[float]
) -> AcceptResult:
    """llama.cpp's rule; ``q`` is only reported in the trace (``None``: point mass)."""
    d, k = _check(p, q, drafts)
    if len(u) != k + 1:
        raise ValueError(f"a round of depth {k} takes {k + 1} uniforms, got {len(u)}")
    masses = _point_masses(p)
    if masses is not None:  # the target's sample of a point mass is its token, whatever u
        return _point_mass_round(*masses, _draft_q(q, d, k), d.tolist(), "accept-match")
    s, dl = _round(p, q, d, k), d.tolist()
    decisions: list[Decision] = []
    for i in range(k):
        x = sample_from_probs(s.vals[i], u[i], s.ids[i])  # the target's own sample, as plain decoding would draw
        kind: DecisionKind = "accept-match" if x == dl[i] else "reject"
        decisions.append(Decision(i, dl[i], x, s.rank[i], s.p_draft[i], s.q_draft[i], s.pool[i], kind, x))
        if kind == "reject":
            return _finish(dl, decisions, x)
    return _finish(dl, decisions, sample_from_probs(s.vals[k], u[k], s.ids[k]))


def strict_accept(
    p: Target, q: Tensor | None, drafts: Tensor | Sequence[int], generator: torch.Generator
) -> AcceptResult:
    """Lossless speculative sampling. ``p [k+1, V]`` target, ``q [k, V]`` drafter (or None)."""
    k = _depth(drafts)
    return strict_accept_from_uniforms(p, q, drafts, draw_uniforms(generator, k + 1))


def match_accept(
    p: Target, q: Tensor | None, drafts: Tensor | Sequence[int], generator: torch.Generator
) -> AcceptResult:
    k = _depth(drafts)
    return match_accept_from_uniforms(p, q, drafts, draw_uniforms(generator, k + 1))


def relaxed_accept(
    p: Target, q: Tensor | None, drafts: Tensor | Sequence[int], generator: torch.Generator, top_n: int,
    relaxed: Sequence[bool] | None = None,
) -> AcceptResult:
    """Lossy top-N rule; ``top_n = 0`` (or no position flagged in ``relaxed``) is ``strict_accept``
    exactly (same draws, same result)."""
    k = _depth(drafts)
    return relaxed_accept_from_uniforms(p, q, drafts, draw_uniforms(generator, k + 1), top_n, relaxed)
