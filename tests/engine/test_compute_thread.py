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


def test_iterate_runs_every_step_and_the_close_on_the_compute_thread():
    compute = ComputeThread(name="test-compute")
    seen, closed = [], []

    def gen():
        try:
            for i in range(5):
                seen.append(threading.current_thread().name)
                yield i
        finally:
            closed.append(threading.current_thread().name)

    try:
        assert list(compute.iterate(gen)) == list(range(5))
        assert set(seen) == {"test-compute"} and closed == ["test-compute"]
        seen.clear(), closed.clear()
        it = compute.iterate(gen)
        assert next(it) == 0
        it.close()  # the consumer stops early: the generation's own finally runs, there
        assert closed == ["test-compute"]
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
