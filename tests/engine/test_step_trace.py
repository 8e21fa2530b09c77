"""The step loop's trace (TANDEM_STEP_TRACE): one line per step, read back per window of wall time."""

from __future__ import annotations

import os
import time

from engine.batching.step_loop import BatchedModel, StepLoop
from engine.batching.step_trace import StepRecord, StepTrace, read_steps, summarise, trace_path
from tests.engine.test_batching import run_sequences


def test_every_step_is_traced_with_its_kind_sequences_rows_and_time(tmp_path):
    def run_batch(model, calls):
        time.sleep(0.01)  # a forward that takes measurable time
        return [None] * len(calls)

    trace = StepTrace(tmp_path / "traces")
    loop = StepLoop(run_batch, trace=trace)
    target, draft = BatchedModel("target", loop, draft=False), BatchedModel("draft", loop, draft=True)

    def drafting():
        draft.forward([1], None)
        target.forward([1, 2], None)  # a verification of one draft

    start = time.time()
    run_sequences(loop, drafting, lambda: target.forward([7], None))
    end = time.time()
    trace.close()
    assert trace.path == trace_path(tmp_path / "traces", os.getpid())
    steps = read_steps(trace.path)
    assert [(s.draft, s.sequences, s.rows) for s in steps] == [(True, 1, 1), (False, 2, 3)]
    assert all(s.seconds >= 0.01 and start <= s.ended <= end for s in steps)
    summary = summarise(steps, start, end)
    assert (summary.target_steps, summary.draft_steps, summary.target_rows) == (1, 1, 3)
    assert summary.rows_per_step == 3.0
    # the two forwards slept 20 ms of the window; the rest was the loop and the test around it
    assert 0.02 <= summary.target_seconds + summary.draft_seconds <= summary.wall
    assert 0 < summary.forward_share <= 1


def test_a_window_counts_only_the_steps_that_ended_inside_it():
    steps = [StepRecord(10.0, False, 2, 2, 0.5), StepRecord(11.0, True, 2, 2, 0.25), StepRecord(12.0, False, 4, 9, 1.0)]
    s = summarise(steps, 10.5, 12.0)
    assert (s.target_steps, s.draft_steps, s.target_rows) == (1, 1, 9)
    assert s.forward_share == (1.0 + 0.25) / 1.5 and s.rows_per_step == 9.0
    empty = summarise(steps, 20.0, 20.0)
    assert empty.forward_share == 0.0 and empty.rows_per_step == 0.0


def test_a_line_cut_short_is_skipped_and_a_closed_trace_writes_nothing(tmp_path):
    trace = StepTrace(tmp_path)
    trace.record(False, [1, 1], 0.02)
    trace.close()
    trace.record(False, [1], 0.01)  # after an unload's close: nothing, and no error in the step that called it
    with open(trace.path, "a") as f:
        f.write("1796660000.5\ttarget\t3")  # a writer cut off mid-line
    steps = read_steps(trace.path)
    assert [(s.sequences, s.rows) for s in steps] == [(2, 2)]


def test_a_directory_the_engine_cannot_write_means_no_trace_not_a_failed_load(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert StepTrace.opened(blocker / "traces") is None  # mkdir under a file: OSError
    assert StepTrace.opened(None) is None and StepTrace.opened("") is None
    trace = StepTrace.opened(tmp_path / "ok")
    assert trace is not None and trace.path.parent == tmp_path / "ok"
    trace.close()
