"""Embedding requests that arrive together run as one engine call.

Clients of an embedding model (a RAG indexer, a search box) send one text a request, several at once. Each call
to the engine is a round trip and a forward of its own; the engine batches the inputs of one call by length
(engine.runtime: one padded forward per batch), so requests merged into one call share forwards. The first
caller runs a call for every request waiting at that moment; the requests that arrive meanwhile wait and
then go together in the next call, run by the first of them: a caller leads one round, its own request's, and
hands on (leader and followers: no thread of its own, no timer, no added latency for a lone request, and no
caller kept serving others' requests after its own is answered).

Requests merge only when they agree on ``truncate`` and ``num_ctx`` (they change how inputs are cut). An error
from a merged call is the error of one of its requests (an input past the context with ``truncate`` off), so
each is then run alone and gets its own answer; an engine that died fails them all, as it would alone.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from engine.contract.protocol import EmbedRequest, EmbedResult, EngineCrashedError


@dataclass
class _Waiting:
    req: EmbedRequest
    wake: threading.Event = field(default_factory=threading.Event)  # answered, or asked to lead
    leads: bool = False
    answered: bool = False
    result: EmbedResult | None = None
    error: BaseException | None = None


class EmbedBatcher:
    def __init__(self, run: Callable[[EmbedRequest], EmbedResult]):
        self._run = run
        self._lock = threading.Lock()
        self._waiting: list[_Waiting] = []
        self._leading = False
        self.calls = 0  # engine calls made (requests / calls: how many shared one)

    def embed(self, req: EmbedRequest) -> EmbedResult:
        me = _Waiting(req)
        with self._lock:
            self._waiting.append(me)
            me.leads = not self._leading
            self._leading = True
        while not me.answered:
            if me.leads:
                self._lead_round()  # answers this caller's request with every other waiting one
            else:
                me.wake.wait()
                me.wake.clear()
        if me.error is not None:
            raise me.error
        assert me.result is not None
        return me.result

    def _lead_round(self) -> None:
        """Run calls for every request waiting now, then make the first to arrive since the next leader."""
        with self._lock:
            batch, self._waiting = self._waiting, []
        for group in _compatible(batch):
            self._call(group)
        with self._lock:
            if self._waiting:
                nxt = self._waiting[0]
                nxt.leads = True
                nxt.wake.set()
            else:
                self._leading = False

    def _call(self, group: list[_Waiting]) -> None:
        merged = replace(group[0].req, inputs=[t for w in group for t in w.req.inputs])
        try:
            self.calls += 1
            t0 = time.perf_counter_ns()
            result = self._run(merged)
        except BaseException as e:  # noqa: BLE001 - handed to its waiters
            if len(group) == 1 or isinstance(e, EngineCrashedError):  # a dead or frozen engine fails everyone
                for w in group:
                    _finish(w, error=e)
            else:  # whose input was it? each alone gets its own answer
                for w in group:
                    self._call([w])
            return
        elapsed = time.perf_counter_ns() - t0
        at = 0
        for w in group:
            n = len(w.req.inputs)
            _finish(w, result=EmbedResult(embeddings=result.embeddings[at:at + n],
                                          token_counts=result.token_counts[at:at + n],
                                          duration_ns=result.duration_ns or elapsed))
            at += n


def _compatible(batch: list[_Waiting]) -> list[list[_Waiting]]:
    groups: dict[tuple[bool, int], list[_Waiting]] = {}
    for w in batch:
        groups.setdefault((w.req.truncate, w.req.num_ctx), []).append(w)
    return list(groups.values())


def _finish(w: _Waiting, *, result: EmbedResult | None = None, error: BaseException | None = None) -> None:
    w.result, w.error, w.answered = result, error, True
    w.wake.set()
