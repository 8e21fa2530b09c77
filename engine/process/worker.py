"""The engine's own process: loads one model (target + drafter) and serves requests over a pipe.

Running the models in a child process is what lets the server survive the engine: a segfault in a
kernel, an out-of-memory kill or a runaway allocation ends this process, and the server only sees a
closed pipe, which it reports as an error for the request in flight.

Protocol (tuples over a `multiprocessing.Connection`):
  server -> engine: ("load", LoadSpec) | ("generate", id, GenerateRequest) | ("cancel", id)
                    | ("embed", EmbedRequest) | ("tokenize", text, add_bos) | ("detokenize", ids)
                    | ("health",) | ("exit",)
  engine -> server: ("ok", payload) | ("error", message, status)      answers, one call at a time
                    | ("chunk", id, TokenChunk) | ("done", id, GenerateResult) | ("failed", id, message, status)
                    | ("beat",)
Generations are streams tagged with the server's id, as many at once as the model has sequence slots: the
engine writes each one's chunks to the pipe as they come (the native engine from its step loop, engine.batching,
which batches their forwards; a backend's from a relay thread), while this loop keeps answering calls (a
tokenize, a health ping) and cancels. While any generation runs, a heartbeat thread sends ("beat",)
every ``beat_interval`` seconds, so the server's watchdog can tell a long prefill (which sends no chunk for a
while) from a frozen process: a stopped or wedged process (or one whose main thread holds the GIL for good)
sends no beats. An exiting engine that still writes its packed-weight cache beats too, before its
("ok", None). A cancel (per id, or the shared flag for all) is checked by the decode loop between rounds,
so it never interrupts a forward pass halfway and the caches stay consistent.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Callable, Iterator

from engine.contract.cancel_flag import CancelFlag
from engine.contract.protocol import EngineError, GenerateResult
from engine.contract.runtime import EngineRuntime
from engine.contract.streaming import fail_at_start
from engine.process.runtimes import load_runtime


EXIT_BEAT_SECONDS = 0.5  # how often an exiting engine that finishes a cache write says it is alive
EXIT_IDLE_SECONDS = 5.0  # how long an exit waits for generations still ending before it releases their weights


def _error_message(exc: BaseException) -> tuple[str, int]:
    """The (message, status) a client sees. Only an ``EngineError`` carries text meant for clients;
    any other exception is a bug or a resource failure whose text (types, paths, tensor shapes)
    goes to the engine's stderr, not into an HTTP answer."""
    if isinstance(exc, EngineError):
        return str(exc), exc.status
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return "out of memory", 500
    return "engine error: internal error (see the server log)", 500


def _reported(exc: BaseException) -> tuple[str, int]:
    """What a client sees of ``exc`` (``_error_message``), after the traceback of anything that is not an
    ``EngineError`` went to the engine's stderr (every one's, with TANDEM_DEBUG)."""
    if os.environ.get("TANDEM_DEBUG") or not isinstance(exc, EngineError):
        traceback.print_exc()
    return _error_message(exc)


class _Sender:
    """The pipe's sending end, shared by the main loop and the heartbeat thread: a large message is
    written in more than one piece, so the two must never interleave."""

    def __init__(self, conn: Connection):
        self._conn = conn
        self._lock = threading.Lock()

    def send(self, msg: tuple) -> None:
        with self._lock:
            self._conn.send(msg)


class _Busy:
    """Whether the engine is working on something the server waits for (generations, an embedding batch, a
    tokenization): the heartbeat beats while any is. A count, not a flag: a tokenization that ends while
    generations run must not silence their heartbeat."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._event = threading.Event()

    def enter(self) -> None:
        with self._lock:
            self._count += 1
            self._event.set()

    def exit(self) -> None:
        with self._lock:
            self._count -= 1
            if self._count == 0:
                self._event.clear()

    @contextmanager
    def held(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.exit()

    def wait(self) -> None:
        self._event.wait()

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._event.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._event.is_set()

    def is_set(self) -> bool:
        return self._event.is_set()


class _PipeSink:
    """One generation's sink (engine.contract.streaming): each item goes over the pipe as it comes, from the
    thread the engine writes it in (the native engine's compute thread, a backend's relay thread)."""

    def __init__(self, out: _Sender, rid: int, ended: Callable[[int], None]):
        self._out = out
        self._rid = rid
        self._ended = ended
        self.closed = False

    def put(self, item) -> None:
        self._send(("done", self._rid, item) if isinstance(item, GenerateResult) else ("chunk", self._rid, item))

    def fail(self, error: BaseException) -> None:
        self._send(("failed", self._rid, *_reported(error)))

    def _send(self, msg: tuple) -> None:
        try:
            self._out.send(msg)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.closed = True  # the server is gone: the generation ends at this chunk

    def end(self) -> None:
        self._ended(self._rid)


class _Generations:
    """The generations running now, and how many (the heartbeat beats while any). None holds a thread here: the
    engine writes each one's items to its pipe sink as they come."""

    def __init__(self, out: _Sender, busy: _Busy, shared_cancel: CancelFlag):
        self._out = out
        self._busy = busy
        self._shared_cancel = shared_cancel
        self._lock = threading.Lock()
        self._cancels: dict[int, threading.Event] = {}

    def start(self, engine: EngineRuntime, rid: int, req) -> None:
        cancel = threading.Event()
        with self._lock:
            self._cancels[rid] = cancel
        self._busy.enter()
        stop = lambda: cancel.is_set() or self._shared_cancel.is_set()  # noqa: E731
        sink = _PipeSink(self._out, rid, self._ended)
        try:
            engine.stream(req, stop, sink)
        except BaseException as exc:  # noqa: BLE001 - report, keep serving: one bad request must not end the engine
            fail_at_start(sink, exc)

    def cancel(self, rid: int) -> None:
        with self._lock:
            event = self._cancels.get(rid)
        if event is not None:
            event.set()

    def _ended(self, rid: int) -> None:
        with self._lock:
            self._cancels.pop(rid, None)
        self._busy.exit()


def _heartbeat(out: _Sender, busy: _Busy, interval: float, loaded: list[EngineRuntime]) -> None:
    """Send ("beat",) every ``interval`` seconds while the engine is busy and its runtime healthy (``loaded``
    holds the runtime once there is one): silence makes the server's watchdog replace the engine."""
    while True:
        busy.wait()
        time.sleep(interval)
        if busy.is_set() and (not loaded or loaded[0].healthy()):
            try:
                out.send(("beat",))
            except (BrokenPipeError, ConnectionResetError, OSError):
                return


def engine_main(conn: Connection, cancel_event: CancelFlag, beat_interval: float = 0.0) -> None:
    """Entry point of the child process. ``beat_interval`` > 0 turns the generation heartbeat on."""
    engine: EngineRuntime | None = None
    loaded: list[EngineRuntime] = []  # the runtime, for the heartbeat thread
    out = _Sender(conn)
    busy = _Busy()
    generations = _Generations(out, busy, cancel_event)
    if beat_interval > 0:
        threading.Thread(target=_heartbeat, args=(out, busy, beat_interval, loaded), name="tandem-heartbeat",
                         daemon=True).start()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        kind = msg[0]
        try:
            if kind == "exit":
                # A packed-weight cache still being written would be lost if this process were killed
                # (the next load would pay the whole repack again): finish it first, beating meanwhile so
                # the server sees an engine at work, not a frozen one (EngineClient.close).
                while engine is not None and not engine.finish_writes(EXIT_BEAT_SECONDS):
                    out.send(("beat",))
                if engine is not None:
                    # a generation still sending its last chunk reads the weights the close releases
                    busy.wait_idle(EXIT_IDLE_SECONDS)
                    # unload: a backend server it started stops (never one it attached to), beating while it exits
                    closer = threading.Thread(target=engine.close, name="tandem-engine-close", daemon=True)
                    closer.start()
                    while closer.join(EXIT_BEAT_SECONDS) is None and closer.is_alive():
                        out.send(("beat",))
                out.send(("ok", None))
                return
            if kind == "health":
                if engine is not None and not engine.healthy():
                    out.send(("error", "the engine's backend stopped answering", 500))
                else:
                    out.send(("ok", {"loaded": engine is not None, "pid": os.getpid()}))
            elif kind == "load":
                engine = load_runtime(msg[1])
                loaded.append(engine)
                out.send(("ok", engine.facts))
            elif engine is None:
                out.send(("failed", msg[1], "no model loaded", 500) if kind == "generate" else
                         ("error", "no model loaded", 500))
            # Each of these can take a while (a whole context's text, a large batch): the heartbeat tells
            # them from a freeze, whose bound is seconds.
            elif kind == "tokenize":
                with busy.held():
                    out.send(("ok", engine.tokenize(msg[1], add_bos=msg[2])))
            elif kind == "detokenize":
                with busy.held():
                    out.send(("ok", engine.detokenize(msg[1])))
            elif kind == "embed":
                with busy.held():
                    out.send(("ok", engine.embed(msg[1])))
            elif kind == "generate" and engine.facts.pooling is not None:
                out.send(("failed", msg[1], "an embedding model does not generate", 400))
            elif kind == "generate":
                generations.start(engine, msg[1], msg[2])
            elif kind == "cancel":
                generations.cancel(msg[1])
            else:
                out.send(("error", f"unknown engine command {kind!r}", 500))
        except (BrokenPipeError, ConnectionResetError):
            return
        except BaseException as exc:  # report, keep serving: one bad request must not end the engine
            message, status = _reported(exc)
            try:
                out.send(("error", message, status))
            except (BrokenPipeError, ConnectionResetError):
                return
