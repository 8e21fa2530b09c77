"""benchmarks.kv_pages end to end on a tiny GGUF: a row per shape, both copies timed every rep, and the
copies' caches where the table says they are."""

from __future__ import annotations

import pytest

from benchmarks import kv_pages as bench
from engine.models import loader
from engine.ops.memory import huge_pages_available, process_mappings
from tests.tiny_gguf import TinySpec, write_tiny_gguf


@pytest.mark.skipif(not huge_pages_available(), reason="this kernel has no transparent huge pages")
def test_table(tmp_path, monkeypatch):
    # head_dim 128 and 4 key heads over 2 layers: 4 kB a position for each of K and V, so a cache of 600
    # positions spans 2 MB pages
    gguf = write_tiny_gguf(tmp_path / "m.gguf", TinySpec(arch="qwen2", dtype="F32", n_head=4, n_head_kv=4,
                                                          head_dim=128, context_length=1024))
    model = loader.load_model(gguf)
    seen = []
    step = bench._step

    def recording(m, caches, token):
        for c in caches:
            where = [mp for mp in process_mappings() if mp.start <= c.k.data_ptr() < mp.end][0]
            seen.append(where.huge_advised and not where.heap)
        return step(m, caches, token)

    monkeypatch.setattr(bench, "_step", recording)
    times = bench.measure(model, 600, 2, reps=3)
    assert {k: len(v) for k, v in times.items()} == {"2 MB": 3, "4 kB": 3}
    # rep 0 times the 2 MB copy first, rep 1 the 4 kB one: each step over two caches
    assert seen[:4] == [True, True, False, False] and seen[4:8] == [False, False, True, True]

    out = tmp_path / "kv.md"
    monkeypatch.setattr(loader, "load_model", lambda path: model)
    bench.main([str(gguf), "--shapes", "30x1,20x3", "--reps", "2", "--threads", "1", "--markdown", str(out)])
    rows = [line.split("|")[1].strip() for line in out.read_text().splitlines() if line.startswith("| ") and "ms" not in line]
    assert rows == ["30 x 1", "20 x 3"]
