"""benchmarks.moe end to end on a tiny configuration: one row per width, and the bytes it reports follow from
the routing (a single token reads its k experts, as the dense model reads an FFN of the same size, plus
the routers; wider batches read more distinct experts per forward)."""

from __future__ import annotations

from benchmarks import moe as bench

TINY = ["--layers", "1", "--embd", "64", "--heads", "4", "--head-dim", "16", "--experts", "8", "--used", "2",
        "--expert-ff", "32", "--reps", "1", "--widths", "1,4"]


def test_table(tmp_path, capsys):
    out = tmp_path / "moe.md"
    bench.main([*TINY, "--markdown", str(out)])
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r.split("|")[1].strip() for r in rows] == ["1", "4"]
    ratio = {int(r.split("|")[1]): float(r.split("|")[7]) for r in rows}
    # width 1: the same FFN bytes as the dense model, plus an F32 router of 8 x 64 per layer
    assert 1.0 <= ratio[1] < 1.1
    assert ratio[4] <= ratio[1] * 8 / 2  # never more than every expert once per forward
    assert "python -m benchmarks.moe" in out.read_text()
