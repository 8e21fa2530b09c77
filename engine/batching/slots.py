"""Sequence slots: what one sequence of a loaded model owns while the model serves several at once.

A slot is a KV cache region of the load's ``num_ctx`` (one per slot, allocated at load: admission never runs
out of cache mid-request), the drafters with state of their own over the shared weights (a draft model's
cache, an MTP head's, the n-gram index), and the depth controllers' learned acceptance. The verification
costs stay one table per target: a forward's price belongs to the machine, whichever slot paid it.

A request takes a free slot whose cache it can reuse without dropping another conversation: one its prompt
continues (a chat's next turn finds its own slot's cache), one whose last prompt it keeps whole and departs from
only in what the slot generated (the next turn of a thinking model whose template drops the reasoning from the
history, or a reply that tokenizes differently when the template renders it again), or one holding this very prompt
(asked again), the longest such prefix first; else the slot used least recently, an empty one first. Where another
slot, busy or not, holds a longer prefix of the prompt (the system prompt every client of an application sends, the
chat template's opening), the slot copies those positions from it instead of evaluating them again. Apart from the
re-rendered answer, that is Ollama's rule (its runner's cache slots): a new conversation that shares only a system
prompt with a slot forks that prefix into a free slot instead of evicting the slot's conversation. A slot whose
cache cannot copy another's positions (recurrent state) is reused for the longest prefix, as nothing else would
keep it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Sequence

from engine.batching.policy import SHARED_PREFIX_MIN
from engine.cache.kv import KVCache
from engine.contract.protocol import EngineError
from engine.speculative.depth import AdaptiveDepth
from engine.speculative.drafter import Drafter


@dataclass
class SequenceSlot:
    index: int
    cache: KVCache
    drafters: dict[str, Drafter]
    controllers: dict[str, AdaptiveDepth] = field(default_factory=dict)
    busy: bool = False
    used_at: int = 0  # when it last started a request (a counter)
    prompt_length: int = 0  # the length of the prompt it last served (what follows in its cache, it generated)


class SlotPool:
    """The slots of one loaded model (taken and freed on the compute thread; counted from any)."""

    def __init__(self, slots: Sequence[SequenceSlot]):
        if not slots:
            raise ValueError("a slot pool needs at least one slot")
        self.slots = list(slots)
        self._lock = threading.Lock()
        self._clock = 0
        self.adopted = 0  # positions copied from another slot's cache so far (share_prefix)

    def __len__(self) -> int:
        return len(self.slots)

    def free(self) -> int:
        with self._lock:
            return sum(not s.busy for s in self.slots)

    def busy(self) -> int:
        with self._lock:
            return sum(s.busy for s in self.slots)

    def acquire(self, tokens: Sequence[int]) -> SequenceSlot:
        """The free slot to serve ``tokens`` (see the module's docstring), marked busy; an ``EngineError`` (503)
        when every slot is busy (the runtime queues a request until ``free``)."""
        tokens = list(tokens)
        with self._lock:
            free = [s for s in self.slots if not s.busy]
            if not free:
                raise EngineError(f"all {len(self.slots)} sequence slots are busy", 503)
            common = {s.index: s.cache.common_prefix(tokens) for s in free}
            reusable = [s for s in free if _keeps_other_work(s, common[s.index], len(tokens))]
            if reusable:
                slot = max(reusable, key=lambda s: (common[s.index], -s.used_at))
            else:  # every free slot holds another conversation: the oldest gives way (share_prefix forks into it)
                slot = min(free, key=lambda s: s.used_at)
            self._clock += 1
            slot.busy, slot.used_at, slot.prompt_length = True, self._clock, len(tokens)
            return slot

    def share_prefix(self, slot: SequenceSlot, tokens: Sequence[int]) -> int:
        """Give ``slot`` the longest prefix of ``tokens`` another slot's cache holds, when it beats its own by at
        least SHARED_PREFIX_MIN tokens; how many positions it adopted (0: none). Only plain KV caches (a
        recurrent layer's state is not a per-position copy). Run where no forward is in flight (the step loop
        runs a new sequence's first Python between two steps)."""
        if type(slot.cache) is not KVCache:
            return 0
        tokens = list(tokens)
        # leave the prompt's last token to evaluate: its logits start the generation
        own = min(slot.cache.common_prefix(tokens), len(tokens) - 1)
        donors = [(min(s.cache.common_prefix(tokens), len(tokens) - 1), s) for s in self.slots
                  if s is not slot and type(s.cache) is KVCache]
        n, donor = max(donors, key=lambda d: d[0], default=(0, None))
        if donor is None or n < own + SHARED_PREFIX_MIN:
            return 0
        slot.cache.adopt_prefix(donor.cache, n)
        self.adopted += n
        return n

    def release(self, slot: SequenceSlot) -> None:
        with self._lock:
            slot.busy = False


def _keeps_other_work(slot: SequenceSlot, common: int, prompt_length: int) -> bool:
    """Whether serving a prompt of ``prompt_length`` tokens that shares ``common`` leading tokens with ``slot``'s
    cache in that slot drops nothing but what the prompt itself replaces: the prompt continues the cache (an empty
    one too), keeps the slot's last prompt whole (the same conversation, whose last answer the template rendered
    otherwise than it was generated: only that answer's positions go), or the cache holds the whole prompt (the
    same prompt again: only its old answer goes). A cache that cannot copy another's positions is always worth its
    prefix."""
    if type(slot.cache) is not KVCache:
        return True
    return common == len(slot.cache) or 0 < slot.prompt_length <= common or common == prompt_length
