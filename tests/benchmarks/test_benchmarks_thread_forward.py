"""benchmarks.thread_forward runs end to end on a tiny model and reports each round."""

from __future__ import annotations

from benchmarks import thread_forward
from tests.engine.speculative.test_speculation import write_model


def test_thread_forward_reports_each_round(tmp_path):
    out = thread_forward.main([str(write_model(tmp_path, "llama", seed=0)), "--forwards", "2", "--rounds", "2",
                               "--threads", "1"])
    rows = [line for line in out.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert len(rows) == 2
