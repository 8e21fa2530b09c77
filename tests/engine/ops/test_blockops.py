"""The fused block ops (engine/kernels/blockops.cpp) equal the PyTorch formulas they replace: RMSNorm,
both RoPE layouts on strided views, SiLU times up and attention, in the native (-march=native) and portable builds. The
model-level check (a forward with the ops equals one without) is in test_model_tiny."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.models.layers import RotaryEmbedding
from engine.ops.kernels import load_block_ops, qdot_status

pytestmark = pytest.mark.skipif(not qdot_status().available,
                                reason=f"native kernels not available here: {qdot_status().detail}")


@pytest.mark.parametrize("shape", [(1, 896), (7, 64), (3, 2, 128)])
def test_rms_norm(block_ops, shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g) * 3
    w = torch.randn(shape[-1], generator=g)
    want = F.rms_norm(x, (shape[-1],), w, 1e-6)
    torch.testing.assert_close(block_ops.block_rms_norm(x, w, 1e-6), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("style", ["neox", "normal"])
@pytest.mark.parametrize("n", [1, 5])
def test_rope_on_a_strided_view(block_ops, style, n):
    g = torch.Generator().manual_seed(1)
    H, Hkv, D = 4, 2, 64
    qkv = torch.randn(n, (H + 2 * Hkv) * D, generator=g)
    qk = qkv[:, :(H + Hkv) * D].view(n, H + Hkv, D)  # what Attention rotates: a view into the projection
    rope = RotaryEmbedding(D, 10000.0, style)
    cos, sin = rope.get(37, n, torch.device("cpu"), torch.float32)
    got = block_ops.block_rope(qk, cos, sin, style == "neox")
    assert got.is_contiguous() and got.shape == (n, H + Hkv, D)
    torch.testing.assert_close(got, rope.apply(qk, cos, sin), rtol=1e-5, atol=1e-5)


def test_bad_input_is_refused(block_ops):
    with pytest.raises(RuntimeError, match="float32"):
        block_ops.block_rms_norm(torch.ones(2, 4, dtype=torch.bfloat16), torch.ones(4), 1e-6)
    with pytest.raises(RuntimeError, match="last dimension"):
        block_ops.block_rms_norm(torch.ones(2, 5), torch.ones(4), 1e-6)
    with pytest.raises(RuntimeError, match="cos/sin"):
        block_ops.block_rope(torch.ones(2, 3, 8), torch.ones(2, 1, 3), torch.ones(2, 1, 3), True)


@pytest.mark.parametrize("shape", [(1, 2 * 4864), (5, 2 * 37), (2, 3, 2 * 64)])
def test_silu_mul_is_silu_of_the_gate_times_the_up_half(block_ops, shape):
    g = torch.Generator().manual_seed(shape[0])
    gate_up = torch.randn(*shape, generator=g) * 6
    gate_up.view(-1)[:6] = torch.tensor([0.0, -0.0, 90.0, -90.0, 1e-30, -200.0])  # edges of exp's range
    out = block_ops.block_silu_mul(gate_up)
    gate, up = gate_up.double().chunk(2, dim=-1)
    assert out.shape == (*shape[:-1], shape[-1] // 2)
    torch.testing.assert_close(out.double(), F.silu(gate) * up, rtol=2e-6, atol=1e-30)


def test_silu_mul_is_the_same_on_every_build():
    """Sixteen lanes a step where registers are 512 bits wide, eight elsewhere: each lane the same operations, so
    the same values (a prefix's cache must not depend on the host's vector width)."""
    ops = {v: load_block_ops(v) for v in ("native", "avx2")}
    ops = {v: o for v, o in ops.items() if o is not None}
    if len(ops) < 2:
        pytest.skip("one build only")
    g = torch.Generator().manual_seed(4)
    for shape in [(3, 2 * 8960), (2, 2 * 37), (1, 2 * 24)]:  # 16-lane steps, then an 8-lane one and a tail
        gate_up = torch.randn(*shape, generator=g) * 8
        gate_up.view(-1)[:6] = torch.tensor([0.0, -0.0, 95.0, -95.0, 1e-30, -88.5])
        outs = [o.block_silu_mul(gate_up) for o in ops.values()]
        assert all(torch.equal(out, outs[0]) for out in outs), shape


def test_silu_mul_refuses_an_odd_width(block_ops):
    with pytest.raises(RuntimeError, match="even"):
        block_ops.block_silu_mul(torch.randn(2, 7))


def _attention_reference(q, keys, values, scale):
    """The fused op's definition in float64: query i (of n) sees keys [0, S - n + i]; GQA by repetition."""
    n, H, D = q.shape
    Hkv, S, _ = keys.shape
    rep = H // Hkv
    k = keys.double().repeat_interleave(rep, dim=0)
    v = values.double().repeat_interleave(rep, dim=0)
    s = torch.einsum("nhd,hsd->hns", q.double(), k) * scale
    visible = torch.arange(S)[None, :] <= (S - n + torch.arange(n))[:, None]
    s = s.masked_fill(~visible, float("-inf"))
    return torch.einsum("hns,hsd->nhd", torch.softmax(s, dim=-1), v)


# Query heads per key head 1-8 take a path with their dot products side by side, other counts and
# head sizes that are not a multiple of 8 the general one.
@pytest.mark.parametrize("n,S,H,Hkv,D", [(1, 1, 4, 2, 64), (1, 150, 12, 2, 128), (5, 40, 4, 4, 64),
                                         (16, 16, 6, 2, 32), (3, 300, 14, 2, 64), (2, 33, 8, 1, 24),
                                         (2, 20, 9, 1, 64), (2, 17, 6, 3, 20), (1, 70, 15, 3, 40)])
def test_attention_matches_causal_softmax(block_ops, n, S, H, Hkv, D):
    g = torch.Generator().manual_seed(n + S)
    # q a strided view inside a wider tensor (as after the fused qkv and RoPE), the cache a slice
    q = torch.randn(n, H + Hkv, D, generator=g)[:, :H]
    cache_k = torch.randn(Hkv, S + 7, D, generator=g)
    cache_v = torch.randn(Hkv, S + 7, D, generator=g)
    keys, values = cache_k[:, :S], cache_v[:, :S]
    out = block_ops.block_attention(q, keys, values, D ** -0.5)
    assert out.shape == (n, H, D) and out.is_contiguous()
    torch.testing.assert_close(out.double(), _attention_reference(q, keys, values, D ** -0.5), rtol=1e-5, atol=1e-5)


def test_attention_softmax_holds_over_a_wide_range_of_scores(block_ops):
    """Scores hundreds apart (the exponent's far tail, where it is clamped) still give the softmax."""
    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 4, 64, generator=g) * 8
    keys = torch.randn(2, 90, 64, generator=g) * 8
    values = torch.randn(2, 90, 64, generator=g)
    out = block_ops.block_attention(q, keys, values, 1.0)
    torch.testing.assert_close(out.double(), _attention_reference(q, keys, values, 1.0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,past,H,Hkv,D", [(9, 0, 4, 2, 64), (70, 0, 12, 2, 128), (45, 29, 6, 2, 20)])
def test_attention_rows_do_not_depend_on_the_batch(block_ops, n, past, H, Hkv, D):
    """A prompt attended in one call gives the values it gives token by token (prefix reuse relies on it):
    rows attended in blocks that share key reads (8 rows, 32 keys at a time), after earlier positions or not,
    on the paths by query heads per key head and the general one."""
    g = torch.Generator().manual_seed(7 + n)
    S = past + n
    q = torch.randn(n, H, D, generator=g)
    keys = torch.randn(Hkv, S, D, generator=g)
    values = torch.randn(Hkv, S, D, generator=g)
    whole = block_ops.block_attention(q, keys, values, 0.125)
    rows = torch.cat([block_ops.block_attention(q[i:i + 1], keys[:, :past + i + 1], values[:, :past + i + 1], 0.125)
                      for i in range(n)])
    assert torch.equal(whole, rows)
    torch.testing.assert_close(whole.double(), _attention_reference(q, keys, values, 0.125), rtol=1e-5, atol=1e-5)


def test_attention_a_nan_key_makes_the_rows_that_see_it_nan(block_ops):
    """The scores' maximum is taken eight lanes at a time, in no fixed order: a NaN score must still poison exactly
    the rows whose softmax it is in (as the one-at-a-time maximum did), whichever lane it lands in."""
    g = torch.Generator().manual_seed(5)
    n, S, H, Hkv, D = 6, 40, 6, 2, 64
    q = torch.randn(n, H, D, generator=g)
    for bad in (0, 3, S - n + 2):  # the first key, a key inside the first eight, one only the last rows see
        keys, values = torch.randn(Hkv, S, D, generator=g), torch.randn(Hkv, S, D, generator=g)
        keys[1, bad, 5] = float("nan")
        out = block_ops.block_attention(q, keys, values, D ** -0.5)
        sees = torch.arange(n) + S - n >= bad  # query i sees keys [0, S - n + i]
        assert out[sees][:, 3:].isnan().all() and not out[~sees].isnan().any()
        assert not out[:, :3].isnan().any()  # key head 0's query heads never read it


def test_attention_refuses_bad_shapes(block_ops):
    q = torch.randn(2, 4, 64)
    with pytest.raises(RuntimeError, match="key heads"):
        block_ops.block_attention(q, torch.randn(3, 8, 64), torch.randn(3, 8, 64), 1.0)
    with pytest.raises(RuntimeError, match="queries over"):
        block_ops.block_attention(q, torch.randn(2, 1, 64), torch.randn(2, 1, 64), 1.0)


def test_attention_is_the_same_on_every_build():
    """The AVX-512 build takes two keys per register and sixteen values of d at a time, and reduces sixteen keys'
    sums across registers where the 256-bit code reduces eight; each lane adds the same products in the same
    order, so a model attends the same on every host with FMA (the portable x86-64-v2 build has none: its
    products round before they are added)."""
    ops = {v: load_block_ops(v) for v in ("native", "avx2")}
    ops = {v: o for v, o in ops.items() if o is not None}
    if len(ops) < 2:
        pytest.skip("one build only")
    g = torch.Generator().manual_seed(3)
    # 77 and 300 keys: sixteen (AVX-512) and eight (AVX2) keys' sums reduced together, then what is left
    for n, S, H, Hkv, D in [(5, 77, 12, 2, 128), (3, 40, 8, 4, 64), (2, 19, 6, 2, 24), (1, 1, 4, 2, 64),
                            (4, 300, 14, 2, 64), (2, 45, 4, 1, 256)]:
        q = torch.randn(n, H, D, generator=g)
        keys, values = torch.randn(Hkv, S, D, generator=g), torch.randn(Hkv, S, D, generator=g)
        outs = {v: o.block_attention(q, keys, values, D ** -0.5) for v, o in ops.items()}
        first = next(iter(outs.values()))
        for v, out in outs.items():
            assert torch.equal(out, first), (v, n, S, H, Hkv, D)
