"""Graceful shutdown of a real `tandem serve` process: SIGTERM (what Ctrl-C also triggers) with a stream in
flight ends that stream with a final line (done or `{"error": ...}`) and the process exits within a bound."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from server.serving import SHUTDOWN_GRACE
from tests.server_thread import free_port, make_store

ROOT = Path(__file__).resolve().parents[2]


def test_sigterm_ends_streams_with_a_final_line(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    port = free_port()
    env = {**os.environ, "TANDEM_HOST": f"127.0.0.1:{port}", "TANDEM_MODELS": str(store.root),
           "TANDEM_NUM_THREAD": "1", "TANDEM_NOPRUNE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            try:
                if httpx.get(url + "/", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        body = {"model": "tiny", "prompt": "hello", "options": {"num_predict": -1}}
        with httpx.stream("POST", url + "/api/generate", json=body, timeout=30) as r:
            lines = r.iter_lines()
            assert json.loads(next(lines))["done"] is False
            proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            rest = [json.loads(line) for line in lines if line]
        assert rest, "no line after SIGTERM"
        last = rest[-1]
        assert last.get("done") is True or last == {"error": "server is shutting down"}, last
        assert all(item.get("done") is False for item in rest[:-1])
        # uvicorn re-raises the signal it caught once it has shut down, so the exit reads as SIGTERM's.
        assert proc.wait(timeout=SHUTDOWN_GRACE + 15) in (0, -signal.SIGTERM)
        assert time.monotonic() - t0 < SHUTDOWN_GRACE + 15
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


def test_drain_ends_ndjson_and_sse_streams_and_refuses_new_requests(tmp_path: Path) -> None:
    """The drain itself, with a fake engine: after the grace, a native stream ends with the error line and a
    /v1 stream with an SSE error event; a request arriving meanwhile is a 503."""
    import asyncio

    from server.settings import Settings
    from tests.server.test_server_lifecycle import FakeEngine
    from tests.server_thread import ServerThread

    store = make_store(tmp_path)
    FakeEngine.step = 0.02
    with ServerThread(store, Settings(), engine_factory=FakeEngine) as srv, httpx.Client(base_url=srv.url,
                                                                                         timeout=30) as c:
        with c.stream("POST", "/api/chat", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                                 "options": {"num_predict": 100000}}) as r:
            lines = r.iter_lines()
            assert json.loads(next(lines))["done"] is False
            (stream,) = srv.lifecycle._streams
            drain = asyncio.run_coroutine_threadsafe(srv.lifecycle.drain(0.2), stream._loop)
            rest = [json.loads(line) for line in lines if line]
        assert rest[-1] == {"error": "server is shutting down"}
        drain.result(5)
        r = c.post("/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False})
        assert (r.status_code, r.json()) == (503, {"error": "server is shutting down"})

    FakeEngine.instances.clear()
    with ServerThread(store, Settings(), engine_factory=FakeEngine) as srv, httpx.Client(base_url=srv.url,
                                                                                         timeout=30) as c:
        with c.stream("POST", "/v1/chat/completions", json={
                "model": "tiny", "stream": True, "max_tokens": 100000,
                "messages": [{"role": "user", "content": "hi"}]}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")
            (stream,) = srv.lifecycle._streams
            asyncio.run_coroutine_threadsafe(srv.lifecycle.drain(0.2), stream._loop).result(5)
            events = [line for line in lines if line.startswith("data: ")]
        error = json.loads(events[-1].removeprefix("data: "))["error"]
        assert error["message"] == "server is shutting down"
