"""The one thread that runs a loaded model's parallel work.

libgomp (the OpenMP runtime torch and the native kernels parallelise with) keeps a team of worker threads per
thread that opens a parallel region. When a process holds more such workers than it has CPUs, every team stops
spinning between regions and sleeps on a futex instead, and a forward opens a few hundred regions: measured on
Zen 5 (2 cores), one decode forward of the 1.5B took 21 ms from the thread that loaded the model and 26 ms from any
other (benchmarks/thread_forward.py), and the engine process ran every generation in a thread of its own, so
every request the server streamed paid it (37 against 47 tok/s). So the load, every forward and every other
heavy tensor operation of a model run on one long-lived thread: its team is the only one there is. That thread is
one per process (``ComputeThread.shared()``), like the OpenMP runtime it stands for: two models loaded in one
process (a test's, a benchmark's llama.cpp beside tandem) share it rather than bring back a second team.

``run(fn)`` runs ``fn`` there and returns its result (or raises its exception) to the caller; called from that
thread it just calls ``fn``. ``post(fn)`` hands ``fn`` over without waiting for it. A model's step loop
(engine.batching.step_loop) that has sequences in flight is stepped here (``step_while_busy``): between two steps
the thread runs whatever was handed to it meanwhile, so a new sequence, an embedding or a second model's load waits
at most one step.
"""

from __future__ import annotations

import atexit
import queue
import threading
from typing import TYPE_CHECKING, Any, Callable, TypeVar

if TYPE_CHECKING:
    from engine.batching.step_loop import StepLoop

T = TypeVar("T")

EXIT_JOIN_SECONDS = 10.0  # how long an exiting process waits for the compute thread's current work


class _Call:
    """One function waiting for the compute thread, and what it gave."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class ComputeThread:
    """A daemon thread that runs the functions handed to it, one at a time, in order (see the module doc)."""

    _shared: "ComputeThread | None" = None
    _shared_lock = threading.Lock()

    def __init__(self, name: str = "tandem-compute"):
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._loops: list[StepLoop] = []  # step loops with sequences in flight (touched only by this thread)
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()
        atexit.register(self._end_at_exit)

    @classmethod
    def shared(cls) -> "ComputeThread":
        """This process's compute thread (started on first use)."""
        with cls._shared_lock:
            if cls._shared is None or not cls._shared._thread.is_alive():
                cls._shared = cls()
            return cls._shared

    def set_threads(self, n: int) -> None:
        """The OpenMP team size of the compute thread's parallel work from now on (a load's ``num_thread``)."""
        if n > 0:
            import torch

            self.run(lambda: torch.set_num_threads(n))

    def _serve(self) -> None:
        while True:
            if self._loops:  # sequences in flight: run what was handed over meanwhile, then step them
                calls = []
                while True:
                    try:
                        calls.append(self._calls.get_nowait())
                    except queue.Empty:
                        break
            else:
                calls = [self._calls.get()]
            for call in calls:
                if call is None:
                    return
                try:
                    call.result = call.fn()
                except BaseException as e:  # noqa: BLE001 - handed to the caller, who raises it
                    call.error = e
                call.done.set()
            for loop in list(self._loops):
                loop.step()
                if not loop.busy:
                    self._loops.remove(loop)

    def step_while_busy(self, loop: "StepLoop") -> None:
        """Step ``loop`` from now on, for as long as it has sequences (call it here, after starting one)."""
        if loop not in self._loops:
            self._loops.append(loop)

    @property
    def here(self) -> bool:
        """Whether the calling thread is the compute thread."""
        return threading.current_thread() is self._thread

    def run(self, fn: Callable[[], T]) -> T:
        if self.here:
            return fn()
        if not self._thread.is_alive():
            raise RuntimeError("the model's compute thread has stopped")
        call = _Call(fn)
        self._calls.put(call)
        call.done.wait()
        if call.error is not None:
            raise call.error
        return call.result

    def post(self, fn: Callable[[], Any]) -> None:
        """Hand ``fn`` over and return at once (``fn`` reports its own outcome; an exception it raises is dropped)."""
        if not self._thread.is_alive():
            raise RuntimeError("the model's compute thread has stopped")
        self._calls.put(_Call(fn))

    def _end_at_exit(self) -> None:
        """Let the thread finish what it runs and end before the interpreter finalizes: a daemon thread still
        running when it does is ended by a forced unwind, which greenlet's C++ frames (a sequence's last switch
        out of the step loop) answer with std::terminate, an abort at every exit that raced a generation's end."""
        if self._thread.is_alive():
            self._calls.put(None)
            self._thread.join(EXIT_JOIN_SECONDS)

    def stop(self) -> None:
        """Let the thread end once the calls already handed to it are done (never the shared one's)."""
        if self is not ComputeThread._shared:
            self._calls.put(None)
