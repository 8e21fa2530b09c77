"""benchmarks.decode end to end on a tiny GGUF: the JSON has every number, and every ratio is computed from
samples recorded in the same run."""

from __future__ import annotations

import importlib.util
import json
import math
import statistics

import pytest

from benchmarks import decode as bench
from benchmarks.llama_load import extra_buffer_types
from engine.ops.linear import format_problem
from tests.tiny_gguf import TinySpec, write_tiny_gguf

FAST = ["--tokens", "4", "--reps", "1", "--warmup", "0", "--prefill", "32", "--width-inner", "1",
        "--bw-mib", "16", "--settle", "0"]


def _llama_importable() -> bool:
    if importlib.util.find_spec("llama_cpp") is None:
        return False
    try:
        import llama_cpp  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install counts as absent
        return False
    return True


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("bench") / "tiny.gguf", TinySpec(arch="llama"))


def _run(tmp_path, model, extra: list[str], capsys) -> tuple[dict, str]:
    out = tmp_path / "bench.json"
    md = tmp_path / "bench.md"
    assert bench.main([str(model), *FAST, *extra, "--json", str(out), "--markdown", str(md)]) == 0
    printed = capsys.readouterr().out
    assert md.read_text().strip() == printed.strip()
    return json.loads(out.read_text()), printed


def _close(a, b, rel=1e-9):
    return a is not None and b is not None and math.isclose(a, b, rel_tol=rel)


def _times(series: dict) -> list[float]:
    return [s["seconds"] for s in series["samples"]]


def _check_subject(row: dict, widths: list[int]) -> None:
    for name in ("prefill", "decode_e2e", "decode_forward"):
        ser = row[name]
        assert ser["samples"], name
        for s in ser["samples"]:
            assert s["seconds"] > 0 and s["count"] > 0
        rates = [s["count"] / s["seconds"] for s in ser["samples"]]
        assert _close(ser["summary"]["rate_median"], statistics.median(rates))
        assert _close(ser["summary"]["rate_best"], max(rates))
    assert row["prefill"]["samples"][0]["count"] == 32
    assert 1 <= row["decode_e2e"]["samples"][0]["count"] <= 3  # 4 tokens at most, the first from the prompt
    assert row["decode_forward"]["samples"][0]["count"] == 4
    # width ratios = recorded times / the width-1 time of the same run
    assert sorted(int(w) for w in row["width"]) == widths
    t1 = _times(row["width"]["1"])
    for w in widths:
        tw = _times(row["width"][str(w)])
        assert _close(row["width_ms"][str(w)]["median"], statistics.median(tw) * 1e3)
        assert _close(row["width_ratio"][str(w)]["median"], statistics.median(tw) / statistics.median(t1))
        assert _close(row["width_ratio"][str(w)]["min"], min(tw) / min(t1))
    assert _close(row["width_ratio"]["1"]["median"], 1.0)
    # the bound: bandwidth of this run / bytes per token
    b = row["bound"]
    assert b["bytes_per_token"] == row["bytes_per_token"] > 0
    assert _close(b["ceiling_tok_s"], b["bandwidth_gbs"] * 1e9 / b["bytes_per_token"])
    assert _close(b["fraction_forward"], row["decode_forward"]["summary"]["rate_median"] / b["ceiling_tok_s"])


def test_bench_tandem_only(tmp_path, tiny, capsys):
    data, printed = _run(tmp_path, tiny, ["--no-llama", "--formats", "auto,bf16-packed,bf16,int8,int4"], capsys)
    # a format this CPU cannot run is left out, with the engine's reason (bf16-packed on AVX2-only hosts)
    packed_problem = format_problem("bf16-packed")
    assert data["settings"]["skipped_formats"] == ({"bf16-packed": packed_problem} if packed_problem else {})
    for key in ("started", "finished", "command", "model", "settings", "environment", "loadavg_start",
                "loadavg_end", "bandwidth", "prompt_tokens", "llama_cpp", "repetitions", "results", "vs_llama_cpp"):
        assert key in data, key
    env = data["environment"]
    for key in ("torch", "threads", "amx", "avx512", "avx512_bf16", "cpu_model"):
        assert key in env, key
    assert "benchmarks.decode" in data["command"] and "--tokens 4" in data["command"]
    assert data["settings"]["threads"] == env["threads"] >= 1
    assert len(data["loadavg_start"]) == 3 and len(data["loadavg_end"]) == 3
    assert data["llama_cpp"]["status"].startswith("skipped")
    assert data["vs_llama_cpp"] == {}
    bw = data["bandwidth"]
    assert len(bw["gemv_gbs"]) == len(bw["sum_gbs"]) == 1
    # the bound uses the fastest probe (the native stream read where it builds)
    assert bw["used_gbs"] == max(bw["gemv_gbs"] + bw["sum_gbs"] + bw["stream_gbs"]) > 0
    assert data["prompt_tokens"] == 32

    rows = data["results"]
    # 'auto' resolves to one concrete format; auto-int4 on an F32 file = int8 kernels, but another name
    assert [r["kind"] for r in rows] == ["tandem"] * len(rows)
    assert {r["format"] for r in rows} >= {"bf16", "int8", "int4"} | (set() if packed_problem else {"bf16-packed"})
    assert len({r["format"] for r in rows}) == len(rows)
    for r in rows:
        _check_subject(r, [1, 2, 4, 8, 16])
        assert r["linears_w1"]["samples"] and r["overhead"]["linears_ms"] > 0
        assert r["load_seconds"] > 0
    # different formats read different bytes per token
    by = {r["format"]: r["bytes_per_token"] for r in rows}
    assert by["bf16"] > by["int8"] > by["int4"]
    for label in ("## Speed", "## Cost of one forward by width", "tandem bf16", "load average"):
        assert label in printed


@pytest.mark.skipif(not _llama_importable(), reason="llama_cpp (llama-cpp-python) is not importable")
def test_bench_with_llama_cpp(tmp_path, tiny, capsys):
    data, printed = _run(tmp_path, tiny, ["--formats", "int8"], capsys)
    status = data["llama_cpp"]["status"]
    if "comparison skipped" in status:  # importable, but the probe run crashed (e.g. a build for another CPU)
        assert "## tandem / llama.cpp" not in printed and data["vs_llama_cpp"] == {}
        pytest.skip(status)
    rows = {r["label"]: r for r in data["results"]}
    assert set(rows) == {"tandem int8", "llama.cpp"}
    ref = rows["llama.cpp"]
    _check_subject(ref, [1, 2, 4, 8, 16])
    _check_subject(rows["tandem int8"], [1, 2, 4, 8, 16])
    # tandem / llama.cpp ratios come from the medians recorded in this run
    vs = data["vs_llama_cpp"]["tandem int8"]
    for name in ("prefill", "decode_e2e", "decode_forward"):
        mine = rows["tandem int8"][name]["summary"]["rate_median"]
        theirs = ref[name]["summary"]["rate_median"]
        assert _close(vs[name]["ratio"], mine / theirs)
        # one repetition: the same-repetition ratio is the same number
        assert _close(vs[name]["same_rep_median"], mine / theirs)
    # both engines ran the same prompt in the same run, interleaved
    order = data["repetitions"][0]["order"]
    assert set(order) == {"tandem int8", "llama.cpp"}
    assert "## tandem / llama.cpp (same run)" in printed


def test_llama_cpp_loads_without_extra_buffer_types_only_when_asked():
    """llama.cpp built natively on an AMX host crashes after repacking its weights for AMX; the bench then
    loads it with ``use_extra_bufts`` off. ``Llama()`` has no such argument, so the defaults it reads are
    overridden for the load alone, and only when asked."""
    import types

    class Params:
        use_extra_bufts = True

    low = types.SimpleNamespace(llama_model_default_params=Params)
    module = types.SimpleNamespace(llama_cpp=low)
    with extra_buffer_types(module, True):
        assert low.llama_model_default_params().use_extra_bufts is True
    with extra_buffer_types(module, False):
        assert low.llama_model_default_params().use_extra_bufts is False
    assert low.llama_model_default_params is Params
    assert low.llama_model_default_params().use_extra_bufts is True
