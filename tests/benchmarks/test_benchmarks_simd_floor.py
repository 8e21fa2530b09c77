"""benchmarks.simd_floor: the probe builds and runs, and the qdot kernel's linears of a tiny GGUF get a figure each
(a smoke run: the numbers mean nothing here)."""

from __future__ import annotations

import shutil

import pytest

from benchmarks import simd_floor as bench
from benchmarks.linears import kinds
from engine.contract.gguf import GGUFFile
from engine.ops.kernels import cpu_flags, qdot_status
from tests.tiny_gguf import TinySpec, write_tiny_gguf

pytestmark = pytest.mark.skipif("avx2" not in cpu_flags() or shutil.which("g++") is None or
                                not qdot_status().available, reason="needs AVX2, g++ and the qdot kernel")


def test_probe_and_kernel_figures(tmp_path, capsys):
    path = write_tiny_gguf(tmp_path / "t.gguf", TinySpec(arch="llama", n_layer=2, dtype="Q8_0", seed=1))
    md = tmp_path / "r.md"
    assert bench.main(["--model", str(path), "--widths", "1,4", "--repeats", "1", "--seconds", "0.02",
                       "--markdown", str(md)]) == 0
    text = md.read_text()
    assert text in capsys.readouterr().out
    assert "`python -m benchmarks.simd_floor --model t.gguf --widths 1,4 --repeats 1`" in text
    vnni = "avx512_vnni" in cpu_flags()
    for name, probe in bench.PROBES.items():
        line = next((line for line in text.splitlines() if line.startswith(f"| {probe} |")), None)
        if name in bench.VNNI_PROBES and not vnni:
            assert line is None  # its zmm instructions would fault here
            continue
        assert float(line.split("|")[2]) > 0
    for kind in kinds(GGUFFile(path)):
        cells = next(line for line in text.splitlines() if line.startswith(f"| {kind} |")).split("|")[2:4]
        assert all(float(c) > 0 for c in cells)
