"""Every forward of a loaded model runs on the process's one compute thread (engine.batching.compute): the load,
a lone generation whole, a batch's steps, embeddings. A second thread opening parallel regions brings a second
OpenMP team, and with more workers than CPUs libgomp's teams stop spinning (a forward 1.1-1.2x slower)."""

from __future__ import annotations

import threading

import pytest

from engine.batching.compute import ComputeThread
from tests.engine.speculative.test_speculation import PROMPT, generate, write_model
from tests.engine.test_batching import concurrently, engine


def test_run_returns_raises_and_nests():
    compute = ComputeThread(name="test-compute")
    try:
        assert compute.run(lambda: 6 * 7) == 42
        with pytest.raises(ValueError, match="bad"):
            compute.run(lambda: (_ for _ in ()).throw(ValueError("bad")))
        # called from the compute thread itself it runs in place (no wait on itself)
        assert compute.run(lambda: compute.run(lambda: threading.current_thread().name)) == "test-compute"
    finally:
        compute.stop()


def test_a_busy_step_loop_is_stepped_between_the_calls_handed_over():
    """While a loop has sequences, the compute thread steps it, and runs what is handed over between two steps."""
    from engine.batching.step_loop import BatchedModel, StepLoop

    compute = ComputeThread(name="test-compute")
    where: list[str] = []
    loop = StepLoop(run_batch=lambda model, calls: where.append(threading.current_thread().name) or [0] * len(calls))
    target = BatchedModel(object(), loop, draft=False)
    finished = threading.Event()

    def body():
        for _ in range(50):
            target.forward([1], None)
        finished.set()

    try:
        compute.run(lambda: (loop.start(body), compute.step_while_busy(loop)))
        assert compute.run(lambda: 6 * 7) == 42  # served while the sequence steps
        assert finished.wait(10) and len(where) == 50 and set(where) == {"test-compute"}
        assert compute.run(lambda: loop.busy) is False
    finally:
        compute.stop()


def _recording_forwards(model, names: list[str]):
    forward, forward_batch = model.forward, model.forward_batch

    def recorded(*a, **k):
        names.append(threading.current_thread().name)
        return forward(*a, **k)

    def recorded_batch(*a, **k):
        names.append(threading.current_thread().name)
        return forward_batch(*a, **k)

    model.forward, model.forward_batch = recorded, recorded_batch


@pytest.mark.parametrize("slots", [1, 3])
def test_every_forward_runs_on_the_compute_thread(tmp_path, slots):
    eng = engine(write_model(tmp_path, "llama", seed=0), n=slots)
    names: list[str] = []
    _recording_forwards(eng.target, names)
    compute_name = eng.compute.run(lambda: threading.current_thread().name)

    def run(i):
        return generate(eng, PROMPT + " " * i, temperature=0, num_predict=6, drafter="none").tokens

    outs = concurrently(run, slots)
    assert all(len(o) > 0 for o in outs)
    assert names and set(names) == {compute_name}, set(names)
