"""Torch dequantizers for GGUF tensor bytes, and the exact Q4 -> int4 (group 32) mapping.

Every function takes the *raw block bytes* of a tensor as a uint8 torch tensor (normally
``torch.from_numpy`` over the mmap view from :meth:`engine.contract.gguf.GGUFFile.tensor_data`, so nothing
is copied up front) and works in chunks of rows, so the extra memory at any moment is a few
megabytes of temporaries on top of the output itself.

The arithmetic mirrors ``gguf.quants`` (gguf-py) operation by operation, in f32, so the f32 output is
bit-identical to ``gguf.quants.dequantize`` (the tests check this for every type). Other output
dtypes are the f32 result rounded once.

Block layouts are ggml's (ggml-common.h). Within a block, "sub-block" means the 16- or 32-element
groups that share one scale.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from engine.contract.gguf import GGML_TYPES, GGUFFile

# Elements per chunk of work: big enough that per-op overhead is negligible, small enough that the
# f32 temporaries (a handful of them) stay around 10-40 MB.
CHUNK_ELEMS = 1 << 21

QK_K = 256

# GGML type ids used below (ggml.h ABI).
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 10, 11, 12, 13, 14, 30
IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS = 16, 17, 18, 19, 20, 21, 22, 23
IQ1_M, MXFP4 = 29, 39

# Types whose 4-bit codes map exactly onto torch's int4 group-32 weight format.
INT4_EXACT_TYPES = frozenset({Q4_0, Q4_1, Q4_K})

# --------------------------------------------------------------------------------------------
# helpers


def raw_tensor(f: GGUFFile, name: str) -> torch.Tensor:
    """The bytes of tensor ``name`` as a 1-D uint8 torch tensor sharing memory with the mmap.

    The tensor is read-only memory: never write to it (all functions here only read)."""
    arr = f.tensor_data(name)
    with warnings.catch_warnings():
        # torch warns that the array is not writable; we only ever read from it.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


def _as_raw(raw: torch.Tensor | np.ndarray) -> torch.Tensor:
    if isinstance(raw, np.ndarray):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.from_numpy(raw)
    if raw.dtype != torch.uint8:
        raise TypeError(f"raw GGUF bytes must be uint8, got {raw.dtype}")
    return raw.reshape(-1) if raw.is_contiguous() else raw.contiguous().reshape(-1)


def _type_info(ggml_type: int) -> tuple[str, int, int]:
    if ggml_type not in GGML_TYPES:
        raise ValueError(f"unknown GGML type {ggml_type}")
    return GGML_TYPES[ggml_type]


def row_bytes(ggml_type: int, k: int) -> int:
    """Bytes of one row of ``k`` elements."""
    name, block, block_bytes = _type_info(ggml_type)
    if k % block:
        raise ValueError(f"row length {k} is not a multiple of the {name} block size {block}")
    return k // block * block_bytes


def _f16(blocks: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """Bytes [a, b) of every block read as f16 and widened to f32: [n_blocks, (b - a) // 2]."""
    return blocks[:, a:b].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, m] bytes -> [n, 2m] as (low nibbles of all m bytes, then high nibbles): ggml's Q4_0/Q4_1/Q5 order."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1)


def _bits(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Unpack ``width``-bit fields of bytes (lowest first), stacked at ``dim``.

    Scalar shifts + stack: much faster in torch than one broadcast shift by a vector."""
    mask = (1 << width) - 1
    parts = [(x >> s) & mask if s else x & mask for s in range(0, 8, width)]
    return torch.stack(parts, dim=dim)


def _u16(blocks: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """Bytes [a, b) of every block as little-endian uint16 words, held in int32 (torch's uint16 has no
    shifts): [n_blocks, (b - a) // 2]."""
    return blocks[:, a:b].contiguous().view(torch.int16).to(torch.int32) & 0xFFFF


def _u32(blocks: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """Bytes [a, b) of every block as little-endian 32-bit words in int32: [n_blocks, (b - a) // 4].

    Read fields with ``(w >> s) & mask``: the mask drops what the arithmetic shift copies of bit 31."""
    return blocks[:, a:b].contiguous().view(torch.int32)


def _fields(w: torch.Tensor, shifts: tuple[int, ...], mask: int) -> torch.Tensor:
    """``(w >> s) & mask`` for each shift, stacked on a new last dim."""
    return torch.stack([(w >> s) & mask for s in shifts], dim=-1)


def _sign_bits(x: torch.Tensor) -> torch.Tensor:
    """Bytes -> ±1.0 per bit (bit set: -1), lowest bit first: [..., 8] f32, the values gguf-py multiplies by."""
    return 1.0 - 2.0 * _bits(x, 1, dim=-1).float()


def _scale_sub(q: torch.Tensor, scale: torch.Tensor, minus: torch.Tensor | None = None,
               plus: torch.Tensor | None = None, offset: float = 0.0) -> torch.Tensor:
    """f32 ``(q - offset) * scale [- minus | + plus]`` with in-place passes.

    The rounding sequence is gguf-py's (one rounding for the product, one for the add/sub), so
    results stay bit-identical; in-place ops over a fresh f32 tensor are about 4x faster than
    mixed-dtype broadcast arithmetic."""
    w = q.float()
    if offset:
        w.sub_(offset)
    w.mul_(scale)
    if minus is not None:
        w.sub_(minus)
    if plus is not None:
        w.add_(plus)
    return w


# --------------------------------------------------------------------------------------------
# per-type block dequantizers: uint8 [n_blocks, type_size] -> f32 [n_blocks, block_size]


def _deq_f32(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.contiguous().view(torch.float32).reshape(-1, 1)


def _deq_f16(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.contiguous().view(torch.float16).float().reshape(-1, 1)


def _deq_bf16(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.contiguous().view(torch.bfloat16).float().reshape(-1, 1)


def _deq_q4_0(blocks: torch.Tensor) -> torch.Tensor:
    # w = (q - 8) * d
    return _scale_sub(_nibbles(blocks[:, 2:18]), _f16(blocks, 0, 2), offset=8.0)


def _deq_q4_1(blocks: torch.Tensor) -> torch.Tensor:
    # w = q * d + m
    return _scale_sub(_nibbles(blocks[:, 4:20]), _f16(blocks, 0, 2), plus=_f16(blocks, 2, 4))


def _q5_high_bits(qh: torch.Tensor) -> torch.Tensor:
    """[n, 4] little-endian uint32 bytes -> [n, 32]: bit j of the word at position j."""
    return _bits(qh, 1, dim=2).reshape(qh.shape[0], 32)


def _q5_0_codes(blocks: torch.Tensor) -> torch.Tensor:
    """Q5_0 block -> 5-bit codes [n, 32]: 4 low bits | 1 high bit << 4."""
    return _nibbles(blocks[:, 6:22]) | (_q5_high_bits(blocks[:, 2:6]) << 4)


def _q5_1_codes(blocks: torch.Tensor) -> torch.Tensor:
    """Q5_1 block -> 5-bit codes [n, 32]."""
    return _nibbles(blocks[:, 8:24]) | (_q5_high_bits(blocks[:, 4:8]) << 4)


def _deq_q5_0(blocks: torch.Tensor) -> torch.Tensor:
    # w = (q - 16) * d
    return _scale_sub(_q5_0_codes(blocks), _f16(blocks, 0, 2), offset=16.0)


def _deq_q5_1(blocks: torch.Tensor) -> torch.Tensor:
    # w = q * d + m
    return _scale_sub(_q5_1_codes(blocks), _f16(blocks, 0, 2), plus=_f16(blocks, 2, 4))


def _deq_q8_0(blocks: torch.Tensor) -> torch.Tensor:
    # w = q * d
    return _scale_sub(blocks[:, 2:34].contiguous().view(torch.int8), _f16(blocks, 0, 2))


def _deq_q2_k(blocks: torch.Tensor) -> torch.Tensor:
    # 16 sub-blocks of 16: w = (d * sc) * q - (dmin * m), 4-bit sc/m, 2-bit q
    nb = blocks.shape[0]
    scales = blocks[:, 0:16]
    d = _f16(blocks, 80, 82)
    dmin = _f16(blocks, 82, 84)
    dl = (d * (scales & 0xF).float()).reshape(nb, 16, 1)
    ml = (dmin * (scales >> 4).float()).reshape(nb, 16, 1)
    q = _bits(blocks[:, 16:80].reshape(nb, 2, 32), 2, dim=2).reshape(nb, 16, 16)
    return _scale_sub(q, dl, minus=ml).reshape(nb, QK_K)


def _deq_q3_k(blocks: torch.Tensor) -> torch.Tensor:
    # 16 sub-blocks of 16: w = (d * (sc - 32)) * (q - 4 * (1 - hbit)), 6-bit sc, 2+1-bit q
    nb = blocks.shape[0]
    hmask = blocks[:, 0:32]
    scales = blocks[:, 96:108]
    d = _f16(blocks, 108, 110)
    lsc = _bits(scales[:, :8].reshape(nb, 8), 4, dim=1).reshape(nb, 16)
    hsc = _bits(scales[:, 8:12].reshape(nb, 4), 2, dim=1).reshape(nb, 16)
    sc = lsc | (hsc << 4)
    dl = (d * (sc.float() - 32.0)).reshape(nb, 16, 1)
    ql = _bits(blocks[:, 32:96].reshape(nb, 2, 32), 2, dim=2).reshape(nb, 16, 16)
    qh = _bits(hmask, 1, dim=1).reshape(nb, 16, 16)
    # the offset 4 applies where the mask bit is 0
    q = ql.float() - ((qh ^ 1) << 2).float()
    return q.mul_(dl).reshape(nb, QK_K)


def _q4k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpack the 12-byte 6-bit scales/mins of Q4_K/Q5_K: uint8 [n, 12] -> ([n, 8], [n, 8])."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc, mn


def _q4k_factors(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K block -> (d f32 [n, 1], dmin f32 [n, 1], sc uint8 [n, 8], m uint8 [n, 8])."""
    sc, mn = _q4k_scale_min(blocks[:, 4:16])
    return _f16(blocks, 0, 2), _f16(blocks, 2, 4), sc, mn


def _q4k_scales(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K block -> (d*sc f32 [n, 8, 1], dmin*m f32 [n, 8, 1])."""
    nb = blocks.shape[0]
    d, dmin, sc, mn = _q4k_factors(blocks)
    return (d * sc.float()).reshape(nb, 8, 1), (dmin * mn.float()).reshape(nb, 8, 1)


def _q4k_codes(blocks: torch.Tensor) -> torch.Tensor:
    """Q4_K block -> 4-bit codes uint8 [n, 8, 32]; each 32 bytes hold sub-blocks 2j (low) and 2j+1 (high)."""
    nb = blocks.shape[0]
    return _bits(blocks[:, 16:144].reshape(nb, 4, 32), 4, dim=2).reshape(nb, 8, 32)


def _deq_q4_k(blocks: torch.Tensor) -> torch.Tensor:
    # 8 sub-blocks of 32: w = (d * sc) * q - (dmin * m)
    dsc, dm = _q4k_scales(blocks)
    return _scale_sub(_q4k_codes(blocks), dsc, minus=dm).reshape(-1, QK_K)


def _q5k_codes(blocks: torch.Tensor) -> torch.Tensor:
    """Q5_K block -> 5-bit codes [n, 8, 32]: as Q4_K with a fifth bit, sub-block i takes bit i of qh[l]."""
    nb = blocks.shape[0]
    qh = _bits(blocks[:, 16:48], 1, dim=1)  # [nb, 8, 32]
    ql = _bits(blocks[:, 48:176].reshape(nb, 4, 32), 4, dim=2).reshape(nb, 8, 32)
    return ql | (qh << 4)


def _deq_q5_k(blocks: torch.Tensor) -> torch.Tensor:
    # 8 sub-blocks of 32: w = (d * sc) * q - (dmin * m)
    dsc, dm = _q4k_scales(blocks)
    return _scale_sub(_q5k_codes(blocks), dsc, minus=dm).reshape(-1, QK_K)


def _q6k_codes(blocks: torch.Tensor) -> torch.Tensor:
    """Q6_K block -> 6-bit codes [n, 16, 16] (4 low bits | 2 high bits << 4), one row per sub-block."""
    nb = blocks.shape[0]
    ql = _bits(blocks[:, 0:128].reshape(nb, 2, 64), 4, dim=2).reshape(nb, 8, 32)
    qh = _bits(blocks[:, 128:192].reshape(nb, 2, 32), 2, dim=2).reshape(nb, 8, 32)
    return (ql | (qh << 4)).reshape(nb, 16, 16)


def _q6k_scales(blocks: torch.Tensor) -> torch.Tensor:
    """Q6_K block -> the 16 sub-block scales d * sc, f32 [n, 16]."""
    return _f16(blocks, 208, 210) * blocks[:, 192:208].contiguous().view(torch.int8).float()


def _deq_q6_k(blocks: torch.Tensor) -> torch.Tensor:
    # 16 sub-blocks of 16: w = (d * sc) * (q - 32), int8 sc, 4+2-bit q
    dsc = _q6k_scales(blocks).unsqueeze(-1)
    return _scale_sub(_q6k_codes(blocks), dsc, offset=32.0).reshape(-1, QK_K)


# --- IQ types and MXFP4. Their lookup tables (kvalues, sign patterns, lattice grids) are format data:
# taken from gguf-py (decoded there from ggml's tables) on first use, so the values are the reference's.


@functools.lru_cache(maxsize=None)
def _kvalues(name: str) -> torch.Tensor:
    """The 16 non-linear 4-bit code values of IQ4_NL/IQ4_XS (``IQ4_NL``) or MXFP4 (doubled E2M1), f32 [16]."""
    from gguf import quants

    return torch.tensor(getattr(quants, name).kvalues, dtype=torch.float32)


@functools.lru_cache(maxsize=None)
def _grid(name: str) -> torch.Tensor:
    """The lattice of IQ type ``name`` (a gguf.quants class name): f32 [entries, 4 or 8]."""
    from gguf import quants

    cls = getattr(quants, name)
    cls.init_grid()
    return torch.from_numpy(cls.grid.reshape(cls.grid_shape).copy())


@functools.lru_cache(maxsize=None)
def _ksigns() -> torch.Tensor:
    """ggml's 128 sign patterns (7 stored sign bits + the parity bit) as ±1.0: f32 [128, 8]."""
    from gguf import quants

    return _sign_bits(torch.frombuffer(bytearray(quants.IQ2_XXS.ksigns), dtype=torch.uint8))


def _half_scales(blocks: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """The 4-bit sub-block scales in bytes [a, b) (low nibble first), as f32 0.5 + s: [n, 2 * (b - a)]."""
    return 0.5 + _bits(blocks[:, a:b], 4, dim=2).reshape(blocks.shape[0], -1).float()


def _signed_grid(db: torch.Tensor, grid: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """gguf-py's ``db * grid * signs`` (in that order; the signs are exact) flattened to [n, QK_K]."""
    return grid.mul_(db).mul_(signs).reshape(-1, QK_K)


def _deq_iq4_nl(blocks: torch.Tensor) -> torch.Tensor:
    # w = d * kvalues[q], the codes in Q4_0's nibble order
    return _scale_sub(_kvalues("IQ4_NL")[_nibbles(blocks[:, 2:18]).long()], _f16(blocks, 0, 2))


def _iq4xs_scales(blocks: torch.Tensor) -> torch.Tensor:
    """IQ4_XS's 6-bit sub-block scales minus 32 (low 4 bits in bytes 4-7, high 2 bits in the u16 at 2): [n, 8]."""
    nb = blocks.shape[0]
    low = _bits(blocks[:, 4:8], 4, dim=2).reshape(nb, 8)
    high = _bits(blocks[:, 2:4], 2, dim=2).reshape(nb, 8)
    return (low | (high << 4)).to(torch.int32) - 32


def _deq_iq4_xs(blocks: torch.Tensor) -> torch.Tensor:
    # 8 sub-blocks of 32: w = (d * (sc - 32)) * kvalues[q], each 16 bytes hold a sub-block's low then high nibbles
    nb = blocks.shape[0]
    dl = (_f16(blocks, 0, 2) * _iq4xs_scales(blocks).float()).reshape(nb, 8, 1)
    q = _bits(blocks[:, 8:136].reshape(nb, 8, 16), 4, dim=2).reshape(nb, 8, 32)
    return _scale_sub(_kvalues("IQ4_NL")[q.long()], dl).reshape(nb, QK_K)


def _deq_iq2_xxs(blocks: torch.Tensor) -> torch.Tensor:
    # 8 sub-blocks of 32, each two u32: 4 grid ids (8 values each), then 4x7-bit sign-pattern ids and a
    # 4-bit scale: w = (d * (0.5 + s) * 0.25) * grid * sign
    nb = blocks.shape[0]
    meta = _u32(blocks, 2, 66).reshape(nb, 8, 2)[..., 1]  # [nb, 8]
    db = (_f16(blocks, 0, 2) * (0.5 + ((meta >> 28) & 0xF).float()) * 0.25).reshape(nb, 8, 1, 1)
    signs = _ksigns()[_fields(meta, (0, 7, 14, 21), 0x7F).long()]  # [nb, 8, 4, 8]
    grid = _grid("IQ2_XXS")[blocks[:, 2:66].reshape(nb, 8, 2, 4)[:, :, 0].long()]  # the first word's bytes
    return _signed_grid(db, grid, signs)


def _deq_iq2_xs(blocks: torch.Tensor) -> torch.Tensor:
    # 16 sub-blocks of 16, each two u16 of 9-bit grid id | 7-bit sign-pattern id << 9:
    # w = (d * (0.5 + s) * 0.25) * grid * sign
    nb = blocks.shape[0]
    qs = _u16(blocks, 2, 66)  # [nb, 32]
    db = (_f16(blocks, 0, 2) * _half_scales(blocks, 66, 74) * 0.25).reshape(nb, 16, 1, 1)
    signs = _ksigns()[(qs >> 9).long()].reshape(nb, 16, 2, 8)
    grid = _grid("IQ2_XS")[(qs & 511).long()].reshape(nb, 16, 2, 8)
    return _signed_grid(db, grid, signs)


def _deq_iq2_s(blocks: torch.Tensor) -> torch.Tensor:
    # 16 sub-blocks of 16: 10-bit grid ids (8 low bits in qs, 2 high in qh), one sign bit per value:
    # w = (d * (0.5 + s) * 0.25) * grid * sign
    nb = blocks.shape[0]
    db = (_f16(blocks, 0, 2) * _half_scales(blocks, 74, 82) * 0.25).reshape(nb, 16, 1, 1)
    signs = _sign_bits(blocks[:, 34:66]).reshape(nb, 16, 2, 8)
    qh = _bits(blocks[:, 66:74], 2, dim=2).reshape(nb, 32)
    ids = blocks[:, 2:34].long() | (qh.long() << 8)
    return _signed_grid(db, _grid("IQ2_S")[ids].reshape(nb, 16, 2, 8), signs)


def _deq_iq3_xxs(blocks: torch.Tensor) -> torch.Tensor:
    # 8 sub-blocks of 32: 8 grid ids of 4 values each, one u32 of 4x7-bit sign-pattern ids and a 4-bit
    # scale: w = (d * (0.5 + s) * 0.5) * grid * sign
    nb = blocks.shape[0]
    meta = _u32(blocks, 66, 98)  # [nb, 8]
    db = (_f16(blocks, 0, 2) * (0.5 + ((meta >> 28) & 0xF).float()) * 0.5).reshape(nb, 8, 1, 1)
    signs = _ksigns()[_fields(meta, (0, 7, 14, 21), 0x7F).long()]  # [nb, 8, 4, 8]
    grid = _grid("IQ3_XXS")[blocks[:, 2:66].long()].reshape(nb, 8, 4, 8)
    return _signed_grid(db, grid, signs)


def _deq_iq3_s(blocks: torch.Tensor) -> torch.Tensor:
    # 8 sub-blocks of 32: 9-bit grid ids of 4 values (8 low bits in qs, 1 high in qh), one sign bit per
    # value: w = (d * (1 + 2 * s)) * grid * sign
    nb = blocks.shape[0]
    sc = _bits(blocks[:, 106:110], 4, dim=2).reshape(nb, 8)
    db = (_f16(blocks, 0, 2) * (1 + 2 * sc).float()).reshape(nb, 8, 1, 1)
    signs = _sign_bits(blocks[:, 74:106]).reshape(nb, 8, 4, 8)
    qh = _bits(blocks[:, 66:74], 1, dim=2).reshape(nb, 64)
    ids = blocks[:, 2:66].long() | (qh.long() << 8)
    return _signed_grid(db, _grid("IQ3_S")[ids].reshape(nb, 8, 4, 8), signs)


def _iq1_values(grid_ids: torch.Tensor, shape: tuple[int, ...], delta: torch.Tensor, dl: torch.Tensor) -> torch.Tensor:
    """gguf-py's ``dl * (grid + delta)`` over the IQ1 lattice (values -1, 0, 1) viewed as ``shape``, flattened
    to [n, QK_K]."""
    grid = _grid("IQ1_S")[grid_ids.long()].reshape(shape)
    return grid.add_(delta).mul_(dl).reshape(-1, QK_K)


def _iq1_delta(negative: torch.Tensor) -> torch.Tensor:
    """IQ1's lattice shift: -0.125 where the flag is set, else +0.125 (f32)."""
    return torch.where(negative, -0.125, 0.125).float()


def _deq_iq1_s(blocks: torch.Tensor) -> torch.Tensor:
    # 8 sub-blocks of 32, one u16 each: 4x3 high grid-id bits, a 3-bit scale, the shift's sign:
    # w = (d * (2 * s + 1)) * (grid + delta)
    nb = blocks.shape[0]
    qh = _u16(blocks, 34, 50)  # [nb, 8]
    dl = (_f16(blocks, 0, 2) * (2 * ((qh >> 12) & 7) + 1).float()).reshape(nb, 8, 1, 1)
    delta = _iq1_delta((qh & 0x8000) != 0).reshape(nb, 8, 1, 1)
    ids = blocks[:, 2:34].to(torch.int32) | (_fields(qh, (0, 3, 6, 9), 7).reshape(nb, 32) << 8)
    return _iq1_values(ids, (nb, 8, 4, 8), delta, dl)


def _iq1m_d(blocks: torch.Tensor) -> torch.Tensor:
    """IQ1_M's f16 scale, stored as the top nibbles of its four u16 scale words (lowest first): f32 [n, 1]."""
    top = blocks[:, 49:56:2]  # the high byte of each word
    lo = (top[:, 0] >> 4) | (top[:, 1] & 0xF0)
    hi = (top[:, 2] >> 4) | (top[:, 3] & 0xF0)
    return torch.stack([lo, hi], dim=1).view(torch.float16).float()


def _deq_iq1_m(blocks: torch.Tensor) -> torch.Tensor:
    # 16 sub-blocks of 16 with 3-bit scales; each nibble of qh holds 3 high grid-id bits and the shift's
    # sign for 8 values: w = (d * (2 * s + 1)) * (grid + delta)
    nb = blocks.shape[0]
    sc = _fields(_u16(blocks, 48, 56), (0, 3, 6, 9), 7).reshape(nb, 16)
    dl = (_iq1m_d(blocks) * (2 * sc + 1).float()).reshape(nb, 8, 2, 1, 1)
    qh = _bits(blocks[:, 32:48], 4, dim=2).reshape(nb, 32)
    delta = _iq1_delta((qh & 0x08) != 0).reshape(nb, 8, 2, 2, 1)
    ids = blocks[:, 0:32].to(torch.int32) | ((qh & 7).to(torch.int32) << 8)
    return _iq1_values(ids, (nb, 8, 2, 2, 8), delta, dl)


def _e8m0_half(e: torch.Tensor) -> torch.Tensor:
    """E8M0 exponent bytes -> f32 2^(e - 128), half the scale (the kvalues are doubled E2M1); e < 2 gives the
    f32 subnormals, as ggml_e8m0_to_fp32_half."""
    e = e.to(torch.int32)
    subnormal = 0x00200000 << e.clamp(max=1)  # clamped: no shift past the word where e >= 2 (not taken)
    return torch.where(e < 2, subnormal, (e - 1) << 23).view(torch.float32)


def _deq_mxfp4(blocks: torch.Tensor) -> torch.Tensor:
    # w = e8m0_half(e) * kvalues[q], the codes in Q4_0's nibble order
    return _scale_sub(_kvalues("MXFP4")[_nibbles(blocks[:, 1:17]).long()], _e8m0_half(blocks[:, 0:1]))


_DEQUANT: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    F32: _deq_f32,
    F16: _deq_f16,
    BF16: _deq_bf16,
    Q4_0: _deq_q4_0,
    Q4_1: _deq_q4_1,
    Q5_0: _deq_q5_0,
    Q5_1: _deq_q5_1,
    Q8_0: _deq_q8_0,
    Q2_K: _deq_q2_k,
    Q3_K: _deq_q3_k,
    Q4_K: _deq_q4_k,
    Q5_K: _deq_q5_k,
    Q6_K: _deq_q6_k,
    IQ2_XXS: _deq_iq2_xxs,
    IQ2_XS: _deq_iq2_xs,
    IQ2_S: _deq_iq2_s,
    IQ3_XXS: _deq_iq3_xxs,
    IQ3_S: _deq_iq3_s,
    IQ1_S: _deq_iq1_s,
    IQ1_M: _deq_iq1_m,
    IQ4_NL: _deq_iq4_nl,
    IQ4_XS: _deq_iq4_xs,
    MXFP4: _deq_mxfp4,
}

SUPPORTED_TYPES = frozenset(_DEQUANT)


def is_supported(ggml_type: int) -> bool:
    return ggml_type in _DEQUANT


# --------------------------------------------------------------------------------------------
# public API


def _rows_view(raw: torch.Tensor, ggml_type: int, shape: tuple[int, ...]) -> tuple[torch.Tensor, int, int]:
    """raw bytes -> ([rows, row_bytes] uint8 view, rows, k)."""
    if ggml_type not in _DEQUANT:
        name = GGML_TYPES.get(ggml_type, (f"type{ggml_type}",))[0]
        raise NotImplementedError(f"dequantization of GGML type {name} is not supported")
    shape = tuple(int(s) for s in shape)
    k = shape[-1] if shape else 1
    rows = 1
    for s in shape[:-1]:
        rows *= s
    rb = row_bytes(ggml_type, k)
    raw = _as_raw(raw)
    if raw.numel() != rows * rb:
        raise ValueError(f"{raw.numel()} bytes do not hold a {GGML_TYPES[ggml_type][0]} tensor of shape {shape} "
                         f"({rows * rb} bytes expected)")
    return raw.view(rows, rb), rows, k


def dequantize(raw: torch.Tensor, ggml_type: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32,
               *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Dequantize raw GGUF bytes to a new tensor of ``shape`` (torch order) and ``dtype``.

    The f32 result equals ``gguf.quants.dequantize`` bit for bit. ``out`` (optional) is a
    contiguous tensor with ``rows * k`` elements to write into instead (any float dtype); it is
    returned reshaped to ``shape``."""
    raw2, rows, k = _rows_view(raw, ggml_type, shape)
    _, block, block_bytes = GGML_TYPES[ggml_type]
    fn = _DEQUANT[ggml_type]
    if out is None:
        out = torch.empty(rows, k, dtype=dtype)
    else:
        if out.numel() != rows * k or not out.is_contiguous():
            raise ValueError("out must be a contiguous tensor with as many elements as the result")
        out = out.view(rows, k)
    chunk = max(1, CHUNK_ELEMS // max(k, 1))
    for r0 in range(0, rows, chunk):
        r1 = min(rows, r0 + chunk)
        blocks = raw2[r0:r1].reshape(-1, block_bytes)
        out[r0:r1].copy_(fn(blocks).view(r1 - r0, k))
    return out.view(shape)


def dequantize_rows(raw: torch.Tensor, ggml_type: int, shape: tuple[int, ...], rows: torch.Tensor,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantize only the given rows of a 2-D tensor: [len(rows), K]. For embedding lookups.

    Where the native kernels are built and take the type, one native call does it (the same bits:
    ``engine/ops/kernels/gguf_rows.cpp``); the torch dequantizers cost ~100 small ops a call."""
    raw2, n_rows, k = _rows_view(raw, ggml_type, shape)
    rows = torch.as_tensor(rows, dtype=torch.long).reshape(-1)
    if ggml_type in _native_row_types() and raw2.device.type == "cpu":
        from engine.ops.kernels import load_block_ops

        try:
            out = load_block_ops().dequantize_gguf_rows(raw2, ggml_type, k, rows)
        except RuntimeError as e:  # its one refusal that reaches here: an index out of range
            raise IndexError(str(e).splitlines()[0]) from None
        return out if dtype == torch.float32 else out.to(dtype)
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= n_rows):
        raise IndexError(f"row index out of range for a tensor with {n_rows} rows")
    sel = raw2.index_select(0, rows)
    return dequantize(sel, ggml_type, (rows.numel(), k), dtype)


@functools.lru_cache(maxsize=None)
def _native_row_types() -> frozenset[int]:
    """The GGML types the native row dequantizer takes (none where the kernels are not built)."""
    from engine.ops.kernels import load_block_ops

    ops = load_block_ops()
    return frozenset(int(t) for t in ops.gguf_rows_types()) if ops is not None else frozenset()


def load_tensor(f: GGUFFile, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A whole tensor of ``f``, dequantized into a new (writable) tensor of ``dtype``."""
    info = f.tensors[name]
    return dequantize(raw_tensor(f, name), info.ggml_type, info.shape, dtype)


# --------------------------------------------------------------------------------------------
# exact int4 mapping


def q4_to_int4_groups(raw: torch.Tensor, ggml_type: int, shape: tuple[int, int]
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split a Q4_0/Q4_1/Q4_K tensor [N, K] into torch's int4 group-32 form, without loss.

    Returns ``(q, scales, zeros)``: q uint8 [N, K] in 0..15, scales and zeros f32 [K // 32, N],
    such that ``w[n, k] = (q[n, k] - 8) * scales[k // 32, n] + zeros[k // 32, n]`` — the
    convention of ``torch._weight_int4pack_mm_for_cpu``.

    * Q4_0: w = (q - 8)·d                  -> scale = d,    zero = 0 (bit-exact)
    * Q4_1: w = q·d + m                    -> scale = d,    zero = 8·d + m
    * Q4_K: w = (d·sc)·q − dmin·m per 32    -> scale = d·sc, zero = 8·d·sc − dmin·m
    For Q4_1/Q4_K the re-association can move a value by about one f32 ulp of the group's largest
    weight (the zero is rounded once to f32); in exact arithmetic the two forms are equal.
    """
    raw2, n, k = _rows_view(raw, ggml_type, shape)
    if len(shape) != 2:
        raise ValueError("q4_to_int4_groups needs a 2-D tensor")
    g = k // 32
    q = torch.empty(n, k, dtype=torch.uint8)
    scales = torch.empty(n, g, dtype=torch.float32)
    zeros = torch.empty(n, g, dtype=torch.float32)
    _, _, block_bytes = GGML_TYPES[ggml_type]
    chunk = max(1, CHUNK_ELEMS // k)
    for r0 in range(0, n, chunk):
        r1 = min(n, r0 + chunk)
        blocks = raw2[r0:r1].reshape(-1, block_bytes)
        if ggml_type == Q4_0:
            qq = _nibbles(blocks[:, 2:18])
            s = _f16(blocks, 0, 2)
            z = torch.zeros_like(s)
        elif ggml_type == Q4_1:
            qq = _nibbles(blocks[:, 4:20])
            s = _f16(blocks, 0, 2)
            z = 8.0 * s + _f16(blocks, 2, 4)
        elif ggml_type == Q4_K:
            qq = _q4k_codes(blocks)
            dsc, dm = _q4k_scales(blocks)
            s = dsc
            z = 8.0 * dsc - dm
        else:
            raise ValueError(f"{GGML_TYPES[ggml_type][0]} has no exact int4 mapping (only Q4_0, Q4_1, Q4_K)")
        q[r0:r1] = qq.reshape(r1 - r0, k)
        scales[r0:r1] = s.reshape(r1 - r0, g)
        zeros[r0:r1] = z.reshape(r1 - r0, g)
    return q, scales.t().contiguous(), zeros.t().contiguous()


# --------------------------------------------------------------------------------------------
# integer codes for the qdot kernel (engine/kernels/qdot.cpp)


@dataclass(frozen=True)
class IntegerCodes:
    """A tensor [N, K] as unsigned integer codes with one scale (and zero) per group along K.

    ``w[n, k] = scales[n, g] * codes[n, k] + zeros[n, g]`` when ``zeros`` is given, else
    ``scales[n, g] * (codes[n, k] - offset)``, with ``g = k // group``. ``bits`` is 4, 5, 6 or 8:
    the codes are below ``2 ** bits``."""

    codes: torch.Tensor  # uint8 [N, K]
    bits: int
    group: int
    scales: torch.Tensor  # f32 [N, K // group]
    zeros: torch.Tensor | None  # f32 [N, K // group]
    offset: int
    # K-quants' own two-level factors (None for other types): scales = supers[..., 0] * scale_codes and
    # zeros = supers[..., 1] * zero_codes, per super-block of 256 values (what ggml stores; the qdot
    # kernel reads these rather than f16 products, so that it reads the file's bytes per weight).
    scale_codes: torch.Tensor | None = None  # int16 [N, K // group]: Q6_K int8, Q4_K/Q5_K 6-bit
    zero_codes: torch.Tensor | None = None  # int16 [N, K // group]: Q4_K/Q5_K 6-bit mins
    supers: torch.Tensor | None = None  # f32 [N, K // 256, S]: d (S = 1) and -dmin (S = 2)

    def dequantize(self) -> torch.Tensor:
        """f32 weights from the codes (the tests' check of the mapping)."""
        n, k = self.codes.shape
        q = self.codes.float().view(n, k // self.group, self.group)
        if self.zeros is None:
            w = (q - self.offset) * self.scales[..., None]
        else:
            w = q * self.scales[..., None] + self.zeros[..., None]
        return w.reshape(n, k)


# type -> (bits, group, offset or None when the type has per-group zeros)
INTEGER_CODE_LAYOUTS: dict[int, tuple[int, int, int | None]] = {
    Q4_0: (4, 32, 8), Q4_1: (4, 32, None), Q4_K: (4, 32, None),
    Q5_0: (5, 32, 16), Q5_1: (5, 32, None), Q5_K: (5, 32, None),
    Q6_K: (6, 16, 32), Q8_0: (8, 32, 128),
    # IQ4_NL's values d * kvalues[q] are d * (code - 128) with code = kvalue + 128 (kvalues lie in -127..113)
    IQ4_NL: (8, 32, 128),
    # IQ4_XS the same per 32 values, its scale d * (sc - 32) held as an f16 like every group scale here: one
    # rounding of at most 2^-11 relative per group (the product needs up to 17 significant bits). Requantizing
    # the values to Q8_0's rule instead rounded every weight to 1/254 of its group's largest: on SmolLM2's
    # blk.3.ffn_down requantized by llama.cpp to IQ4_XS, a relative error of 9.4e-4 against 1.8e-4 this way
    IQ4_XS: (8, 32, 128),
}


# K-quants whose group scales are small codes times per-super-block factors (256 values): type -> S,
# the factors per super-block (d; or d and -dmin).
SUPER_BLOCK = 256
TWO_LEVEL_TYPES: dict[int, int] = {Q4_K: 2, Q5_K: 2, Q6_K: 1}


# Every other type is requantized to Q8_0's rule (requantize_q8): this layout.
REQUANTIZED_LAYOUT = (8, 32, 128)


def code_layout(ggml_type: int) -> tuple[int, int, int | None]:
    """(bits, group, offset) the qdot format holds a tensor of this type in."""
    return INTEGER_CODE_LAYOUTS.get(ggml_type, REQUANTIZED_LAYOUT)


def _two_level_blocks(blocks: torch.Tensor, ggml_type: int):
    """One chunk of K-quant blocks -> (scale codes [nb, groups], zero codes [nb, groups] | None,
    supers [nb, S])."""
    if ggml_type == Q6_K:
        return blocks[:, 192:208].contiguous().view(torch.int8).to(torch.int16), None, _f16(blocks, 208, 210)
    d, dmin, sc, mn = _q4k_factors(blocks)
    return sc.to(torch.int16), mn.to(torch.int16), torch.cat([d, -dmin], dim=1)


def _integer_blocks(blocks: torch.Tensor, ggml_type: int):
    """One chunk of blocks -> (codes [nb, block], scales [nb, groups], zeros [nb, groups] | None)."""
    nb = blocks.shape[0]
    if ggml_type == Q4_0:
        return _nibbles(blocks[:, 2:18]), _f16(blocks, 0, 2), None
    if ggml_type == Q4_1:
        return _nibbles(blocks[:, 4:20]), _f16(blocks, 0, 2), _f16(blocks, 2, 4)
    if ggml_type == Q4_K:
        dsc, dm = _q4k_scales(blocks)
        return _q4k_codes(blocks).reshape(nb, QK_K), dsc.reshape(nb, 8), -dm.reshape(nb, 8)
    if ggml_type == Q5_0:
        return _q5_0_codes(blocks), _f16(blocks, 0, 2), None
    if ggml_type == Q5_1:
        return _q5_1_codes(blocks), _f16(blocks, 0, 2), _f16(blocks, 2, 4)
    if ggml_type == Q5_K:
        dsc, dm = _q4k_scales(blocks)
        return _q5k_codes(blocks).reshape(nb, QK_K), dsc.reshape(nb, 8), -dm.reshape(nb, 8)
    if ggml_type == Q6_K:
        return _q6k_codes(blocks).reshape(nb, QK_K), _q6k_scales(blocks), None
    if ggml_type == Q8_0:
        q = (blocks[:, 2:34].contiguous().view(torch.int8).to(torch.int16) + 128).to(torch.uint8)
        return q, _f16(blocks, 0, 2), None
    if ggml_type == IQ4_NL:
        kv = _kvalues("IQ4_NL")[_nibbles(blocks[:, 2:18]).long()]
        return (kv + 128).to(torch.uint8), _f16(blocks, 0, 2), None
    if ggml_type == IQ4_XS:
        q = _bits(blocks[:, 8:136].reshape(nb, 8, 16), 4, dim=2).reshape(nb, QK_K)
        return (_kvalues("IQ4_NL")[q.long()] + 128).to(torch.uint8), _f16(blocks, 0, 2) * _iq4xs_scales(blocks).float(), None
    raise ValueError(f"{GGML_TYPES[ggml_type][0]} has no integer-code layout")


def integer_codes(raw: torch.Tensor, ggml_type: int, shape: tuple[int, int]) -> IntegerCodes:
    """The codes and group scales of a quantized tensor [N, K], without loss.

    Q4_0/Q4_1/Q4_K keep their 4-bit codes, Q5_0/Q5_1/Q5_K their 5-bit ones and Q8_0 its 8-bit ones
    (signed codes shifted by 128), all in groups of 32; Q6_K its 6-bit codes in groups of 16; IQ4_NL and
    IQ4_XS become 8-bit codes (their non-linear values shifted by 128) with their own scales (IQ4_XS's the
    product of its super-block d and sub-block scale, as ggml computes it).
    Scales and zeros are the f32 products ggml computes (d·sc, −dmin·m)."""
    if ggml_type not in INTEGER_CODE_LAYOUTS:
        raise ValueError(f"{GGML_TYPES.get(ggml_type, (ggml_type,))[0]} has no integer-code layout")
    bits, group, offset = INTEGER_CODE_LAYOUTS[ggml_type]
    raw2, n, k = _rows_view(raw, ggml_type, shape)
    if len(shape) != 2:
        raise ValueError("integer_codes needs a 2-D tensor")
    g = k // group
    codes = torch.empty(n, k, dtype=torch.uint8)
    scales = torch.empty(n, g, dtype=torch.float32)
    zeros = None if offset is not None else torch.empty(n, g, dtype=torch.float32)
    _, _, block_bytes = GGML_TYPES[ggml_type]
    two_level = TWO_LEVEL_TYPES.get(ggml_type)
    if two_level:
        scale_codes = torch.empty(n, g, dtype=torch.int16)
        zero_codes = torch.empty(n, g, dtype=torch.int16) if zeros is not None else None
        supers = torch.empty(n, k // SUPER_BLOCK, two_level, dtype=torch.float32)
    chunk = max(1, CHUNK_ELEMS // k)
    for r0 in range(0, n, chunk):
        r1 = min(n, r0 + chunk)
        blocks = raw2[r0:r1].reshape(-1, block_bytes)
        q, s, z = _integer_blocks(blocks, ggml_type)
        codes[r0:r1] = q.reshape(r1 - r0, k)
        scales[r0:r1] = s.reshape(r1 - r0, g)
        if zeros is not None:
            zeros[r0:r1] = z.reshape(r1 - r0, g)
        if two_level:
            sc, zc, sup = _two_level_blocks(blocks, ggml_type)
            scale_codes[r0:r1] = sc.reshape(r1 - r0, g)
            if zero_codes is not None:
                zero_codes[r0:r1] = zc.reshape(r1 - r0, g)
            supers[r0:r1] = sup.reshape(r1 - r0, k // SUPER_BLOCK, two_level)
    if not two_level:
        return IntegerCodes(codes, bits, group, scales, zeros, offset or 0)
    return IntegerCodes(codes, bits, group, scales, zeros, offset or 0, scale_codes, zero_codes, supers)


def requantize_q4(w: torch.Tensor) -> IntegerCodes:
    """4-bit codes per 32 values by Q4_0's rule (ggml's: d = the block's value of largest magnitude / -8, codes
    round(x / d) + 8 clamped to 0..15, d rounded to f16 first), for a lossy copy read only as a screen
    (engine.models.pruned_head): half the bytes of Q8_0, a code error of up to d / 2 a weight."""
    n, k = w.shape
    g = w.reshape(n, k // 32, 32)
    signed_max = torch.gather(g, -1, g.abs().argmax(dim=-1, keepdim=True)).squeeze(-1)
    d = (signed_max / -8.0).to(torch.float16).float()
    inverse = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = (g * inverse[..., None] + 8.5).floor_().clamp_(0, 15).to(torch.uint8)
    return IntegerCodes(q.reshape(n, k), 4, 32, d, None, 8)


def requantize_q8(w: torch.Tensor) -> IntegerCodes:
    """Symmetric 8-bit codes per 32 values (Q8_0's rule) for weights that have no exact layout."""
    n, k = w.shape
    g = w.reshape(n, k // 32, 32)
    d = (g.abs().amax(dim=-1) / 127.0).to(torch.float16).float()
    safe = torch.where(d > 0, d, torch.ones_like(d))
    q = (g / safe[..., None]).round_().clamp_(-127, 127).add_(128).to(torch.uint8)
    bits, group, offset = REQUANTIZED_LAYOUT
    return IntegerCodes(q.reshape(n, k), bits, group, d, None, offset)
