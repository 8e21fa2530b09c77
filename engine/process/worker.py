"""The engine's own process: loads one model (target + drafter) and serves requests over a pipe.

Running the models in a child process is what lets the server survive the engine: a segfault in a
kernel, an out-of-memory kill or a runaway allocation ends this process, and the server only sees a
closed pipe, which it reports as an error for the request in flight.

Protocol (tuples over a `multiprocessing.Connection`; one request at a time):
  server -> engine: ("load", LoadSpec) | ("generate", GenerateRequest) | ("tokenize", text, add_bos)
                    | ("detokenize", ids) | ("health",) | ("exit",)
  engine -> server: ("ok", payload) | ("chunk", TokenChunk) | ("done", GenerateResult)
                    | ("error", message, status)
Cancellation uses a shared Event, checked by the decode loop between rounds, so a cancel never
interrupts a forward pass halfway and the caches stay consistent.
"""

from __future__ import annotations

import os
import traceback
from multiprocessing.connection import Connection
from typing import Any

from engine.process.protocol import EngineError, GenerateResult, LoadSpec


def _error_message(exc: BaseException) -> tuple[str, int]:
    """The (message, status) a client sees. Only an ``EngineError`` carries text meant for clients;
    any other exception is a bug or a resource failure whose text (types, paths, tensor shapes)
    goes to the engine's stderr, not into an HTTP answer."""
    if isinstance(exc, EngineError):
        return str(exc), exc.status
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return "out of memory", 500
    return "engine error: internal error (see the server log)", 500


def engine_main(conn: Connection, cancel_event: Any) -> None:
    """Entry point of the child process."""
    import torch  # imported here: the server process never loads torch

    engine = None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        kind = msg[0]
        try:
            if kind == "exit":
                conn.send(("ok", None))
                return
            if kind == "health":
                conn.send(("ok", {"loaded": engine is not None, "pid": os.getpid()}))
            elif kind == "load":
                spec: LoadSpec = msg[1]
                torch.set_num_threads(spec.num_thread if spec.num_thread > 0 else (os.cpu_count() or 1))
                from engine.runtime import ModelRuntime

                engine = ModelRuntime.load(spec)
                conn.send(("ok", engine.facts))
            elif engine is None:
                conn.send(("error", "no model loaded", 500))
            elif kind == "tokenize":
                conn.send(("ok", engine.tokenize(msg[1], add_bos=msg[2])))
            elif kind == "detokenize":
                conn.send(("ok", engine.detokenize(msg[1])))
            elif kind == "generate":
                for item in engine.generate(msg[1], should_stop=cancel_event.is_set):
                    conn.send(("done", item) if isinstance(item, GenerateResult) else ("chunk", item))
            else:
                conn.send(("error", f"unknown engine command {kind!r}", 500))
        except (BrokenPipeError, ConnectionResetError):
            return
        except BaseException as exc:  # report, keep serving: one bad request must not end the engine
            if os.environ.get("TANDEM_DEBUG") or not isinstance(exc, EngineError):
                traceback.print_exc()
            message, status = _error_message(exc)
            try:
                conn.send(("error", message, status))
            except (BrokenPipeError, ConnectionResetError):
                return
