"""benchmarks.pair_in_batch runs end to end on a tiny pair and reports each client count."""

from __future__ import annotations

from benchmarks import pair_in_batch
from tests.engine.speculative.test_speculation import write_model


def test_pair_in_batch_reports_each_client_count(tmp_path):
    target, draft = write_model(tmp_path, "t", seed=0), write_model(tmp_path, "d", seed=0, noise=0.3)
    out = pair_in_batch.main([str(target), str(draft), "--slots", "2", "--clients", "1,2", "--reps", "1",
                              "--tokens", "4", "--requests", "2", "--threads", "1", "--num-ctx", "128"])
    rows = [line for line in out.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert len(rows) == 2
