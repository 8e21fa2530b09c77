"""benchmarks.linears on a tiny GGUF: every 2-D weight but the embedding lands in one kind, timed at each
width (a smoke run: the numbers mean nothing here)."""

from __future__ import annotations

from benchmarks import linears as bench
from engine.contract.gguf import GGUFFile
from tests.tiny_gguf import TinySpec, write_tiny_gguf


def test_linears_by_kind(tmp_path, capsys):
    path = write_tiny_gguf(tmp_path / "t.gguf", TinySpec(arch="llama", n_layer=2, dtype="Q8_0", seed=1))
    groups = bench.kinds(GGUFFile(path))
    assert groups["ffn_down Q8_0"] == ["blk.0.ffn_down.weight", "blk.1.ffn_down.weight"]
    assert not any(k.startswith(("token_embd", "output_norm", "attn_norm")) for k in groups)
    md = tmp_path / "r.md"
    bench.main([str(path), "--widths", "1,3", "--passes", "1", "--format", "f32", "--markdown", str(md)])
    table = md.read_text()
    assert table in capsys.readouterr().out
    for kind, names in groups.items():
        assert f"| {kind} | {len(names)} |" in table


def test_synthetic_weights_are_written_and_timed_one_kind_each(tmp_path, capsys):
    path = tmp_path / "s.gguf"
    bench.main([str(path), "--synthetic", "Q5_0:48x64,Q8_0:16x96", "--threads", "1", "--widths", "1,2",
                "--passes", "2"])
    f = GGUFFile(path)
    assert {n: (t.type_name, tuple(t.shape)) for n, t in f.tensors.items()} == {
        "blk.0.q5_0_48x64.weight": ("Q5_0", (48, 64)), "blk.0.q8_0_16x96.weight": ("Q8_0", (16, 96))}
    out = capsys.readouterr().out
    assert "| q5_0_48x64 Q5_0 | 1 |" in out and "| q8_0_16x96 Q8_0 | 1 |" in out
    assert "1 threads" in out
