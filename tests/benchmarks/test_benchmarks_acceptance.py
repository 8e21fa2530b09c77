"""benchmarks.acceptance on a small vocabulary (a smoke run: the numbers mean nothing here)."""

from __future__ import annotations

from benchmarks import acceptance as bench


def test_acceptance_benchmark_times_both_forms(tmp_path, capsys):
    t = bench.time_rounds(vocab=500, width=3, opts=bench.SETTINGS["greedy"], reps=3)
    assert set(t) == {"candidates", "dense"} and all(v > 0 for v in t.values())
    md = tmp_path / "a.md"
    assert bench.main(["--vocab", "500", "--widths", "1,2", "--reps", "2", "--markdown", str(md)]) == 0
    table = md.read_text()
    assert table in capsys.readouterr().out
    assert table.count("| greedy |") == 2
