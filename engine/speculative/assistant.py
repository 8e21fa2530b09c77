"""Drafting with Gemma 4's assistant: a read-only, single-position MTP drafter over the target's own state."""

from __future__ import annotations

from typing import Callable, Sequence

from torch import Tensor

from engine.cache.kv import KVCache
from engine.models.gemma4_assistant_model import Gemma4Assistant
from engine.speculative.drafter import EMPTY, DraftContext, Drafter, Proposal, TargetOutput, sample_chain


class AssistantDrafter(Drafter):
    """Drafts with a ``Gemma4Assistant`` that reads the target's KV cache and keeps no state of its own.

    Every draft of a round sits at the last committed position P (the token the target sampled but
    has not evaluated yet; the target's cache holds positions before it): step 1 takes that token and
    the target's hidden state at P - 1, each further step the previous draft and the assistant's own
    projected state. Nothing is written anywhere, so a rejection costs nothing and ``commit`` only
    keeps the one hidden state the next round starts from.

    The seed state is the target's hidden state *after* its final norm (what the assistant was trained
    on); the loop hands over pre-norm states, so ``final_norm`` (the target's) is applied to the one row
    kept.
    """

    kind = "mtp"
    needs_hidden = True

    def __init__(self, assistant: Gemma4Assistant, target_cache: KVCache, final_norm: Callable[[Tensor], Tensor],
                 vocab_size: int):
        super().__init__()
        self.assistant = assistant
        self.cache = target_cache  # read only
        self.final_norm = final_norm
        self.vocab_size = vocab_size
        self._h: Tensor | None = None  # the target's normed hidden state at P - 1

    def begin(self, tokens: Sequence[int]) -> None:
        super().begin(tokens)
        self._h = None  # the evaluation's commit brings the state

    def commit(self, tokens_committed: Sequence[int], n_total: int, target: TargetOutput | None = None) -> None:
        super().commit(tokens_committed, n_total, target)
        self._h = None
        if target is None or target.hidden is None:
            raise RuntimeError("the assistant drafter needs the target's hidden states at every commit")
        row = len(self.tokens) - 2 - target.start  # position P - 1 of the new log, in this forward's rows
        if 0 <= row < target.hidden.shape[0]:
            self._h = self.final_norm(target.hidden[row:row + 1])[0]

    def reset(self) -> None:
        super().reset()
        self._h = None

    def fork(self, target_cache) -> "AssistantDrafter":
        return AssistantDrafter(self.assistant, target_cache, self.final_norm, self.vocab_size)

    def propose(self, k: int, ctx: DraftContext) -> Proposal:
        position = len(self.tokens) - 1
        if k <= 0 or self._h is None or position <= 0 or self.cache.length != position:
            return EMPTY
        # Every step drafts from the fixed last committed position: the assistant's own output state
        # carries the chain, and nothing is written to any cache.
        logits, h = self.assistant.step(self.tokens[-1], self._h, self.cache, position)

        def advance(token: int) -> Tensor:
            nonlocal h
            next_logits, h = self.assistant.step(token, h, self.cache, position)
            return next_logits

        return sample_chain(k, ctx, self.tokens, self.vocab_size, logits, advance)

    def memory_bytes(self) -> int:
        return self.assistant.weight_bytes()
