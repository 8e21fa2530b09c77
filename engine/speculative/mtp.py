"""Drafting with a NextN multi-token-prediction head (DeepSeek-V3 / GLM, Qwen3.5) fed by the target's hidden states."""

from __future__ import annotations

import time
from typing import Sequence

import torch
from torch import Tensor

from engine.models.eagle3 import Eagle3Head
from engine.models.nextn import NextNHead
from engine.speculative.drafter import EMPTY, DraftContext, Drafter, Proposal, TargetOutput, sample_chain


class MtpDrafter(Drafter):
    """Drafts with a NextN multi-token-prediction head (``engine.models.nextn.NextNHead``, or an EAGLE-3 head,
    ``engine.models.eagle3.Eagle3Head``, which pairs the same way over other states of the target): entry j of
    its KV cache is the "pair" (h_j, t_{j+1}) of the target's hidden state at position j and
    the token that followed; the head's output g_j for it predicts t_{j+2}.

    Invariant after every commit: pairs 0..len(tokens)-2 are cached (as many as the target's cache
    holds positions), and ``_last`` = g of the newest pair, which predicts the first draft. Deeper
    drafts chain on the head's own output: pair (g, d_i) at the next position predicts d_{i+1}.
    Those speculative pairs are dropped at commit (a truncation) and replaced by pairs built from
    the target's real hidden states, which arrive in ``commit(..., target)``.

    The real pairs are run through the head when the next proposal needs them, not at commit: a controller settled
    on plain decoding then pays nothing per step (it paid a head forward every step, 13-25 % of a SmolLM2 step).
    Only the pairs of plain steps are catch-up: the last commit's pairs are what any round pays (a round that
    follows a round runs exactly those), so they go with the drafting; a run of more than ``fuse_rows`` older pairs
    goes through the head first, timed apart (``Proposal.catchup_seconds``), as a draft model's missed tokens are,
    and a shorter one rides in the same forward (a head forward over 5 rows costs about what it costs over 1).
    """

    kind = "mtp"
    needs_hidden = True

    def __init__(self, head: NextNHead | Eagle3Head, capacity: int, fuse_rows: int = 4):
        super().__init__()
        self.fuse_rows = fuse_rows
        self.head = head
        self.cache = head.new_cache(capacity)
        self.vocab_size = head.config.vocab_size
        self._t0: int | None = None  # token 0 (pairs record t_{j+1}; h_j also depends on t_0)
        self._last: Tensor | None = None
        # the target's states for pairs cache.length .. cache.length + n - 1, not yet through the head
        self._pending: list[Tensor] = []
        self._last_rows = 0  # pairs the newest commit added (the newest pending rows): not catch-up

    # -- state ---------------------------------------------------------------------------------
    def prefix_limit(self, tokens: Sequence[int]) -> int:
        """Pairs still valid for ``tokens``: pair j needs t_0..t_{j+1} unchanged."""
        if not tokens or self._t0 != tokens[0]:
            return 0
        n = self.cache.common_prefix(list(tokens[1:]))
        if n < self.cache.length or not self._pending:
            return n
        # pending pairs count as held: the next proposal runs them through the head
        pending = self.tokens[n + 1:n + 1 + self._pending_rows()]
        while n - self.cache.length < len(pending) and n + 1 < len(tokens) and \
                tokens[n + 1] == pending[n - self.cache.length]:
            n += 1
        return n

    def begin(self, tokens: Sequence[int]) -> None:
        self._include_pending()  # pairs of the last request's tokens, which begin replaces
        super().begin(tokens)
        self.cache.truncate(self.prefix_limit(self.tokens))
        self._t0 = self.tokens[0] if self.tokens else None
        self._last = None  # the prefill's commit brings fresh hidden states

    def _pending_rows(self) -> int:
        return sum(t.shape[0] for t in self._pending)

    def commit(self, tokens_committed: Sequence[int], n_total: int, target: TargetOutput | None = None) -> None:
        super().commit(tokens_committed, n_total, target)
        states = target.states(self.head.reads) if target is not None else None
        if states is None:
            raise RuntimeError("the MTP drafter needs the target's hidden states at every commit")
        start = target.start
        held = self.cache.length + self._pending_rows()
        if start > held:
            raise RuntimeError(f"MTP head holds {held} positions but the target resumed at {start}")
        if start < self.cache.length:  # this round's speculative pairs (or older ones) go
            self.cache.truncate(start)
            self._pending = []
        elif start < held:  # pending pairs from ``start`` on are superseded by this commit's states
            keep = start - self.cache.length
            rows = torch.cat(self._pending)[:keep] if self._pending else None
            self._pending = [rows] if rows is not None and rows.shape[0] else []
        end = len(self.tokens) - 1  # pairs start..end-1: every position whose successor is committed
        if end > start:
            # a copy: the target's forward may hand out rows of a buffer its next forward writes
            self._pending.append(states[: end - start].clone())
            self._last = None  # the newest pair's g comes with the pending pairs
        self._last_rows = max(end - start, 0)
        if self._t0 is None and self.tokens:
            self._t0 = self.tokens[0]

    def _include_pending(self, rows: int | None = None) -> None:
        """Run the oldest ``rows`` pending pairs (all by default) through the head in one forward, leaving
        ``_last`` the newest included pair's g."""
        if not self._pending:
            return
        hidden = torch.cat(self._pending) if len(self._pending) > 1 else self._pending[0]
        if rows is not None and rows < hidden.shape[0]:
            hidden, rest = hidden[:rows], hidden[rows:]
            self._pending = [rest]
        else:
            self._pending = []
        start = self.cache.length
        g = self.head.forward(self.head.from_target(hidden), self.tokens[start + 1:start + 1 + hidden.shape[0]],
                              self.cache)
        self._last = g[-1]

    def reset(self) -> None:
        super().reset()
        self.cache.reset()
        self._t0, self._last, self._pending, self._last_rows = None, None, [], 0

    def fork(self, target_cache) -> "MtpDrafter":
        return MtpDrafter(self.head, self.cache.capacity, self.fuse_rows)

    # -- compute -------------------------------------------------------------------------------
    def propose(self, k: int, ctx: DraftContext) -> Proposal:
        k = min(k, self.cache.capacity - self.cache.length - self._pending_rows() + 1)
        if k <= 0:
            return EMPTY
        catchup, caught_up = 0.0, 0
        older = self._pending_rows() - self._last_rows  # pairs of plain steps since the last round
        if older > self.fuse_rows:
            t0 = time.perf_counter()
            self._include_pending(older)
            catchup, caught_up = time.perf_counter() - t0, older
        self._include_pending()
        if self._last is None:
            return EMPTY
        g = self._last

        def advance(token: int) -> Tensor:
            # chain: the head's own output stands in for the target's hidden state
            nonlocal g
            g = self.head.forward(g.reshape(1, -1), [token], self.cache)[-1]
            return self.head.logits(g)

        return sample_chain(k, ctx, self.tokens, self.vocab_size, self.head.logits(self._last), advance, catchup,
                            caught_up)

    def memory_bytes(self) -> int:
        return self.head.weight_bytes() + self.cache.nbytes()
