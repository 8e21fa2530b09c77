"""Drafting with a NextN multi-token-prediction head (DeepSeek-V3 / GLM, Qwen3.5) fed by the target's hidden states."""

from __future__ import annotations

from typing import Sequence

from torch import Tensor

from engine.models.nextn import NextNHead
from engine.speculative.drafter import EMPTY, DraftContext, Drafter, Proposal, TargetOutput, sample_chain


class MtpDrafter(Drafter):
    """Drafts with a NextN multi-token-prediction head (``engine.models.nextn.NextNHead``): entry j of
    its KV cache is the "pair" (h_j, t_{j+1}) of the target's hidden state at position j and
    the token that followed; the head's output g_j for it predicts t_{j+2}.

    Invariant after every commit: pairs 0..len(tokens)-2 are cached (as many as the target's cache
    holds positions), and ``_last`` = g of the newest pair, which predicts the first draft. Deeper
    drafts chain on the head's own output: pair (g, d_i) at the next position predicts d_{i+1}.
    Those speculative pairs are dropped at commit (a truncation) and replaced by pairs built from
    the target's real hidden states, which arrive in ``commit(..., target)``.
    """

    kind = "mtp"
    needs_hidden = True

    def __init__(self, head: NextNHead, capacity: int):
        super().__init__()
        self.head = head
        self.cache = head.new_cache(capacity)
        self.vocab_size = head.config.vocab_size
        self._t0: int | None = None  # token 0 (pairs record t_{j+1}; h_j also depends on t_0)
        self._last: Tensor | None = None

    # -- state ---------------------------------------------------------------------------------
    def prefix_limit(self, tokens: Sequence[int]) -> int:
        """Pairs still valid for ``tokens``: pair j needs t_0..t_{j+1} unchanged."""
        if not tokens or self._t0 != tokens[0]:
            return 0
        return self.cache.common_prefix(list(tokens[1:]))

    def begin(self, tokens: Sequence[int]) -> None:
        super().begin(tokens)
        self.cache.truncate(self.prefix_limit(self.tokens))
        self._t0 = self.tokens[0] if self.tokens else None
        self._last = None  # the prefill's commit brings fresh hidden states

    def commit(self, tokens_committed: Sequence[int], n_total: int, target: TargetOutput | None = None) -> None:
        super().commit(tokens_committed, n_total, target)
        if target is None or target.hidden is None:
            raise RuntimeError("the MTP drafter needs the target's hidden states at every commit")
        start = target.start
        if start > self.cache.length:
            raise RuntimeError(f"MTP head holds {self.cache.length} positions but the target resumed at {start}")
        self.cache.truncate(start)  # drop this round's speculative pairs
        end = len(self.tokens) - 1  # pairs start..end-1: every position whose successor is committed
        if end > start:
            g = self.head.forward(self.head.from_target(target.hidden[: end - start]), self.tokens[start + 1:end + 1],
                                  self.cache)
            self._last = g[-1]
        if self._t0 is None and self.tokens:
            self._t0 = self.tokens[0]

    def reset(self) -> None:
        super().reset()
        self.cache.reset()
        self._t0, self._last = None, None

    def fork(self, target_cache) -> "MtpDrafter":
        return MtpDrafter(self.head, self.cache.capacity)

    # -- compute -------------------------------------------------------------------------------
    def propose(self, k: int, ctx: DraftContext) -> Proposal:
        k = min(k, self.cache.capacity - self.cache.length + 1)
        if k <= 0 or self._last is None:
            return EMPTY
        g = self._last

        def advance(token: int) -> Tensor:
            # chain: the head's own output stands in for the target's hidden state
            nonlocal g
            g = self.head.forward(g.reshape(1, -1), [token], self.cache)[-1]
            return self.head.logits(g)

        return sample_chain(k, ctx, self.tokens, self.vocab_size, self.head.logits(self._last), advance)

    def memory_bytes(self) -> int:
        return self.head.weight_bytes() + self.cache.nbytes()
