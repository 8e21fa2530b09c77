"""IQ quantization types and MXFP4: engine.ops.dequant against libggml itself and against gguf-py (bit-exact), and
tiny models stored in these types loading and running like their f32-dequantized twins."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine.contract.capabilities import SUPPORTED_TENSOR_TYPES
from engine.contract.gguf import GGML_TYPES, GGUFFile
from engine.models.loader import load_model
from engine.ops import dequant as dq
from engine.ops import linear as L
from engine.ops.kernels import load_qdot
from tests import libggml
from tests.tiny_gguf import TinySpec, random_blocks, write_tiny_gguf

GT = gguf.GGMLQuantizationType

IQ_TYPES = [GT.IQ4_NL, GT.IQ4_XS, GT.IQ3_XXS, GT.IQ3_S, GT.IQ2_XXS, GT.IQ2_XS, GT.IQ2_S, GT.IQ1_S, GT.IQ1_M,
            GT.MXFP4]


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a).reshape(-1).copy())


def _blocks(qtype: GT, n: int, k: int, seed: int = 0) -> np.ndarray:
    raw = random_blocks(qtype, (n, k), np.random.default_rng(seed))
    if qtype == GT.MXFP4:  # every E8M0 exponent once, the subnormal (0, 1) and overflowing ones included
        raw.reshape(-1, 17)[:256, 0] = np.arange(256)
    return raw


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_bit_exact_with_gguf_py(qtype):
    n, k = 96, 1024  # 384 blocks of 256: every sign pattern, and most grid points of the smaller lattices
    raw = _blocks(qtype, n, k)
    with np.errstate(over="ignore"):  # MXFP4's largest exponents overflow to inf, in both
        ref = gguf.quants.dequantize(raw, qtype).reshape(n, k)
    assert not np.isnan(ref).any()
    got = dq.dequantize(_t(raw), int(qtype), (n, k))
    assert torch.equal(got, torch.from_numpy(ref))
    assert torch.equal(dq.dequantize(_t(raw), int(qtype), (n, k), torch.bfloat16), got.bfloat16())


@pytest.mark.skipif(libggml.library() is None, reason="libggml-base (llama.cpp) not found")
@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_bit_exact_with_libggml(qtype):
    """llama.cpp's own quantizer writes the blocks (real ones: scales and grid points as a model's weights carry
    them) and its own to_float reads them; ours reads the same f32 bits. Random blocks too (every sign pattern)."""
    n, k = 32, 1024
    x = np.random.default_rng(3).standard_normal((n, k)).astype(np.float32) * 0.02
    _, block, block_bytes = GGML_TYPES[int(qtype)]
    for raw in (libggml.quantize(x, int(qtype), k // block * block_bytes), _blocks(qtype, n, k, seed=2)):
        with np.errstate(over="ignore"):
            ref = libggml.dequantize(raw, int(qtype), n * k).reshape(n, k)
        got = dq.dequantize(_t(raw), int(qtype), (n, k))
        assert torch.equal(got, torch.from_numpy(ref))


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_rows(qtype):
    n, k = 40, 512
    raw = _blocks(qtype, n, k, seed=1)
    with np.errstate(over="ignore"):
        ref = torch.from_numpy(gguf.quants.dequantize(raw, qtype).reshape(n, k))
    rows = torch.tensor([5, 0, 39, 5, 17])
    assert torch.equal(dq.dequantize_rows(_t(raw), int(qtype), (n, k), rows), ref[rows])


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_chunks_do_not_change_the_result(qtype, monkeypatch):
    n, k = 16, 512
    raw = _blocks(qtype, n, k, seed=2)
    whole = dq.dequantize(_t(raw), int(qtype), (n, k))
    monkeypatch.setattr(dq, "CHUNK_ELEMS", 3 * k)  # 3 rows a chunk, the last one short
    assert torch.equal(dq.dequantize(_t(raw), int(qtype), (n, k)), whole)


def test_iq4_nl_keeps_its_values_as_8_bit_codes():
    n, k = 24, 512
    raw = _t(_blocks(GT.IQ4_NL, n, k))
    ic = dq.integer_codes(raw, int(GT.IQ4_NL), (n, k))
    assert (ic.bits, ic.group, ic.offset, ic.zeros) == (8, 32, 128, None)
    assert torch.equal(ic.dequantize(), dq.dequantize(raw, int(GT.IQ4_NL), (n, k)))


def test_iq4_xs_keeps_its_values_as_8_bit_codes_with_f16_group_scales():
    """Its codes exactly; its group scale d * (sc - 32) rounded once to f16 (within 2^-11), far closer to the file
    than requantizing its values to 8 bits per 32 would be."""
    n, k = 24, 512
    raw = _t(_blocks(GT.IQ4_XS, n, k))
    want = dq.dequantize(raw, int(GT.IQ4_XS), (n, k))
    ic = dq.integer_codes(raw, int(GT.IQ4_XS), (n, k))
    assert (ic.bits, ic.group, ic.offset, ic.zeros) == (8, 32, 128, None)
    assert torch.equal(ic.dequantize(), want)  # f32 scales: exact
    codes = (ic.codes.float() - 128).view(n, -1, 32)
    kept = (codes * ic.scales.half().float().view(n, -1, 1)).view(n, k)
    assert torch.allclose(kept, want, rtol=2 ** -11, atol=0)
    rq = dq.requantize_q8(want)
    requantized = ((rq.codes.float() - 128).view(n, -1, 32) * rq.scales.half().float().view(n, -1, 1)).view(n, k)
    assert (kept - want).norm() < 0.5 * (requantized - want).norm()


def test_capabilities_name_every_dequantized_type():
    # what create accepts is what the engine loads
    assert SUPPORTED_TENSOR_TYPES == {GGML_TYPES[t][0] for t in dq.SUPPORTED_TYPES}


# -- tiny models ------------------------------------------------------------------------------------


def _f32_twin(path, out) -> None:
    """The GGUF at ``path`` with every tensor dequantized to f32 (gguf-py's reference values)."""
    r = gguf.GGUFReader(str(path))
    tensors = {t.name: gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(
        tuple(int(d) for d in reversed(t.shape))) for t in r.tensors}
    write_tiny_gguf(out, _spec("F32"), tensors)


def _spec(dtype: str) -> TinySpec:
    # rows of 256: the IQ types' super-blocks
    return TinySpec(arch="llama", n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, dtype=dtype, seed=3,
                    tied_output=False)


@pytest.mark.parametrize("dtype", [t.name for t in IQ_TYPES])
def test_tiny_model_runs_like_its_f32_twin(dtype, tmp_path):
    path = write_tiny_gguf(tmp_path / "q.gguf", _spec(dtype))
    with GGUFFile(path) as f:
        assert {t.type_name for t in f.tensors.values() if len(t.shape) == 2} == {dtype}
    _f32_twin(path, tmp_path / "f32.gguf")
    ids = torch.tensor([3, 17, 42, 99, 7, 150])
    want = load_model(tmp_path / "f32.gguf", fmt="f32")
    ref = want(ids, want.new_cache(16))
    got = load_model(path, fmt="f32")
    assert torch.allclose(got(ids, got.new_cache(16)), ref, rtol=0, atol=1e-5 * float(ref.abs().max()))
    auto = load_model(path)  # the default weight format: int8 or qdot (IQ4_NL's own codes), never refused
    logits = auto(ids, auto.new_cache(16))
    assert float((logits - ref).norm() / ref.norm()) < 0.05


@pytest.mark.skipif(load_qdot() is None, reason="the qdot kernel is not built here")
def test_iq4_nl_runs_through_qdot_with_its_own_codes(tmp_path):
    path = write_tiny_gguf(tmp_path / "q.gguf", _spec("IQ4_NL"))
    name = "blk.0.attn_q.weight"
    with GGUFFile(path) as f:
        lin = L.load_linear(f, name, "qdot")
        ic = dq.integer_codes(dq.raw_tensor(f, name), int(GT.IQ4_NL), f.tensors[name].shape)
    assert (lin.bits, lin.group, lin.offset, lin.zeros.numel()) == (8, 32, 128, 0)
    assert torch.equal(lin.codes, L.pack_codes(ic.codes, 8))
    assert torch.equal(lin.scales, L.pack_group_values(ic.scales.half()))
