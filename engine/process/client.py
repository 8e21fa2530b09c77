"""The server-side handle on one engine process: load, tokenize, generate as a stream, embed, cancel, health.

Calls block; the server runs them in worker threads. One generation at a time per engine (the
scheduler serialises requests per model), so a single pipe carries everything in order.

The watchdog lives here: with a ``timeout``, every wait on the pipe (a generation's next chunk, a
tokenize) gives up after ``timeout`` seconds without any message; the engine's heartbeat (sent every
``timeout / 4`` at most while it generates) counts as a message, so a long prefill is not mistaken for
a freeze. An engine that misses the bound is killed (its pipe state is unknown, a late answer would be
read as the next request's) and the call raises ``EngineUnresponsiveError``.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from typing import Any, Iterator

from engine.process.cancel_flag import CancelFlag
from engine.process.protocol import (
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


def await_exit_answer(conn, silence: float, cap: float) -> bool:
    """Read an exiting engine's messages until its answer: True once it came, False when the engine was
    silent for ``silence`` seconds or beat for longer than ``cap`` (then the caller kills it)."""
    deadline = time.monotonic() + silence + cap
    while time.monotonic() < deadline and conn.poll(min(silence, max(0.0, deadline - time.monotonic()))):
        if conn.recv()[0] != "beat":
            return True
    return False


class EngineClient:
    def __init__(self, timeout: float | None = None) -> None:
        """``timeout``: seconds without any message from a busy engine before it counts as frozen
        (None: wait forever, no heartbeat)."""
        self._conn, child_conn = _CTX.Pipe(duplex=True)
        self._cancel = CancelFlag(_CTX)
        self._timeout = timeout
        beat = min(1.0, timeout / 4) if timeout else 0.0
        from engine.process.worker import engine_main

        self._proc = _CTX.Process(target=engine_main, args=(child_conn, self._cancel, beat), daemon=True,
                                  name="tandem-engine")
        self._proc.start()
        child_conn.close()
        # Guards the pipe: a health check from another thread must not interleave with a generation.
        self._lock = threading.Lock()
        self._last_heard = time.monotonic()  # when the engine last sent anything (heartbeats count)
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
        self._proc.kill()
        self._proc.join(5)
        return EngineUnresponsiveError(f"engine process stopped responding (no answer within {timeout:g}s); "
                                       "it was stopped and the next request starts a new one")

    def _recv(self, timeout: float | None = None) -> tuple:
        """The next message other than a heartbeat; ``timeout`` bounds the silence between messages
        (a heartbeat restarts it). Past it the engine is killed and EngineUnresponsiveError raised."""
        try:
            while True:
                if timeout is not None and not self._conn.poll(timeout):
                    raise self._unresponsive(timeout)
                msg = self._conn.recv()
                self._last_heard = time.monotonic()
                if msg[0] != "beat":
                    return msg
        except (EOFError, ConnectionResetError, BrokenPipeError, OSError):
            raise self._crashed() from None

    def silent_for(self) -> float:
        """Seconds a call in progress has waited without hearing from the engine (0 when idle)."""
        return time.monotonic() - self._last_heard if self._lock.locked() else 0.0

    def _send(self, msg: tuple) -> None:
        self._last_heard = time.monotonic()
        try:
            self._conn.send(msg)
        except (BrokenPipeError, ConnectionResetError, OSError):
            raise self._crashed() from None

    def _call(self, msg: tuple, timeout: float | None = None) -> Any:
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            raise self._unresponsive(timeout)  # the pipe is held by a stream that no longer drains
        try:
            self._send(msg)
            reply = self._recv(timeout)
        finally:
            self._lock.release()
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
        """Every input's pooled vector (an embedding model only), in one round trip."""
        return self._call(("embed", req), self._timeout)

    def health(self, timeout: float = 5.0) -> dict:
        if not self.alive():
            raise self._crashed()
        return self._call(("health",), timeout)

    def cancel(self) -> None:
        """Ask the running generation to stop at its next round boundary."""
        self._cancel.set()

    def generate(self, req: GenerateRequest) -> Iterator[TokenChunk | GenerateResult]:
        """Stream chunks, then the final result. Closing the iterator early cancels the generation
        and drains the pipe, so the next request starts clean."""
        self._lock.acquire()
        finished = False
        try:
            self._cancel.clear()
            self._send(("generate", req))
            while True:
                try:
                    reply = self._recv(self._timeout)
                except EngineCrashedError:
                    finished = True  # dead or killed: nothing left to drain
                    raise
                if reply[0] == "chunk":
                    yield reply[1]
                elif reply[0] == "done":
                    finished = True
                    yield reply[1]
                    return
                elif reply[0] == "error":
                    finished = True
                    raise EngineError(reply[1], reply[2])
                else:
                    finished = True
                    raise EngineError(f"unexpected engine reply {reply[0]!r}")
        finally:
            if not finished and self.alive():
                self._cancel.set()
                try:
                    while self._recv(self._timeout)[0] == "chunk":
                        pass
                except EngineError:
                    pass
            self._lock.release()

    def close(self, timeout: float = 5.0, finish_cap: float = EXIT_FINISH_CAP) -> None:
        """Ask the engine to exit; kill it if it stays silent for ``timeout`` seconds. A generation in
        progress is cancelled first, so closing never waits for it to run to completion, and a frozen
        engine costs the bound, not a hang. An engine that beats while it finishes writing its
        packed-weight cache is given up to ``finish_cap`` seconds more (the write is the next load's
        speed; killed halfway it is lost)."""
        self._cancel.set()
        if self._proc.is_alive() and self._lock.acquire(timeout=timeout):
            answered = False
            try:
                self._conn.send(("exit",))
                answered = await_exit_answer(self._conn, timeout, finish_cap)
            except (BrokenPipeError, OSError, EOFError):
                pass
            finally:
                self._lock.release()
            self._proc.join(timeout if answered else 0)  # a silent one has had its bound: killed below
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._conn.close()

    def kill(self) -> None:
        """Hard stop (used by tests and by unload when the engine does not answer)."""
        self._proc.kill()
        self._proc.join(5)
