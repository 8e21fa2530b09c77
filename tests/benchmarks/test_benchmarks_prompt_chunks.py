"""benchmarks.prompt_chunks runs end to end on a tiny model and reports every cell."""

from __future__ import annotations

from benchmarks import prompt_chunks
from tests.engine.speculative.test_speculation import write_model


def test_prompt_chunks_reports_every_length_and_chunk(tmp_path):
    path = write_model(tmp_path, "llama", seed=0)
    out = prompt_chunks.main([str(path), "--lengths", "40,70", "--chunks", "16,32", "--reps", "1",
                              "--markdown", str(tmp_path / "out.md")])
    rows = [line for line in out.splitlines() if line.startswith("| 40 ") or line.startswith("| 70 ")]
    assert len(rows) == 2 and all(row.count("(") == 2 for row in rows)
    assert (tmp_path / "out.md").read_text() == out
