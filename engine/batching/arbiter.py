"""One forward for several sequences: the step barrier that continuous batching is built on.

Each sequence the engine serves runs its own decode loop (``engine.speculative.loop.DecodeLoop``) in its own
thread, unchanged: it drafts, verifies, accepts and streams as it would alone. What it sees as its target (and
its draft model) is a ``BatchedModel``, whose ``forward`` does not run at once: it hands the call to the
``ForwardArbiter`` and waits. When every sequence the arbiter serves is waiting in a forward, the step runs:

* if some sequences wait on a draft model, those forwards run first, batched by model, and only they are
  released (a sequence drafting a chain comes back for its next draft step while the others keep waiting at
  their verification);
* otherwise every waiting target forward runs as ONE forward over all of their rows (``Model.forward_batch``:
  each sequence's rows attend only to its own cache), which is where batching pays: a CPU forward over 8
  rows costs about 1.8 of a forward over 1, since the weights are read once for all rows.

So a sequence's verification rows and a plain sequence's single row share one forward, and a new request's
prefill chunk joins the next step. Sequences join when their request starts and leave when it ends (or
fails); a leaving sequence can complete a step the others were waiting for, and runs it. The thread whose
arrival completes a step runs it (there is no coordinator thread); the runtime's ``run_batch`` hands the forward
itself to the process's compute thread (engine.batching.compute), where every parallel region of the model opens.
A batched forward that raises is run again one sequence at a time, so that only the sequence whose forward fails
alone gets the error.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

#: (model, list of forward calls) -> list of results, one per call, in order
BatchRunner = Callable[[Any, list["ForwardCall"]], list[Any]]


@dataclass
class ForwardCall:
    """One sequence's forward, waiting for its step."""

    model: Any
    draft: bool  # a draft model's forward (run before the targets')
    tokens: list[int]
    cache: Any
    logits_for: str
    return_hidden: bool
    done: bool = False
    result: Any = None
    error: BaseException | None = None


@dataclass
class ForwardArbiter:
    """The step barrier of the sequences one loaded model serves (see the module doc)."""

    run_batch: BatchRunner
    # Told (total rows, seconds) after each target step of single rows and verifications, the width table the
    # depth controllers price a batch's steps by (AdaptiveDepth.cost). Steps that carry a prompt chunk
    # are left out: its rows compute no logits and would price every width wider than what verifying costs.
    on_step: Callable[[int, float], None] | None = None
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _active: int = 0
    _pending: list[ForwardCall] = field(default_factory=list)
    _running: bool = False
    _exclusive: int = 0  # callers of run_exclusive waiting for the sequences to stand still
    _in_exclusive: bool = False  # a run_exclusive function is running
    steps: int = 0  # target steps run so far
    rows: int = 0  # target rows forwarded so far (rows / steps: the mean batch width)

    def join(self) -> None:
        """A sequence starts using its cache. Not while an exclusive section runs: that section may be reading the
        cache (a slot's prompt shared with another), and a sequence that joined after it saw every active one
        waiting would go on to write it (a new request cuts its slot's cache back to its prompt's prefix first)."""
        with self._cond:
            while self._in_exclusive:
                self._cond.wait()
            self._active += 1

    def leave(self) -> None:
        with self._cond:
            self._active -= 1
            self._cond.notify_all()
        self._run_ready()

    @property
    def active(self) -> int:
        return self._active

    def forward(self, call: ForwardCall) -> Any:
        """Wait for ``call``'s step (running it when this arrival completes it) and return its result."""
        with self._cond:
            self._pending.append(call)
            self._cond.notify_all()
        while True:
            self._run_ready()
            with self._cond:
                if call.done:
                    break
                if not self._ready():
                    self._cond.wait()
                if call.done:
                    break
        if call.error is not None:
            raise call.error
        return call.result

    def run_exclusive(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` while every active sequence waits in a forward (or none is active) and no step runs: no
        sequence touches its cache meanwhile, so ``fn`` may read one sequence's cache into another's. Steps are
        held back from the moment this is called, so a busy batch reaches that point within one step."""
        with self._cond:
            self._exclusive += 1
            try:
                while self._running or len(self._pending) < self._active:
                    self._cond.wait()
                self._running = self._in_exclusive = True
            finally:
                self._exclusive -= 1
        try:
            return fn()
        finally:
            with self._cond:
                self._running = self._in_exclusive = False
                self._cond.notify_all()

    def _ready(self) -> bool:
        return not self._running and not self._exclusive and bool(self._pending) and \
            len(self._pending) >= self._active

    def _run_ready(self) -> None:
        """Run one step if every active sequence waits (on the calling thread)."""
        with self._cond:
            if not self._ready():
                return
            self._running = True
            drafts = [c for c in self._pending if c.draft]
            group = drafts if drafts else list(self._pending)
            for c in group:
                self._pending.remove(c)
        try:
            started = time.perf_counter()
            failed = False
            by_model: dict[int, list[ForwardCall]] = {}
            for c in group:
                by_model.setdefault(id(c.model), []).append(c)
            for calls in by_model.values():
                try:
                    results = self.run_batch(calls[0].model, calls)
                    for c, r in zip(calls, results):
                        c.result = r
                except BaseException as e:
                    failed = True
                    if len(calls) == 1:
                        calls[0].error = e
                        continue
                    # Whose rows failed it? Each alone: only that sequence's request fails. (Nothing was
                    # committed: a forward commits its caches' lengths after its last layer.)
                    for c in calls:
                        try:
                            c.result = self.run_batch(c.model, [c])[0]
                        except BaseException as alone:  # noqa: BLE001 - the sequence's own error
                            c.error = alone
            if not drafts:
                width = sum(len(c.tokens) for c in group)
                self.steps += 1
                self.rows += width
                if self.on_step is not None and not failed and all(_decoding(c) for c in group):
                    self.on_step(width, time.perf_counter() - started)
        finally:
            with self._cond:
                for c in group:
                    c.done = True
                self._running = False
                self._cond.notify_all()


def _decoding(call: ForwardCall) -> bool:
    """A decode step's row or a verification's rows (logits for every row), not a prompt chunk."""
    return len(call.tokens) == 1 or call.logits_for == "all"


#: With other sequences in flight, a prompt is evaluated at most this many tokens a step: its chunk shares each
#: forward with their decode rows, and a larger one would stall their streams for its length. Alone, a prompt
#: takes the whole chunk it asked for (no stream waits on it; a request that arrives meanwhile joins the next
#: step): a lone 1,700-token prompt 1.07x faster in chunks of 256 than of 64 (docs/bench/prompt-chunks-zen5.md).
SHARED_PROMPT_CHUNK = 64


class BatchedModel:
    """What a sequence's decode loop calls ``forward`` on: the shared model, through the arbiter. Everything
    else (config, caches, output head) is the model's own."""

    def __init__(self, model: Any, arbiter: ForwardArbiter, draft: bool):
        self._model = model
        self._arbiter = arbiter
        self._draft = draft

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    @property
    def unbatched(self) -> Any:
        return self._model

    def prompt_chunk(self, requested: int) -> int:
        """How many of a prompt's tokens the next step evaluates: all ``requested`` when this sequence is the only
        one the arbiter serves, else at most :data:`SHARED_PROMPT_CHUNK`."""
        return requested if self._arbiter.active <= 1 else min(requested, SHARED_PROMPT_CHUNK)

    def forward(self, tokens, cache, *, logits_for: str = "all", return_hidden: bool = False):
        return self._arbiter.forward(ForwardCall(self._model, self._draft, [int(t) for t in tokens], cache,
                                                 logits_for, return_hidden))
