"""Where a generation's items go: a ``Sink`` its engine writes to as the answer comes, whichever thread that is.

The engine process hands each generation a sink that sends over its pipe (engine.process.worker), so that no
request needs a thread of its own there: the native engine writes from its step loop, on the compute thread, and an
engine whose answer is an iterator (a backend server's stream) is relayed by ``stream_in_thread``. In-process
callers (tests, benchmarks) read a ``QueueSink`` as an iterator (``ModelRuntime.generate``).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

from .protocol import GenerateRequest, GenerateResult, TokenChunk


class Sink(Protocol):
    """One generation's destination. ``put`` each chunk and then the result, or ``fail`` once; ``end`` last of all,
    once the engine holds nothing of the generation's (its slot is free). ``closed``: the reader has gone, so the
    generation ends at its next chunk."""

    closed: bool

    def put(self, item: TokenChunk | GenerateResult) -> None: ...

    def fail(self, error: BaseException) -> None: ...

    def end(self) -> None: ...


def fail_at_start(sink: Sink, error: BaseException) -> None:
    """A generation that failed before the engine held anything of it: its error, then its end."""
    sink.fail(error)
    sink.end()


@dataclass
class _Failure:
    error: BaseException


_END = object()


class QueueSink:
    """A sink read as an iterator (``items``), in another thread than the writer's, or in the writer's own with
    ``pump`` doing the writer's next piece of work whenever nothing is there to read."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.closed = False

    def put(self, item: TokenChunk | GenerateResult) -> None:
        self._queue.put(item)

    def fail(self, error: BaseException) -> None:
        self._queue.put(_Failure(error))

    def end(self) -> None:
        self._queue.put(_END)

    def items(self, pump: Callable[[], None] | None = None) -> Iterator[TokenChunk | GenerateResult]:
        """What was put, as it comes, until the end (raising a failure's error); closing it early closes the
        sink."""
        try:
            while True:
                if pump is not None:
                    while self._queue.empty():
                        pump()
                item = self._queue.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:
            self.closed = True


class StreamsByThread:
    """``stream`` for an engine whose ``generate`` is an iterator: relayed from a thread of its own."""

    def stream(self, req: GenerateRequest, should_stop: Callable[[], bool], sink: Sink) -> None:
        stream_in_thread(self.generate, req, should_stop, sink)  # type: ignore[attr-defined]


def stream_in_thread(generate: Callable[..., Iterator[TokenChunk | GenerateResult]], req: GenerateRequest,
                     should_stop: Callable[[], bool], sink: Sink, name: str = "tandem-stream") -> None:
    """Relay ``generate(req, should_stop=...)`` into ``sink`` from a thread of its own (an engine whose answer
    is an iterator over a backend server's stream)."""

    def relay() -> None:
        try:
            items = generate(req, should_stop=should_stop)
            for item in items:
                sink.put(item)
                if sink.closed:
                    getattr(items, "close", lambda: None)()
                    break
        except BaseException as e:  # noqa: BLE001 - the sink reports it
            sink.fail(e)
        finally:
            sink.end()

    threading.Thread(target=relay, name=name, daemon=True).start()
