"""benchmarks.load end to end on a tiny quantized GGUF: a row per kind of load, the warm one mapping the cache the
cold one wrote."""

from __future__ import annotations

import pytest

from benchmarks import load as bench
from engine.ops.kernels import qdot_status
from tests.tiny_gguf import TinySpec, write_tiny_gguf


@pytest.mark.skipif(not qdot_status().available, reason="the qdot kernel is not built here")
def test_table(tmp_path):
    gguf = write_tiny_gguf(tmp_path / "m.gguf", TinySpec(arch="qwen2", dtype="Q8_0"))
    out = tmp_path / "load.md"
    bench.main([str(gguf), "--rounds", "1", "--threads", "1", "--markdown", str(out)])
    rows = [line.split("|") for line in out.read_text().splitlines()
            if line.startswith(("| no cache", "| cold", "| warm"))]
    assert [r[1].strip() for r in rows] == ["no cache", "cold", "warm"]
    assert all(r[6].strip() == "qdot" and float(r[2].split()[0]) > 0 and float(r[4].split()[0]) > 0 for r in rows)
