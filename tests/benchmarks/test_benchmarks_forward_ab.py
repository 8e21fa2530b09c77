"""benchmarks.forward_ab on a tiny GGUF, this checkout against itself (a smoke run: the numbers mean nothing here):
both sides load, answer every width and the prefill chunk, and the report has a row each."""

from __future__ import annotations

from pathlib import Path

from benchmarks import forward_ab as bench
from tests.tiny_gguf import TinySpec, write_tiny_gguf


def test_both_sides_time_every_forward(tmp_path):
    path = write_tiny_gguf(tmp_path / "t.gguf", TinySpec(arch="llama", n_layer=2, dtype="Q8_0", seed=1))
    here = Path(bench.__file__).resolve().parent.parent
    times = bench.measure(here, str(path), [1, 4], 32, rounds=2, threads=1)
    assert list(times) == ["w=1", "w=4", "prefill 32"]
    reps = {"w=1": 8, "w=4": 2, "prefill 32": 1}
    for label, (base, this) in times.items():
        assert len(base) == len(this) == 2 * reps[label] and min(base + this) > 0
    lines = bench.report(times, "python -m benchmarks.forward_ab ...", 1)
    rows = [line for line in lines if line.startswith("| w=") or line.startswith("| prefill")]
    assert [r.split(" | ")[0] for r in rows] == ["| w=1", "| w=4", "| prefill 32"]
