"""Linear-layer weight formats built straight from GGUF tensors, behind one small interface.

    lin = load_linear(f, [q_name, k_name, v_name], "auto-int4", bias_names=[q_bias, k_bias, v_bias])
    y = lin(x)          # x [..., K] in lin.compute_dtype -> y [..., N] in the same dtype

(the tensor names come from ``engine.models.loader``, the one place that knows them).

Formats (``fmt``); the kernels' measured costs are in docs/cpu-engine-measurements.md and
docs/measurements.md ("Weight formats"):

* ``f32``          dequantized f32 weights, ``F.linear`` (MKL). The test reference; 4 bytes/weight.
* ``bf16``         bf16 weights, ``F.linear`` (oneDNN AMX). 2 bytes/weight.
* ``bf16-packed``  bf16 weights reordered once into oneDNN's blocked layout
                   (``mkldnn._reorder_linear_weight`` + ``mkldnn._linear_pointwise``). 2 bytes/weight;
                   the cost is flat from 1 to 16 activation rows, which makes speculative verification cheap.
* ``int8``         per-output-channel symmetric int8 (``torch._weight_int8pack_mm``), bf16 activations.
                   Lossy requantization of any source (~0.4 % relative error per weight).
* ``int4``         group-32 asymmetric int4 (``torch._weight_int4pack_mm_for_cpu``), bf16 activations.
                   *Exact* for Q4_K/Q4_0/Q4_1 sources (same 4-bit codes, scale/zero per 32 weights,
                   see :func:`engine.ops.dequant.q4_to_int4_groups`); other sources are requantized
                   with per-group min/max (lossy: Q6_K/Q5_x/Q8_0 lose real precision).
* ``auto-int4``    ``int4`` for tensors stored as Q4_K/Q4_0/Q4_1, ``int8`` for everything else. This keeps
                   a Q4_K_M model (Q4_K + Q6_K) as close to the file as the kernels allow: the Q4_K
                   tensors are reproduced exactly (up to bf16 scales) and Q6_K ones get 8 bits.
* ``qdot``         every Q4_0/Q4_1/Q4_K/Q5_0/Q5_1/Q5_K/Q6_K/Q8_0 tensor keeps its own integer codes (4, 5,
                   6 or 8 bits, f16 group scales; IQ4_NL's and IQ4_XS's non-linear values as 8-bit codes) and is
                   multiplied by tandem's native kernel
                   (``engine/ops/kernels/qdot.cpp``, AVX512-VNNI or AVX2) against activations rounded to int8 per 32
                   values (per 256 for K-quants), as llama.cpp does; other sources are requantized to 8 bits per 32 (Q8_0's
                   rule). f32 activations. Only where the kernel builds (:func:`engine.ops.kernels.qdot_status`).

Fused loading: ``names`` may list several tensors that are concatenated along the output dim
(fused qkv, fused gate/up). Under ``auto-int4`` the parts can map to different kernels (Q4_K_M
stores attn_v/ffn_down as Q6_K in some layers): consecutive parts with the same kernel are fused,
and if more than one group remains the result is a :class:`SplitLinear` that runs the groups and
concatenates their outputs along the last dim — exact semantics, at the price of one small concat.
Under ``int4`` every part goes to int4 (exact or requantized), so the whole thing stays fused.

Biases are stored in the compute dtype. They are fused into the kernel where it takes one
(``F.linear``, oneDNN) and otherwise added to the output in the compute dtype.

Activations for the bf16/int formats must be bf16 (the int kernels are many times slower with f32
activations); ``forward`` casts other dtypes to the compute dtype and back, as a safety net only.

CUDA: the int4/int8 CPU kernels have no CUDA equivalent with the same packing (CUDA's
``_weight_int4pack_mm`` uses a different tile layout that has not been validated on a device here),
and oneDNN prepacking is CPU only. With ``device='cuda'`` every bf16/int format therefore falls back
to dense bf16 ``F.linear`` (cuBLAS); ``f32`` stays f32.

Modules hold no mutable state after construction, so one ``Linear`` can be called from several
threads at once.
"""

from __future__ import annotations

import functools
import hashlib

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence, get_args

import torch
import torch.nn.functional as F

from engine.contract.gguf import GGML_TYPES, GGUFFile
from engine.ops import dequant as dq
from engine.contract.options import WeightFormat
from engine.ops.kernels import load_qdot, qdot_fast, qdot_status

FORMATS = tuple(f for f in get_args(WeightFormat) if f != "auto")  # what a request may name, less "auto"
INT4_GROUP = 32
# Rows per conversion window for the int4/int8 builders: a multiple of 64 (the CPU int4 packing
# works in independent blocks of 64 output rows) sized to keep temporaries at a few MB.
_WINDOW_ELEMS = 1 << 21


# ============================================================================================
# modules


class Linear(torch.nn.Module):
    """y = x @ W.T (+ b) with W [out_features, in_features] in some storage format."""

    format: str = "?"

    def __init__(self, in_features: int, out_features: int, compute_dtype: torch.dtype):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.compute_dtype = compute_dtype

    def _matmul(self, x2: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N], both compute dtype
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        if in_dtype != self.compute_dtype:
            x = x.to(self.compute_dtype)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x2.shape[0] == 0:
            y = x2.new_empty((0, self.out_features))
        else:
            y = self._matmul(x2 if x2.is_contiguous() else x2.contiguous())
        y = y.view(*lead, self.out_features)
        return y if in_dtype == self.compute_dtype else y.to(in_dtype)

    def weight_nbytes(self) -> int:
        """Bytes held by this module's weight storage (for reports and memory tests)."""
        total = 0
        for t in self._storage_tensors():
            total += _nbytes(t)
        return total

    def _storage_tensors(self) -> list[torch.Tensor]:
        return [b for b in self.buffers()]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.format}"


def _nbytes(t: torch.Tensor) -> int:
    if t.is_mkldnn:
        return t.numel() * t.element_size()
    return t.untyped_storage().nbytes()


class DenseLinear(Linear):
    """Plain ``F.linear`` over a dense f32 or bf16 weight (any device)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__(weight.shape[1], weight.shape[0], weight.dtype)
        self.format = "f32" if weight.dtype == torch.float32 else "bf16"
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)

    def _matmul(self, x2: torch.Tensor) -> torch.Tensor:
        return F.linear(x2, self.weight, self.bias)


class PackedBF16Linear(Linear):
    """bf16 weight prepacked once into oneDNN's blocked (AMX) layout."""

    format = "bf16-packed"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__(weight.shape[1], weight.shape[0], torch.bfloat16)
        # An opaque mkldnn tensor: kept as a plain attribute so that Module.to()/state_dict() do not
        # try to treat it as a strided tensor.
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16).contiguous())
        self.register_buffer("bias", bias)

    def _matmul(self, x2: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x2, self.packed_weight, self.bias, "none", [], "")

    def _storage_tensors(self) -> list[torch.Tensor]:
        return [self.packed_weight, *self.buffers()]


class Int8Linear(Linear):
    """Per-output-channel symmetric int8 weight-only quantization (bf16 activations)."""

    format = "int8"

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
        super().__init__(qweight.shape[1], qweight.shape[0], torch.bfloat16)
        self.register_buffer("qweight", qweight)  # int8 [N, K]
        self.register_buffer("scales", scales)  # bf16 [N]
        self.register_buffer("bias", bias)

    def _matmul(self, x2: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int8pack_mm(x2, self.qweight, self.scales)
        return y if self.bias is None else y.add_(self.bias)


class Int4Linear(Linear):
    """Group-32 asymmetric int4 weight-only (``_weight_int4pack_mm_for_cpu``, bf16 activations).

    ``packed`` is uint8 [N_pad, K/2] from ``_convert_weight_to_int4pack_for_cpu``; ``scale_zeros`` is
    bf16 [K/32, N_pad, 2]; w = (q - 8) * scale + zero. N_pad rounds N up to the kernel's multiple
    of 16 (the padding rows are zero weights and are sliced off)."""

    format = "int4"

    def __init__(self, packed: torch.Tensor, scale_zeros: torch.Tensor, out_features: int, bias: torch.Tensor | None):
        super().__init__(packed.shape[1] * 2, out_features, torch.bfloat16)
        self.register_buffer("packed", packed)
        self.register_buffer("scale_zeros", scale_zeros)
        self.register_buffer("bias", bias)

    def _matmul(self, x2: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int4pack_mm_for_cpu(x2, self.packed, INT4_GROUP, self.scale_zeros)
        if y.shape[1] != self.out_features:
            y = y[:, : self.out_features].contiguous()
        return y if self.bias is None else y.add_(self.bias)


class QDotLinear(Linear):
    """GGUF integer codes dotted against int8-quantized activations (``engine/kernels/qdot.cpp``).

    ``codes`` uint8 [ceil(N/16), 2 K bits] in the kernel's layout (:func:`pack_codes`; bits 4, 5, 6
    or 8); ``scales``/``zeros`` [ceil(N/16), K/group, 16] (:func:`pack_group_values`): f16 values,
    or for K-quants their 8-bit codes (int8 Q6_K scales, uint8 Q4_K/Q5_K scales and mins) with
    ``supers`` f16 [ceil(N/16), K/256, S, 16] (:func:`pack_supers`; empty otherwise) holding each
    super-block's d (and -dmin); ``zeros`` is empty when every group uses ``w = scale * (code - offset)``.
    Activations and output are f32: the kernel quantizes each row to int8 itself, per 32 values (per 256
    against K-quants' 8-bit scale codes)."""

    format = "qdot"

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int, group: int,
                 offset: int, out_features: int, bias: torch.Tensor | None, supers: torch.Tensor | None = None):
        super().__init__(codes.shape[1] // (2 * bits), out_features, torch.float32)
        self.bits, self.group, self.offset = bits, group, offset
        self._op = load_qdot()
        if self._op is None:
            raise RuntimeError(f"the qdot kernel is not available: {qdot_status().detail}")
        self.register_buffer("codes", codes)
        self.register_buffer("scales", scales)
        self.register_buffer("zeros", zeros)
        self.register_buffer("supers", torch.empty(0, dtype=torch.float16) if supers is None else supers)
        self.register_buffer("bias", None if bias is None else bias.float())

    def _matmul(self, x2: torch.Tensor) -> torch.Tensor:
        return self._op(x2, self.codes, self.scales, self.zeros, self.supers, self.bits, self.group, self.offset,
                        self.out_features, self.bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", bits={self.bits}, group={self.group}"


QDOT_BLOCK_ROWS = 16  # the qdot kernel's weight rows per block (one per 32-bit register lane)


def _pack_high(high: torch.Tensor, bits: int) -> torch.Tensor:
    """Bits 4-5 of a step's two 64-byte slots [..., 2, 64] as the kernel's planes [..., 16 * (bits - 4)]:
    5 bits -> 16 bytes for both slots (bit 4 s + l of byte b = slot s's byte 16 l + b), 6 bits -> 16 bytes
    a slot (byte i = bytes i, 16 + i, 32 + i, 48 + i in bit pairs 0-1 ... 6-7)."""
    lead = high.shape[:-2]
    if bits == 5:
        b = (high & 1).reshape(*lead, 8, 16).transpose(-1, -2).to(torch.int32)  # [..., byte b, bit 4 s + l]
        return (b << torch.arange(8, dtype=torch.int32)).sum(-1).to(torch.uint8)
    b = (high & 3).reshape(*lead, 2, 4, 16).to(torch.int32)
    return (b << (2 * torch.arange(4, dtype=torch.int32))[:, None]).sum(-2).to(torch.uint8).reshape(*lead, 32)


def _blocks_of_rows(t: torch.Tensor) -> torch.Tensor:
    """[N, X] -> [ceil(N / 16), 16, X], padding rows with zeros."""
    n = t.shape[0]
    pad = -n % QDOT_BLOCK_ROWS
    if pad:
        t = torch.cat([t, t.new_zeros(pad, *t.shape[1:])])
    return t.reshape(-1, QDOT_BLOCK_ROWS, *t.shape[1:])


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes uint8 [N, K] (below 2**bits) -> the qdot kernel's layout [ceil(N/16), 2 K bits].

    Rows go in blocks of 16; for each 8 values k0..k0+7 of a block, two 64-byte slots (values
    k0..k0+3, then k0+4..k0+7; byte 4 r + j = row r's value j). 8 bits: the slots as they are; 4/5/6
    bits: 64 bytes of nibbles (low = first slot, high = second), then the slots' high-bit planes
    (:func:`_pack_high`). Padding rows get code 0."""
    n, k = codes.shape
    blocks = _blocks_of_rows(codes)  # [B, 16, K]
    nb = blocks.shape[0]
    slots = blocks.reshape(nb, QDOT_BLOCK_ROWS, k // 8, 2, 4).permute(0, 2, 3, 1, 4).reshape(nb, k // 8, 2, 64)
    if bits == 8:
        return slots.reshape(nb, 2 * k * bits).contiguous()
    parts = [(slots[:, :, 0] & 0x0F) | ((slots[:, :, 1] & 0x0F) << 4)]
    if bits > 4:
        parts.append(_pack_high(slots >> 4, bits))
    return torch.cat(parts, dim=-1).reshape(nb, 2 * k * bits).contiguous()


def pack_group_values(values: torch.Tensor) -> torch.Tensor:
    """Per-group scales or zeros [N, K/G] -> the kernel's [ceil(N/16), K/G, 16] (padding rows 0)."""
    return _blocks_of_rows(values).transpose(1, 2).contiguous()


def pack_supers(supers: torch.Tensor) -> torch.Tensor:
    """Super-block factors [N, K/256, S] -> the kernel's f16 [ceil(N/16), K/256, S, 16] (padding rows 0)."""
    return _blocks_of_rows(supers.to(torch.float16)).permute(0, 2, 3, 1).contiguous()


class SplitLinear(Linear):
    """Several linears over the same input whose outputs are concatenated (mixed-format fusions)."""

    format = "split"

    def __init__(self, parts: Sequence[Linear]):
        super().__init__(parts[0].in_features, sum(p.out_features for p in parts), parts[0].compute_dtype)
        self.parts = torch.nn.ModuleList(parts)

    def _matmul(self, x2: torch.Tensor) -> torch.Tensor:
        return torch.cat([p._matmul(x2) for p in self.parts], dim=-1)

    def _storage_tensors(self) -> list[torch.Tensor]:
        return [t for p in self.parts for t in p._storage_tensors()]

    def extra_repr(self) -> str:
        return super().extra_repr() + " [" + ", ".join(p.format for p in self.parts) + "]"


# ============================================================================================
# sources


@dataclass(frozen=True)
class _Source:
    """One GGUF tensor as rows of raw bytes (mmap view)."""

    name: str
    raw: torch.Tensor  # uint8 [n, row_bytes]
    ggml_type: int
    n: int
    k: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]

    def dequant_rows(self, a: int, b: int, dtype: torch.dtype = torch.float32,
                     out: torch.Tensor | None = None) -> torch.Tensor:
        return dq.dequantize(self.raw[a:b], self.ggml_type, (b - a, self.k), dtype, out=out)


def _source(f: GGUFFile, name: str, rows: tuple[int, int] | None = None) -> _Source:
    """A 2-D tensor as rows; with ``rows`` = (a, b), rows [a, b) of a tensor of any rank >= 2 viewed as
    [prod(leading dims), last dim] (how a stacked 3-D expert tensor yields one expert's matrix: the rows
    of an expert are contiguous, and quantization blocks never cross a row)."""
    if name not in f.tensors:
        raise KeyError(f"{f.path}: no tensor {name!r}")
    info = f.tensors[name]
    if len(info.shape) != 2 and (rows is None or len(info.shape) < 2):
        raise ValueError(f"{name}: a linear weight must be 2-D, got shape {info.shape}")
    if not dq.is_supported(info.ggml_type):
        raise NotImplementedError(f"{name}: GGML type {info.type_name} is not supported")
    k = info.shape[-1]
    n = 1
    for d in info.shape[:-1]:
        n *= d
    raw = dq.raw_tensor(f, name).view(n, dq.row_bytes(info.ggml_type, k))
    if rows is not None:
        a, b = rows
        if not 0 <= a < b <= n:
            raise ValueError(f"{name}: rows [{a}, {b}) out of range for {n} rows")
        raw, n = raw[a:b], b - a
    return _Source(name, raw, info.ggml_type, n, k)


@dataclass(frozen=True)
class _Screen:
    """A source's rows as 4-bit codes by Q4_0's rule (``dq.requantize_q4``), built as they are packed: a lossy
    copy at half Q8_0's bytes, for scores that only pick out the rows worth scoring exactly
    (engine.models.pruned_head). Packed as a Q4_0 tensor would be."""

    source: _Source
    ggml_type: int = dq.Q4_0

    @property
    def name(self) -> str:
        return f"{self.source.name} (4-bit screen)"

    @property
    def n(self) -> int:
        return self.source.n

    @property
    def k(self) -> int:
        return self.source.k


def _windows(srcs: Sequence[_Source], r0: int, r1: int):
    """(source, local start, local end) pieces covering fused output rows [r0, r1)."""
    off = 0
    for s in srcs:
        a, b = max(r0, off), min(r1, off + s.n)
        if a < b:
            yield s, a - off, b - off
        off += s.n


def _window_rows(k: int, align: int = 64) -> int:
    return max(align, _WINDOW_ELEMS // k // align * align)


# ============================================================================================
# builders (all work window by window: no full-size f32 copy of a tensor is ever made)


def _dense_weight(srcs: Sequence[_Source], dtype: torch.dtype) -> torch.Tensor:
    k = srcs[0].k
    w = torch.empty(sum(s.n for s in srcs), k, dtype=dtype)
    off = 0
    for s in srcs:
        s.dequant_rows(0, s.n, dtype, out=w[off:off + s.n])
        off += s.n
    return w


def _int8_weight(srcs: Sequence[_Source]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8: scale = bf16(max|w| / 127), q = round(w / scale)."""
    k = srcs[0].k
    n = sum(s.n for s in srcs)
    q = torch.empty(n, k, dtype=torch.int8)
    scales = torch.empty(n, dtype=torch.bfloat16)
    step = _window_rows(k, 1)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        w = torch.cat([s.dequant_rows(a, b) for s, a, b in _windows(srcs, r0, r1)])
        sc = (w.abs().amax(dim=1) / 127.0).to(torch.bfloat16)
        scf = sc.float()
        scf = torch.where(scf > 0, scf, torch.ones_like(scf))
        q[r0:r1] = w.div_(scf[:, None]).round_().clamp_(-128, 127).to(torch.int8)
        scales[r0:r1] = sc
    return q, scales


def _int4_rows(s: _Source, a: int, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows [a, b) of a source as int4 codes/scales/zeros ([b-a, K] uint8, [K/32, b-a] f32 x2)."""
    if s.ggml_type in dq.INT4_EXACT_TYPES:
        return dq.q4_to_int4_groups(s.raw[a:b], s.ggml_type, (b - a, s.k))
    return requantize_int4(s.dequant_rows(a, b))


def requantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lossy min/max group-32 int4 of an f32 matrix [N, K] -> (q uint8 [N, K], scales, zeros [K/32, N]).

    The scale and zero are rounded to bf16 (the kernel's dtype) *before* the codes are chosen, so
    the codes compensate for that rounding."""
    n, k = w.shape
    g = w.reshape(n, k // INT4_GROUP, INT4_GROUP)
    mn = g.amin(dim=-1)
    mx = g.amax(dim=-1)
    scale = ((mx - mn) / 15.0).to(torch.bfloat16).float()
    zero = (mn + 8.0 * scale).to(torch.bfloat16).float()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = ((g - zero[..., None]) / safe[..., None] + 8.0).round_().clamp_(0, 15)
    q = torch.where(scale[..., None] > 0, q, torch.full_like(q, 8.0))
    return q.to(torch.uint8).reshape(n, k), scale.t().contiguous(), zero.t().contiguous()


def _int4_weight(srcs: Sequence[_Source]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Packed int4 weight [N_pad, K/2] and bf16 scale_zeros [K/32, N_pad, 2] for the fused sources."""
    k = srcs[0].k
    n = sum(s.n for s in srcs)
    n_pad = (n + 15) // 16 * 16
    groups = k // INT4_GROUP
    packed = torch.empty(n_pad, k // 2, dtype=torch.uint8)
    scale_zeros = torch.zeros(groups, n_pad, 2, dtype=torch.bfloat16)
    step = _window_rows(k, 64)
    for r0 in range(0, n_pad, step):
        r1 = min(n_pad, r0 + step)
        qs, ss, zs = [], [], []
        for s, a, b in _windows(srcs, r0, r1):
            q, sc, z = _int4_rows(s, a, b)
            qs.append(q), ss.append(sc), zs.append(z)
        if r1 > n:  # padding rows: code 8 with zero scale/zero -> weight 0
            p = r1 - max(r0, n)
            qs.append(torch.full((p, k), 8, dtype=torch.uint8))
            ss.append(torch.zeros(groups, p))
            zs.append(torch.zeros(groups, p))
        q = torch.cat(qs).to(torch.int32)
        packed[r0:r1] = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        scale_zeros[:, r0:r1, 0] = torch.cat(ss, dim=1).to(torch.bfloat16)
        scale_zeros[:, r0:r1, 1] = torch.cat(zs, dim=1).to(torch.bfloat16)
    return packed, scale_zeros, n


def _qdot_rows(s: _Source | _Screen, a: int, b: int) -> dq.IntegerCodes:
    if isinstance(s, _Screen):
        return dq.requantize_q4(s.source.dequant_rows(a, b))
    if s.ggml_type in dq.INTEGER_CODE_LAYOUTS:
        return dq.integer_codes(s.raw[a:b], s.ggml_type, (b - a, s.k))
    return dq.requantize_q8(s.dequant_rows(a, b))


def _to_f16(t: torch.Tensor, what: str) -> torch.Tensor:
    h = t.to(torch.float16)
    if not bool(torch.isfinite(h).all()):
        raise ValueError(f"{what}: a group scale does not fit in float16; use another weight format")
    return h


def _qdot_layout(srcs: Sequence[_Source]) -> tuple[int, int, int | None]:
    """Bits, group size and the common code offset (None: the groups have their own zeros) of fused sources."""
    layouts = {dq.code_layout(s.ggml_type) for s in srcs}
    (bits, group), = {lay[:2] for lay in layouts}  # kernel_for never fuses different layouts
    offsets = {lay[2] for lay in layouts}
    offset = offsets.pop() if len(offsets) == 1 and None not in offsets else None
    return bits, group, offset


def _qdot_supers(srcs: Sequence[_Source]) -> int:
    """How many super-block factors the fused sources' packed layout keeps per super-block: S (1 or 2)
    when they are all one K-quant type (their 8-bit scale codes are kept), else 0 (f16 scales)."""
    types = {s.ggml_type for s in srcs}
    return dq.TWO_LEVEL_TYPES.get(types.pop(), 0) if len(types) == 1 else 0


def _qdot_specs(k: int, n: int, bits: int, group: int, offset: int | None,
                supers: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The shapes and dtypes of the packed tensors ``_qdot_weight`` builds for n rows of k values."""
    blocks = -(-n // QDOT_BLOCK_ROWS)
    scale_dtype = torch.float16 if not supers else torch.int8 if supers == 1 else torch.uint8
    zero_dtype = torch.float16 if not supers else torch.uint8
    per_group = (k // group, QDOT_BLOCK_ROWS)
    return {"codes": ((blocks, 2 * k * bits), torch.uint8),
            "scales": ((blocks, *per_group), scale_dtype),
            "zeros": ((blocks if offset is None else 0, *per_group), zero_dtype),
            "supers": ((blocks, k // dq.SUPER_BLOCK, supers, QDOT_BLOCK_ROWS) if supers else (0,), torch.float16)}


def _qdot_weight(srcs: Sequence[_Source]) -> dict[str, torch.Tensor]:
    """Codes, scales, zeros and super-block factors for the fused sources in the kernel's layout,
    built window by window (windows of whole 16-row blocks)."""
    k = srcs[0].k
    n = sum(s.n for s in srcs)
    bits, group, offset = _qdot_layout(srcs)
    supers = _qdot_supers(srcs)
    out = {name: torch.empty(shape, dtype=dtype)
           for name, (shape, dtype) in _qdot_specs(k, n, bits, group, offset, supers).items()}
    step = _window_rows(k, QDOT_BLOCK_ROWS)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        b0, b1 = r0 // QDOT_BLOCK_ROWS, -(-r1 // QDOT_BLOCK_ROWS)
        parts = [_qdot_rows(s, a, b) for s, a, b in _windows(srcs, r0, r1)]
        out["codes"][b0:b1] = pack_codes(torch.cat([p.codes for p in parts]), bits)
        if supers:  # the file's own codes and factors: exact, and as many bytes as the file
            out["scales"][b0:b1] = pack_group_values(torch.cat([p.scale_codes for p in parts]).to(out["scales"].dtype))
            if offset is None:
                out["zeros"][b0:b1] = pack_group_values(torch.cat([p.zero_codes for p in parts]).to(torch.uint8))
            out["supers"][b0:b1] = pack_supers(torch.cat([p.supers for p in parts]))
            continue
        out["scales"][b0:b1] = pack_group_values(_to_f16(torch.cat([p.scales for p in parts]), srcs[0].name))
        if offset is None:
            z = torch.cat([p.zeros if p.zeros is not None else -p.offset * p.scales for p in parts])
            out["zeros"][b0:b1] = pack_group_values(_to_f16(z, srcs[0].name))
    return out


def _qdot_linear(srcs: Sequence[_Source], packed: dict[str, torch.Tensor], bias: torch.Tensor | None) -> QDotLinear:
    bits, group, offset = _qdot_layout(srcs)
    return QDotLinear(packed["codes"], packed["scales"], packed["zeros"], bits, group, offset or 0,
                      sum(s.n for s in srcs), bias, supers=packed["supers"])


def _bias(f: GGUFFile, srcs: Sequence[_Source], bias_names: Sequence[str | None] | None,
          dtype: torch.dtype) -> torch.Tensor | None:
    if not bias_names or all(b is None for b in bias_names):
        return None
    if len(bias_names) != len(srcs):
        raise ValueError(f"{len(bias_names)} bias names for {len(srcs)} weights")
    parts = []
    for s, bname in zip(srcs, bias_names):
        if bname is None:
            parts.append(torch.zeros(s.n, dtype=dtype))
            continue
        b = dq.load_tensor(f, bname, torch.float32).reshape(-1)
        if b.numel() != s.n:
            raise ValueError(f"{bname}: {b.numel()} values for {s.n} output rows of {s.name}")
        parts.append(b.to(dtype))
    return torch.cat(parts)


def _build_cached(f: GGUFFile, key: str, srcs: Sequence[_Source], bias: torch.Tensor | None, fmt: str) -> Linear:
    """``_build``, through the file's packed-weight cache (``f.packs``) for the qdot layout: a later load
    maps the packed codes and scales instead of rebuilding them."""
    packs = f.packs
    if packs is None or not fmt.startswith("qdot"):
        return _build(srcs, bias, fmt)
    key = f"{fmt}|{key}"
    bits, group, offset = _qdot_layout(srcs)
    n = sum(s.n for s in srcs)
    saved = packs.get(key, _qdot_specs(srcs[0].k, n, bits, group, offset, _qdot_supers(srcs)))
    if saved is not None:
        return _qdot_linear(srcs, saved, bias)
    packed = _qdot_weight(srcs)
    packs.put(key, packed)
    return _qdot_linear(srcs, packed, bias)


def _build(srcs: Sequence[_Source], bias: torch.Tensor | None, fmt: str) -> Linear:
    if fmt == "f32":
        return DenseLinear(_dense_weight(srcs, torch.float32), bias)
    if fmt == "bf16":
        return DenseLinear(_dense_weight(srcs, torch.bfloat16), bias)
    if fmt == "bf16-packed":
        return PackedBF16Linear(_dense_weight(srcs, torch.bfloat16), bias)
    if fmt == "int8":
        q, scales = _int8_weight(srcs)
        return Int8Linear(q, scales, bias)
    if fmt == "int4":
        packed, scale_zeros, n = _int4_weight(srcs)
        return Int4Linear(packed, scale_zeros, n, bias)
    if fmt.startswith("qdot"):
        return _qdot_linear(srcs, _qdot_weight(srcs), bias)
    raise ValueError(f"unknown linear format {fmt!r}")


def kernel_for(ggml_type: int, fmt: str, k: int) -> str:
    """The concrete kernel format one source tensor gets under ``fmt`` (resolves ``auto-int4``)."""
    if fmt == "qdot":
        if k % 32:
            return "f32"  # activations are quantized per 32 values; odd widths are tiny, keep them exact
        bits, group, _ = dq.code_layout(ggml_type)
        return f"qdot{bits}g{group}"  # fuse only parts with the same code layout
    if fmt == "auto-int4":
        fmt = "int4" if ggml_type in dq.INT4_EXACT_TYPES else "int8"
    if fmt == "int4" and k % INT4_GROUP:
        fmt = "int8"  # the int4 kernel needs whole groups of 32 along K
    if fmt == "int8" and k % 16:
        fmt = "bf16"  # torch's int8 kernel crashes (SIGSEGV) when K is not a multiple of 16
    return fmt


def load_linear(f: GGUFFile, names: str | Sequence[str], fmt: str, *,
                bias_names: str | Sequence[str | None] | None = None,
                compute_dtype: torch.dtype | None = None,
                device: str | torch.device = "cpu",
                rows: tuple[int, int] | None = None) -> Linear:
    """Build a :class:`Linear` from one GGUF weight, or several concatenated along the output dim.

    ``rows`` = (a, b): take rows [a, b) of each named tensor, viewed as [all rows, in_features] whatever its
    rank (one expert's slice of a stacked expert tensor), instead of the whole tensor.

    ``fmt`` is one of :data:`FORMATS`. ``compute_dtype`` is the activation dtype: f32 for ``f32``,
    bf16 for everything else (the only dtype the bf16/int CPU kernels take); passing anything else
    raises. ``device='cuda'`` gives dense bf16 (or f32) weights on the GPU, see the module doc.

    When the file carries LoRA adapters (``f.lora``, ``engine.ops.lora``), the linear comes back wrapped in
    their update, the base weights untouched in their format."""
    lin = _load_linear(f, names, fmt, bias_names=bias_names, compute_dtype=compute_dtype, device=device, rows=rows)
    if f.lora is None or rows is not None:  # adapters target whole 2-D weights, never an expert's slice
        return lin
    names = [names] if isinstance(names, str) else names
    return f.lora.wrap([(n, f.tensors[n].shape[0]) for n in names], lin).to(device)


def _load_linear(f: GGUFFile, names: str | Sequence[str], fmt: str, *,
                 bias_names: str | Sequence[str | None] | None, compute_dtype: torch.dtype | None,
                 device: str | torch.device, rows: tuple[int, int] | None) -> Linear:
    if fmt not in FORMATS:
        raise ValueError(f"unknown linear format {fmt!r}; expected one of {FORMATS}")
    names = [names] if isinstance(names, str) else list(names)
    if isinstance(bias_names, str):
        bias_names = [bias_names]
    if not names:
        raise ValueError("load_linear needs at least one tensor name")
    want = torch.float32 if fmt in ("f32", "qdot") else torch.bfloat16
    if compute_dtype is not None and compute_dtype != want:
        raise ValueError(f"format {fmt!r} computes in {want}, not {compute_dtype}")
    srcs = [_source(f, n, rows) for n in names]
    k = srcs[0].k
    for s in srcs[1:]:
        if s.k != k:
            raise ValueError(f"cannot fuse {s.name} (in_features {s.k}) with {srcs[0].name} ({k})")
    bias = _bias(f, srcs, bias_names, want)
    device = torch.device(device)

    if device.type != "cpu":
        # No validated int4/int8/prepacked kernels off-CPU: dense weights for cuBLAS.
        lin = DenseLinear(_dense_weight(srcs, want), bias)
        return lin.to(device)

    kernels = [kernel_for(s.ggml_type, fmt, k) for s in srcs]
    # Fuse runs of consecutive sources that share a kernel.
    groups: list[tuple[str, list[int]]] = []
    for i, kern in enumerate(kernels):
        if groups and groups[-1][0] == kern:
            groups[-1][1].append(i)
        else:
            groups.append((kern, [i]))
    key = ",".join(names) + (f"[{rows[0]}:{rows[1]}]" if rows is not None else "")
    if len(groups) == 1:
        return _build_cached(f, key, srcs, bias, groups[0][0])
    parts = []
    off = 0
    for kern, idx in groups:
        gs = [srcs[i] for i in idx]
        n = sum(s.n for s in gs)
        parts.append(_build_cached(f, f"{key}#{idx[0]}", gs, None if bias is None else bias[off:off + n].clone(),
                                   kern))
        off += n
    return SplitLinear(parts)


def load_linear_rows(f: GGUFFile, name: str, fmt: str, ids: torch.Tensor) -> Linear:
    """A linear over the rows ``ids`` (int64, any order) of one GGUF weight, on the CPU: output j is
    row ``ids[j]``'s (a pruned output head). ``fmt`` as for :func:`load_linear`."""
    sub, digest = _selected_rows(f, name, ids)
    return _build_cached(f, f"{name}[rows {digest}]", [sub], None, kernel_for(sub.ggml_type, fmt, sub.k))


def _selected_rows(f: GGUFFile, name: str, ids: torch.Tensor) -> tuple[_Source, str]:
    """The rows ``ids`` of one GGUF weight as a source, and a digest of ``ids`` for the packed-weight cache's key."""
    src = _source(f, name)
    ids = ids.to(torch.long)
    return (_Source(name, src.raw.index_select(0, ids), src.ggml_type, len(ids), src.k),
            hashlib.sha256(ids.numpy().tobytes()).hexdigest()[:16])


def load_screen_rows(f: GGUFFile, name: str, ids: torch.Tensor) -> QDotLinear | None:
    """A 4-bit copy (Q4_0's rule) of the rows ``ids`` of one GGUF weight, for the qdot kernel, or None where
    that kernel is not fast here or K is not whole groups of 32: scores that only pick out the rows worth
    scoring exactly (a pruned head's rest), at half the bytes a read of 8-bit rows costs."""
    if not qdot_fast() or f.tensors[name].shape[-1] % 32:
        return None
    rows, digest = _selected_rows(f, name, ids)
    return _build_cached(f, f"{name}[rows {digest}, 4-bit screen]", [_Screen(rows)], None, "qdot4g32")


# ============================================================================================
# embeddings


class Embedding:
    """Token-embedding lookup that dequantizes only the requested rows from the mmap bytes.

    The table itself costs no RAM beyond the file mapping (the GGUFFile must stay open)."""

    def __init__(self, f: GGUFFile, name: str, dtype: torch.dtype = torch.bfloat16,
                 device: str | torch.device = "cpu"):
        info = f.tensors[name]
        if len(info.shape) != 2:
            raise ValueError(f"{name}: an embedding table must be 2-D, got {info.shape}")
        self.name = name
        self.ggml_type = info.ggml_type
        self.num_embeddings, self.embedding_dim = info.shape
        self.dtype = dtype
        self.device = torch.device(device)
        self._raw = dq.raw_tensor(f, name).view(self.num_embeddings, dq.row_bytes(info.ggml_type, self.embedding_dim))

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        ids = torch.as_tensor(ids)
        flat = ids.reshape(-1).to(device="cpu", dtype=torch.long)
        rows = dq.dequantize_rows(self._raw, self.ggml_type, (self.num_embeddings, self.embedding_dim), flat,
                                  self.dtype)
        rows = rows.view(*ids.shape, self.embedding_dim)
        return rows if self.device.type == "cpu" else rows.to(self.device)


# ============================================================================================
# default formats

INT4_EXACT_TYPE_NAMES = frozenset(GGML_TYPES[t][0] for t in dq.INT4_EXACT_TYPES)
# Types that a "4-bit" recipe (Q4_K_M, Q4_K_S, Q4_0, Q4_1) keeps next to its Q4 tensors.
_Q4_COMPANION_TYPE_NAMES = frozenset({"Q6_K", "F32"})


@functools.lru_cache(maxsize=None)
def _packed_bf16_problem() -> str | None:
    """Why oneDNN's packed bf16 linear cannot run here (it asks for AVX512BW/VL/DQ or AVX-NE-CONVERT
    and raises on an AVX2-only CPU), or None."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16))
    except RuntimeError:
        return "weight format 'bf16-packed' needs oneDNN's bf16 kernels, which this CPU cannot run " \
               "(they need AVX512BW/VL/DQ or AVX-NE-CONVERT)"
    return None


def format_problem(fmt: str, device: torch.device | str = "cpu") -> str | None:
    """Why weight format ``fmt`` cannot run on this machine, or None when it can: the load refuses it
    with this reason instead of failing inside a kernel."""
    if torch.device(device).type != "cpu":
        return None  # off the CPU every format is dense bf16/f32 (see the module doc)
    if fmt == "bf16-packed":
        return _packed_bf16_problem()
    if fmt.startswith("qdot") and load_qdot() is None:
        return f"weight format {fmt!r} needs the qdot kernel, which is not available: {qdot_status().detail}"
    return None


def cpu_has_amx() -> bool:
    """Whether oneDNN can use AMX bf16 here (the flat-cost bf16 kernel needs it)."""
    try:
        return bool(torch.cpu._is_amx_tile_supported()) and bool(torch.cpu._is_avx512_bf16_supported())
    except Exception:  # older torch without the probes
        return False


def _mostly_q4(source_types: Iterable[str] | Mapping[str, int]) -> bool:
    if isinstance(source_types, Mapping):
        total = sum(source_types.values())
        q4 = sum(v for t, v in source_types.items() if t.upper() in INT4_EXACT_TYPE_NAMES)
        return total > 0 and q4 * 2 > total
    types = {t.upper() for t in source_types}
    return bool(types & INT4_EXACT_TYPE_NAMES) and types <= INT4_EXACT_TYPE_NAMES | _Q4_COMPANION_TYPE_NAMES


def default_format(role: str, source_type_names: Iterable[str] | Mapping[str, int], *,
                   amx: bool | None = None, qdot: bool | None = None) -> str:
    """The weight format for a model, from its role, the GGML types of its weights and the CPU.

    ``source_type_names``: the type names of the model's linear weights, or (better) a mapping
    type name -> element count. ``amx`` defaults to :func:`cpu_has_amx`, ``qdot`` to whether one of
    the qdot kernel's vector paths (AVX512-VNNI, AVX2) is built here.

    * a target stored as floats (F32, F16, BF16: an unquantized import): served at its stored precision,
      as Ollama serves a model that was not quantized at create: ``f32`` (exact for all three; MKL's
      sgemm), or ``bf16-packed`` for a BF16 source on AMX CPUs (exact there, and the flat-cost kernel).
      Trading precision for speed is the user's call: ``--quantize`` at create, or the
      ``weight_format`` option.
    * where qdot is available: ``qdot`` for a drafter and for any quantized target (Q4_K_M, Q8_0,
      ...), AMX or not. It keeps every Q4/Q5/Q6/Q8 tensor's own codes (no requantization at all); on an
      AMX CPU it also decodes a Q8_0 target 2.3x faster than ``bf16-packed`` (which reads 2 bytes a
      weight) and verifies up to 16 tokens faster, though ``bf16-packed`` prefills faster.
      Without it the rules below apply.

    * drafter: always ``auto-int4``. A drafter runs at width 1, where the int kernels are the
      fastest; its quality only moves the acceptance rate, and ``auto-int4`` still keeps every
      non-Q4 tensor at 8 bits.
    * target whose weights are mostly Q4_K/Q4_0/Q4_1 (Q4_K_M & co.): ``auto-int4``. The Q4 tensors
      are reproduced exactly (bf16 scales), it is the fastest format for widths 1-4 (draft length
      up to 3) and needs 0.6-1 byte/weight instead of 2.
    * any other target (without qdot): ``bf16-packed`` on AMX CPUs (flat cost from 1 to 16 rows, so
      long speculative drafts verify for free), ``auto-int4`` (i.e. int8 for these sources) without
      AMX, where bf16 falls back to a slow non-AMX path that costs several times more for 2+ rows than
      for 1 and than int8 at every width.

    The per-width measurements behind these rules are in docs/measurements.md ("Weight formats").
    """
    if role not in ("target", "drafter"):
        raise ValueError(f"role must be 'target' or 'drafter', not {role!r}")
    integer = "qdot" if (qdot_fast() if qdot is None else qdot) else "auto-int4"
    if role == "drafter" or _mostly_q4(source_type_names):
        return integer
    if amx is None:
        amx = cpu_has_amx()
    floats = _float_types(source_type_names)
    if floats:
        return "bf16-packed" if amx and floats == {"BF16"} else "f32"
    if integer == "qdot":
        return integer
    return "bf16-packed" if amx else integer


def _float_types(source_types: Iterable[str] | Mapping[str, int]) -> set[str]:
    """The source's type names when every linear weight is a float (F32/F16/BF16), else an empty set."""
    types = {t.upper() for t in source_types}
    return types if types and types <= {"F32", "F16", "BF16"} else set()
