"""The qdot kernel (engine/kernels/qdot.cpp) and its weight layout: GGUF integer codes dotted
against int8-quantized activations.

* the codes and group scales of every quantized type reproduce ggml's dequantization exactly;
* the kernel computes exactly (to f32 rounding) what its definition says: the f16-scaled codes
  times the activations quantized to int8 per 32 values, for 4- and 8-bit codes, groups of 16
  and 32, zeros or an offset, K with and without a last lone 64-value chunk, 1-9 rows, bias;
* each vector path this CPU can run (the native build: AVX512-VNNI or AVX2; and the x86-64-v3 AVX2
  build on AVX-512 hosts) matches the definition, agrees with the portable C++ path, and does not
  saturate on extreme codes; AVX2 and AVX-512 give the same outputs;
* as a linear layer it stays within activation-quantization error of the f32 matmul, fuses
  sources of different types, and a whole model in qdot follows the f32 model.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine.ops import dequant as dq
from engine.ops import linear as L
from engine.contract.gguf import GGUFFile
from engine.ops.kernels import load_qdot, qdot_status
from tests.engine.ops.test_dequant import random_kquant_blocks
from tests.engine.ops.test_linear import write_tensor_gguf

GT = gguf.GGMLQuantizationType

pytestmark = pytest.mark.skipif(not qdot_status().available,
                                reason=f"qdot kernel not available here: {qdot_status().detail}")

NO_SUPERS = torch.empty(0, dtype=torch.half)


@pytest.fixture(params=["native", "avx2", "avx512-emulated"])
def ops(request):
    """The op namespace of one vector build this CPU can run ("avx2" only where native is another ISA;
    the AVX-512 path over SIMDe where native is not that path and SIMDe's headers are installed)."""
    isa_of = {"avx2": "avx2", "avx512-emulated": "avx512vnni"}
    if request.param != "native" and qdot_status().isa == isa_of[request.param]:
        pytest.skip(f"the native build already is the {isa_of[request.param]} path")
    status = qdot_status(request.param)
    if not status.available:
        pytest.skip(f"{request.param} build not available: {status.detail}")
    return getattr(torch.ops, status.namespace)


def portable_ops():
    status = qdot_status("portable")
    if not status.available:
        pytest.skip(f"portable build failed: {status.detail}")
    assert status.isa == "scalar"
    return getattr(torch.ops, status.namespace)
  # f16 group scales take no super-block factors
CODE_TYPES = [GT.Q4_0, GT.Q4_1, GT.Q4_K, GT.Q5_0, GT.Q5_1, GT.Q5_K, GT.Q6_K, GT.Q8_0]
K_QUANTS = (GT.Q4_K, GT.Q5_K, GT.Q6_K)


def quantized(qtype, n: int, k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if qtype in K_QUANTS:
        return random_kquant_blocks(qtype, n, k, rng, scale=0.002)
    return gguf.quants.quantize((rng.standard_normal((n, k)) * 0.1).astype(np.float32), qtype)


@pytest.mark.parametrize("qtype", CODE_TYPES, ids=lambda t: t.name)
def test_integer_codes_reproduce_dequantization(qtype):
    n, k = 24, 512
    raw = torch.from_numpy(quantized(qtype, n, k).reshape(-1).copy())
    ic = dq.integer_codes(raw, int(qtype), (n, k))
    bits, group, offset = dq.INTEGER_CODE_LAYOUTS[int(qtype)]
    assert (ic.bits, ic.group) == (bits, group)
    assert int(ic.codes.max()) < (16 if bits == 4 else 256)
    ref = dq.dequantize(raw, int(qtype), (n, k))
    # same values; Q4_1/Q4_K/Q5_1/Q5_K re-associate (scale*q + zero), about an ulp of the group
    assert torch.allclose(ic.dequantize(), ref, rtol=0, atol=float(ref.abs().max()) * 2e-6)
    if offset is not None:
        assert torch.equal(ic.dequantize(), ref)


# -- the kernel against its definition -----------------------------------------------------------


def quantize_activations_ref(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """The kernel's activation rounding, in Python: int8 per `block` values (32 for f16-scaled weights, 256 for
    K-quants), dx = max|x| / 127."""
    m, k = x.shape
    g = x.view(m, k // block, block)
    amax = g.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(g * inv)  # round half to even, as nearbyint
    return (q.double() * (amax.double() / 127.0).float().double()).view(m, k)


def reference_weight(codes_u8, group, scales16, zeros16, offset):
    n, k = codes_u8.shape
    q = codes_u8.double().view(n, k // group, group)
    s = scales16.double()[..., None]
    w = q * s + zeros16.double()[..., None] if zeros16.numel() else (q - offset) * s
    return w.view(n, k)


def reference(x, codes_u8, bits, group, scales16, zeros16, offset, bias=None, block=32):
    y = quantize_activations_ref(x, block) @ reference_weight(codes_u8, group, scales16, zeros16, offset).t()
    return y if bias is None else y + bias.double()


def random_layout(n, k, bits, group, with_zeros, seed=0):
    """Random codes, scales and zeros, and the same packed for the kernel: (codes, packed codes,
    packed scales, packed zeros, scales, zeros)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2 ** bits, (n, k), generator=g, dtype=torch.uint8)
    scales = (torch.rand(n, k // group, generator=g) * 0.02 + 1e-3).half()
    zeros = ((torch.rand(n, k // group, generator=g) - 0.5) * 0.1).half() if with_zeros \
        else torch.empty(0, k // group, dtype=torch.half)
    packed = L.pack_codes(codes, bits)
    packed_zeros = L.pack_group_values(zeros) if with_zeros else torch.empty(0, dtype=torch.half)
    return codes, packed, L.pack_group_values(scales), packed_zeros, scales, zeros


LAYOUTS = [(4, 32, True), (4, 32, False), (5, 32, False), (5, 32, True), (6, 16, False), (8, 32, False),
           (8, 32, True)]


@pytest.mark.parametrize("bits,group,with_zeros", LAYOUTS)
@pytest.mark.parametrize("k,n", [(256, 37), (192, 16), (96, 5)])  # n: partial, whole and lone row blocks
def test_kernel_matches_definition(ops, bits, group, with_zeros, k, n):
    op = ops.qdot_linear
    codes, packed, ps, pz, scales, zeros = random_layout(n, k, bits, group, with_zeros, seed=k + bits)
    offset = 2 ** (bits - 1)
    bias = torch.randn(n)
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 50):  # every rows-per-pass instance, and passes after a full one
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        x[0, :32] = 0.0  # an all-zero activation group (dx = 0)
        for b in (None, bias):
            y = op(x, packed, ps, pz, NO_SUPERS, bits, group, offset, n, b)
            ref = reference(x, codes, bits, group, scales, zeros, offset, b)
            assert y.shape == (m, n) and y.dtype == torch.float32
            err = float((y.double() - ref).abs().max() / ref.abs().max())
            assert err < 2e-6, (m, err)


@pytest.mark.parametrize("bits,group,with_zeros", LAYOUTS)
def test_dequantize_reads_the_layout(ops, bits, group, with_zeros):
    """qdot_dequantize unpacks codes with the kernel's own code: the packed layout round-trips."""
    n, k = 300, 96
    codes, packed, ps, pz, scales, zeros = random_layout(n, k, bits, group, with_zeros, seed=9)
    offset = 2 ** (bits - 1)
    w = ops.qdot_dequantize(packed, ps, pz, NO_SUPERS, bits, group, offset, n)
    w_ref = reference_weight(codes, group, scales, zeros, offset)
    assert torch.allclose(w.double(), w_ref, rtol=0, atol=float(w_ref.abs().max()) * 2e-7)  # f32 rounding


# -- K-quants' two-level scales: 8-bit codes times per-super-block f16 factors ----------------------

TWO_LEVEL = [(4, 32, True), (5, 32, True), (6, 16, False)]  # Q4_K, Q5_K (uint8 sc and m), Q6_K (int8 sc)


def random_two_level(n, k, bits, group, with_zeros, seed=0):
    """Random codes and K-quant-style factors, and the same packed: (codes, packed, packed scale codes,
    packed zero codes, packed supers, scales, zeros) where scales/zeros are the f32 products."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2 ** bits, (n, k), generator=g, dtype=torch.uint8)
    groups, supers_n = k // group, k // 256
    if with_zeros:
        sc = torch.randint(0, 64, (n, groups), generator=g, dtype=torch.int16)
        mc = torch.randint(0, 64, (n, groups), generator=g, dtype=torch.int16)
        sup = torch.stack([torch.rand(n, supers_n, generator=g) * 1e-3,
                           -torch.rand(n, supers_n, generator=g) * 1e-3], -1).half().float()
    else:
        sc = torch.randint(-128, 128, (n, groups), generator=g, dtype=torch.int16)
        mc = None
        sup = (torch.rand(n, supers_n, 1, generator=g) * 1e-3).half().float()
    per_super = 256 // group
    d = sup[..., 0].repeat_interleave(per_super, dim=1)
    scales = d * sc.float()
    zeros = sup[..., 1].repeat_interleave(per_super, dim=1) * mc.float() if with_zeros else torch.empty(0, groups)
    ps = L.pack_group_values(sc.to(torch.uint8 if with_zeros else torch.int8))
    pz = L.pack_group_values(mc.to(torch.uint8)) if with_zeros else torch.empty(0, dtype=torch.uint8)
    return codes, L.pack_codes(codes, bits), ps, pz, L.pack_supers(sup), scales, zeros


@pytest.mark.parametrize("bits,group,with_zeros", TWO_LEVEL)
@pytest.mark.parametrize("k,n", [(512, 37), (256, 16)])
def test_two_level_kernel_matches_definition(ops, bits, group, with_zeros, k, n):
    op = ops.qdot_linear
    codes, packed, ps, pz, sup, scales, zeros = random_two_level(n, k, bits, group, with_zeros, seed=k + bits)
    offset = 32 if bits == 6 else 0
    bias = torch.randn(n)
    for m in (1, 3, 4, 5, 6, 7, 8, 9):  # every rows-per-pass instance (AVX-512: up to 8 a pass)
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        for b in (None, bias):
            y = op(x, packed, ps, pz, sup, bits, group, offset, n, b)
            ref = reference(x, codes, bits, group, scales, zeros, offset, b, block=256)
            err = float((y.double() - ref).abs().max() / ref.abs().max())
            assert err < 2e-6, (m, err)
    w = ops.qdot_dequantize(packed, ps, pz, sup, bits, group, offset, n)
    w_ref = reference_weight(codes, group, scales, zeros, offset)
    assert torch.allclose(w.double(), w_ref, rtol=0, atol=float(w_ref.abs().max()) * 2e-7)


@pytest.mark.parametrize("bits,group,with_zeros", TWO_LEVEL)
def test_two_level_portable_path_agrees(ops, bits, group, with_zeros):
    portable = portable_ops()
    k, n = 512, 29
    codes, packed, ps, pz, sup, scales, zeros = random_two_level(n, k, bits, group, with_zeros, seed=3)
    offset = 32 if bits == 6 else 0
    x = torch.randn(6, k, generator=torch.Generator().manual_seed(5))
    a = ops.qdot_linear(x, packed, ps, pz, sup, bits, group, offset, n, None)
    b = portable.qdot_linear(x, packed, ps, pz, sup, bits, group, offset, n, None)
    # exact integer sums over each super-block, then the same fused multiply-adds, in every path
    assert torch.equal(a, b)
    assert torch.equal(ops.qdot_dequantize(packed, ps, pz, sup, bits, group, offset, n),
                       portable.qdot_dequantize(packed, ps, pz, sup, bits, group, offset, n))


def test_two_level_kernel_refuses_mismatched_factors():
    op = load_qdot()
    codes, packed, ps, pz, sup, scales, zeros = random_two_level(16, 256, 4, 32, True)
    x = torch.randn(1, 256)
    with pytest.raises(RuntimeError, match="supers must be"):
        op(x, packed, ps, pz, NO_SUPERS, 4, 32, 0, 16, None)  # codes without their factors
    with pytest.raises(RuntimeError, match="supers must be"):
        op(x, packed, ps, pz, sup[:, :, :1].contiguous(), 4, 32, 0, 16, None)  # d without -dmin
    with pytest.raises(RuntimeError, match="uint8 for 4- and 5-bit"):
        op(x, packed, ps.view(torch.int8), torch.empty(0, dtype=torch.uint8), sup[:, :, :1].contiguous(),
           4, 32, 0, 16, None)
    with pytest.raises(RuntimeError, match="take no super-block"):
        op(x, packed, ps.half(), pz.half(), sup, 4, 32, 0, 16, None)


@pytest.mark.parametrize("qtype", K_QUANTS, ids=lambda t: t.name)
def test_k_quant_factors_give_the_group_scales(qtype):
    """The codes and factors a K-quant keeps (what the kernel reads) multiply to ggml's scales exactly."""
    n, k = 24, 512
    raw = torch.from_numpy(quantized(qtype, n, k).reshape(-1).copy())
    ic = dq.integer_codes(raw, int(qtype), (n, k))
    per_super = 256 // ic.group
    d = ic.supers[..., 0].repeat_interleave(per_super, dim=1)
    assert torch.equal(d * ic.scale_codes.float(), ic.scales)
    if ic.zeros is not None:
        assert torch.equal(ic.supers[..., 1].repeat_interleave(per_super, dim=1) * ic.zero_codes.float(), ic.zeros)
        assert int(ic.scale_codes.min()) >= 0 and int(ic.scale_codes.max()) < 64
    else:
        assert ic.zero_codes is None and ic.supers.shape == (n, k // 256, 1)


def test_a_row_does_not_depend_on_the_batch():
    """Each activation row is rounded and summed on its own: a prompt computed in one call or row by
    row gives the same outputs (prefix reuse and speculation rely on it)."""
    op = load_qdot()
    codes, packed, ps, pz, scales, zeros = random_layout(40, 256, 4, 32, True, seed=4)
    x = torch.randn(60, 256, generator=torch.Generator().manual_seed(8))
    whole = op(x, packed, ps, pz, NO_SUPERS, 4, 32, 8, 40, None)
    rows = torch.cat([op(x[i:i + 1], packed, ps, pz, NO_SUPERS, 4, 32, 8, 40, None) for i in range(60)])
    assert torch.equal(whole, rows)


def test_every_weight_block_is_computed_once_whatever_the_threads():
    """The linears' blocks go out as one share per thread, a thread done early taking chunks from the back of
    another's (parallel.h's parallel_shares): with more threads than cores, shares finish unevenly and are taken
    from, and every output is still computed, exactly as with one thread. A split over two parts of different
    types (q_proj beside k_proj) is cut anywhere, within either part or across their border."""
    op = load_qdot()
    n, k = 16 * 301 + 5, 256  # 302 blocks, 16 a chunk (block_grain: 64k weights), the last one partial
    codes, packed, ps, pz, sup, scales, zeros = random_two_level(n, k, 4, 32, True, seed=11)
    x = torch.randn(7, k, generator=torch.Generator().manual_seed(12))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = op(x, packed, ps, pz, sup, 4, 32, 0, n, None)
        assert torch.allclose(one.double(), reference(x, codes, 4, 32, scales, zeros, 0, None, block=256),
                              rtol=0, atol=float(one.abs().max()) * 2e-6)
        for t in (2, 3, 5):
            torch.set_num_threads(t)
            for _ in range(20):
                assert torch.equal(op(x, packed, ps, pz, sup, 4, 32, 0, n, None), one), t
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("path", ["vector", "portable"])
@pytest.mark.parametrize("bits,group", [(4, 32), (6, 16)])
def test_activation_quantization_is_exact(ops, path, bits, group):
    """Weights that pick one value each read the quantized activations back: every q (rounded half to
    even, ties included) times its block's dx, and every group's dx * sum(q), to the last bit. The
    vector paths quantize 8 values a step; this holds them to the scalar definition."""
    ops = ops if path == "vector" else portable_ops()
    m, k = 5, 128
    g = torch.Generator().manual_seed(11)
    x = torch.randn(m, k, generator=g)
    x[1] = torch.arange(k) % 9 - 4.5  # blocks whose max is 4.5 ... 127 / 4.5 is no tie, so force some:
    x[2, :32] = torch.tensor([127.0] + [i + 0.5 for i in range(-15, 16)])  # inv = 1: x.5 ties to even
    x[3, 32:64] = 0.0  # an all-zero block: dx 0, q 0
    # rows 0..k-1 pick value j (code 1, scale 1, zero 0); rows k.. pick nothing but give group j's term
    n_pick, n_groups = k, k // group
    codes = torch.zeros(n_pick + n_groups, k, dtype=torch.uint8)
    codes[torch.arange(k), torch.arange(k)] = 1
    scales = torch.ones(n_pick + n_groups, n_groups).half()
    zeros = torch.zeros(n_pick + n_groups, n_groups).half()
    zeros[n_pick + torch.arange(n_groups), torch.arange(n_groups)] = 1.0
    y = ops.qdot_linear(x, L.pack_codes(codes, bits), L.pack_group_values(scales), L.pack_group_values(zeros),
                        NO_SUPERS, bits, group, 0, n_pick + n_groups, None)
    blocks = x.view(m, k // 32, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    q = torch.round(blocks * torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax)))
    dx = amax / 127.0
    assert torch.equal(y[:, :n_pick], (q * dx).view(m, k))
    sums = q.view(m, k // group, group).sum(-1)
    dx_of_group = dx.view(m, k // 32).repeat_interleave(32 // group, dim=1)
    assert torch.equal(y[:, n_pick:], dx_of_group * sums)


@pytest.mark.parametrize("path", ["vector", "portable"])
@pytest.mark.parametrize("bits,group,with_zeros", TWO_LEVEL)
def test_k_quants_quantize_activations_per_256(ops, path, bits, group, with_zeros):
    """K-quants read activations quantized by Q8_K's rule, one scale per 256 values (their integer sums
    then run over a whole super-block before one float step): weights that pick one value read back
    q times its super-block's dx, and min codes read back dx times a group's sum of q, to the last bit."""
    ops = ops if path == "vector" else portable_ops()
    m, k = 5, 512
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(12))
    x[1, :256] = torch.arange(256) % 9 - 4.5
    x[2, 256:] = 0.0  # an all-zero super-block: dx 0
    x[3, 7] = 40.0  # one large value sets its super-block's scale
    n_groups = k // group
    n_pick = k
    n = n_pick + (n_groups if with_zeros else 0)
    offset = 32 if bits == 6 else 0
    codes = torch.full((n, k), offset, dtype=torch.uint8)
    codes[torch.arange(k), torch.arange(k)] = offset + 1
    sc = torch.ones(n, n_groups, dtype=torch.int16)
    sup = torch.zeros(n, k // 256, 2 if with_zeros else 1)
    sup[..., 0] = 1.0
    if with_zeros:  # rows past the picks: no code, min code 1 on group j, -dmin 1
        sc[n_pick:] = 0
        mc = torch.zeros(n, n_groups, dtype=torch.int16)
        mc[n_pick + torch.arange(n_groups), torch.arange(n_groups)] = 1
        sup[n_pick:, :, 1] = 1.0
        pz = L.pack_group_values(mc.to(torch.uint8))
    else:
        pz = torch.empty(0, dtype=torch.uint8)
    ps = L.pack_group_values(sc.to(torch.uint8 if with_zeros else torch.int8))
    y = ops.qdot_linear(x, L.pack_codes(codes, bits), ps, pz, L.pack_supers(sup), bits, group, offset, n, None)
    blocks = x.view(m, k // 256, 256)
    amax = blocks.abs().amax(-1, keepdim=True)
    q = torch.round(blocks * torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax)))
    dx = amax / 127.0
    assert torch.equal(y[:, :n_pick], (q * dx).view(m, k))
    if with_zeros:
        sums = q.view(m, n_groups, group).sum(-1)
        assert torch.equal(y[:, n_pick:], dx.view(m, k // 256).repeat_interleave(256 // group, dim=1) * sums)


@pytest.mark.parametrize("bits,group,with_zeros", LAYOUTS)
def test_portable_path_agrees_with_vector_path(ops, bits, group, with_zeros):
    portable = portable_ops()
    k, n = 320, 29
    codes, packed, ps, pz, scales, zeros = random_layout(n, k, bits, group, with_zeros, seed=3)
    x = torch.randn(6, k, generator=torch.Generator().manual_seed(5))
    a = ops.qdot_linear(x, packed, ps, pz, NO_SUPERS, bits, group, 8, n, None)
    b = portable.qdot_linear(x, packed, ps, pz, NO_SUPERS, bits, group, 8, n, None)
    assert float((a - b).abs().max() / b.abs().max()) < 2e-6
    wa = ops.qdot_dequantize(packed, ps, pz, NO_SUPERS, bits, group, 8, n)
    wb = portable.qdot_dequantize(packed, ps, pz, NO_SUPERS, bits, group, 8, n)
    assert torch.equal(wa, wb)


@pytest.mark.parametrize("bits,group,with_zeros,two_level",
                         [(*layout, False) for layout in LAYOUTS] + [(*layout, True) for layout in TWO_LEVEL])
@pytest.mark.parametrize("code", ["lowest", "highest"])
def test_extreme_codes_do_not_saturate(ops, bits, group, with_zeros, two_level, code):
    """Every code at its lowest or highest value against activations that all round to +127 or -127:
    the largest partial sums any path forms (AVX2 adds byte products into int16 before widening)."""
    k, n = 512, 32
    if two_level:
        codes, packed, ps, pz, sup, scales, zeros = random_two_level(n, k, bits, group, with_zeros, seed=1)
    else:
        codes, packed, ps, pz, scales, zeros = random_layout(n, k, bits, group, with_zeros, seed=1)
        sup = NO_SUPERS
    codes.fill_(0 if code == "lowest" else 2 ** bits - 1)
    packed = L.pack_codes(codes, bits)
    # Q6_K's codes are always centred on 32 (the kernel refuses another offset): its extremes are -32 and 31
    offset = 32 if two_level and bits == 6 else 0 if code == "highest" else 2 ** (bits - 1)
    x = torch.ones(3, k)
    x[1] = -1.0
    x[2, ::2] = -1.0
    y = ops.qdot_linear(x, packed, ps, pz, sup, bits, group, offset, n, None)
    ref = reference(x, codes, bits, group, scales, zeros, offset, block=256 if two_level else 32)
    err = float((y.double() - ref).abs().max() / ref.abs().max())
    assert err < 2e-6, err


def test_avx2_and_avx512_paths_give_the_same_outputs():
    """Same integer sums, same float steps in the same order: a model gives the same tokens on an
    AVX2 host as on an AVX-512 one."""
    native = qdot_status()
    avx512 = native if native.isa == "avx512vnni" else qdot_status("avx512-emulated")
    avx2 = native if native.isa == "avx2" else qdot_status("avx2")
    if not (avx512.available and avx2.available):
        pytest.skip("needs an AVX2 host and either AVX512-VNNI or SIMDe's headers (libsimde-dev) to emulate it: "
                    f"{avx512.detail}; {avx2.detail}")
    op512, op2 = getattr(torch.ops, avx512.namespace).qdot_linear, getattr(torch.ops, avx2.namespace).qdot_linear
    for bits, group, with_zeros in LAYOUTS:
        codes, packed, ps, pz, scales, zeros = random_layout(48, 512, bits, group, with_zeros, seed=bits)
        x = torch.randn(7, 512, generator=torch.Generator().manual_seed(2))
        args = (x, packed, ps, pz, NO_SUPERS, bits, group, 8, 48, None)
        assert torch.equal(op512(*args), op2(*args))
    for bits, group, with_zeros in TWO_LEVEL:
        codes, packed, ps, pz, sup, scales, zeros = random_two_level(48, 512, bits, group, with_zeros, seed=bits)
        x = torch.randn(7, 512, generator=torch.Generator().manual_seed(2))
        args = (x, packed, ps, pz, sup, bits, group, 32 if bits == 6 else 0, 48, None)
        assert torch.equal(op512(*args), op2(*args))


def test_int8_scale_codes_take_only_the_centre_offset():
    """Q6_K's codes are centred on 32, which the integer sums rely on (they fit int16 only centred)."""
    codes, packed, ps, pz, sup, scales, zeros = random_two_level(16, 256, 6, 16, False)
    x = torch.randn(2, 256)
    with pytest.raises(RuntimeError, match="offset 32"):
        load_qdot()(x, packed, ps, pz, sup, 6, 16, 0, 16, None)


def test_kernel_refuses_bad_shapes():
    op = load_qdot()
    codes, packed, ps, pz, scales, zeros = random_layout(8, 128, 4, 32, True)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        op(torch.randn(1, 100), packed, ps, pz, NO_SUPERS, 4, 32, 8, 8, None)
    with pytest.raises(RuntimeError, match="bytes per block"):
        op(torch.randn(1, 96), packed, ps, pz, NO_SUPERS, 4, 32, 8, 8, None)
    with pytest.raises(RuntimeError, match=r"ceil\(N/16\)"):
        op(torch.randn(1, 128), packed, ps, pz, NO_SUPERS, 4, 32, 8, 40, None)  # wrong row count
    with pytest.raises(RuntimeError, match="f32"):
        op(torch.randn(1, 128).bfloat16(), packed, ps, pz, NO_SUPERS, 4, 32, 8, 8, None)


@pytest.mark.parametrize("bits", [4, 5, 6, 8])
def test_pack_codes_layout(bits):
    """The byte layout the kernel reads (its header comment), spot-checked by hand; the kernel's
    own unpacking is checked against the reference by test_dequantize_reads_the_layout."""
    g = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2 ** bits, (20, 64), generator=g, dtype=torch.uint8)
    p = L.pack_codes(codes, bits)
    assert p.shape == (2, 2 * 64 * bits)  # two blocks of 16 rows (the second padded)
    c = codes.tolist()
    b = p[0].tolist()
    per8 = 16 * bits  # bytes per 8 values of a block
    # row 5, values 8..15: second group of 8; slot 0 = values 8..11, slot 1 = 12..15; byte 4 r + j
    if bits == 8:
        assert b[per8 + 5 * 4 + 2] == c[5][10] and b[per8 + 64 + 5 * 4 + 3] == c[5][15]
    else:
        assert b[per8 + 5 * 4 + 2] == c[5][10] & 15 | (c[5][14] & 15) << 4
    if bits == 5:  # one 16-byte plane for both slots: bit 4 s + i // 16 of byte i % 16
        i = 5 * 4 + 2  # slot byte 22 (quarter 1) of row 5, value 10 (slot 0) and of row 5, value 14 (slot 1)
        assert i % 16 == 6 and (b[per8 + 64 + 6] >> 1) & 1 == c[5][10] >> 4
        assert (b[per8 + 64 + 6] >> 5) & 1 == c[5][14] >> 4
        i = 15 * 4 + 1  # row 15, value 9: slot byte 61, quarter 3 -> plane byte 13, bit 3 (slot 0)
        assert i % 16 == 13 and (b[per8 + 64 + 13] >> 3) & 1 == c[15][9] >> 4
        assert (b[per8 + 64 + 13] >> 7) & 1 == c[15][13] >> 4  # value 13: slot 1, bit 7
    if bits == 6:
        i = 13 * 4 + 1  # row 13, value 9: slot byte 53 = 48 + 5 -> plane byte 5, bits 6-7
        assert (b[per8 + 64 + i % 16] >> (2 * (i // 16))) & 3 == c[13][9] >> 4
    first = c[16][0] if bits == 8 else c[16][0] & 15 | (c[16][4] & 15) << 4
    assert int(p[1, 0]) == first  # the second block starts with row 16
    # rows 20-31 are padding: zero codes
    assert int(p[1, 4 * 4]) == 0 and int(p[1, 15 * 4 + 3]) == 0


# -- as a linear layer ---------------------------------------------------------------------------

TENSORS = {  # name -> (type, rows, K)
    "q4k.weight": (GT.Q4_K, 48, 256),
    "q4k2.weight": (GT.Q4_K, 40, 256),
    "q6k.weight": (GT.Q6_K, 32, 256),
    "q40.weight": (GT.Q4_0, 24, 256),
    "q41.weight": (GT.Q4_1, 40, 256),
    "q50.weight": (GT.Q5_0, 16, 256),
    "q80.weight": (GT.Q8_0, 32, 256),
    "f16.weight": (GT.F16, 32, 256),
    "q40_tail.weight": (GT.Q4_0, 24, 192),
    "q80_k96.weight": (GT.Q8_0, 8, 96),
    "f16_odd.weight": (GT.F16, 8, 40),  # K not a multiple of 32: kept as exact f32
}
BIASES = {"q4k.bias": 48, "q6k.bias": 32}


@pytest.fixture(scope="module")
def f(tmp_path_factory):
    path = tmp_path_factory.mktemp("qdot") / "qdot.gguf"
    rng = np.random.default_rng(11)
    tensors = {}
    for i, (name, (qtype, n, k)) in enumerate(TENSORS.items()):
        if qtype == GT.F16:
            tensors[name] = (rng.standard_normal((n, k)) * 0.1).astype(np.float16)
        else:
            tensors[name] = (quantized(qtype, n, k, seed=i), qtype)
    for name, n in BIASES.items():
        tensors[name] = (rng.standard_normal(n) * 0.5).astype(np.float32)
    write_tensor_gguf(path, tensors)
    with GGUFFile(path) as fh:
        yield fh


def matmul_error(lin, w_ref, bias=None, widths=(1, 4, 5, 7, 16)) -> float:
    worst = 0.0
    for m in widths:
        x = torch.randn(m, lin.in_features, generator=torch.Generator().manual_seed(m))
        ref = x.double() @ w_ref.double().t()
        if bias is not None:
            ref = ref + bias.double()
        out = lin(x)
        assert out.shape == (m, lin.out_features) and out.dtype == torch.float32
        worst = max(worst, float((out.double() - ref).abs().max() / ref.abs().max()))
    return worst


def ref_weight(f, names):
    return torch.cat([dq.load_tensor(f, n) for n in names])


@pytest.mark.parametrize("name", [n for n in TENSORS if n != "f16_odd.weight"])
def test_linear_close_to_f32(f, name):
    lin = L.load_linear(f, name, "qdot")
    assert lin.format == "qdot"
    # int8 activations per 32 values (up to 0.4 % per value): torch's int8 format gets 2e-2 here; K-quants'
    # per 256 (Q8_K's rule, as llama.cpp multiplies them: a larger block's larger max, about 1.3x the error)
    bound = 4e-2 if lin.scales.dtype != torch.float16 else 3e-2
    assert matmul_error(lin, ref_weight(f, [name])) < bound


def test_exact_sources_keep_their_codes(f):
    lin = L.load_linear(f, "q6k.weight", "qdot")
    assert (lin.bits, lin.group, lin.offset, lin.zeros.numel()) == (6, 16, 32, 0)
    # 6-bit codes, an int8 scale per 16 and one f16 d per 256: exactly Q6_K's 210 bytes per 256 values
    assert lin.weight_nbytes() == 32 * 210 and lin.scales.dtype == torch.int8
    lin = L.load_linear(f, "q50.weight", "qdot")
    assert (lin.bits, lin.group, lin.offset, lin.zeros.numel()) == (5, 32, 16, 0)
    lin = L.load_linear(f, "q4k.weight", "qdot")
    assert (lin.bits, lin.group) == (4, 32) and lin.zeros.shape == (3, 8, 16)  # 3 blocks of 16 rows
    # Q4_K: 4-bit codes, uint8 scale and min per 32, f16 d and -dmin per 256 = 4.625 bits a weight
    # (the file's 6-bit scales pack to 4.5)
    assert lin.weight_nbytes() == 48 * 256 * 4.625 / 8 and lin.zeros.dtype == torch.uint8
    # two Q4_K tensors fuse and keep their codes; Q4_0 has none to keep (f16 group scales)
    fused = L.load_linear(f, ["q4k.weight", "q4k2.weight"], "qdot")
    assert fused.format == "qdot" and fused.scales.dtype == torch.uint8 and fused.supers.shape == (6, 1, 2, 16)
    assert L.load_linear(f, "q40.weight", "qdot").scales.dtype == torch.float16


def test_fusion_and_bias(f):
    names = ["q4k.weight", "q40.weight", "q41.weight", "q6k.weight"]
    bias_names = ["q4k.bias", None, None, "q6k.bias"]
    lin = L.load_linear(f, names, "qdot", bias_names=bias_names)
    # Q4_K + Q4_0 + Q4_1 fuse (the offset-8 codes get explicit zeros); Q6_K's groups of 16 do not
    assert isinstance(lin, L.SplitLinear) and [p.out_features for p in lin.parts] == [112, 32]
    bias = torch.cat([dq.load_tensor(f, "q4k.bias"), torch.zeros(64), dq.load_tensor(f, "q6k.bias")])
    assert matmul_error(lin, ref_weight(f, names), bias) < 3e-2
    x = torch.randn(3, 256)
    separate = torch.cat([L.load_linear(f, n, "qdot", bias_names=[b])(x) for n, b in zip(names, bias_names)], -1)
    # fused with Q4_0/Q4_1, Q4_K's scales are f16 products (d * sc rounded) and its activations are rounded per
    # 32 as theirs are; alone it keeps d and sc and reads them per 256 (Q8_K's rule). The other parts: the same.
    fused = lin(x)
    assert torch.allclose(fused[:, :48], separate[:, :48], rtol=0, atol=4e-2 * float(separate[:, :48].abs().max()))
    assert torch.allclose(fused[:, 48:], separate[:, 48:], rtol=0, atol=1e-5 * float(separate[:, 48:].abs().max()))
    same = L.load_linear(f, ["q40.weight", "q41.weight"], "qdot")(x)
    assert torch.allclose(same, separate[:, 48:112], rtol=0, atol=1e-5 * float(same.abs().max()))


def test_k_not_multiple_of_32_falls_back(f):
    lin = L.load_linear(f, "f16_odd.weight", "qdot")
    assert lin.format == "f32"
    assert matmul_error(lin, ref_weight(f, ["f16_odd.weight"])) < 1e-5
    # and torch's int8 kernel, which crashes when K is not a multiple of 16, is not used for it
    assert L.load_linear(f, "f16_odd.weight", "auto-int4").format == "bf16"
    x = torch.randn(2, 40)
    assert lin(x).dtype == torch.float32


def test_a_killed_builders_lock_does_not_block_the_next_load():
    """torch's build lock file survives a builder killed mid-build, and torch waits on it forever; the
    next engine must still load the kernel (here: within 120 s, in a fresh process)."""
    import subprocess
    import sys
    from pathlib import Path

    from engine.ops.kernels import build_directory

    lock = build_directory(qdot_status().detail) / "lock"
    lock.touch()
    try:
        out = subprocess.run(
            [sys.executable, "-c", "from engine.ops.kernels import qdot_status; print(qdot_status().available)"],
            capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[3])
    finally:
        lock.unlink(missing_ok=True)
    assert out.stdout.strip() == "True", out.stderr[-2000:]


def test_the_engine_runs_the_build_tandem_kernel_variant_names(monkeypatch):
    """TANDEM_KERNEL_VARIANT=avx2 makes the engine's kernels the AVX2 build (to time that path on an AVX-512 host);
    an unknown name keeps the native one."""
    from engine.ops import kernels

    if not qdot_status("avx2").available:
        pytest.skip(f"no AVX2 build here: {qdot_status('avx2').detail}")
    try:
        monkeypatch.setenv("TANDEM_KERNEL_VARIANT", "avx2")
        qdot_status.cache_clear()
        assert qdot_status().namespace == "tandem_avx2" and qdot_status().isa == "avx2"
        assert load_qdot() is torch.ops.tandem_avx2.qdot_linear and kernels.load_block_ops() is torch.ops.tandem_avx2
        monkeypatch.setenv("TANDEM_KERNEL_VARIANT", "sse9")
        qdot_status.cache_clear()
        assert qdot_status().namespace == "tandem"
    finally:
        monkeypatch.delenv("TANDEM_KERNEL_VARIANT")
        qdot_status.cache_clear()
