"""``GenerationStream``: one generation on a leased engine, consumed by the event loop.

The engine client's calls block, so the generation runs in a thread of its own and hands its chunks to the event
loop through a queue; its lease is given back from that thread's completion, never earlier, so a client that went
away cannot leave the engine writing to its pipe while the next request starts.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator, Protocol

from engine.contract.protocol import EngineCrashedError, EngineError, GenerateRequest, GenerateResult, TokenChunk

SHUTDOWN_MESSAGE = "server is shutting down"


class StreamLease(Protocol):
    """What a stream needs of its lease (server.lifecycle.Lease)."""

    crashed: bool

    @property
    def engine(self) -> Any: ...

    @property
    def closing(self) -> bool: ...

    def track(self, stream: "GenerationStream") -> None: ...

    def untrack(self, stream: "GenerationStream") -> None: ...

    def release(self) -> None: ...

_END = object()


class GenerationStream:
    """One generation on a leased engine, run in a thread, consumed with ``async for``.

    Yields TokenChunk items, then one GenerateResult; an engine failure is raised from the iteration.
    ``cancel()`` (client gone) stops the engine at its next round; the lease is released when the
    worker thread has fully drained the engine, never earlier.
    """

    def __init__(self, lease: StreamLease, request: GenerateRequest):
        self.lease = lease
        self.request = request
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._cancelled = threading.Event()
        self._handle: Any = None  # the engine's stream, once started: cancels this generation alone
        self._started = False
        self.finished = asyncio.Event()
        lease.track(self)

    def start(self) -> None:
        if self._started or self._cancelled.is_set():
            return
        self._started = True
        threading.Thread(target=self._work, name="tandem-generate", daemon=True).start()

    def _post(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is gone (server shutting down)
            pass

    def _work(self) -> None:
        engine = self.lease.engine
        try:
            if self._cancelled.is_set():
                return
            it = self._handle = engine.generate(self.request)
            try:
                for item in it:
                    self._post(item)
                    if self._cancelled.is_set():
                        break
            finally:
                close = getattr(it, "close", None)
                if close is not None:
                    close()  # cancels and drains an unfinished generation
        except EngineCrashedError as e:
            self.lease.crashed = True
            self._post(e)
        except BaseException as e:  # reported to the consumer; the engine keeps serving
            if not engine.alive():
                self.lease.crashed = True
            self._post(e)
        finally:
            self._post(_END)
            try:
                self._loop.call_soon_threadsafe(self._done)
            except RuntimeError:
                pass

    def _done(self) -> None:
        self.lease.untrack(self)
        self.lease.release()
        self.finished.set()

    def cancel(self) -> None:
        """Stop the generation (safe to call more than once, from the event loop)."""
        if self._cancelled.is_set():
            return
        self._cancelled.set()
        if not self._started:
            self.lease.untrack(self)
            self.lease.release()
            self.finished.set()
            self._queue.put_nowait(_END)  # a consumer still iterating ends at once
            return
        try:
            handle = self._handle
            if handle is None:
                return  # not asked of the engine yet: the worker sees the flag before it asks
            if hasattr(handle, "cancel"):
                handle.cancel()  # this generation only: the engine may serve others at once
            else:
                self.lease.engine.cancel()
        except Exception:
            pass

    def abort(self, error: BaseException) -> None:
        """End the stream with ``error`` for its consumer (after the items already queued) and stop the
        engine's work (the server is shutting down)."""
        self._queue.put_nowait(error)
        self.cancel()

    async def __aiter__(self) -> AsyncIterator[TokenChunk | GenerateResult]:
        if self.lease.closing and not self._started:
            self.abort(EngineError(SHUTDOWN_MESSAGE, 503))
        self.start()
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
