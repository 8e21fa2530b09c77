"""The model lifecycle: an engine process per model, loaded on first use, leased to requests, kept alive,
unloaded, replaced after a crash or a freeze. It decides which engine a request runs on and when; what happens
inside an engine's step (which sequences decode, verify or prefill together) is the engine's own batching
(engine/batching/), which this module never sees.

One engine process serves one model (target and drafter together). A *slot* exists per model weights
pair (copies of a model share one engine, as Ollama keys runners by model path) and holds:

* the running engine, if any, with the LoadSpec it was built from and when it expires;
* how many requests hold a lease on it now: up to the engine's sequence slots (``ModelFacts.num_parallel``,
  from ``TANDEM_NUM_PARALLEL`` / ``OLLAMA_NUM_PARALLEL``), which it serves at once (engine.batching);
* an asyncio.Lock held while a request decides what to do with the engine (reuse, load, reload) and by
  unloads, never across a generation; a reload (other load options) waits until the engine is idle;
* the number of requests waiting for a lease, bounded by ``max_queue`` (503 beyond it).

Every blocking EngineClient call runs in a worker thread so the event loop never blocks. A generation
runs in its own thread (server.engine_process.stream.GenerationStream) that feeds the event loop through a
queue; its lease is released from that thread's completion, so a client that went away can never leave the
engine busy while the next request starts writing to its pipe.

The watchdog (``Settings.engine_timeout``): the engine client kills an engine that stays silent past the
bound while it works (its heartbeat keeps a long prefill alive), which fails that request like a crash;
an idle engine is pinged before it is reused (and every PING_INTERVAL) and dropped when it does not
answer; stopping an engine
is bounded and ends in a kill. So a frozen engine costs one request, never the model.

Shutdown (``drain``): new requests are refused, running streams get a short grace to finish, then end
with an error the client sees as a final line, before the engines stop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Protocol

import anyio

from blobs.model import StoredModel
from engine.contract.options import Options
from engine.contract.protocol import (
    EXIT_FINISH_CAP,
    EmbedRequest,
    EmbedResult,
    EngineError,
    GenerateRequest,
    LoadSpec,
    ModelFacts,
)

from engine.contract.llamacpp_launch import plan as plan_llamacpp

from .effective_options import choose_engine, vllm_launch
from .engine_process.stream import SHUTDOWN_MESSAGE
from .settings import Settings, VllmSettings

log = logging.getLogger("tandem.lifecycle")

MAX_QUEUE_MESSAGE = "server busy, please try again.  maximum pending requests exceeded"
STOP_TIMEOUT = 3.0  # seconds an engine gets to exit when asked before it is killed
PING_TIMEOUT = 5.0  # seconds an idle engine gets to answer the health ping before reuse
PING_INTERVAL = 30.0  # seconds between health pings of idle engines (a frozen one leaves /api/ps)
# An unload waiting for a running request kills the engine once it has been silent this long (it sends a
# heartbeat every second while it generates), instead of waiting out the whole TANDEM_ENGINE_TIMEOUT.
UNLOAD_SILENCE = 5.0
# Go's time.Duration(math.MaxInt64): what Ollama adds to now for a model kept forever.
_FOREVER_DELTA = timedelta(microseconds=(2**63 - 1) // 1000)


class QueueFullError(Exception):
    status = 503

    def __init__(self) -> None:
        super().__init__(MAX_QUEUE_MESSAGE)


class QueueTimeoutError(QueueFullError):
    """A request waited longer than TANDEM_QUEUE_TIMEOUT for its model (503, as a full queue)."""

    def __init__(self, seconds: float) -> None:
        Exception.__init__(self, f"server busy: timed out after {seconds:g}s waiting for the model; "
                                 "please try again later")


class EngineHandle(Protocol):
    """What the lifecycle needs of an engine handle (server.engine_process.client.EngineClient; fakes in tests)."""

    pid: int | None

    def load(self, spec: LoadSpec, timeout: float | None = None) -> ModelFacts: ...
    def generate(self, req: GenerateRequest) -> Any: ...
    def embed(self, req: EmbedRequest) -> EmbedResult: ...
    def tokenize(self, text: str, add_bos: bool | None = None) -> list[int]: ...
    def detokenize(self, ids: list[int]) -> str: ...
    def cancel(self) -> None: ...
    def health(self, timeout: float = 5.0) -> Any: ...
    def silent_for(self) -> float: ...
    def alive(self) -> bool: ...
    def close(self, timeout: float = 5.0) -> None: ...
    def kill(self) -> None: ...


def _default_engine_factory(timeout: float) -> EngineHandle:
    from server.engine_process.client import EngineClient

    return EngineClient(timeout=None if math.isinf(timeout) else timeout)


@dataclass
class LoadedModel:
    """A loaded model: its engine process and what it was loaded with."""

    name: str  # display name of the model that loaded it
    model: StoredModel
    spec: LoadSpec
    engine: EngineHandle
    facts: ModelFacts
    loaded_at: float
    load_seconds: float
    keep_alive: float  # seconds; FOREVER = never expires
    expires_at: datetime


@dataclass
class Slot:
    key: "SlotKey"
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0
    runner: LoadedModel | None = None
    timer: asyncio.TimerHandle | None = None
    loading: bool = False
    active: int = 0  # leases held now
    # set (and replaced by a fresh one) whenever a lease ends: what a request waiting for a lease awaits
    freed: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: asyncio.Event | None = None  # an engine of this slot is being stopped; set when it is

    def lease_ended(self) -> None:
        self.active -= 1
        self.freed.set()
        self.freed = asyncio.Event()

    def full(self) -> bool:
        """Whether a request would have to wait (every sequence slot leased, or a load or unload running)."""
        capacity = self.runner.facts.num_parallel if self.runner is not None else 1
        return self.lock.locked() or self.active >= max(1, capacity)

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def expiry(keep_alive: float, now: datetime | None = None) -> datetime:
    now = now or datetime.now(timezone.utc)
    if math.isinf(keep_alive):
        return now + _FOREVER_DELTA
    return now + timedelta(seconds=keep_alive)


def serves(loaded: LoadSpec, wanted: LoadSpec) -> bool:
    """Whether an engine loaded with ``loaded`` serves a request that asks for ``wanted``: the same load, or one
    that differs only by a smaller context. The engine caps each request at its own ``num_ctx`` (truncation and
    the context shift happen there, engine.runtime), so clients that ask for different contexts share one
    engine instead of reloading it for each other (Ollama reloads on every num_ctx change)."""
    return loaded == wanted or (wanted.num_ctx < loaded.num_ctx and replace(wanted, num_ctx=loaded.num_ctx) == loaded)


SlotKey = tuple[str, str | None, tuple[str, ...], tuple]


def model_key(model: StoredModel, default_engine: str = "native") -> SlotKey:
    """Which models share one engine: the same weights, drafter and adapters (two models over one base with
    different adapters are two engines). On vLLM, whose speculative configuration is fixed when it starts, the
    model's own speculation parameters count too: a plain model and an n-gram one from the same folder would
    otherwise restart vLLM for each other's requests."""
    engine: tuple = ()
    if model.params.get("engine", default_engine) == "llamacpp":  # beside the same GGUF on the native engine
        # llama-server's drafter is fixed when it starts, as vLLM's: the model's own choice of it counts too
        engine = ("llamacpp", str(model.params.get("drafter", "auto")), str(model.params.get("draft_num_predict", "")))
    if model.params.get("engine", default_engine) == "vllm":
        launch = vllm_launch(model, VllmSettings())  # where vLLM comes from is the server's, the same for all
        engine = ("vllm", launch.drafter, launch.num_speculative_tokens, launch.tensor_parallel_size,
                  launch.pipeline_parallel_size)
    if model.projector_path is not None:
        engine += ("projector", str(model.projector_path))
    return (str(model.model_path), str(model.draft_path) if model.draft_path else None,
            tuple(str(p) for p in model.adapter_paths), engine)


class Lease:
    """Exclusive use of a loaded engine for one request. Release exactly once (idempotent)."""

    def __init__(self, lifecycle: "ModelLifecycle", slot: Slot, runner: LoadedModel, keep_alive: float, load_seconds: float):
        self._lifecycle = lifecycle
        self.slot = slot
        self.runner = runner
        self.keep_alive = keep_alive
        self.load_seconds = load_seconds  # time from the request to a ready engine (queue wait + load)
        self._released = False
        self.crashed = False

    @property
    def engine(self) -> EngineHandle:
        return self.runner.engine

    @property
    def closing(self) -> bool:
        """The server is shutting down: a stream not started yet ends at once."""
        return self._lifecycle._closing

    def track(self, stream: Any) -> None:
        """A generation runs on this lease (drain() waits for it, then aborts it)."""
        self._lifecycle._streams.add(stream)

    def untrack(self, stream: Any) -> None:
        self._lifecycle._streams.discard(stream)

    def release(self) -> None:
        """Give the engine back (call on the event loop). Applies keep_alive; a crashed engine is dropped."""
        if self._released:
            return
        self._released = True
        self._lifecycle._release(self)


class ModelLifecycle:
    def __init__(self, settings: Settings, engine_factory: Callable[[], EngineHandle] | None = None,
                 pack_dir: Path | None = None):
        """``pack_dir``: where engines cache packed weight layouts (beside the store), so reloads are fast."""
        self.settings = settings
        self.pack_dir = pack_dir
        self._engine_factory = engine_factory or (lambda: _default_engine_factory(settings.engine_timeout))
        self._slots: dict[SlotKey, Slot] = {}
        self._closing = False
        self._streams: set = set()  # GenerationStreams running now (ended by drain)
        self.ping_interval = PING_INTERVAL
        self._pinger: asyncio.Task | None = None
        # Background unloads (keep_alive 0, expiry); kept so they are not garbage-collected mid-flight.
        self._tasks: set[asyncio.Task] = set()

    # -- acquiring ------------------------------------------------------------------------------
    def load_spec(self, model: StoredModel, options: Options) -> LoadSpec:
        """The LoadSpec for a request. Only load-time options that the model's parameters or the request
        set explicitly count (a change reloads the engine); num_ctx defaults to the server's context
        length and is capped at the model's trained context length, as Ollama does."""
        trained = int(model.config.get("context_length") or 0)
        num_ctx = options.explicit_or("num_ctx", 0)
        if num_ctx <= 0:
            num_ctx = self.settings.context_length
            if trained:
                num_ctx = min(num_ctx, trained)
        elif trained and num_ctx > trained:
            log.warning("requested context size too large for model: num_ctx=%d n_ctx_train=%d", num_ctx, trained)
            num_ctx = trained
        num_thread = options.explicit_or("num_thread", 0) or self.settings.num_thread or 0
        weight_format = options.explicit_or("weight_format", self.settings.weight_format)
        choice = choose_engine(model, options, self.settings)
        engine = choice.engine
        assert model.model_path is not None
        return LoadSpec(
            engine=engine,
            vllm=vllm_launch(model, self.settings.vllm) if engine == "vllm" else None,
            llamacpp=plan_llamacpp(options, Options.merged(model.params, None), has_draft=model.draft_path is not None,
                                   why=choice.why)
            if engine == "llamacpp" else None,
            model_path=str(model.model_path),
            draft_path=str(model.draft_path) if model.draft_path else None,
            projector_path=str(model.projector_path) if model.projector_path else None,
            adapter_paths=tuple(str(p) for p in model.adapter_paths),
            num_ctx=max(num_ctx, 1),
            num_thread=max(num_thread, 0),
            weight_format=weight_format,
            draft_vocab=options.draft_vocab,
            pack_dir=str(self.pack_dir) if self.pack_dir is not None else None,
            num_parallel=self.settings.num_parallel,
            suffix_tokens=self.settings.suffix_tokens,
            step_trace_dir=self.settings.step_trace or None,
            device=options.device(),
        )

    async def acquire(self, model: StoredModel, options: Options, keep_alive: float) -> Lease:
        """Wait for the model's engine (loading or reloading it as needed). Raises QueueFullError when
        too many requests already wait, QueueTimeoutError (a QueueFullError: 503) when the model stays
        busy longer than ``settings.queue_timeout``, or the engine's error when it cannot load."""
        started = time.monotonic()
        self._start_pinger()
        key = model_key(model, self.settings.engine)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = Slot(key)
        if slot.full() and slot.waiting >= self.settings.max_queue:
            raise QueueFullError()
        wait = self.settings.queue_timeout
        deadline = None if math.isinf(wait) else started + wait
        slot.waiting += 1
        try:
            while True:
                if slot.lock.locked():
                    await self._until(slot.lock.acquire(), deadline)
                else:  # taken at once, before any other request runs: the next one sees it held
                    await slot.lock.acquire()
                try:
                    lease, wait_for = await self._try_lease(slot, model, options, keep_alive, started)
                finally:
                    slot.lock.release()
                if lease is not None:
                    return lease
                await self._until(wait_for.wait(), deadline)
        finally:
            slot.waiting -= 1

    async def _until(self, awaitable: Any, deadline: float | None) -> Any:
        """Await ``awaitable`` until ``deadline`` (monotonic; None: for ever), else QueueTimeoutError."""
        if deadline is None:
            return await awaitable
        try:
            return await asyncio.wait_for(awaitable, max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise QueueTimeoutError(self.settings.queue_timeout) from None

    async def _try_lease(self, slot: Slot, model: StoredModel, options: Options, keep_alive: float,
                         started: float) -> tuple[Lease | None, asyncio.Event | None]:
        """With the slot's lock held: a lease on the model's engine (reusing, loading or reloading it), or
        what to wait for first (a free sequence slot, the engine going idle for a reload, a stop)."""
        if self._closing:
            raise EngineError(SHUTDOWN_MESSAGE, 503)
        if slot.stopping is not None:
            return None, slot.stopping
        spec = self.load_spec(model, options)
        runner = slot.runner
        if runner is not None and runner.engine.alive() and serves(runner.spec, spec) and slot.active == 0:
            if not await self._answers(runner):
                log.warning("engine of %s (pid %s) did not answer a health ping; starting a new one",
                            runner.name, runner.engine.pid)
        if runner is not None and (not runner.engine.alive() or not serves(runner.spec, spec)):
            if slot.active > 0 and runner.engine.alive():
                return None, slot.freed  # other load options: reload once the running requests end
            why = "engine exited" if not runner.engine.alive() else "load options changed"
            log.info("reloading %s (%s)", runner.name, why)
            slot.runner = None
            await anyio.to_thread.run_sync(_stop_engine, runner.engine)
            runner = None
        if runner is None:
            runner = await self._load(slot, model, spec, keep_alive)
        elif slot.active >= max(1, runner.facts.num_parallel):
            return None, slot.freed
        slot.cancel_timer()
        slot.active += 1
        # Copies share an engine (same weights); /api/ps names it after the model that used it last.
        runner.name, runner.model = model.name.display(), model
        runner.keep_alive = keep_alive
        runner.expires_at = expiry(keep_alive)
        return Lease(self, slot, runner, keep_alive, time.monotonic() - started), None

    async def _answers(self, runner: LoadedModel) -> bool:
        """The watchdog's check before an idle engine is reused: it answers a health ping in time (one that
        does not is killed, by the client, so it no longer counts as alive)."""
        if math.isinf(self.settings.engine_timeout):
            return True
        timeout = min(PING_TIMEOUT, self.settings.engine_timeout)

        def ping() -> bool:
            try:
                runner.engine.health(timeout)
                return True
            except EngineError:
                if runner.engine.alive():
                    runner.engine.kill()
                return False

        return await anyio.to_thread.run_sync(ping)

    def _start_pinger(self) -> None:
        if self._pinger is None and not self._closing and not math.isinf(self.settings.engine_timeout):
            self._pinger = asyncio.get_running_loop().create_task(self._ping_idle())

    async def _ping_idle(self) -> None:
        """Ping every idle engine each ``ping_interval`` seconds; one that does not answer is killed and
        dropped, so /api/ps stops listing a frozen engine without waiting for its next request."""
        while not self._closing:
            await asyncio.sleep(self.ping_interval)
            for slot in list(self._slots.values()):
                runner = slot.runner
                if runner is None or slot.lock.locked() or slot.active or slot.waiting or self._closing:
                    continue
                async with slot.lock:
                    if slot.runner is not runner or slot.active or self._closing or await self._answers(runner):
                        continue
                    log.warning("engine of %s (pid %s) did not answer a health ping; unloading it",
                                runner.name, runner.engine.pid)
                    slot.cancel_timer()
                    slot.runner = None
                    await anyio.to_thread.run_sync(_stop_engine, runner.engine)

    async def _load(self, slot: Slot, model: StoredModel, spec: LoadSpec, keep_alive: float) -> LoadedModel:
        t0 = time.monotonic()
        slot.loading = True
        engine: EngineHandle | None = None

        def start_and_load() -> tuple[EngineHandle, ModelFacts]:
            nonlocal engine
            engine = self._engine_factory()
            timeout = None if math.isinf(self.settings.load_timeout) else self.settings.load_timeout
            return engine, engine.load(spec, timeout=timeout)

        try:
            engine, facts = await anyio.to_thread.run_sync(start_and_load)
        except BaseException as e:
            if engine is not None:
                await anyio.to_thread.run_sync(_stop_engine, engine)
            if isinstance(e, EngineError):
                log.error("loading %s failed: %s", model.name.display(), e)
            raise
        finally:
            slot.loading = False
        seconds = time.monotonic() - t0
        draft = f" + draft {facts.draft_architecture}" if facts.draft_architecture else ""
        log.info("loaded %s (%s%s) on %s in %.2fs: num_ctx=%d, %s, engine pid %s", model.name.display(),
                 facts.architecture, draft, facts.device, seconds, spec.num_ctx, facts.weight_format, engine.pid)
        slot.runner = LoadedModel(name=model.name.display(), model=model, spec=spec, engine=engine, facts=facts,
                             loaded_at=time.time(), load_seconds=seconds, keep_alive=keep_alive,
                             expires_at=expiry(keep_alive))
        return slot.runner

    # -- releasing ----------------------------------------------------------------------------
    def _release(self, lease: Lease) -> None:
        slot, runner = lease.slot, lease.runner
        slot.lease_ended()
        if slot.runner is not runner:  # unloaded or replaced meanwhile
            return
        if lease.crashed or not runner.engine.alive():
            slot.runner = None
            slot.cancel_timer()
            log.warning("engine of %s (pid %s) died; the next request starts a new one", runner.name, runner.engine.pid)
            self._spawn_stop(slot, runner.engine)
            return
        if slot.active > 0:  # other requests still run on it: the last one to end applies its keep_alive
            return
        if lease.keep_alive <= 0 or self._closing:
            slot.runner = None
            log.info("unloading %s (keep_alive 0)", runner.name)
            self._spawn_stop(slot, runner.engine)
            return
        runner.expires_at = expiry(lease.keep_alive)
        if not math.isinf(lease.keep_alive):
            loop = asyncio.get_running_loop()
            slot.timer = loop.call_later(lease.keep_alive, lambda: self._spawn(self._expire(slot, runner)))

    def _spawn_stop(self, slot: Slot, engine: EngineHandle) -> None:
        """Stop ``engine`` in the background; until it is stopped, a request for the slot waits (it must not
        load a second copy beside the one still shutting down)."""
        stopped = slot.stopping = asyncio.Event()

        async def stop() -> None:
            try:
                await anyio.to_thread.run_sync(_stop_engine, engine)
            finally:
                if slot.stopping is stopped:
                    slot.stopping = None
                stopped.set()

        self._spawn(stop())

    async def _expire(self, slot: Slot, runner: LoadedModel) -> None:
        slot.timer = None
        if slot.runner is not runner or slot.waiting or slot.active or slot.lock.locked():
            return
        async with slot.lock:
            if slot.runner is not runner or slot.waiting or slot.active:
                return
            if runner.expires_at > datetime.now(timezone.utc) + timedelta(milliseconds=50):
                return
            slot.runner = None
            log.info("unloading %s (keep_alive expired)", runner.name)
            await anyio.to_thread.run_sync(_stop_engine, runner.engine)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- management ---------------------------------------------------------------------------
    async def unload(self, model: StoredModel) -> bool:
        """Unload a model now (after its in-flight request). True when it was loaded."""
        slot = self._slots.get(model_key(model, self.settings.engine))
        if slot is None or slot.runner is None:
            return False
        await self._lock_for_unload(slot)
        try:
            slot.cancel_timer()
            runner, slot.runner = slot.runner, None
            if runner is None:
                return False
            log.info("unloading %s (requested)", runner.name)
            await anyio.to_thread.run_sync(_stop_engine, runner.engine)
            return True
        finally:
            slot.lock.release()

    async def _lock_for_unload(self, slot: Slot) -> None:
        """Take the slot's lock once the running requests have ended, as Ollama's unload waits for them
        (new ones wait meanwhile); but an engine silent for UNLOAD_SILENCE meanwhile is frozen: kill it
        (its requests fail as the watchdog's would), so an unload never waits on a wedged engine."""
        # With the watchdog off there is no heartbeat either, so silence proves nothing: just wait.
        bound = math.inf if math.isinf(self.settings.engine_timeout) else min(UNLOAD_SILENCE,
                                                                              self.settings.engine_timeout)
        acquire = asyncio.ensure_future(slot.lock.acquire())
        try:
            while True:
                done, _ = await asyncio.wait({acquire}, timeout=0.25)
                if done:
                    if not slot.active:
                        return
                    waiter = asyncio.ensure_future(slot.freed.wait())
                    await asyncio.wait({waiter}, timeout=0.25)
                    waiter.cancel()
                runner = slot.runner
                if runner is not None and runner.engine.silent_for() > bound and runner.engine.alive():
                    log.warning("engine of %s (pid %s) silent for %.0fs during an unload; killing it",
                                runner.name, runner.engine.pid, runner.engine.silent_for())
                    await anyio.to_thread.run_sync(runner.engine.kill)
        except BaseException:
            acquire.cancel()
            if acquire.done() and not acquire.cancelled() and acquire.exception() is None:
                slot.lock.release()
            raise

    def loaded(self) -> list[LoadedModel]:
        """Loaded engines that are still alive, longest remaining keep_alive first (as /api/ps sorts)."""
        runners = [s.runner for s in self._slots.values() if s.runner is not None and s.runner.engine.alive()]
        return sorted(runners, key=lambda r: r.expires_at, reverse=True)

    def runner_for(self, model: StoredModel) -> LoadedModel | None:
        slot = self._slots.get(model_key(model, self.settings.engine))
        return slot.runner if slot else None

    async def drain(self, grace: float) -> None:
        """Begin a shutdown: refuse new requests (503), give running generations ``grace`` seconds to
        finish, then end the rest with SHUTDOWN_MESSAGE (a final error line for a stream already
        started) and cancel their engine work."""
        self._closing = True
        streams = list(self._streams)
        if streams:
            log.info("shutting down: waiting up to %gs for %d running generation(s)", grace, len(streams))
            waits = [asyncio.ensure_future(s.finished.wait()) for s in streams]
            _, pending = await asyncio.wait(waits, timeout=grace)
            for w in pending:
                w.cancel()
        for stream in list(self._streams):
            stream.abort(EngineError(SHUTDOWN_MESSAGE, 503))

    async def shutdown(self) -> None:
        self._closing = True
        if self._pinger is not None:
            self._pinger.cancel()
        for slot in self._slots.values():
            slot.cancel_timer()
        engines = [s.runner.engine for s in self._slots.values() if s.runner is not None]
        for s in self._slots.values():
            s.runner = None
        for engine in engines:
            await anyio.to_thread.run_sync(_stop_engine, engine)
        for task in list(self._tasks):
            try:
                await asyncio.wait_for(task, 10)
            except (asyncio.TimeoutError, Exception):
                pass


def _stop_engine(engine: EngineHandle, timeout: float = STOP_TIMEOUT) -> None:
    """Stop an engine process: cancel what it runs, ask it to exit, kill it if it does not within
    ``timeout`` (a wedged engine holding its pipe must not hang an unload or the server's shutdown)."""
    try:
        engine.cancel()
    except Exception:
        pass

    def close() -> None:
        try:
            engine.close(timeout)
        except Exception:
            pass

    closer = threading.Thread(target=close, name="tandem-engine-close", daemon=True)
    closer.start()
    # engine.close is bounded by itself (silence bounds, the cap on finishing a cache write); this bound
    # only catches a close that hangs outside them
    closer.join(3 * timeout + EXIT_FINISH_CAP + 1)
    if closer.is_alive() or engine.alive():
        try:
            engine.kill()
        except Exception:
            pass


async def _stop_engine_async(engine: EngineHandle) -> None:
    await anyio.to_thread.run_sync(_stop_engine, engine)
