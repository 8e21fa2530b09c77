"""Drafting with a small independent language model that shares the target's vocabulary."""

from __future__ import annotations

import time
from typing import Sequence

import torch
from torch import Tensor

from engine.cache.kv import KVCache
from engine.ops.memory import model_bytes
from engine.speculative.drafter import EMPTY, DraftContext, Drafter, Proposal, TargetOutput, sample_chain
from engine.speculative.full_head_check import CheckPrice, correct_chain


class DraftModelDrafter(Drafter):
    """An independent causal LM with the target's vocabulary and its own KV cache.

    Its cache holds a prefix of ``tokens`` (never the last one, whose logits a proposal needs) plus
    the drafts of the round in flight; ``commit`` truncates it to the prefix the round kept (a
    length: no copies) and the next proposal forwards the committed tail (usually 1-2 tokens). The
    cache survives across requests, so a follow-up prompt reuses it like the target's.
    """

    kind = "model"

    def __init__(self, model, capacity: int, vocab_size: int, prefill_chunk: int = 512, fuse_tokens: int = 4):
        super().__init__()
        self.model = model
        self.fuse_tokens = fuse_tokens  # committed tokens forwarded with the round's first draft step
        self.cache: KVCache = model.new_cache(capacity)
        self.vocab_size = vocab_size
        self.prefill_chunk = prefill_chunk
        self.corrected = 0  # drafts the full head replaced (a pruned head's misses), since load
        # Evaluate a request's prompt at its first proposal instead of in ``begin`` (engine.runtime sets it for
        # a model serving several sequences: there the prompt's draft forward is a step every other sequence
        # waits for, and under load the controller rarely drafts at all)
        self.lazy_prompt = False
        self._included = 0  # tokens[:_included] are scored by a pruned head (lazy_prompt: up to the last proposal)
        self._prompt_end = 0  # tokens[:_prompt_end] are the request's prompt
        # A pruned head's chain check, priced by the text (how often its tokens are ones the head did not score)
        self.check_price = CheckPrice()
        self.checks_skipped = 0  # chains left unchecked because the check would not have paid, since load
        self._last_drafts: list[int] = []

    def _include(self, tokens: Sequence[int]) -> int:
        """A pruned head (``draft_vocab``) scores the request's own tokens too; how many it did not score before."""
        include = getattr(self.model.output, "include", None)
        return include(tokens) if include is not None else 0

    def _include_pending(self) -> None:
        """Include every token since the last inclusion: with ``lazy_prompt`` this waits for a proposal, like the
        prompt's forward (a quarter of a millisecond a token, which sequences decoding plainly side by side
        would otherwise pay one after another at every step). The generated ones among them tell the check's
        price how often the text leaves the head's tokens."""
        start = min(self._included, len(self.tokens))
        split = min(max(start, self._prompt_end), len(self.tokens))
        if start < split:
            self._include(self.tokens[start:split])
        if split < len(self.tokens):
            self.check_price.observe_committed(len(self.tokens) - split, self._include(self.tokens[split:]))
        self._included = len(self.tokens)

    def _sync(self) -> None:
        n = min(self.cache.common_prefix(self.tokens), max(len(self.tokens) - 1, 0))
        self.cache.truncate(n)

    def begin(self, tokens: Sequence[int]) -> None:
        super().begin(tokens)
        self._included = 0
        self._prompt_end = len(self.tokens)
        self.check_price.begin_request()
        self._last_drafts = []
        if not self.lazy_prompt:
            self._include_pending()
        # A new request keeps what the cache can resume from: a recurrent cache (engine.cache.recurrent)
        # only at the lengths it recorded, so not necessarily the whole common prefix.
        self.cache.reuse_prefix(self.tokens)
        # Evaluate the prompt now (counted with the prompt), not inside the first round's timing.
        if not self.lazy_prompt:
            self._forward_tail(upto=len(self.tokens) - 1, want_logits=False)

    def backlog(self) -> int:
        # its cache holds a prefix of ``tokens`` and never the last one, which a proposal forwards as its first step
        return max(0, len(self.tokens) - 1 - self.cache.length)

    def commit(self, tokens_committed: Sequence[int], n_total: int, target: TargetOutput | None = None) -> None:
        super().commit(tokens_committed, n_total, target)
        self.check_price.observe_round(self._last_drafts, tokens_committed)
        self._last_drafts = []
        if not self.lazy_prompt:
            self._include_pending()
        self._sync()

    def _forward_tail(self, upto: int, want_logits: bool) -> Tensor | None:
        """Forward ``tokens[cache.length:upto]``; the last position's logits if asked (None when there
        was nothing to forward or none were asked)."""
        tail = self.tokens[self.cache.length:upto]
        logits = None
        for i in range(0, len(tail), self.prefill_chunk):
            part = tail[i:i + self.prefill_chunk]
            last = i + self.prefill_chunk >= len(tail)
            logits = self.model.forward(part, self.cache, logits_for="last" if (last and want_logits) else "none")
        return logits

    def propose(self, k: int, ctx: DraftContext) -> Proposal:
        k = min(k, self.cache.capacity - len(self.tokens) + 1)
        if k <= 0 or not self.tokens:
            return EMPTY
        self._include_pending()
        # A drafting round leaves two committed tokens to forward (the last draft and the bonus);
        # plain steps in between add theirs. A few go in the same forward (a small model's step over
        # 4 tokens costs about what it costs over 2, while a separate forward costs a whole step);
        # a long run is forwarded first and timed apart (``catchup_seconds``).
        catchup, caught_up = 0.0, 0
        if len(self.tokens) - self.cache.length > self.fuse_tokens:
            t0 = time.perf_counter()
            caught_up = len(self.tokens) - 2 - self.cache.length
            self._forward_tail(upto=len(self.tokens) - 2, want_logits=False)
            catchup = time.perf_counter() - t0
        head = self.model.output
        check = getattr(head, "can_complete", False)  # a pruned head (draft_vocab) that keeps its other rows
        inputs: list[Tensor] = []  # the head's input at each drafted position, for the full head's check

        def step(tokens: list[int]) -> Tensor:
            if not check:
                return self.model.forward(tokens, self.cache, logits_for="last")
            out = self.model.forward(tokens, self.cache, logits_for="last", return_hidden=True)
            inputs.append(out.hidden[-1:])
            return out.logits

        final = (len(self.tokens) - self.cache.length - 1) % self.prefill_chunk + 1  # the last chunk's tokens
        self._forward_tail(upto=len(self.tokens) - final, want_logits=False)
        logits = step(self.tokens[self.cache.length:])
        pruned = [logits[-1:]]

        def advance(token: int) -> Tensor:
            row = step([token])
            pruned.append(row)
            return row

        prop = sample_chain(k, ctx, self.tokens, self.vocab_size, logits[-1:], advance, catchup, caught_up)
        self._last_drafts = list(prop.tokens)
        if not check or not prop.tokens:
            return prop
        n = len(prop.tokens)  # one scoring per drafted position (a draft_p_min stop scored one more)
        if not self.check_price.worth(n, ctx.token_seconds):
            self.checks_skipped += 1
            return prop
        t0 = time.perf_counter()
        full = head.complete(torch.cat(inputs[:n]), torch.cat(pruned[:n]))
        prop, replaced = correct_chain(prop, full, self.tokens, ctx, self.vocab_size)
        self.check_price.observe_check(time.perf_counter() - t0)
        self.corrected += replaced
        self._last_drafts = list(prop.tokens)
        return prop

    def reset(self) -> None:
        super().reset()
        self.cache.reset()

    def fork(self, target_cache) -> "DraftModelDrafter":
        forked = DraftModelDrafter(self.model, self.cache.capacity, self.vocab_size, self.prefill_chunk,
                                   self.fuse_tokens)
        forked.lazy_prompt = self.lazy_prompt
        return forked

    def memory_bytes(self) -> int:
        return model_bytes(self.model) + self.cache.nbytes()
