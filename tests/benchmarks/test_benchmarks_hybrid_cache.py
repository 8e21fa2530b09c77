"""benchmarks.hybrid_cache end to end on a tiny geometry: the states it reports held follow from what the
cache keeps (the prompt's two checkpoints plus one state per position inside the verification)."""

from __future__ import annotations

import argparse

from benchmarks import hybrid_cache as bench
from engine.models.loader import load_model

TINY = dict(embd=64, k_heads=2, v_heads=4, head_k=32, head_v=32, ff=64, layers=4, type="F32")


def test_held_states_follow_the_width(tmp_path):
    path = tmp_path / "hybrid.gguf"
    bench._write(path, argparse.Namespace(**TINY))
    rows = bench.measure(load_model(path), [1, 3], reps=3)
    state = 4 * 32 * 32 * 4  # value heads x head_k x head_v, f32
    conv = (2 * 2 * 32 + 4 * 32) * 3 * 4  # conv channels x (kernel - 1), f32
    assert [(r["width"], r["held_bytes_per_layer"]) for r in rows] == [(1, 2 * (state + conv)), (3, 4 * (state + conv))]
    assert all(r["restore_us"] > 0 and r["forward_ms"] > 0 for r in rows)


def test_table(tmp_path):
    out = tmp_path / "hybrid.md"
    bench.main(["--embd", "64", "--k-heads", "2", "--v-heads", "4", "--head-k", "32", "--head-v", "32", "--ff", "64",
                "--type", "F32", "--reps", "1", "--widths", "1,2", "--threads", "1", "--markdown", str(out)])
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r.split("|")[1].strip() for r in rows] == ["1", "2"]
    assert "python -m benchmarks.hybrid_cache" in out.read_text()
