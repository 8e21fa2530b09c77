"""One loop owns the batch: a loaded model's sequences, stepped together on the compute thread.

Every request the model serves is a *sequence*: its decode loop (engine.speculative.loop.DecodeLoop, the same code
whether it runs alone or beside others) runs as a greenlet on the compute thread (engine.batching.compute). What it
sees as its target (and its draft model) is a ``BatchedModel``, whose ``forward`` does not run: it parks the
sequence with a ``ForwardCall``. Each ``step``:

1. resumes every runnable sequence until it parks at its next forward or ends: its Python (sampling, acceptance,
   drafting, streaming its text to its request's queue) runs here, one sequence after another;
2. picks the step's forwards (``policy.next_group``: draft-model forwards first, else every target forward) and
   runs them as ONE ``forward_batch`` per model, each sequence's rows attending to its own cache: a CPU forward
   over 8 rows costs about 2 of one, since the weights are read once for all rows;
3. hands each of those sequences its result, or its own error (a batched forward that raises is run again one
   sequence at a time, so that only the sequence whose forward fails gets the error).

Between steps the compute thread serves its other work (a new sequence's start, an embedding, a load): a sequence
joins at a step boundary, where no forward is half done and no sequence is between a forward and its bookkeeping
of it, so copying another slot's cached prefix there needs no lock. The slot states are explicit
(``SequenceState``): runnable, waiting in a forward, done.

Why greenlets and not a thread per sequence (how this engine batched before): the threads met at a barrier, each
step handed through a condition variable per sequence, and their Python ran one after another under the GIL
anyway. Why not plain generators: a forward is called from deep inside the drafters (a draft model's chain, its
catch-up on accepted tokens), and making every such call a ``yield`` would fork the decode loop into a batched
copy and an unbatched one.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import greenlet

from engine.batching import policy
from engine.batching.policy import ForwardCall
from engine.batching.step_trace import StepTrace

#: (model, list of forward calls) -> list of results, one per call, in order
BatchRunner = Callable[[Any, list[ForwardCall]], list[Any]]


class SequenceState(enum.Enum):
    RUNNABLE = "runnable"  # its Python runs at the next step (just started, or its forward is done)
    WAITING = "waiting"  # parked in a forward the next step may run
    DONE = "done"


@dataclass
class _Sequence:
    runner: greenlet.greenlet
    state: SequenceState = SequenceState.RUNNABLE
    call: ForwardCall | None = None


@dataclass
class StepLoop:
    """The sequences one loaded model serves, stepped together (see the module doc). Every method runs on the
    compute thread, which calls ``step`` while ``busy``."""

    run_batch: BatchRunner
    # Told (total rows, seconds) after each target step of single rows and verifications (policy.prices_widths):
    # the width table the depth controllers price a batch's steps by (AdaptiveDepth.cost).
    on_step: Callable[[int, float], None] | None = None
    # Told every step's forwards (TANDEM_STEP_TRACE): where the engine's time went under load (step_trace).
    trace: StepTrace | None = None
    _sequences: list[_Sequence] = field(default_factory=list)
    _by_runner: dict[greenlet.greenlet, _Sequence] = field(default_factory=dict)
    steps: int = 0  # target steps run so far
    rows: int = 0  # target rows forwarded so far (rows / steps: the mean batch width)

    @property
    def active(self) -> int:
        """Sequences in flight: what shares each step."""
        return len(self._sequences)

    @property
    def busy(self) -> bool:
        return bool(self._sequences)

    def start(self, body: Callable[[], None]) -> None:
        """A new sequence: ``body`` runs from the next step on, parking at each forward. It must not raise (it
        reports its own errors to its request)."""
        seq = _Sequence(greenlet.greenlet(body))
        self._sequences.append(seq)
        self._by_runner[seq.runner] = seq

    def forward(self, call: ForwardCall) -> Any:
        """``call``'s result: from a sequence, once a step has run it (the sequence parks until then); from
        anywhere else, at once and alone."""
        seq = self._by_runner.get(greenlet.getcurrent())
        if seq is None:
            return self.run_batch(call.model, [call])[0]
        seq.runner.parent.switch(call)  # park: the loop resumes us when the step that ran ``call`` is over
        if call.error is not None:
            raise call.error
        return call.result

    def step(self) -> None:
        """Run every runnable sequence to its next forward, then one step of the forwards they wait in."""
        for seq in [s for s in self._sequences if s.state is SequenceState.RUNNABLE]:
            self._resume(seq)
        waiting = {id(s.call): s for s in self._sequences if s.state is SequenceState.WAITING}
        if not waiting:
            return
        group = policy.next_group([s.call for s in waiting.values()])
        started = time.perf_counter()
        failed = self._run(group)
        seconds = time.perf_counter() - started
        rows = [len(c.tokens) for c in group]  # each sequence's rows in the step
        if self.trace is not None:
            self.trace.record(group[0].draft, rows, seconds)
        if not group[0].draft:
            width = sum(rows)
            self.steps += 1
            self.rows += width
            if self.on_step is not None and not failed and policy.prices_widths(group):
                self.on_step(width, seconds)
        for c in group:
            waiting[id(c)].state = SequenceState.RUNNABLE

    def _resume(self, seq: _Sequence) -> None:
        seq.runner.parent = greenlet.getcurrent()  # where it parks: this step (whoever started it)
        try:
            parked = seq.runner.switch()  # returns when the sequence parks (the call) or ends (its body's None)
        except BaseException:  # noqa: BLE001 - a body reports its own errors; one that escaped ends only it
            parked = None
        if seq.runner.dead:
            seq.state, seq.call = SequenceState.DONE, None
            self._sequences.remove(seq)
            del self._by_runner[seq.runner]
        else:
            seq.state, seq.call = SequenceState.WAITING, parked

    def _run(self, group: list[ForwardCall]) -> bool:
        """Run ``group``'s forwards, one batch per model; whether any failed (each failing call holds its error)."""
        failed = False
        by_model: dict[int, list[ForwardCall]] = {}
        for c in group:
            by_model.setdefault(id(c.model), []).append(c)
        for calls in by_model.values():
            try:
                for c, r in zip(calls, self.run_batch(calls[0].model, calls)):
                    c.result = r
            except BaseException as e:  # noqa: BLE001 - each sequence gets its own error below
                failed = True
                if len(calls) == 1:
                    calls[0].error = e
                    continue
                # Whose rows failed it? Each alone: only that sequence's request fails. (Nothing was committed:
                # a forward commits its caches' lengths after its last layer.)
                for c in calls:
                    try:
                        c.result = self.run_batch(c.model, [c])[0]
                    except BaseException as alone:  # noqa: BLE001 - the sequence's own error
                        c.error = alone
        return failed


class BatchedModel:
    """What a sequence's decode loop calls ``forward`` on: the shared model, through the step loop. Everything
    else (config, caches, output head) is the model's own."""

    def __init__(self, model: Any, loop: StepLoop, draft: bool):
        self._model = model
        self._loop = loop
        self._draft = draft

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    @property
    def unbatched(self) -> Any:
        return self._model

    def prompt_chunk(self, requested: int) -> int:
        """How many of a prompt's tokens the next step evaluates (policy.prompt_chunk)."""
        return policy.prompt_chunk(requested, self._loop.active)

    def forward(self, tokens, cache, *, logits_for: str = "all", return_hidden: bool = False):
        return self._loop.forward(ForwardCall(self._model, self._draft, [int(t) for t in tokens], cache,
                                              logits_for, return_hidden))
