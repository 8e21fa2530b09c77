"""benchmarks.first_burst: a fresh server's first burst of clients and the next, measured through the real server (a
smoke run on a tiny model: the numbers mean nothing here)."""

from __future__ import annotations

import shutil

from benchmarks import first_burst as bench
from tests.tiny_gguf import TinySpec, write_tiny_gguf


def test_a_round_reports_the_first_burst_and_the_next(tmp_path, capsys):
    model = write_tiny_gguf(tmp_path / "t.gguf", TinySpec(arch="llama", n_layer=2, seed=1))
    md = tmp_path / "r.md"
    assert bench.main(["--model", str(model), "--clients", "2", "--tokens", "4", "--rounds", "1", "--parallel", "2",
                       "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "`python -m benchmarks.first_burst --model t.gguf --clients 2 --tokens 4 --rounds 1 --parallel 2`" in text
    row = next(line for line in text.splitlines() if line.startswith("| this | 1 |")).split("|")
    first, ttft_p50, ttft_max, later = float(row[3]), float(row[4]), float(row[5]), float(row[7])
    assert first > 0 and later > 0 and 0 < ttft_p50 <= ttft_max


def test_with_a_draft_model_the_burst_goes_to_the_pair(tmp_path):
    model = write_tiny_gguf(tmp_path / "t.gguf", TinySpec(arch="llama", n_layer=2, seed=1))
    draft = write_tiny_gguf(tmp_path / "d.gguf", TinySpec(arch="llama", n_layer=1, seed=2))
    home = bench.prepared_store(str(model), str(draft))
    try:
        assert "DRAFT " in bench.modelfile(home) and "drafter none" not in bench.modelfile(home)
    finally:
        shutil.rmtree(home)
    md = tmp_path / "r.md"
    assert bench.main(["--model", str(model), "--draft", str(draft), "--clients", "2", "--tokens", "4", "--rounds", "1",
                       "--parallel", "2", "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "(the DRAFT pair)" in text and "--draft d.gguf" in text
    row = next(line for line in text.splitlines() if line.startswith("| this | 1 |")).split("|")
    assert float(row[3]) > 0
