"""K-quant quantizers (Q4_K, Q5_K, Q6_K) in numpy, byte-compatible with GGUF / llama.cpp.

These are ports of llama.cpp's reference quantizers (ggml/src/ggml-quants.c), the functions that
``llama-quantize`` and Ollama's ``ggml.Quantize`` use when no importance matrix is given:

* ``quantize_row_q4_K_ref`` -> ``make_qkx2_quants(32, 15, x, w, ..., rmin=-1.0, rdelta=0.1, nstep=20)``
* ``quantize_row_q5_K_ref`` -> ``make_qkx2_quants(32, 31, x, w, ..., rmin=-0.5, rdelta=0.1, nstep=15)``
* ``quantize_row_q6_K_ref`` -> ``make_qx_quants(16, 32, x, L, rmse_type=1, NULL)``

The search is the same one, not a shortcut: for every 32- (or 16-) element sub-block, each candidate
scale is tried in the same order with the same acceptance rule. Instead of looping over blocks the
code here loops over candidates and handles *all sub-blocks of a chunk at once*: sub-block elements
lie along axis 0 of a ``[32, n_subblocks]`` array, so every step is a handful of numpy operations over
the whole chunk.

Arithmetic follows the C code operation by operation in float32 (libggml-base is compiled for
baseline x86-64, so no FMA contraction), and reductions over a sub-block are ``np.add.reduce`` over
axis 0, which numpy evaluates row after row: the same left-to-right order as the C ``for`` loops.
The output is therefore byte-identical to llama.cpp's reference quantizer (tests/importer/test_kquant.py
checks this against libggml when it is available, and against a plain loop-per-block port in
tests/kquant_reference.py everywhere).

Block layouts (ggml-common.h), QK_K = 256 elements per super-block:

* block_q4_K (144 B): f16 d, f16 dmin, u8 scales[12] (6-bit scale + 6-bit min per 32-element
  sub-block, packed as ``get_scale_min_k4`` reads them), u8 qs[128] (4-bit quants)
* block_q5_K (176 B): f16 d, f16 dmin, u8 scales[12], u8 qh[32] (5th bits), u8 qs[128]
* block_q6_K (210 B): u8 ql[128] (low 4 bits), u8 qh[64] (high 2 bits), i8 scales[16], f16 d
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

QK_K = 256
BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
K_TYPES = frozenset(BLOCK_BYTES)

# Super-blocks per unit of work. 1024 super-blocks = 256K values: a [32, 8192] f32 work array is
# 1 MiB, so the dozen temporaries of the search stay in cache-sized pieces while numpy's per-call
# overhead stays negligible.
CHUNK_BLOCKS = 1024

GROUP_MAX_EPS = np.float32(1e-15)
_F32 = np.float32


def _nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: ``fval + 1.5 * 2**23`` in float32, mantissa bits minus 2**22.

    Round-half-to-even for |v| < 2**22 (where it equals ``np.rint``); emulated exactly so that the
    rare out-of-range value wraps the way the C code does."""
    with np.errstate(invalid="ignore", over="ignore"):
        val = (v.astype(np.float32, copy=False) + _F32(12582912.0)).view(np.int32)
    return (val & 0x007FFFFF) - 0x00400000


def _f16_roundtrip(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GGML_FP32_TO_FP16 (round to nearest even, as numpy's cast) and the value read back as f32."""
    with np.errstate(over="ignore"):
        h = v.astype(np.float16)
    return h, h.astype(np.float32)


# --------------------------------------------------------------------------------------------
# make_qkx2_quants: asymmetric (scale + min) search for Q4_K / Q5_K sub-blocks


def _qkx_levels(x: np.ndarray, mn: np.ndarray, iscale: np.ndarray, nmax: np.float32, out: np.ndarray) -> np.ndarray:
    """``L[i] = MAX(0, MIN(nmax, nearest_int(iscale*(x[i] - min))))`` for every sub-block."""
    np.subtract(x, mn, out=out)
    out *= iscale
    np.rint(out, out=out)
    np.clip(out, 0, nmax, out=out)
    return out


def make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                     nstep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised ``make_qkx2_quants`` (use_mad = false) over sub-blocks.

    ``x``, ``w``: float32 ``[n, M]`` (element i of sub-block m at ``[i, m]``). Returns
    ``(scale [M], the_min [M], L [n, M] float32 holding integers 0..nmax)``; a sub-block decodes as
    ``scale * L - the_min``.
    """
    f_nmax = _F32(nmax)
    add, mul = np.add.reduce, np.multiply

    mn = np.minimum.reduce(x, axis=0)
    mx = np.maximum.reduce(x, axis=0)
    sum_w = add(w, axis=0)
    tmp = np.empty_like(x)
    mul(w, x, out=tmp)
    sum_x = add(tmp, axis=0)
    mn = np.where(mn > 0, _F32(0), mn)          # if (min > 0) min = 0;
    flat = mx == mn                              # all equal: L = 0, scale = 0, the_min = -min

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rng = mx - mn
        iscale = f_nmax / rng
        scale = _F32(1) / iscale
        # Copying L for every improved sub-block at every step would cost more than the search
        # itself, so the step that produced the best L is remembered as the (iscale, min) it was
        # computed from, and L is recomputed once at the end (the same float ops, the same values).
        # First guess: the full range mapped onto 0..nmax.
        L_iscale, L_mn = iscale, mn
        L = _qkx_levels(x, L_mn, L_iscale, f_nmax, np.empty_like(x))
        mul(scale, L, out=tmp)
        tmp += mn
        tmp -= x
        tmp *= tmp
        tmp *= w
        best = add(tmp, axis=0)

        laux = np.empty_like(x)
        wl = np.empty_like(x)
        for step in range(nstep + 1):
            # iscale = (rmin + rdelta*is + nmax)/(max - min), with min the best fit so far
            num = _F32(_F32(rmin) + _F32(rdelta) * _F32(step)) + f_nmax
            iscale = num / (mx - mn)
            _qkx_levels(x, mn, iscale, f_nmax, laux)
            mul(w, laux, out=wl)
            sum_l = add(wl, axis=0)
            mul(wl, laux, out=tmp)
            sum_l2 = add(tmp, axis=0)
            mul(wl, x, out=tmp)
            sum_xl = add(tmp, axis=0)
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > 0
            if pos.any():
                this_min = np.where(pos, _F32(0), this_min)
                this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
            mul(this_scale, laux, out=tmp)
            tmp += this_min
            tmp -= x
            tmp *= tmp
            tmp *= w
            cur = add(tmp, axis=0)
            better = (D > 0) & (cur < best) & ~flat
            if better.any():
                L_iscale = np.where(better, iscale, L_iscale)
                L_mn = np.where(better, mn, L_mn)
                best = np.where(better, cur, best)
                scale = np.where(better, this_scale, scale)
                mn = np.where(better, this_min, mn)
        _qkx_levels(x, L_mn, L_iscale, f_nmax, L)

    if flat.any():
        L[:, flat] = 0
        scale = np.where(flat, _F32(0), scale)
    return scale.astype(np.float32), (-mn).astype(np.float32), L


# --------------------------------------------------------------------------------------------
# make_qx_quants: symmetric search for Q6_K sub-blocks (rmse_type = 1, no importance weights)


def make_qx_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised ``make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL)`` over sub-blocks.

    ``x``: float32 ``[n, M]``. Returns ``(scale [M], L [n, M] float32 holding 0..2*nmax-1)``; a
    sub-block decodes as ``scale * (L - nmax)``.
    """
    M = x.shape[1]
    f_nmax = _F32(nmax)
    lo, hi = _F32(-nmax), _F32(nmax - 1)
    add, mul = np.add.reduce, np.multiply
    cols = np.arange(M)

    ax = np.abs(x)
    imax = np.argmax(ax, axis=0)                 # first index of the largest |x| (strict > in C)
    amax = ax[imax, cols]
    vmax = x[imax, cols]
    zero = amax < GROUP_MAX_EPS

    w = mul(x, x)                                # rmse_type 1: weight x^2
    wx = mul(w, x)
    l = np.empty_like(x)
    tmp = np.empty_like(x)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = _F32(-nmax) / vmax
        mul(x, iscale, out=l)
        np.rint(l, out=l)
        np.clip(l, lo, hi, out=l)
        mul(wx, l, out=tmp)
        sumlx = add(tmp, axis=0)
        mul(w, l, out=tmp)
        tmp *= l
        suml2 = add(tmp, axis=0)
        scale = np.where(suml2 != 0, sumlx / suml2, _F32(0))
        best = scale * sumlx
        L_iscale = iscale          # as in make_qkx2_quants: L is recomputed once from the best iscale
        for step in range(-9, 10):
            if step == 0:
                continue
            iscale = -(f_nmax + _F32(0.1) * _F32(step)) / vmax
            mul(x, iscale, out=l)
            np.rint(l, out=l)
            np.clip(l, lo, hi, out=l)
            mul(wx, l, out=tmp)
            sumlx = add(tmp, axis=0)
            mul(w, l, out=tmp)
            tmp *= l
            suml2 = add(tmp, axis=0)
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2) & ~zero
            if better.any():
                L_iscale = np.where(better, iscale, L_iscale)
                scale = np.where(better, sumlx / suml2, scale)
                best = np.where(better, scale * sumlx, best)
        L = mul(x, L_iscale, out=l)
        np.rint(L, out=L)
        np.clip(L, lo, hi, out=L)
        L += f_nmax
    if zero.any():
        L[:, zero] = 0
        scale = np.where(zero, _F32(0), scale)
    return scale.astype(np.float32), L


# --------------------------------------------------------------------------------------------
# super-blocks


def _subblocks(blocks: np.ndarray, n: int) -> np.ndarray:
    """[nb, 256] -> [n, nb * 256 / n]: element i of sub-block m at [i, m] (sub-block m = b * (256/n) + j)."""
    return np.ascontiguousarray(blocks.reshape(-1, n).T)


def _pack_scale_min_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """6-bit scales and mins [nb, 8] -> the 12 bytes ``get_scale_min_k4`` reads."""
    ls = ls.astype(np.uint8)
    lm = lm.astype(np.uint8)
    out = np.empty((ls.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    out[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    return out


def _q45_k_scales(x: np.ndarray, nb: int, nmax: int, rmin: float, rdelta: float, nstep: int):
    """The shared part of quantize_row_q4_K_ref / q5_K_ref: per-sub-block fits, then 6-bit
    quantization of the scales and mins against the super-block's f16 d and dmin, then the final
    requantization of every value with the quantized scales. Returns (d16, dmin16, ls, lm, L[nb,256])."""
    # weights[l] = sqrt(sum(x^2)/32) + |x[l]|
    x2 = np.multiply(x, x)
    av_x = np.sqrt(np.add.reduce(x2, axis=0) / _F32(32))
    w = np.abs(x)
    w += av_x
    scales, mins, L = make_qkx2_quants(x, w, nmax, rmin, rdelta, nstep)
    scales = scales.reshape(nb, 8)
    mins = mins.reshape(nb, 8)

    max_scale = scales.max(axis=1)
    max_scale = np.where(max_scale > 0, max_scale, _F32(0))
    max_min = mins.max(axis=1)
    max_min = np.where(max_min > 0, max_min, _F32(0))
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, _F32(63) / max_scale, _F32(0)).astype(np.float32)
        inv_min = np.where(max_min > 0, _F32(63) / max_min, _F32(0)).astype(np.float32)
    # uint8_t ls = nearest_int(...); ls = MIN(63, ls);
    ls = np.minimum(_nearest_int(inv_scale[:, None] * scales) & 0xFF, 63)
    lm = np.minimum(_nearest_int(inv_min[:, None] * mins) & 0xFF, 63)
    d16, d = _f16_roundtrip(max_scale / _F32(63))
    dmin16, dmin = _f16_roundtrip(max_min / _F32(63))

    dj = (d[:, None] * ls.astype(np.float32)).reshape(-1)       # [M]
    dmj = (dmin[:, None] * lm.astype(np.float32)).reshape(-1)
    keep = dj == 0                                               # if (!d) continue;
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.add(x, dmj)
        v /= dj
        q = np.clip(_nearest_int(v), 0, nmax).astype(np.uint8)
    if keep.any():                                               # rare: keep the search's L there
        q[:, keep] = L[:, keep]
    return d16, dmin16, ls, lm, q.T.reshape(nb, QK_K)


def q4_k_parts(blocks: np.ndarray) -> dict[str, np.ndarray]:
    """``quantize_row_q4_K_ref`` before packing: f16 ``d``/``dmin`` [nb], 6-bit ``scales``/``mins``
    [nb, 8] and 4-bit ``q`` [nb, 256]. Value i decodes as d*scales[i//32]*q[i] - dmin*mins[i//32]."""
    d16, dmin16, ls, lm, L = _q45_k_scales(_subblocks(blocks, 32), blocks.shape[0], 15, -1.0, 0.1, 20)
    return {"d": d16, "dmin": dmin16, "scales": ls.astype(np.uint8), "mins": lm.astype(np.uint8), "q": L}


def q5_k_parts(blocks: np.ndarray) -> dict[str, np.ndarray]:
    """``quantize_row_q5_K_ref`` before packing: as ``q4_k_parts`` with 5-bit ``q``."""
    d16, dmin16, ls, lm, L = _q45_k_scales(_subblocks(blocks, 32), blocks.shape[0], 31, -0.5, 0.1, 15)
    return {"d": d16, "dmin": dmin16, "scales": ls.astype(np.uint8), "mins": lm.astype(np.uint8), "q": L}


def q6_k_parts(blocks: np.ndarray) -> dict[str, np.ndarray]:
    """``quantize_row_q6_K_ref`` before packing: f16 ``d`` [nb], int8 ``scales`` [nb, 16] and 6-bit
    ``q`` [nb, 256] (0..63). Value i decodes as d*scales[i//16]*(q[i] - 32)."""
    nb = blocks.shape[0]
    x = _subblocks(blocks, 16)
    scales, L = make_qx_quants(x, 32)
    scales = scales.reshape(nb, 16)

    # max_scale: the signed scale of largest magnitude (first one on ties)
    aidx = np.argmax(np.abs(scales), axis=1)
    max_scale = scales[np.arange(nb), aidx]
    zero = np.abs(max_scale) < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = np.where(zero, _F32(1), _F32(-128) / max_scale).astype(np.float32)
        d16, d = _f16_roundtrip(_F32(1) / iscale)
        sc = np.minimum(127, _nearest_int(iscale[:, None] * scales)).astype(np.int8)
        dj = (d[:, None] * sc.astype(np.float32)).reshape(-1)
        keep = dj == 0
        q = (np.clip(_nearest_int(x / dj), -32, 31) + 32).astype(np.uint8)
    if keep.any():                               # rare: keep make_qx_quants' L there
        q[:, keep] = L[:, keep]
    q = q.T.reshape(nb, QK_K)
    if zero.any():                               # memset(&y[i], 0, sizeof(block_q6_K))
        d16[zero] = 0
        sc[zero] = 0
        q[zero] = 0
    return {"d": d16, "scales": sc, "q": q}


def _k4_header(parts: dict[str, np.ndarray], block_bytes: int) -> np.ndarray:
    """Blocks of ``block_bytes`` with the header Q4_K and Q5_K share filled in: d, dmin, scales[12]."""
    nb = parts["q"].shape[0]
    out = np.empty((nb, block_bytes), dtype=np.uint8)
    out[:, 0:2] = parts["d"].view(np.uint8).reshape(nb, 2)
    out[:, 2:4] = parts["dmin"].view(np.uint8).reshape(nb, 2)
    out[:, 4:16] = _pack_scale_min_k4(parts["scales"], parts["mins"])
    return out


def pack_q4_k(parts: dict[str, np.ndarray]) -> np.ndarray:
    """block_q4_K bytes [nb, 144]: d, dmin, scales[12], qs[128]."""
    L = parts["q"]
    nb = L.shape[0]
    out = _k4_header(parts, 144)
    L = L.reshape(nb, 4, 2, 32)                  # 64-value groups: low nibble first 32, high nibble next 32
    out[:, 16:] = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(nb, 128)
    return out


def pack_q5_k(parts: dict[str, np.ndarray]) -> np.ndarray:
    """block_q5_K bytes [nb, 176]: d, dmin, scales[12], qh[32], qs[128]."""
    L = parts["q"]
    nb = L.shape[0]
    out = _k4_header(parts, 176)
    L = L.reshape(nb, 8, 32)                     # sub-block j -> bit j of qh[l]
    hi = L >> 4
    qh = np.zeros((nb, 32), dtype=np.uint8)
    for j in range(8):
        qh |= hi[:, j] << j
    out[:, 16:48] = qh
    lo = (L & 0xF).reshape(nb, 4, 2, 32)
    out[:, 48:] = (lo[:, :, 0] | (lo[:, :, 1] << 4)).reshape(nb, 128)
    return out


def pack_q6_k(parts: dict[str, np.ndarray]) -> np.ndarray:
    """block_q6_K bytes [nb, 210]: ql[128], qh[64], scales[16], d."""
    L = parts["q"]
    nb = L.shape[0]
    out = np.empty((nb, 210), dtype=np.uint8)
    L = L.reshape(nb, 2, 4, 32)                  # two 128-value halves, four 32-value rows each
    lo = L & 0xF
    hi = L >> 4
    ql = np.empty((nb, 2, 2, 32), dtype=np.uint8)
    ql[:, :, 0] = lo[:, :, 0] | (lo[:, :, 2] << 4)
    ql[:, :, 1] = lo[:, :, 1] | (lo[:, :, 3] << 4)
    out[:, 0:128] = ql.reshape(nb, 128)
    out[:, 128:192] = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)).reshape(nb, 64)
    out[:, 192:208] = parts["scales"].view(np.uint8)
    out[:, 208:210] = parts["d"].view(np.uint8).reshape(nb, 2)
    return out


def quantize_q4_k_blocks(blocks: np.ndarray) -> np.ndarray:
    """float32 [nb, 256] -> uint8 [nb, 144] (``quantize_row_q4_K_ref``)."""
    return pack_q4_k(q4_k_parts(blocks))


def quantize_q5_k_blocks(blocks: np.ndarray) -> np.ndarray:
    """float32 [nb, 256] -> uint8 [nb, 176] (``quantize_row_q5_K_ref``)."""
    return pack_q5_k(q5_k_parts(blocks))


def quantize_q6_k_blocks(blocks: np.ndarray) -> np.ndarray:
    """float32 [nb, 256] -> uint8 [nb, 210] (``quantize_row_q6_K_ref``)."""
    return pack_q6_k(q6_k_parts(blocks))


_BLOCK_FNS = {"Q4_K": quantize_q4_k_blocks, "Q5_K": quantize_q5_k_blocks, "Q6_K": quantize_q6_k_blocks}


def quantize_blocks(blocks: np.ndarray, type_name: str) -> np.ndarray:
    """float32 [nb, 256] -> uint8 [nb, block_bytes] for ``type_name`` in Q4_K / Q5_K / Q6_K."""
    blocks = np.ascontiguousarray(blocks, dtype=np.float32).reshape(-1, QK_K)
    if blocks.shape[0] == 0:
        return np.empty((0, BLOCK_BYTES[type_name]), dtype=np.uint8)
    return _BLOCK_FNS[type_name](blocks)


def iter_quantize(values: np.ndarray, type_name: str, chunk_blocks: int = CHUNK_BLOCKS) -> Iterator[tuple[int, np.ndarray]]:
    """Quantize ``values`` (any shape, last dimension a multiple of 256) in chunks of super-blocks.

    Yields ``(n_values_done_in_this_chunk, uint8 bytes of the chunk)``; the concatenated bytes are
    the tensor's GGUF data. Chunks never span more than ``chunk_blocks`` super-blocks, so the working
    memory is bounded however large the tensor is."""
    if type_name not in _BLOCK_FNS:
        raise ValueError(f"not a K-quant type: {type_name}")
    if values.shape[-1] % QK_K:
        raise ValueError(f"row length {values.shape[-1]} is not a multiple of {QK_K}")
    flat = values.reshape(-1, QK_K)
    fn = _BLOCK_FNS[type_name]
    for start in range(0, flat.shape[0], chunk_blocks):
        chunk = np.ascontiguousarray(flat[start:start + chunk_blocks], dtype=np.float32)
        yield chunk.size, fn(chunk).reshape(-1)


def quantize(values: np.ndarray, type_name: str) -> np.ndarray:
    """The GGUF bytes of ``values`` as ``type_name``: uint8 ``[*outer, row_len // 256 * block_bytes]``
    (the shape ``gguf.quants.quantize`` returns)."""
    values = np.asarray(values)
    shape = (*values.shape[:-1], values.shape[-1] // QK_K * BLOCK_BYTES[type_name])
    parts = [b for _, b in iter_quantize(values, type_name)]
    out = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint8)
    return out.reshape(shape)
