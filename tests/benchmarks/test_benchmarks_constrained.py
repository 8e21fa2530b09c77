"""benchmarks.constrained end to end on tiny GGUFs (a smoke run: the script works and reports every
configuration; the numbers mean nothing here)."""

from __future__ import annotations

import json

from benchmarks import constrained as bench
from tests.tiny_gguf import TinySpec, write_tiny_gguf


def test_constrained_benchmark_smoke(tmp_path, capsys):
    target = write_tiny_gguf(tmp_path / "t.gguf", TinySpec(arch="qwen2", seed=1))
    draft = write_tiny_gguf(tmp_path / "d.gguf", TinySpec(arch="qwen2", n_layer=1, seed=2))
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    assert bench.main(["--model", str(target), "--draft", str(draft), "--tokens", "6", "--runs", "1",
                       "--warmup", "0", "--temps", "0", "--json", str(out), "--markdown", str(md)]) == 0
    report = json.loads(out.read_text())
    rows = {r["config"]: r for r in report["results"]}
    assert set(rows) == {"plain", "model", "ngram"}
    assert rows["plain"]["ratio"] == 1.0 and rows["plain"]["acceptance_rate"] is None
    assert rows["model"]["tok_s"] > 0 and rows["model"]["acceptance_rate"] is not None
    assert md.read_text().strip() in capsys.readouterr().out  # the table printed is the one written
    assert "| 0 | model |" in md.read_text()
