"""The watchdog against a real server and real engine processes: an engine frozen with SIGSTOP (mid-stream
or idle) costs at most the request it was serving; the model is served again from a fresh engine, an unload
does not wait on the frozen one, and /api/ps stops listing it."""

from __future__ import annotations

import json
import os
import signal
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from server.lifecycle import STOP_TIMEOUT
from server.settings import Settings
from tests.server_thread import ServerThread, make_store

TIMEOUT = 2.0  # the watchdog's bound in this test (TANDEM_ENGINE_TIMEOUT)


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny target/drafter pair for the module (building it is most of a test's time)."""
    return tmp_path_factory.mktemp("watchdog")


def _engine_pid(srv: ServerThread) -> int:
    (runner,) = srv.lifecycle.loaded()
    return runner.engine.pid


def _freeze(pid: int, frozen: list[int]) -> None:
    os.kill(pid, signal.SIGSTOP)
    frozen.append(pid)


def _thaw_and_kill(frozen: list[int]) -> None:
    """The stopped engines a test left: continued and killed, so that none outlives it."""
    for pid in frozen:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _wait_ps_empty(c: httpx.Client, within: float) -> None:
    deadline = time.monotonic() + within
    while c.get("/api/ps").json()["models"]:
        assert time.monotonic() < deadline, "/api/ps still lists the frozen engine"
        time.sleep(0.05)


def test_frozen_engine_is_replaced(pair_dir: Path) -> None:
    store = make_store(pair_dir)
    frozen: list[int] = []
    body = {"model": "tiny", "prompt": "hello", "options": {"num_predict": -1}}
    try:
        with ServerThread(store, Settings(num_thread=1, engine_timeout=TIMEOUT)) as srv, \
                httpx.Client(base_url=srv.url, timeout=30) as c:
            # 1. Frozen mid-stream: the stream ends with an error line within the bound.
            with c.stream("POST", "/api/generate", json=body) as r:
                lines = r.iter_lines()
                assert json.loads(next(lines))["done"] is False
                first = _engine_pid(srv)
                _freeze(first, frozen)
                t0 = time.monotonic()
                rest = [json.loads(line) for line in lines if line]
                elapsed = time.monotonic() - t0
            assert set(rest[-1]) == {"error"} and "stopped responding" in rest[-1]["error"]
            assert all(item.get("done") is False for item in rest[:-1])
            assert elapsed < TIMEOUT + 5
            _wait_ps_empty(c, 5)

            # 2. The next request is served by a new engine.
            r = c.post("/api/generate", json={"model": "tiny", "prompt": "hello", "stream": False})
            assert r.status_code == 200 and r.json()["done"] is True
            second = _engine_pid(srv)
            assert second != first

            # 3. Frozen while idle: the health ping before reuse fails, a new engine serves the request.
            _freeze(second, frozen)
            t0 = time.monotonic()
            r = c.post("/api/generate", json={"model": "tiny", "prompt": "hello", "stream": False})
            assert r.status_code == 200 and r.json()["done"] is True
            third = _engine_pid(srv)
            assert third not in (first, second)
            assert time.monotonic() - t0 < TIMEOUT + 30  # the ping's bound, then a fresh load

            # 4. keep_alive 0 on a frozen idle engine: bounded, then killed; /api/ps is empty.
            _freeze(third, frozen)
            t0 = time.monotonic()
            r = c.post("/api/generate", json={"model": "tiny", "keep_alive": 0})
            assert r.status_code == 200 and r.json()["done_reason"] == "unload"
            assert time.monotonic() - t0 < STOP_TIMEOUT + 3
            assert c.get("/api/ps").json()["models"] == []
    finally:
        _thaw_and_kill(frozen)


def _generated_tokens(c: httpx.Client) -> float:
    m = re.search(r'^tandem_generated_tokens_total{model="tiny:latest"} ([0-9.e+]+)$', c.get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.mark.parametrize("death", ["frozen", "killed"])
def test_a_request_that_streamed_nothing_is_served_by_the_next_engine(pair_dir: Path, death: str) -> None:
    """An engine serving two sequences dies mid-batch, frozen (the watchdog kills it) or killed: the request
    that was streaming ends with an error line, the one that had not streamed a token yet is tried once on a
    new engine and answers as a healthy engine does; its tokens are generated (and counted) once."""
    store = make_store(pair_dir)
    frozen: list[int] = []
    streaming = {"model": "tiny", "prompt": "hello", "options": {"num_predict": -1}}
    waiting = {"model": "tiny", "prompt": "count to ten", "stream": False, "options": {"num_predict": 6}}
    try:
        with ServerThread(store, Settings(num_thread=1, num_parallel=2, engine_timeout=TIMEOUT)) as srv, \
                httpx.Client(base_url=srv.url, timeout=60) as c, httpx.Client(base_url=srv.url, timeout=60) as c2, \
                ThreadPoolExecutor(1) as pool:
            reference = c.post("/api/generate", json=waiting).json()  # greedy: what a healthy engine answers
            with c.stream("POST", "/api/generate", json=streaming) as r:
                lines = r.iter_lines()
                assert json.loads(next(lines))["done"] is False
                first = _engine_pid(srv)
                _freeze(first, frozen)  # the batch stops mid-step
                before = _generated_tokens(c2)
                # the second request takes the free sequence slot (no health ping for an engine in use)
                answer = pool.submit(c2.post, "/api/generate", json=waiting)
                deadline = time.monotonic() + 10
                while not any(slot.active == 2 for slot in srv.lifecycle._slots.values()):
                    assert time.monotonic() < deadline and not answer.done()
                    time.sleep(0.02)
                if death == "killed":
                    os.kill(first, signal.SIGKILL)
                rest = [json.loads(line) for line in lines if line]
            assert set(rest[-1]) == {"error"} and all(item.get("done") is False for item in rest[:-1])
            served = answer.result(60)
            assert served.status_code == 200, served.text
            assert (served.json()["response"], served.json()["eval_count"]) == (reference["response"], 6)
            assert _engine_pid(srv) != first
            assert _generated_tokens(c) - before == 6
    finally:
        _thaw_and_kill(frozen)


def test_engine_timeout_setting() -> None:
    assert Settings.from_env({}).engine_timeout == 10  # seconds: a frozen engine must not hold its model for minutes
    assert Settings.from_env({"TANDEM_ENGINE_TIMEOUT": "90s"}).engine_timeout == 90
    assert Settings.from_env({"TANDEM_ENGINE_TIMEOUT": "45"}).engine_timeout == 45
    assert Settings.from_env({"TANDEM_ENGINE_TIMEOUT": "0"}).engine_timeout == pytest.approx(float("inf"))


def test_a_model_whose_engine_froze_serves_again_within_30_seconds_by_default(pair_dir: Path) -> None:
    """Default settings: from a SIGSTOP mid-stream to the next request served by a fresh engine, within 30 s (the
    issue's bound; 5 minutes before)."""
    store = make_store(pair_dir)
    frozen: list[int] = []
    try:
        with ServerThread(store, Settings(num_thread=1)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
            with c.stream("POST", "/api/generate", json={"model": "tiny", "prompt": "hello",
                                                         "options": {"num_predict": -1}}) as r:
                lines = r.iter_lines()
                assert json.loads(next(lines))["done"] is False
                _freeze(_engine_pid(srv), frozen)
                t0 = time.monotonic()
                assert "error" in [json.loads(line) for line in lines if line][-1]
            r = c.post("/api/generate", json={"model": "tiny", "prompt": "hello", "stream": False})
            assert r.status_code == 200 and r.json()["done"] is True
            assert time.monotonic() - t0 < 30
    finally:
        _thaw_and_kill(frozen)


def test_the_heartbeat_outlives_a_call_that_ends_while_generations_run() -> None:
    """The engine is busy while anything runs: a tokenization that ends beside a generation must not silence
    the generation's heartbeat (a flag cleared by the first to finish would, and the watchdog would then kill a
    working engine after its bound)."""
    from engine.process.worker import _Busy

    busy = _Busy()
    busy.enter()  # a generation
    with busy.held():  # a tokenization
        assert busy.is_set()
    assert busy.is_set()
    busy.exit()
    assert not busy.is_set()


def test_long_prefill_is_not_a_freeze(pair_dir: Path) -> None:
    """A prefill that sends nothing for longer than the bound (a 4096-token prompt, one token per forward)
    survives: the engine's heartbeat is what tells it apart from a frozen engine."""
    from engine.contract.options import Options
    from server.engine_process.client import EngineClient
    from engine.contract.protocol import GenerateRequest, GenerateResult, LoadSpec
    from tests.server_thread import write_pair

    target, _ = write_pair(pair_dir)
    request = GenerateRequest(prompt="hello world " * 600, options=Options.from_map(
        {"num_predict": 2, "num_batch": 1, "temperature": 0}))

    def prefill(timeout: float | None) -> float:
        client = EngineClient(timeout=timeout)
        try:
            client.load(LoadSpec(model_path=str(target), num_ctx=4096, num_thread=1), timeout=120)
            t0 = time.monotonic()
            items = list(client.generate(request))
            assert isinstance(items[-1], GenerateResult) and items[-1].prompt_eval_count == 4096
            assert client.alive()
            return time.monotonic() - t0
        finally:
            client.close()

    # The bound is set from this machine's own prefill (a fast host finished the 4096 forwards in 1.4 s, inside
    # a fixed 2 x 0.75 s), so the prefill always outlasts it many times over.
    timeout = min(0.75, prefill(None) / 8)
    assert prefill(timeout) > 2 * timeout  # long enough that silence would have been fatal


def test_unload_does_not_wait_on_an_engine_frozen_mid_stream(pair_dir: Path) -> None:
    """keep_alive 0 while a stream runs on a frozen engine: the unload kills the silent engine after
    UNLOAD_SILENCE instead of waiting out a long TANDEM_ENGINE_TIMEOUT; the stream ends with an error line."""
    import threading

    from server.lifecycle import UNLOAD_SILENCE

    store = make_store(pair_dir)
    frozen: list[int] = []
    try:
        with ServerThread(store, Settings(num_thread=1, engine_timeout=120)) as srv, \
                httpx.Client(base_url=srv.url, timeout=30) as c:
            with c.stream("POST", "/api/generate", json={"model": "tiny", "prompt": "hello",
                                                         "options": {"num_predict": -1}}) as r:
                lines = r.iter_lines()
                assert json.loads(next(lines))["done"] is False
                _freeze(_engine_pid(srv), frozen)
                unload: dict = {}

                def ask() -> None:
                    t0 = time.monotonic()
                    unload["response"] = c.post("/api/generate", json={"model": "tiny", "keep_alive": 0})
                    unload["seconds"] = time.monotonic() - t0

                asker = threading.Thread(target=ask)
                asker.start()
                rest = [json.loads(line) for line in lines if line]
                asker.join(30)
            assert set(rest[-1]) == {"error"}
            assert unload["response"].status_code == 200 and unload["response"].json()["done_reason"] == "unload"
            assert unload["seconds"] < UNLOAD_SILENCE + STOP_TIMEOUT + 3
            assert c.get("/api/ps").json()["models"] == []
    finally:
        _thaw_and_kill(frozen)


def test_idle_engine_that_misses_the_ping_is_dropped(pair_dir: Path) -> None:
    """The periodic ping (fake engine): an idle engine that stops answering leaves /api/ps (loaded()) on its
    own, and the next request loads a new one."""
    import asyncio

    from blobs.model import load_stored_model
    from server.lifecycle import ModelLifecycle
    from tests.server.test_server_lifecycle import FakeEngine, run_one

    FakeEngine.instances.clear()
    model = load_stored_model(make_store(pair_dir), "tiny")

    async def main() -> None:
        s = ModelLifecycle(Settings(), engine_factory=FakeEngine)
        s.ping_interval = 0.05
        assert await run_one(s, model) == "t0 t1 t2 "
        first = FakeEngine.instances[0]
        assert [r.engine for r in s.loaded()] == [first]
        first.frozen = True
        deadline = time.monotonic() + 5
        while s.loaded():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        assert await run_one(s, model) == "t0 t1 t2 "
        assert len(FakeEngine.instances) == 2 and [r.engine for r in s.loaded()] == [FakeEngine.instances[1]]
        await s.shutdown()

    asyncio.run(main())
