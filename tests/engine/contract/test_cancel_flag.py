"""The engine's cancel flag survives an engine killed at any moment: the server's ``set()`` (called on
its event loop when a client goes away or a stream fails) must never wait on the dead process.

``multiprocessing.Event`` failed this: the engine polls it every round under a semaphore, and a SIGKILL
that lands while the semaphore is held left it held, freezing the whole server (seen in CI as three
engine-kill tests timing out).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

from server.engine_process.client import EngineClient

_CTX = mp.get_context("spawn")


def _poll_forever(flag, ready) -> None:
    ready.set()
    while True:  # what the engine does between rounds, as fast as it can
        flag.is_set()


def _set_returns(flag, within: float) -> bool:
    t = threading.Thread(target=flag.set, daemon=True)
    t.start()
    t.join(within)
    return not t.is_alive()


def test_cancel_never_blocks_after_the_poller_is_killed() -> None:
    client = EngineClient()
    try:
        flag = client._cancel  # the very object the engine process polls
        for attempt in range(12):
            flag.clear()
            ready = _CTX.Event()
            poller = _CTX.Process(target=_poll_forever, args=(flag, ready), daemon=True)
            poller.start()
            assert ready.wait(30)
            time.sleep(0.02 + 0.007 * attempt)  # land the kill at varied points of the poll loop
            os.kill(poller.pid, signal.SIGKILL)
            poller.join(5)
            returned = _set_returns(flag, within=2.0)  # a name, so a failure report never repr()s the flag
            assert returned, f"cancel blocked after kill {attempt + 1}"
            assert flag.is_set()
    finally:
        client.kill()
