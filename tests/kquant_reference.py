"""Test-only port of llama.cpp's reference K-quant quantizers, written the way the C code is.

ggml/src/ggml-quants.c: ``quantize_row_q4_K_ref``, ``quantize_row_q5_K_ref``,
``quantize_row_q6_K_ref`` and their helpers ``make_qkx2_quants`` and ``make_qx_quants``. One super-block
at a time, one sub-block at a time, with the same control flow as the C loops, so that it is easy to
check line by line against the C source. It is the stand-in for libggml when that library is not
installed (CI): tests/importer/test_kquant.py proves it byte-identical to libggml where the library exists.

Only the innermost loops over the 16 or 32 values of a sub-block are numpy expressions. Every value is
float32 and every operation is one IEEE float32 operation, as in the C code (which is compiled without
FMA contraction for baseline x86-64); sums are accumulated left to right (``np.cumsum``, which is
sequential, instead of ``np.sum``, which is pairwise).

Slow (milliseconds per super-block): meant for a few hundred blocks.
"""

from __future__ import annotations

import numpy as np

QK_K = 256
GROUP_MAX_EPS = np.float32(1e-15)
f32 = np.float32


def nearest_int(fval) -> np.ndarray:
    """``float val = fval + 12582912.f; memcpy(&i, &val, 4); return (i & 0x007fffff) - 0x00400000;``"""
    val = (np.asarray(fval, dtype=np.float32) + f32(12582912.0)).astype(np.float32)
    return (val.view(np.int32) & 0x007FFFFF) - 0x00400000


def seqsum(v: np.ndarray) -> np.float32:
    """``float s = 0; for (i...) s += v[i];`` (left to right, float32)."""
    return np.cumsum(v.astype(np.float32), dtype=np.float32)[-1] if v.size else f32(0)


def fp32_to_fp16(v) -> np.ndarray:
    """GGML_FP32_TO_FP16: round to nearest even, as the FP16 library (and numpy) do."""
    with np.errstate(over="ignore"):
        return np.asarray(v, dtype=np.float32).astype(np.float16)


def fp16_to_fp32(h) -> np.float32:
    return f32(np.asarray(h, dtype=np.float16).astype(np.float32))


def make_qkx2_quants(n: int, nmax: int, x: np.ndarray, weights: np.ndarray, rmin: float, rdelta: float,
                     nstep: int, use_mad: bool = False) -> tuple[np.float32, np.ndarray, np.float32]:
    """Returns (scale, L[n] uint8, the_min)."""
    x = x.astype(np.float32)
    weights = weights.astype(np.float32)
    mn = x[0]
    mx = x[0]
    for i in range(1, n):
        mn = min(mn, x[i])
        mx = max(mx, x[i])
    sum_w = seqsum(weights)
    sum_x = seqsum(weights * x)
    if mn > 0:
        mn = f32(0)
    if mx == mn:
        return f32(0), np.zeros(n, np.uint8), f32(-mn)
    iscale = f32(f32(nmax) / f32(mx - mn))
    scale = f32(f32(1) / iscale)
    L = np.clip(nearest_int(iscale * (x - mn)), 0, nmax)
    diff = f32(scale) * L.astype(np.float32) + mn - x
    diff = np.abs(diff) if use_mad else diff * diff
    best_error = seqsum(weights * diff)
    if nstep < 1:
        return scale, L.astype(np.uint8), f32(-mn)
    for step in range(nstep + 1):
        iscale = f32(f32(f32(f32(rmin) + f32(f32(rdelta) * f32(step))) + f32(nmax)) / f32(mx - mn))
        laux = np.clip(nearest_int(iscale * (x - mn)), 0, nmax)
        lf = laux.astype(np.float32)
        wl = weights * lf
        sum_l = seqsum(wl)
        sum_l2 = seqsum(wl * lf)
        sum_xl = seqsum(wl * x)
        D = f32(f32(sum_w * sum_l2) - f32(sum_l * sum_l))
        if D > 0:
            this_scale = f32(f32(f32(sum_w * sum_xl) - f32(sum_x * sum_l)) / D)
            this_min = f32(f32(f32(sum_l2 * sum_x) - f32(sum_l * sum_xl)) / D)
            if this_min > 0:
                this_min = f32(0)
                this_scale = f32(sum_xl / sum_l2)
            diff = this_scale * lf + this_min - x
            diff = np.abs(diff) if use_mad else diff * diff
            cur_error = seqsum(weights * diff)
            if cur_error < best_error:
                L = laux
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, L.astype(np.uint8), f32(-mn)


def make_qx_quants(n: int, nmax: int, x: np.ndarray, rmse_type: int = 1) -> tuple[np.float32, np.ndarray]:
    """``make_qx_quants(n, nmax, x, L, rmse_type, qw=NULL)`` for rmse_type 1 (weights x^2). Returns (scale, L int8)."""
    assert rmse_type == 1
    x = x.astype(np.float32)
    mx = f32(0)
    amax = f32(0)
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < GROUP_MAX_EPS:
        return f32(0), np.zeros(n, np.int8)
    iscale = f32(f32(-nmax) / mx)
    w = x * x

    def sums(iscale):
        l = np.clip(nearest_int(iscale * x), -nmax, nmax - 1)
        lf = l.astype(np.float32)
        return l, seqsum(w * x * lf), seqsum(w * lf * lf)

    l, sumlx, suml2 = sums(iscale)
    L = (l + nmax).astype(np.int8)
    scale = f32(sumlx / suml2) if suml2 else f32(0)
    best = f32(scale * sumlx)
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = f32(-f32(f32(nmax) + f32(f32(0.1) * f32(step))) / mx)
        l, sumlx, suml2 = sums(iscale)
        if suml2 > 0 and f32(sumlx * sumlx) > f32(best * suml2):
            L = (l + nmax).astype(np.int8)
            scale = f32(sumlx / suml2)
            best = f32(scale * sumlx)
    return scale, L


def _q45_k_block(x: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    L = np.zeros(QK_K, np.uint8)
    scales = np.zeros(8, np.float32)
    mins = np.zeros(8, np.float32)
    max_scale = f32(0)
    max_min = f32(0)
    for j in range(8):
        xs = x[32 * j:32 * j + 32]
        sum_x2 = seqsum(xs * xs)
        av_x = np.sqrt(f32(sum_x2 / f32(32)))
        weights = av_x + np.abs(xs)
        scales[j], L[32 * j:32 * j + 32], mins[j] = make_qkx2_quants(32, nmax, xs, weights, rmin, rdelta, nstep)
        max_scale = max(max_scale, scales[j])
        max_min = max(max_min, mins[j])
    inv_scale = f32(63) / max_scale if max_scale > 0 else f32(0)
    inv_min = f32(63) / max_min if max_min > 0 else f32(0)
    sc_bytes = np.zeros(12, np.uint8)
    ls_all, lm_all = [], []
    for j in range(8):
        ls = int(nearest_int(f32(inv_scale * scales[j]))) & 0xFF  # uint8_t ls = nearest_int(...)
        lm = int(nearest_int(f32(inv_min * mins[j]))) & 0xFF
        ls = min(63, ls)
        lm = min(63, lm)
        if j < 4:
            sc_bytes[j] = ls
            sc_bytes[j + 4] = lm
        else:
            sc_bytes[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            sc_bytes[j - 4] |= (ls >> 4) << 6
            sc_bytes[j] |= (lm >> 4) << 6
        ls_all.append(ls)
        lm_all.append(lm)
    d = fp32_to_fp16(f32(max_scale / f32(63)))
    dmin = fp32_to_fp16(f32(max_min / f32(63)))
    for j in range(8):
        sc, m = get_scale_min_k4(j, sc_bytes)
        dj = f32(fp16_to_fp32(d) * f32(sc))
        if not dj:
            continue
        dm = f32(fp16_to_fp32(dmin) * f32(m))
        xs = x[32 * j:32 * j + 32]
        L[32 * j:32 * j + 32] = np.clip(nearest_int((xs + dm) / dj), 0, nmax)
    return d, dmin, sc_bytes, L


def get_scale_min_k4(j: int, q: np.ndarray) -> tuple[int, int]:
    if j < 4:
        return int(q[j]) & 63, int(q[j + 4]) & 63
    return (int(q[j + 4]) & 0xF) | ((int(q[j - 4]) >> 6) << 4), (int(q[j + 4]) >> 4) | ((int(q[j]) >> 6) << 4)


def quantize_row_q4_K_ref(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32).reshape(-1, QK_K)
    out = []
    for blk in x:
        d, dmin, sc, L = _q45_k_block(blk, 15, -1.0, 0.1, 20)
        qs = np.zeros(128, np.uint8)
        for g, j in enumerate(range(0, QK_K, 64)):
            for l in range(32):
                qs[32 * g + l] = L[j + l] | (L[j + l + 32] << 4)
        out.append(np.concatenate([d.reshape(1).view(np.uint8), dmin.reshape(1).view(np.uint8), sc, qs]))
    return np.stack(out) if out else np.zeros((0, 144), np.uint8)


def quantize_row_q5_K_ref(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32).reshape(-1, QK_K)
    out = []
    for blk in x:
        d, dmin, sc, L = _q45_k_block(blk, 31, -0.5, 0.1, 15)
        qh = np.zeros(32, np.uint8)
        ql = np.zeros(128, np.uint8)
        m1, m2 = 1, 2
        for g, n in enumerate(range(0, QK_K, 64)):
            for j in range(32):
                l1 = int(L[n + j])
                if l1 > 15:
                    l1 -= 16
                    qh[j] |= m1
                l2 = int(L[n + j + 32])
                if l2 > 15:
                    l2 -= 16
                    qh[j] |= m2
                ql[32 * g + j] = l1 | (l2 << 4)
            m1 <<= 2
            m2 <<= 2
        out.append(np.concatenate([d.reshape(1).view(np.uint8), dmin.reshape(1).view(np.uint8), sc, qh, ql]))
    return np.stack(out) if out else np.zeros((0, 176), np.uint8)


def quantize_row_q6_K_ref(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32).reshape(-1, QK_K)
    out = []
    for blk in x:
        L = np.zeros(QK_K, np.int16)
        scales = np.zeros(16, np.float32)
        max_scale = f32(0)
        max_abs_scale = f32(0)
        for ib in range(16):
            scale, L[16 * ib:16 * ib + 16] = make_qx_quants(16, 32, blk[16 * ib:16 * ib + 16], 1)
            scales[ib] = scale
            if abs(scale) > max_abs_scale:
                max_abs_scale = abs(scale)
                max_scale = scale
        if max_abs_scale < GROUP_MAX_EPS:
            out.append(np.zeros(210, np.uint8))
            continue
        iscale = f32(f32(-128) / max_scale)
        d = fp32_to_fp16(f32(f32(1) / iscale))
        sc = np.zeros(16, np.int8)
        for ib in range(16):
            sc[ib] = np.int8(min(127, int(nearest_int(f32(iscale * scales[ib])))))
        for j in range(16):
            dj = f32(fp16_to_fp32(d) * f32(sc[j]))
            if not dj:
                continue
            L[16 * j:16 * j + 16] = np.clip(nearest_int(blk[16 * j:16 * j + 16] / dj), -32, 31) + 32
        ql = np.zeros(128, np.uint8)
        qh = np.zeros(64, np.uint8)
        for h, j in enumerate(range(0, QK_K, 128)):
            for l in range(32):
                q1, q2, q3, q4 = (int(L[j + l + k]) for k in (0, 32, 64, 96))
                ql[64 * h + l] = (q1 & 0xF) | ((q3 & 0xF) << 4)
                ql[64 * h + l + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4)
                qh[32 * h + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)
        out.append(np.concatenate([ql, qh, sc.view(np.uint8), d.reshape(1).view(np.uint8)]))
    return np.stack(out) if out else np.zeros((0, 210), np.uint8)


QUANTIZERS = {"Q4_K": quantize_row_q4_K_ref, "Q5_K": quantize_row_q5_K_ref, "Q6_K": quantize_row_q6_K_ref}


def quantize(values: np.ndarray, type_name: str) -> np.ndarray:
    """GGUF bytes of ``values`` (last dimension a multiple of 256), uint8 [*outer, row_bytes]."""
    values = np.asarray(values, np.float32)
    blocks = QUANTIZERS[type_name](values.reshape(-1, QK_K))
    return blocks.reshape(*values.shape[:-1], -1)
