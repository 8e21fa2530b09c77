"""The server-side handle on one engine process: load, tokenize, generate as streams, embed, cancel, health.

Calls block; the server runs them in worker threads. Calls (load, tokenize, health, ...) are answered one at
a time, in order; generations are streams tagged with an id, as many at once as the engine has sequence
slots. A reader thread owns the pipe's receiving end and routes every message: a stream's to that stream's
queue, an answer to the call waiting for it.

The watchdog lives here: with a ``timeout``, every wait (a stream's next chunk, a call's answer) gives up
once the engine has sent nothing at all for ``timeout`` seconds; the engine's heartbeat (sent every
``timeout / 4`` at most while it generates) counts, so a long prefill is not mistaken for a freeze. An
engine that misses the bound is killed (its pipe state is unknown) and every waiter gets
``EngineUnresponsiveError``; one that dies gives every waiter ``EngineCrashedError``.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import threading
import time
from typing import Any, Iterator

from engine.contract.cancel_flag import CancelFlag
from server.engine_process.embed_batcher import EmbedBatcher
from engine.contract.protocol import (
    EXIT_FINISH_CAP,
    EmbedRequest,
    EmbedResult,
    EngineCrashedError,
    EngineError,
    EngineUnresponsiveError,
    GenerateRequest,
    GenerateResult,
    LoadSpec,
    ModelFacts,
    TokenChunk,
)

# spawn, not fork: the server may hold threads and sockets, and torch must initialise fresh in the child.
_CTX = mp.get_context("spawn")
ENGINE_MAIN_MODULE = "engine.process.worker"  # where the child process starts: its engine_main()


def await_exit_answer(conn, silence: float, cap: float) -> bool:
    """Read an exiting engine's messages until its answer: True once it came, False when the engine was
    silent for ``silence`` seconds or beat for longer than ``cap`` (then the caller kills it)."""
    deadline = time.monotonic() + silence + cap
    while time.monotonic() < deadline and conn.poll(min(silence, max(0.0, deadline - time.monotonic()))):
        if conn.recv()[0] != "beat":
            return True
    return False


class _Inbox:
    """One stream's messages in arrival order, and the condition its consumer waits on: the reader wakes only the
    stream a message is for (eight streams woken for each token of one cost the engine's cores under load)."""

    def __init__(self, lock: threading.Lock) -> None:
        self.messages: list[tuple] = []
        self.ready = threading.Condition(lock)

    def pop(self) -> tuple | None:
        return self.messages.pop(0) if self.messages else None


class EngineClient:
    def __init__(self, timeout: float | None = None) -> None:
        """``timeout``: seconds without any message from a busy engine before it counts as frozen
        (None: wait forever, no heartbeat)."""
        self._conn, child_conn = _CTX.Pipe(duplex=True)
        self._cancel = CancelFlag(_CTX)
        self._timeout = timeout
        self._embeds = EmbedBatcher(lambda req: self._call(("embed", req), self._timeout))
        beat = min(1.0, timeout / 4) if timeout else 0.0
        # Named, not imported here: the server reaches the engine only through the contract (tests/test_layout.py);
        # the worker module itself imports torch only inside the child.
        engine_main = importlib.import_module(ENGINE_MAIN_MODULE).engine_main
        self._proc = _CTX.Process(target=engine_main, args=(child_conn, self._cancel, beat), daemon=True,
                                  name="tandem-engine")
        self._proc.start()
        child_conn.close()
        self._call_lock = threading.Lock()  # one call (not stream) in flight at a time
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # guards what follows
        self._state = threading.Condition(self._lock)  # notified on a call's answer and on failure
        self._replies: list[tuple] = []
        self._streams: dict[int, _Inbox] = {}  # each notified on its own messages and on failure
        self._next_id = 0
        self._failure: EngineCrashedError | None = None  # set once the engine died or was killed
        self._waiting = 0  # calls and streams waiting for the engine now
        self._last_heard = time.monotonic()  # when the engine last sent anything (heartbeats count)
        self._reader_started = False
        self._exiting = False
        self.facts: ModelFacts | None = None

    # -- plumbing -----------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.is_alive()

    def _crashed(self) -> EngineCrashedError:
        self._proc.join(timeout=1)
        code = self._proc.exitcode
        how = f"exit code {code}" if code is None or code >= 0 else f"signal {-code}"
        return EngineCrashedError(f"engine process exited unexpectedly ({how})")

    def _unresponsive(self, timeout: float) -> EngineUnresponsiveError:
        """Kill a frozen engine; every waiter gets the error returned (set before the kill, so that the
        reader's crash report of the closed pipe does not take its place)."""
        error = EngineUnresponsiveError(f"engine process stopped responding (no answer within {timeout:g}s); "
                                        "it was stopped and the next request starts a new one")
        self._fail(error)
        self._proc.kill()
        self._proc.join(5)
        return error

    def _fail(self, error: EngineCrashedError) -> None:
        with self._state:
            if self._failure is None:
                self._failure = error
            self._state.notify_all()
            for inbox in self._streams.values():
                inbox.ready.notify_all()

    def _start_reader(self) -> None:
        with self._state:
            if self._reader_started:
                return
            self._reader_started = True
        threading.Thread(target=self._read, name="tandem-engine-reader", daemon=True).start()

    def _read(self) -> None:
        """Route every message from the engine until the pipe closes."""
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, ConnectionResetError, BrokenPipeError, OSError):
                if not self._exiting:
                    self._fail(self._crashed())
                return
            with self._state:
                self._last_heard = time.monotonic()
                kind = msg[0]
                if kind in ("chunk", "done", "failed"):
                    inbox = self._streams.get(msg[1])
                    if inbox is not None:  # a stream its consumer abandoned may still send its last words
                        inbox.messages.append(msg)
                        inbox.ready.notify()
                elif kind != "beat":  # a beat wakes nobody: a waiter rechecks the silence at its own deadline
                    self._replies.append(msg)
                    self._state.notify_all()

    def _wait(self, ready, timeout: float | None, condition: threading.Condition | None = None):
        """Wait on ``condition`` (the calls' by default) until ``ready()`` returns a message (under the state
        lock), the engine fails, or it stays silent past ``timeout`` (then it is killed)."""
        condition = condition or self._state
        with condition:
            self._waiting += 1
            try:
                while True:
                    msg = ready()
                    if msg is not None:
                        return msg
                    if self._failure is not None:
                        raise self._failure
                    if timeout is not None:
                        silent = time.monotonic() - self._last_heard
                        if silent >= timeout:
                            break
                        condition.wait(timeout - silent)
                    else:
                        condition.wait()
            finally:
                self._waiting -= 1
        raise self._unresponsive(timeout)

    def silent_for(self) -> float:
        """Seconds the calls and streams in progress have waited without hearing from the engine (0 when
        none waits)."""
        with self._state:
            return time.monotonic() - self._last_heard if self._waiting else 0.0

    def _send(self, msg: tuple) -> None:
        with self._state:
            if self._failure is not None:
                raise self._failure
            if not self._waiting:
                self._last_heard = time.monotonic()  # an idle engine's silence says nothing
        try:
            with self._send_lock:
                self._conn.send(msg)
        except (BrokenPipeError, ConnectionResetError, OSError):
            error = self._crashed()
            self._fail(error)
            raise error from None

    def _call(self, msg: tuple, timeout: float | None = None) -> Any:
        if not self._call_lock.acquire(timeout=-1 if timeout is None else timeout):
            raise self._unresponsive(timeout)  # a call ahead of this one never got its answer
        try:
            self._start_reader()
            self._send(msg)
            reply = self._wait(lambda: self._replies.pop(0) if self._replies else None, timeout)
        finally:
            self._call_lock.release()
        if reply[0] == "error":
            raise EngineError(reply[1], reply[2])
        return reply[1]

    # -- interface -------------------------------------------------------------------------------
    def load(self, spec: LoadSpec, timeout: float | None = None) -> ModelFacts:
        self.facts = self._call(("load", spec), timeout)
        return self.facts

    def tokenize(self, text: str, add_bos: bool | None = None) -> list[int]:
        return self._call(("tokenize", text, add_bos), self._timeout)

    def detokenize(self, ids: list[int]) -> str:
        return self._call(("detokenize", list(ids)), self._timeout)

    def embed(self, req: EmbedRequest) -> EmbedResult:
        """Every input's pooled vector (an embedding model only). Requests made at the same time from several
        threads go to the engine as one call (server.engine_process.embed_batcher)."""
        return self._embeds.embed(req)

    def health(self, timeout: float = 5.0) -> dict:
        if not self.alive():
            raise self._crashed()
        return self._call(("health",), timeout)

    def cancel(self) -> None:
        """Ask every running generation to stop at its next round boundary."""
        self._cancel.set()
        with self._state:
            ids = list(self._streams)
        for rid in ids:
            try:
                self._send(("cancel", rid))
            except EngineError:
                return

    def generate(self, req: GenerateRequest) -> "GenerationHandle":
        """Stream chunks, then the final result. Closing the iterator early (or ``cancel()`` on it) stops
        this generation alone; the others on the engine go on."""
        with self._state:
            self._next_id += 1
            rid = self._next_id
            self._streams[rid] = _Inbox(self._lock)
        self._cancel.clear()
        return GenerationHandle(self, rid, req)

    def _stream(self, rid: int, req: GenerateRequest) -> Iterator[TokenChunk | GenerateResult]:
        finished = False
        try:
            self._start_reader()
            self._send(("generate", rid, req))
            inbox = self._streams[rid]
            while True:
                try:
                    msg = self._wait(inbox.pop, self._timeout, inbox.ready)
                except EngineCrashedError:
                    finished = True  # dead or killed: nothing left to drain
                    raise
                if msg[0] == "chunk":
                    yield msg[2]
                elif msg[0] == "done":
                    finished = True
                    yield msg[2]
                    return
                else:  # failed
                    finished = True
                    raise EngineError(msg[2], msg[3])
        finally:
            if not finished and self.alive():
                try:
                    self._send(("cancel", rid))
                    inbox = self._streams[rid]
                    while self._wait(inbox.pop, self._timeout, inbox.ready)[0] == "chunk":
                        pass
                except EngineError:
                    pass
            with self._state:
                self._streams.pop(rid, None)

    def close(self, timeout: float = 5.0, finish_cap: float = EXIT_FINISH_CAP) -> None:
        """Ask the engine to exit; kill it if it stays silent for ``timeout`` seconds. Generations in
        progress are cancelled first, so closing never waits for them to run to completion, and a frozen
        engine costs the bound, not a hang. An engine that beats while it finishes writing its
        packed-weight cache is given up to ``finish_cap`` seconds more (the write is the next load's
        speed; killed halfway it is lost)."""
        self.cancel()
        if self._proc.is_alive() and self._call_lock.acquire(timeout=timeout):
            answered = False
            try:
                self._exiting = True
                with self._state:
                    reading = self._reader_started
                    self._replies.clear()
                with self._send_lock:
                    self._conn.send(("exit",))
                if reading:  # the reader routes the answer; beats keep the engine alive up to the cap
                    deadline = time.monotonic() + timeout + finish_cap
                    with self._state:
                        while not self._replies and self._failure is None and time.monotonic() < deadline and \
                                time.monotonic() - self._last_heard < timeout:
                            self._state.wait(0.1)
                        answered = bool(self._replies)
                else:
                    answered = await_exit_answer(self._conn, timeout, finish_cap)
            except (BrokenPipeError, OSError, EOFError):
                pass
            finally:
                self._call_lock.release()
            self._proc.join(timeout if answered else 0)  # a silent one has had its bound: killed below
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._exiting = True
        self._conn.close()

    def kill(self) -> None:
        """Hard stop (used by tests and by unload when the engine does not answer)."""
        self._proc.kill()
        self._proc.join(5)


class GenerationHandle:
    """One generation's stream on an ``EngineClient``: iterate it for chunks and the result; ``cancel()``
    stops this generation at its next round (the others on the engine go on); ``close()`` cancels and
    drains it."""

    def __init__(self, client: EngineClient, rid: int, req: GenerateRequest):
        self._client = client
        self.id = rid
        self._it = client._stream(rid, req)

    def __iter__(self) -> "GenerationHandle":
        return self

    def __next__(self) -> TokenChunk | GenerateResult:
        return next(self._it)

    def cancel(self) -> None:
        try:
            self._client._send(("cancel", self.id))
        except EngineError:
            pass

    def close(self) -> None:
        self._it.close()
