"""An engine asked to exit first finishes the packed-weight cache it is still writing, beating meanwhile;
the client waits for it while it beats, and kills it once it falls silent or beats past the cap. A kill
halfway through the write would cost the next load the whole repack (about 4 s of the 1.5B's load)."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from dataclasses import dataclass

import torch

from engine.process import worker
from server.engine_process.client import await_exit_answer
from engine.contract.protocol import LoadSpec


def _send_later(conn, beats: int, interval: float, answer: bool) -> threading.Thread:
    def run():
        try:
            for _ in range(beats):
                time.sleep(interval)
                conn.send(("beat",))
            if answer:
                conn.send(("ok", None))
        except OSError:  # the reader gave up and closed its end
            pass
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_beats_keep_the_client_waiting_past_the_silence_bound():
    here, there = mp.Pipe()
    _send_later(there, beats=6, interval=0.2, answer=True)  # 1.2 s in all, each gap under the 0.6 s bound
    t0 = time.monotonic()
    assert await_exit_answer(here, silence=0.6, cap=30)
    assert time.monotonic() - t0 >= 1.1


def test_silence_or_endless_beats_give_up():
    here, there = mp.Pipe()
    _send_later(there, beats=1, interval=0.1, answer=False)  # one beat, then nothing
    t0 = time.monotonic()
    assert not await_exit_answer(here, silence=0.5, cap=30)
    assert time.monotonic() - t0 < 5

    here, there = mp.Pipe()
    _send_later(there, beats=100, interval=0.1, answer=True)  # would answer after 10 s
    t0 = time.monotonic()
    assert not await_exit_answer(here, silence=0.5, cap=1.0)
    assert time.monotonic() - t0 < 3


@dataclass
class _Facts:
    pooling: None = None


class _WritingRuntime:
    """A loaded engine whose cache write finishes on the third wait."""

    def __init__(self):
        self.facts = _Facts()
        self.waits = 0

    def finish_writes(self, timeout: float) -> bool:
        self.waits += 1
        time.sleep(min(timeout, 0.05))
        return self.waits >= 3

    def close(self) -> None:
        assert self.waits >= 3, "closed before its cache write finished"
        self.closed = True


def test_exit_waits_for_the_cache_write_and_beats_meanwhile(monkeypatch):
    import engine.runtime

    runtime = _WritingRuntime()
    monkeypatch.setattr(engine.runtime.ModelRuntime, "load", classmethod(lambda cls, spec: runtime))
    monkeypatch.setattr(worker, "EXIT_BEAT_SECONDS", 0.01)
    here, there = mp.Pipe()
    t = threading.Thread(target=worker.engine_main, args=(there, threading.Event()), daemon=True)
    t.start()
    here.send(("load", LoadSpec(model_path="unused", num_thread=torch.get_num_threads())))
    assert here.recv()[0] == "ok"
    here.send(("exit",))
    messages = []
    while not messages or messages[-1][0] == "beat":
        assert here.poll(10)
        messages.append(here.recv())
    t.join(10)
    assert not t.is_alive()
    assert runtime.waits == 3 and runtime.closed  # unloaded once its write was done
    assert messages == [("beat",), ("beat",), ("ok", None)]
