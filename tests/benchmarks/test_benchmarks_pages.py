"""benchmarks.pages end to end on a tiny quantized GGUF: a row for each place the weights can live, the placed
copy on 2 MB mappings and the switched-off one not."""

from __future__ import annotations

import json

import pytest

from benchmarks import pages as bench
from engine.models import loader
from engine.ops.kernels import qdot_status
from engine.ops.memory import huge_pages_available, place_on_huge_pages
from tests.tiny_gguf import TinySpec, write_tiny_gguf


@pytest.mark.skipif(not qdot_status().available, reason="the qdot kernel is not built here")
@pytest.mark.skipif(not huge_pages_available(), reason="this kernel has no transparent huge pages")
def test_table(tmp_path):
    gguf = write_tiny_gguf(tmp_path / "m.gguf", TinySpec(arch="qwen2", dtype="Q8_0", n_embd=512, n_ff=2048))
    out, js = tmp_path / "pages.md", tmp_path / "pages.json"
    bench.main([str(gguf), "--rounds", "2", "--tokens", "2", "--threads", "1", "--markdown", str(out),
                "--json", str(js)])
    rows = [line.split("|") for line in out.read_text().splitlines() if line.startswith("| ") and "ms" not in line]
    assert [r[1].strip() for r in rows] == ["placed", "4 kB", "pack cache"]
    results = json.loads(js.read_text())["results"]
    assert results["placed"]["AnonHugePages"] > results["4 kB"]["AnonHugePages"]
    assert all(len(r["ms_per_token"]) == 2 for r in results.values())
    assert loader.place_on_huge_pages is place_on_huge_pages  # the switch is put back
