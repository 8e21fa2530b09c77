"""A stand-in engine process for the engine client's routing tests: every ``generate`` is answered with
``req`` chunks (an int, the request's stand-in) a few milliseconds apart, then ``done``; ``exit`` ends it."""

from __future__ import annotations

import threading
import time


def engine_main(conn, cancel_event, beat_interval: float = 0.0) -> None:
    lock = threading.Lock()

    def stream(rid: int, count: int) -> None:
        for i in range(count):
            time.sleep(0.002)
            with lock:
                conn.send(("chunk", rid, i))
        with lock:
            conn.send(("done", rid, count))

    while True:
        msg = conn.recv()
        if msg[0] == "generate":
            threading.Thread(target=stream, args=(msg[1], msg[2]), daemon=True).start()
        elif msg[0] == "exit":
            with lock:
                conn.send(("exited",))
            return
