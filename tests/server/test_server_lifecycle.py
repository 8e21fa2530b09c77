"""The model lifecycle with a fake engine (no processes, no torch): loading, serialisation, the bounded queue,
keep_alive, reloads on load-option changes, crash recovery and cancellation; plus settings parsing and
one HTTP check of the 503 answer."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from blobs import BlobStore
from blobs.model import load_stored_model
from engine.contract.options import Options
from engine.contract.protocol import (
    EngineCrashedError,
    EngineUnresponsiveError,
    GenerateRequest,
    GenerateResult,
    LoadSpec,
    ModelFacts,
    TokenChunk,
)
from engine.contract.speculation_stats import SpeculationStats
from importer import CreateRequest, create_model
from server.engine_process.stream import GenerationStream
from server.lifecycle import ModelLifecycle, QueueFullError
from server.settings import (
    FOREVER,
    DurationError,
    Settings,
    allowed_origins,
    env_keep_alive,
    keep_alive_seconds,
    parse_go_duration,
    parse_host,
)
from tests.tiny_gguf import TinySpec, write_tiny_gguf


class FakeEngine:
    """Stands in for EngineClient: one token per `step` seconds, honours cancel, can 'crash'."""

    instances: list["FakeEngine"] = []
    step = 0.01
    slots = 1  # sequences served at once (ModelFacts.num_parallel)

    def __init__(self) -> None:
        self.pid = 10_000 + len(FakeEngine.instances)
        self._alive = True
        self._cancel = threading.Event()
        self.spec: LoadSpec | None = None
        self.closed = False
        self.active = 0
        self.max_active = 0
        self.crash_after: int | None = None
        self.generated = 0
        self.cancels = 0
        self.calls = 0
        self.requests: list[GenerateRequest] = []
        self.frozen = False
        FakeEngine.instances.append(self)

    def load(self, spec: LoadSpec, timeout: float | None = None) -> ModelFacts:
        self.spec = spec
        return ModelFacts(architecture="llama", context_length=spec.num_ctx, vocab_size=300, device="cpu",
                          weight_format="f32", draft_architecture=None, draft_weight_format=None,
                          memory_bytes=1234, bos_token="", eos_token="", add_bos=False, num_parallel=FakeEngine.slots)

    def generate(self, req: GenerateRequest):
        self.calls += 1
        self.requests.append(req)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        self._cancel.clear()
        try:
            n = req.options.num_predict
            for i in range(n):
                if not self._alive:  # died while this stream ran: a dead process answers nothing
                    raise EngineCrashedError("engine process exited unexpectedly (signal 9)")
                if self._cancel.is_set():
                    break
                if self.crash_after is not None and i >= self.crash_after:
                    self._alive = False
                    raise EngineCrashedError("engine process exited unexpectedly (signal 9)")
                time.sleep(self.step)
                self.generated += 1
                yield TokenChunk(text=f"t{i} ", token_ids=[i])
            yield GenerateResult(done_reason="length", prompt_eval_count=3, prompt_cached=0,
                                 prompt_eval_duration_ns=1000, eval_count=n, eval_duration_ns=2000,
                                 context=[1, 2, 3], speculation=SpeculationStats())
        finally:
            self.active -= 1

    def tokenize(self, text: str, add_bos: bool | None = None) -> list[int]:
        return list(range(len(text.split())))

    def detokenize(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))

    def cancel(self) -> None:
        self.cancels += 1
        self._cancel.set()

    def alive(self) -> bool:
        return self._alive

    def health(self, timeout: float = 5.0) -> dict:
        if self.frozen:  # as EngineClient answers after killing an engine that missed the ping
            self._alive = False
            raise EngineUnresponsiveError("engine process stopped responding")
        return {"loaded": True, "pid": self.pid}

    def silent_for(self) -> float:
        return 0.0

    def close(self, timeout: float = 5.0) -> None:
        self.closed = True
        self._alive = False

    def kill(self) -> None:
        self._alive = False


@pytest.fixture(scope="module")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> BlobStore:
    d = tmp_path_factory.mktemp("sched")
    write_tiny_gguf(d / "t.gguf", TinySpec(arch="llama", n_layer=1, n_embd=32, n_ff=64, seed=1))
    store = BlobStore(d / "models")
    digest, _ = store.add_file(d / "t.gguf")
    create_model(store, CreateRequest(model="fake", files={"t.gguf": digest}))
    create_model(store, CreateRequest(model="fake-ctx", files={"t.gguf": digest}, parameters={"num_ctx": 128}))
    return store


@pytest.fixture(autouse=True)
def _reset() -> None:
    FakeEngine.instances.clear()
    FakeEngine.step = 0.01
    FakeEngine.slots = 1


def lifecycle(**kw) -> ModelLifecycle:
    return ModelLifecycle(Settings(**kw), engine_factory=FakeEngine)


async def run_one(s: ModelLifecycle, model, keep_alive: float = 300, load=None, num_predict: int = 3) -> str:
    lease = await s.acquire(model, Options.from_map(load), keep_alive)
    stream = GenerationStream(lease, GenerateRequest(prompt="x", options=Options(num_predict=num_predict)))
    text = ""
    async for item in stream:
        if isinstance(item, TokenChunk):
            text += item.text
    await asyncio.wait_for(stream.finished.wait(), 5)
    return text


def test_load_on_first_use_and_reuse(model_store: BlobStore) -> None:
    model = load_stored_model(model_store, "fake")

    async def main() -> None:
        s = lifecycle()
        assert s.loaded() == []
        assert await run_one(s, model) == "t0 t1 t2 "
        assert await run_one(s, model) == "t0 t1 t2 "
        assert len(FakeEngine.instances) == 1
        [r] = s.loaded()
        assert r.name == "fake:latest" and r.spec.num_ctx == 256  # the model's trained context caps 4096
        assert timedelta(seconds=290) < r.expires_at - datetime.now(timezone.utc) <= timedelta(seconds=300)
        await s.shutdown()
        assert FakeEngine.instances[0].closed

    asyncio.run(main())


def test_requests_are_serialised(model_store: BlobStore) -> None:
    model = load_stored_model(model_store, "fake")

    async def main() -> None:
        s = lifecycle()
        texts = await asyncio.gather(*(run_one(s, model, num_predict=5) for _ in range(4)))
        assert texts == ["t0 t1 t2 t3 t4 "] * 4
        assert len(FakeEngine.instances) == 1 and FakeEngine.instances[0].max_active == 1
        await s.shutdown()

    asyncio.run(main())


def test_an_engine_with_slots_serves_that_many_requests_at_once(model_store: BlobStore) -> None:
    model = load_stored_model(model_store, "fake")
    FakeEngine.slots = 4

    async def main() -> None:
        s = lifecycle()
        texts = await asyncio.gather(*(run_one(s, model, num_predict=5) for _ in range(10)))
        assert texts == ["t0 t1 t2 t3 t4 "] * 10
        assert len(FakeEngine.instances) == 1 and FakeEngine.instances[0].max_active == 4
        await s.shutdown()

    asyncio.run(main())


def test_sixty_four_clients_against_four_slots_complete_or_get_a_clean_503(model_store: BlobStore) -> None:
    model = load_stored_model(model_store, "fake")
    FakeEngine.slots = 4

    async def main() -> None:
        s = lifecycle(max_queue=8)

        async def client() -> str:
            try:
                return await run_one(s, model, num_predict=4)
            except QueueFullError as e:
                assert e.status == 503
                return "503"

        got = await asyncio.gather(*(client() for _ in range(64)))
        done = [g for g in got if g != "503"]
        # all 64 arrive while the first loads the model: 8 may wait (the queue), the others are refused at once
        assert set(done) == {"t0 t1 t2 t3 "} and len(done) >= 8 and got.count("503") == 64 - len(done)
        assert FakeEngine.instances[0].max_active == 4 and len(FakeEngine.instances) == 1
        assert await run_one(s, model) == "t0 t1 t2 "  # nothing was left held
        await s.shutdown()

    asyncio.run(main())


def test_other_load_options_wait_for_the_running_requests_then_reload(model_store: BlobStore) -> None:
    model = load_stored_model(model_store, "fake")
    FakeEngine.slots = 4
    FakeEngine.step = 0.02

    async def main() -> None:
        s = lifecycle()
        running = [asyncio.create_task(run_one(s, model, num_predict=10)) for _ in range(2)]
        await asyncio.sleep(0.05)
        other = asyncio.create_task(run_one(s, model, load={"draft_vocab": 0}))
        assert await asyncio.gather(*running) == ["t0 t1 t2 t3 t4 t5 t6 t7 t8 t9 "] * 2
        assert await other == "t0 t1 t2 "
        first, second = FakeEngine.instances
        assert first.generated == 20 and first.closed and second.spec.draft_vocab == 0
        await s.shutdown()

    asyncio.run(main())


def test_an_engine_that_dies_with_a_full_batch_fails_each_request_and_restarts(model_store: BlobStore) -> None:
    model = load_stored_model(model_store, "fake")
    FakeEngine.slots = 4

    async def main() -> None:
        s = lifecycle()
        await run_one(s, model)
        FakeEngine.instances[0].crash_after = 2

        async def doomed() -> str:
            with pytest.raises(EngineCrashedError):
                await run_one(s, model, num_predict=10)
            return "failed"

        assert await asyncio.gather(*(doomed() for _ in range(4))) == ["failed"] * 4
        assert await run_one(s, model) == "t0 t1 t2 "
        assert len(FakeEngine.instances) == 2
        await s.shutdown()

    asyncio.run(main())


def test_queue_bound(model_store: BlobStore) -> None:
    model = load_stored_model(model_store, "fake")

    async def main() -> None:
        s = lifecycle(max_queue=1)
        running = await s.acquire(model, Options(), 300)
        waiting = asyncio.create_task(s.acquire(model, Options(), 300))
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFullError) as e:
            await s.acquire(model, Options(), 300)
        assert e.value.status == 503
        assert str(e.value) == "server busy, please try again.  maximum pending requests exceeded"
        running.release()
        lease = await asyncio.wait_for(waiting, 5)
        lease.release()
        await s.shutdown()

    asyncio.run(main())


def test_keep_alive_zero_expiry_and_forever(model_store: BlobStore) -> None:
    model = load_stored_model(model_store, "fake")

    async def main() -> None:
        s = lifecycle()
        await run_one(s, model, keep_alive=0)
        await asyncio.sleep(0.05)
        assert s.loaded() == [] and FakeEngine.instances[0].closed

        await run_one(s, model, keep_alive=0.2)
        assert len(s.loaded()) == 1
        await asyncio.sleep(0.5)
        assert s.loaded() == [] and FakeEngine.instances[1].closed

        await run_one(s, model, keep_alive=FOREVER)
        [r] = s.loaded()
        assert r.expires_at.year > datetime.now().year + 200
        await s.shutdown()

    asyncio.run(main())


def test_a_smaller_context_is_served_by_the_loaded_engine(model_store: BlobStore) -> None:
    """Clients asking for different num_ctx share one engine (each request is capped at its own num_ctx in the
    engine) instead of reloading it for each other; a larger one than loaded still reloads."""
    model = load_stored_model(model_store, "fake")

    async def main() -> None:
        s = lifecycle(context_length=64)
        await run_one(s, model)
        await run_one(s, model, load={"num_ctx": 48})
        await run_one(s, model, load={"num_ctx": 32})
        assert len(FakeEngine.instances) == 1 and FakeEngine.instances[0].spec.num_ctx == 64
        await run_one(s, model, load={"num_ctx": 128})
        assert len(FakeEngine.instances) == 2 and FakeEngine.instances[1].spec.num_ctx == 128
        await run_one(s, model, load={"num_ctx": 32})
        assert len(FakeEngine.instances) == 2
        await run_one(s, model, load={"num_ctx": 32, "draft_vocab": 0})  # another load option still reloads
        assert len(FakeEngine.instances) == 3
        await s.shutdown()

    asyncio.run(main())


def test_load_option_change_reloads(model_store: BlobStore) -> None:
    model = load_stored_model(model_store, "fake")
    with_ctx = load_stored_model(model_store, "fake-ctx")

    async def main() -> None:
        s = lifecycle(context_length=64)
        await run_one(s, model)
        assert FakeEngine.instances[0].spec.num_ctx == 64  # the server default
        await run_one(s, model, load={"num_ctx": 100})
        assert len(FakeEngine.instances) == 2 and FakeEngine.instances[0].closed
        assert FakeEngine.instances[1].spec.num_ctx == 100
        await run_one(s, model, load={"num_ctx": 100})
        assert len(FakeEngine.instances) == 2
        # Same weights, another name with its own num_ctx parameter: one engine slot, reloaded.
        assert s.load_spec(with_ctx, Options.from_map({"num_ctx": 128})).num_ctx == 128
        # draft_vocab is load-time too: set, it reaches the engine's spec and reloads it
        assert s.load_spec(model, Options()).draft_vocab == 16384  # the default
        await run_one(s, model, load={"num_ctx": 100, "draft_vocab": 0})
        assert len(FakeEngine.instances) == 3 and FakeEngine.instances[2].spec.draft_vocab == 0
        # the device: the CPU unless num_gpu asks for a GPU (issue 36); asking reloads onto it
        assert FakeEngine.instances[2].spec.device == "cpu"
        await run_one(s, model, load={"num_ctx": 100, "draft_vocab": 0, "num_gpu": 4, "main_gpu": 1})
        assert len(FakeEngine.instances) == 4 and FakeEngine.instances[3].spec.device == "cuda:1"
        await s.shutdown()

    asyncio.run(main())


def test_crash_gives_error_and_next_request_restarts(model_store: BlobStore) -> None:
    model = load_stored_model(model_store, "fake")

    async def main() -> None:
        s = lifecycle()
        await run_one(s, model)
        FakeEngine.instances[0].crash_after = 1
        lease = await s.acquire(model, Options(), 300)
        stream = GenerationStream(lease, GenerateRequest(prompt="x", options=Options(num_predict=5)))
        got = []
        with pytest.raises(EngineCrashedError):
            async for item in stream:
                got.append(item)
        await asyncio.wait_for(stream.finished.wait(), 5)
        assert len(got) == 1 and lease.crashed
        assert await run_one(s, model) == "t0 t1 t2 "
        assert len(FakeEngine.instances) == 2
        await s.shutdown()

    asyncio.run(main())


def test_cancel_stops_engine_and_frees_the_model(model_store: BlobStore) -> None:
    model = load_stored_model(model_store, "fake")
    FakeEngine.step = 0.02

    async def main() -> None:
        s = lifecycle()
        lease = await s.acquire(model, Options(), 300)
        stream = GenerationStream(lease, GenerateRequest(prompt="x", options=Options(num_predict=500)))
        n = 0
        async for item in stream:
            n += 1
            if n == 3:
                stream.cancel()
                break
        await asyncio.wait_for(stream.finished.wait(), 5)
        engine = FakeEngine.instances[0]
        assert engine.cancels >= 1 and engine.generated < 20
        t = time.monotonic()
        assert await run_one(s, model) == "t0 t1 t2 "
        assert time.monotonic() - t < 2
        await s.shutdown()

    asyncio.run(main())


def test_unload(model_store: BlobStore) -> None:
    model = load_stored_model(model_store, "fake")

    async def main() -> None:
        s = lifecycle()
        assert not await s.unload(model)
        await run_one(s, model)
        assert await s.unload(model)
        assert s.loaded() == [] and FakeEngine.instances[0].closed
        await s.shutdown()

    asyncio.run(main())


# --- settings ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value,expected", [
    (None, ("http", "127.0.0.1", 11434)),
    ("", ("http", "127.0.0.1", 11434)),
    ("1.2.3.4", ("http", "1.2.3.4", 11434)),
    (":56789", ("http", "", 56789)),
    ("1.2.3.4:56789", ("http", "1.2.3.4", 56789)),
    ("http://1.2.3.4", ("http", "1.2.3.4", 80)),
    ("https://1.2.3.4", ("https", "1.2.3.4", 443)),
    ("example.com", ("http", "example.com", 11434)),
    ("[::1]:8080", ("http", "::1", 8080)),
    ("  \"0.0.0.0:9000\" ", ("http", "0.0.0.0", 9000)),
    ("ollama.com", ("https", "ollama.com", 443)),
    ("1.2.3.4:99999", ("http", "1.2.3.4", 11434)),
])
def test_parse_host(value, expected) -> None:
    h = parse_host(value)
    assert (h.scheme, h.host, h.port) == expected


def test_host_helpers() -> None:
    assert parse_host(":56789").url() == "http://127.0.0.1:56789"
    assert parse_host(":56789").bind_host == "0.0.0.0"
    assert parse_host(None).is_loopback() and parse_host("localhost:1").is_loopback()
    assert not parse_host("0.0.0.0").is_loopback()


def test_durations_and_keep_alive() -> None:
    assert parse_go_duration("5m") == 300 and parse_go_duration("1h30m") == 5400
    assert parse_go_duration("1.5s") == 1.5 and parse_go_duration("-1s") == -1 and parse_go_duration("0") == 0
    assert parse_go_duration("300ms") == pytest.approx(0.3)
    for bad, msg in (("5", 'time: missing unit in duration "5"'), ("abc", 'time: invalid duration "abc"'),
                     ("5x", 'time: unknown unit "x" in duration "5x"')):
        with pytest.raises(DurationError) as e:
            parse_go_duration(bad)
        assert str(e.value) == msg
    assert keep_alive_seconds(None, 300) == 300
    assert keep_alive_seconds(10, 300) == 10 and keep_alive_seconds(-1, 300) == math.inf
    assert keep_alive_seconds("10m", 300) == 600 and keep_alive_seconds("-1m", 300) == math.inf
    assert keep_alive_seconds(0, 300) == 0 and keep_alive_seconds("0", 300) == 0
    with pytest.raises(ValueError):
        keep_alive_seconds(True, 300)
    assert env_keep_alive({}) == 300
    assert env_keep_alive({"TANDEM_KEEP_ALIVE": "10m"}) == 600
    assert env_keep_alive({"TANDEM_KEEP_ALIVE": "42"}) == 42
    assert env_keep_alive({"TANDEM_KEEP_ALIVE": "-1"}) == math.inf


def test_settings_from_env(tmp_path: Path) -> None:
    s = Settings.from_env({"TANDEM_HOST": "0.0.0.0:1234", "TANDEM_MODELS": f"'{tmp_path}'", "TANDEM_MAX_QUEUE": "3",
                           "TANDEM_NOPRUNE": "1", "TANDEM_CONTEXT_LENGTH": "8192", "TANDEM_DEBUG": "true",
                           "TANDEM_ORIGINS": "http://a.example, https://b.example:*"})
    assert (s.host.host, s.host.port) == ("0.0.0.0", 1234)
    assert s.models == tmp_path and s.max_queue == 3 and s.noprune and s.debug and s.context_length == 8192
    assert s.origins[:2] == ["http://a.example", "https://b.example:*"]
    assert "http://localhost:*" in allowed_origins({}) and "vscode-webview://*" in allowed_origins({})
    d = Settings.from_env({})
    assert d.max_queue == 512 and d.keep_alive == 300 and d.context_length == 4096 and not d.noprune
    assert Settings.from_env({"TANDEM_NOPRUNE": "false"}).noprune is False


# --- the 503 over HTTP (fake engine, real server) -----------------------------------------------


def test_queue_full_over_http(model_store: BlobStore) -> None:
    from tests.server_thread import ServerThread

    FakeEngine.step = 0.05
    settings = Settings(max_queue=0)
    with ServerThread(model_store, settings, engine_factory=FakeEngine) as srv:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            with c.stream("POST", "/api/generate", json={"model": "fake", "prompt": "hi",
                                                         "options": {"num_predict": 40}}) as first:
                assert first.status_code == 200
                lines = first.iter_lines()  # keep the iterator: dropping it closes the connection
                next(lines)
                r = c.post("/api/generate", json={"model": "fake", "prompt": "hi", "stream": False})
                assert r.status_code == 503
                assert r.json() == {"error": "server busy, please try again.  maximum pending requests exceeded"}
            # the stream was closed early: its engine work is cancelled and the model is soon free again
            deadline = time.monotonic() + 5
            while True:
                r = c.post("/api/generate", json={"model": "fake", "prompt": "hi", "stream": False,
                                                  "options": {"num_predict": 2}})
                if r.status_code != 503 or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert r.status_code == 200 and r.json()["response"] == "t0 t1 "
            assert FakeEngine.instances[0].generated < 40
            assert FakeEngine.instances[0].cancels >= 1


def test_options_reach_the_engine_typed(model_store: BlobStore, tmp_path: Path) -> None:
    """The edge parses options once and the engine gets them typed: draft_acceptance from a Modelfile
    PARAMETER or the request's options (both used to drop it), the trace flag only as draft_trace."""
    from modelfile import parameters_from_commands, parse
    from tests.server_thread import ServerThread

    write_tiny_gguf(tmp_path / "t.gguf", TinySpec(arch="llama", n_layer=1, n_embd=32, n_ff=64, seed=1))
    digest, _ = model_store.add_file(tmp_path / "t.gguf")
    params, _ = parameters_from_commands(parse("FROM t\nPARAMETER draft_acceptance match\nPARAMETER n_max 2\n"))
    create_model(model_store, CreateRequest(model="fake-match", files={"t.gguf": digest}, parameters=params))
    with ServerThread(model_store, Settings(), engine_factory=FakeEngine) as srv:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = c.post("/api/generate", json={"model": "fake-match", "prompt": "hi", "stream": False,
                                              "options": {"num_predict": 1, "draft_trace": True}})
            assert r.status_code == 200
            r = c.post("/api/generate", json={"model": "fake", "prompt": "hi", "stream": False,
                                              "options": {"num_predict": 1, "draft_acceptance": "match"}})
            assert r.status_code == 200
            r = c.post("/api/generate", json={"model": "fake", "prompt": "hi", "stream": False,
                                              "options": {"draft_acceptance": "lossy"}})
            assert (r.status_code, r.json()) == (  # tandem's own range check: 400 since issue 15 (was 500)
                400, {"error": 'invalid draft_acceptance value [lossy]: must be "strict" or "match"'})
    from_params, from_request = [req.options for e in FakeEngine.instances for req in e.requests]
    assert isinstance(from_params, Options) and from_params.draft_acceptance == "match"
    assert from_params.draft_num_predict == 2 and from_params.draft_trace
    assert from_params.explicit == {"draft_acceptance", "draft_num_predict", "num_predict", "draft_trace"}
    assert from_request.draft_acceptance == "match" and not from_request.draft_trace


def test_startup_prunes_unused_blobs_unless_noprune(tmp_path: Path) -> None:
    from tests.server_thread import ServerThread

    store = BlobStore(tmp_path / "models")
    stray, _ = store.write_blob(b"nobody references this")
    with ServerThread(store, Settings(noprune=True), engine_factory=FakeEngine):
        pass
    assert store.has_blob(stray)
    with ServerThread(store, Settings(), engine_factory=FakeEngine):
        pass
    assert not store.has_blob(stray)


def test_client_gone_while_queued_or_not_streaming(model_store: BlobStore) -> None:
    from tests.server_thread import ServerThread

    FakeEngine.step = 0.05
    with ServerThread(model_store, Settings(), engine_factory=FakeEngine) as srv:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            with c.stream("POST", "/api/generate", json={"model": "fake", "prompt": "hi",
                                                         "options": {"num_predict": 30}}) as first:
                lines = first.iter_lines()
                next(lines)
                with pytest.raises(httpx.ReadTimeout):  # gives up while queued behind the first
                    httpx.post(srv.url + "/api/generate", timeout=0.3,
                               json={"model": "fake", "prompt": "x", "stream": False, "options": {"num_predict": 5}})
                rest = [line for line in lines if line]
            assert '"done":true' in rest[-1]
            engine = FakeEngine.instances[0]
            time.sleep(0.3)
            assert engine.calls == 1  # the abandoned request never reached the engine

            with pytest.raises(httpx.ReadTimeout):  # stream:false, client gone mid-generation
                httpx.post(srv.url + "/api/generate", timeout=0.5,
                           json={"model": "fake", "prompt": "x", "stream": False, "options": {"num_predict": 200}})
            deadline = time.monotonic() + 5
            while engine.active and time.monotonic() < deadline:
                time.sleep(0.05)
            assert engine.active == 0 and engine.cancels >= 1 and engine.generated < 30 + 100
            r = c.post("/api/generate", json={"model": "fake", "prompt": "hi", "stream": False,
                                              "options": {"num_predict": 2}})
            assert r.status_code == 200 and r.json()["response"] == "t0 t1 "
