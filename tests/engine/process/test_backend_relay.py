"""The relay in front of a backend server (engine/backend_process.py): its SSE reading, its cancel watching and its
health monitor, which every token of a llama-server or vLLM stream goes through."""

from __future__ import annotations

import threading
import time

import engine.backend_process as bp


class _Response:
    def __init__(self, chunks: list[bytes]):
        self._chunks = chunks

    def iter_bytes(self):
        yield from self._chunks


def test_sse_payloads_are_read_whole_across_chunk_boundaries():
    body = (b'data: {"content": "a\\u00e9", "tokens": [1]}\n\n: keep-alive comment\n\n'
            b'data: {"content": "\xc3\xa9", "tokens": [2]}\r\n\r\ndata: [DONE]')
    for size in (1, 2, 3, 7, len(body)):
        chunks = [body[i:i + size] for i in range(0, len(body), size)]
        assert list(bp.sse_data(_Response(chunks))) == [
            b'{"content": "a\\u00e9", "tokens": [1]}', b'{"content": "\xc3\xa9", "tokens": [2]}', b"[DONE]"]


class _Stream:
    def __init__(self):
        self.closed = threading.Event()

    def close(self):
        self.closed.set()


def _watchers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tandem-test-cancel"]


def test_one_watcher_closes_exactly_the_cancelled_streams_and_ends_when_none_is_watched():
    watcher = bp.CancelWatcher("test")
    flags = [threading.Event() for _ in range(8)]
    streams = [_Stream() for _ in flags]
    unwatch = [watcher.watch(s, f.is_set) for s, f in zip(streams, flags)]
    assert len(_watchers()) == 1  # one thread for every stream of the runtime
    flags[3].set()
    assert streams[3].closed.wait(2)
    time.sleep(3 * bp.CANCEL_POLL)
    assert [s.closed.is_set() for s in streams] == [i == 3 for i in range(8)]
    for end in unwatch:
        end()
    flags[5].set()  # ended streams are not closed afterwards
    deadline = time.monotonic() + 2
    while _watchers() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _watchers() and not streams[5].closed.is_set()
    again = _Stream()
    watcher.watch(again, lambda: True)  # a later stream starts a watcher again
    assert again.closed.wait(2)


def test_streamed_events_stand_for_health_pings_and_a_silent_backend_is_pinged(monkeypatch):
    monkeypatch.setattr(bp, "HEALTH_INTERVAL", 0.05)
    pings = []
    monitor = bp.HealthMonitor("test", lambda timeout: pings.append(timeout) or True, None)
    try:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:  # a stream's events arriving
            monitor.answered()
            time.sleep(0.005)
        assert pings == [] and monitor.healthy()
        time.sleep(0.5)  # silence: the monitor asks the backend itself
        assert len(pings) >= 3
    finally:
        monitor.stop()
