"""What the server-backed engines (vLLM, llama-server) share: the backend process started under the reaper with its
log (``BackendProcess``), and the monitor that turns its faults into the engine process's own (``HealthMonitor``):
a backend that exits ends this process, so the server sees a crashed engine and starts a new one; a backend that
stops answering turns ``healthy()`` false, which silences the heartbeat, so the watchdog replaces the engine."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from engine.contract.protocol import EngineError
from engine.contract.streaming import StreamsByThread

HEALTH_INTERVAL = 1.0  # seconds between the monitor's /health pings
HEALTH_TIMEOUT = 5.0  # a ping's own bound
HEALTH_GRACE = 8.0  # seconds without a successful ping before the backend counts as frozen
EXIT_DELAY = 1.0  # seconds between the backend's exit and this process's, for the failed requests' messages
LOG_TAIL_LINES = 25
STOP_TIMEOUT = 15.0  # seconds a backend gets to exit (the reaper's own grace is 10)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REAPER = Path(__file__).parent / "process" / "reaper.py"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BackendProcess:
    """A backend server (``argv``) started for one model under the reaper, in a working directory of its own that
    holds its log; ``name`` says which backend in errors."""

    def __init__(self, name: str, argv: list[str], workdir: Path, log_name: str):
        self.name = name
        self.workdir = workdir
        self.log_path = workdir / log_name
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen([sys.executable, str(_REAPER), str(os.getpid()), "--", *argv],
                                          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True, cwd=workdir)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def wait_ready(self, healthy: Callable[[float], bool], timeout: float | None, poll: float) -> None:
        """Until ``healthy`` answers; a backend that exits first (or is not up within ``timeout``) is an error
        carrying the end of its log."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if not self.alive():
                raise EngineError(f"{self.name} failed to start (exit code {self._proc.returncode}); the end of its "
                                  f"log:\n{self.log_tail()}", 500)
            if healthy(2.0):
                return
            if deadline is not None and time.monotonic() > deadline:
                self.stop()
                raise EngineError(f"{self.name} did not start within {timeout:g}s; the end of its log:\n"
                                  f"{self.log_tail()}", 500)
            time.sleep(poll)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        kept = [_ANSI.sub("", l) for l in text.splitlines() if l.strip()]
        return "\n".join(kept[-lines:])

    def stop(self) -> None:
        """Stop the backend (the reaper stops its whole process tree) and remove the working directory."""
        if self.alive():
            self._proc.terminate()
            try:
                self._proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, 9)
                self._proc.wait(5)
        shutil.rmtree(self.workdir, ignore_errors=True)


class BackendServer:
    """A backend server this engine process started: its ``process`` (BackendProcess) and its HTTP ``api`` (with
    ``healthy(timeout)`` and ``close()``); subclasses set both, and how often ``wait_ready`` polls."""

    process: BackendProcess
    api: Any
    ready_poll = 0.1

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.alive()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until the server answers its health check; one that exits first (or is not up within ``timeout``) is
        an error carrying the end of its log."""
        self.process.wait_ready(self.api.healthy, timeout, poll=self.ready_poll)

    def log_tail(self) -> str:
        return self.process.log_tail()

    def stop(self) -> None:
        """Stop the server (the reaper stops its whole process tree) and remove the working directory."""
        self.process.stop()
        self.api.close()


class HealthMonitor:
    """Pings a backend every HEALTH_INTERVAL; ends this process when a backend it started exits."""

    def __init__(self, name: str, ping: Callable[[float], bool], process: BackendProcess | None):
        self.name = name
        self._ping = ping
        self._process = process
        self._last_ok = time.monotonic()
        self._stopping = threading.Event()
        threading.Thread(target=self._run, name=f"tandem-{name}-monitor", daemon=True).start()

    def _run(self) -> None:
        while not self._stopping.wait(HEALTH_INTERVAL):
            if self._process is not None and not self._process.alive():
                print(f"tandem: {self.name} exited; the end of its log:\n{self._process.log_tail()}", file=sys.stderr,
                      flush=True)
                time.sleep(EXIT_DELAY)
                if not self._stopping.is_set():
                    os._exit(3)  # the server sees a crashed engine and starts a new one for the next request
                return
            if time.monotonic() - self._last_ok < HEALTH_INTERVAL:
                continue  # a stream event arrived since the last check: no ping needed to know it answers
            if self._ping(HEALTH_TIMEOUT):
                self._last_ok = time.monotonic()

    def answered(self) -> None:
        """The backend just sent something (a streamed event): it answers. Under load the pings it saves were a
        request each second beside the generations, on the cores the backend computes with."""
        self._last_ok = time.monotonic()

    def healthy(self) -> bool:
        """Whether the backend answered within the last HEALTH_GRACE seconds (and, started here, runs)."""
        if self._process is not None and not self._process.alive():
            return False
        return time.monotonic() - self._last_ok < HEALTH_GRACE

    def stop(self) -> None:
        self._stopping.set()


def error_text(response: Any, server: str) -> str:
    """A backend's own message for a refused request (an OpenAI-style error object, or a bare ``message``), without
    its internals; else which status it answered. ``response`` is an httpx response whose body was read."""
    try:
        body = response.json()
    except ValueError:
        return f"{server} answered {response.status_code}"
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error)
    if isinstance(body, dict) and "message" in body:
        return str(body["message"])
    return f"{server} answered {response.status_code}"


def event_error_text(event: dict[str, Any]) -> str:
    """The message of an error event in a backend's stream."""
    error = event.get("error")
    return str(error.get("message") if isinstance(error, dict) else error)


CANCEL_POLL = 0.05  # seconds between the checks of the watched streams' cancel flags


class CancelWatcher:
    """Closes each watched stream once its ``should_stop()`` holds, checked every CANCEL_POLL seconds: a request
    waiting on a long prefill receives no chunk to check between, and a closed connection is how both servers learn
    to free the slot. One thread checks all of a runtime's streams, and only while there are some (a thread per
    stream woke eight times as often under eight clients, on the cores the backend computes with)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[Any, Callable[[], bool]]] = {}
        self._next = 0
        self._running = False

    def watch(self, stream: Any, should_stop: Callable[[], bool]) -> Callable[[], None]:
        """Watch ``stream``; call the returned function when the stream ends, to stop watching it."""
        with self._lock:
            self._next += 1
            key = self._next
            self._watched[key] = (stream, should_stop)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name=f"tandem-{self._name}-cancel", daemon=True).start()
        return lambda: self._unwatch(key)

    def _unwatch(self, key: int) -> None:
        with self._lock:
            self._watched.pop(key, None)

    def _run(self) -> None:
        while True:
            time.sleep(CANCEL_POLL)
            with self._lock:
                if not self._watched:
                    self._running = False  # the next watch() starts a thread again
                    return
                watched = list(self._watched.items())
            for key, (stream, should_stop) in watched:
                if should_stop():
                    self._unwatch(key)
                    stream.close()


def sse_data(response: Any) -> Iterator[bytes]:
    """The payload of each ``data:`` line of a server-sent-event stream (an httpx response), stripped. Bytes read and
    split here, not httpx's ``iter_lines``: its text decoding per chunk was the relay's largest cost per token."""
    pending = b""
    for chunk in response.iter_bytes():
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip()
    if pending.startswith(b"data:"):
        yield pending[5:].strip()


class BackendRuntime(StreamsByThread):
    """The parts of the runtime interface (engine.process.worker) a server-backed runtime answers the same way:
    health from its monitor, detokenizing and closing through its backend, each stream relayed from a thread of its
    own (its ``generate`` reads the backend's HTTP stream); ``name`` says which engine in errors.
    Subclasses set ``api`` (with ``detokenize`` and ``close``), ``server`` (None when attached), ``monitor`` and
    ``cancels`` (a CancelWatcher)."""

    name = ""
    api: Any
    server: Any
    monitor: HealthMonitor
    cancels: CancelWatcher

    def healthy(self) -> bool:
        """Whether the backend answers (HealthMonitor): the worker's heartbeat asks."""
        return self.monitor.healthy()

    def detokenize(self, ids: list[int]) -> str:
        return self.api.detokenize(ids)

    def embed(self, req: Any) -> Any:
        raise EngineError(f"the {self.name} engine serves generation; embed with a model on the native engine", 400)

    def finish_writes(self, timeout: float) -> bool:
        return True

    def close(self) -> None:
        self.monitor.stop()
        if self.server is not None:
            self.server.stop()  # never an attached backend: it is not tandem's to stop
        else:
            self.api.close()
