"""A minimal, fast GGUF reader: metadata, tensor directory and mmap-backed tensor bytes.

Why not ``gguf.GGUFReader``: it builds one numpy memmap slice per string of the tokenizer arrays
(150k-260k of them) and takes 2-9 s just to open a file. Walking the header with ``struct`` over an
``mmap`` takes well under a second, and tensor data is never copied until a dequantizer asks for it.
This module needs only numpy, so the importer can use it without loading torch.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32


class GGUFError(ValueError):
    """A file that is not a readable GGUF, with a message fit for a user."""


# GGML tensor types: id -> (name, elements per block, bytes per block). The values are the
# on-disk ABI of ggml (ggml.h), so they are fixed constants, not configuration.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}
GGML_TYPE_IDS: dict[str, int] = {name: tid for tid, (name, _, _) in GGML_TYPES.items()}

# llama.cpp's `general.file_type` (enum llama_ftype) -> the name Ollama shows as quantization level.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
    16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S",
    22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
    28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4",
}
FILE_TYPE_IDS: dict[str, int] = {name: fid for fid, name in FILE_TYPES.items()}

# GGUF metadata value types.
_SCALAR_FORMATS: dict[int, str] = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d",
}
_NUMPY_DTYPES: dict[int, str] = {
    0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8",
}
_TYPE_STRING = 8
_U64 = struct.Struct("<Q")
_TYPE_ARRAY = 9


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor directory. ``dims`` is GGUF order (ne0 = innermost = row length)."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int  # absolute byte offset in the file
    n_bytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0] if self.ggml_type in GGML_TYPES else f"type{self.ggml_type}"

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape in torch/numpy order (outermost first)."""
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n


class _Cursor:
    """Sequential little-endian reads over a buffer, raising GGUFError on truncation."""

    def __init__(self, buf: memoryview, path: str):
        self.buf = buf
        self.pos = 0
        self.path = path

    def _need(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            raise GGUFError(f"{self.path}: truncated GGUF header (needed {n} bytes at offset {self.pos})")

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self._need(size)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        self._need(n)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        # GGUF strings are UTF-8, but some vocabularies carry invalid sequences (partial bytes).
        return raw.decode("utf-8", errors="replace")

    def _string_array(self, count: int) -> list[str]:
        # The vocabulary arrays hold 150k-260k strings: this loop is the whole cost of opening a
        # model, so it avoids per-item method calls.
        buf, pos, end = self.buf, self.pos, len(self.buf)
        unpack = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for _ in range(count):
            if pos + 8 > end:
                raise GGUFError(f"{self.path}: truncated GGUF header (string array)")
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > end:
                raise GGUFError(f"{self.path}: truncated GGUF header (string array)")
            append(str(buf[pos : pos + n], "utf-8", "replace"))
            pos += n
        self.pos = pos
        return out

    def value(self, vtype: int) -> Any:
        if vtype in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[vtype])
        if vtype == _TYPE_STRING:
            return self.string()
        if vtype == _TYPE_ARRAY:
            etype = self.scalar("<I")
            count = self.scalar("<Q")
            if etype in _NUMPY_DTYPES:
                dtype = np.dtype(_NUMPY_DTYPES[etype])
                nbytes = dtype.itemsize * count
                self._need(nbytes)
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
                self.pos += nbytes
                return arr.astype(bool) if etype == 7 else arr
            if etype == _TYPE_STRING:
                return self._string_array(count)
            if etype == _TYPE_ARRAY:
                return [self.value(_TYPE_ARRAY) for _ in range(count)]
            raise GGUFError(f"{self.path}: unknown GGUF array element type {etype}")
        raise GGUFError(f"{self.path}: unknown GGUF metadata value type {vtype}")


def tensor_nbytes(ggml_type: int, dims: tuple[int, ...]) -> int:
    if ggml_type not in GGML_TYPES:
        raise GGUFError(f"unknown GGML tensor type {ggml_type}")
    _, block, block_bytes = GGML_TYPES[ggml_type]
    n = 1
    for d in dims:
        n *= d
    if dims and dims[0] % block:
        raise GGUFError(f"tensor row length {dims[0]} is not a multiple of the {GGML_TYPES[ggml_type][0]} block size {block}")
    return n // block * block_bytes


class GGUFFile:
    """An open GGUF file. Metadata is parsed eagerly (fast); tensor bytes are mmap views.

    Use as a context manager, or call ``close()``; views returned by ``tensor_data`` must not
    outlive the file.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        # Tensors derived from this file's bytes and cached on disk (engine.ops.pack_cache.PackCache:
        # the packed kernel layouts), or None; set by whoever loads a model from it.
        self.packs = None
        # LoRA adapters applied to the linears loaded from this file (engine.ops.lora.LoraWeights), or None;
        # set by the model loader for a target with ADAPTER layers.
        self.lora = None
        try:
            self._fd = open(self.path, "rb")
        except FileNotFoundError:
            raise GGUFError(f"{self.path}: no such file") from None
        except IsADirectoryError:
            raise GGUFError(f"{self.path}: is a directory, not a GGUF file") from None
        size = os.fstat(self._fd.fileno()).st_size
        if size < 24:
            self._fd.close()
            raise GGUFError(f"{self.path}: not a GGUF file (only {size} bytes)")
        self._mmap = mmap.mmap(self._fd.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._parse(memoryview(self._mmap))
        except BaseException:
            self.close()
            raise

    def _parse(self, buf: memoryview) -> None:
        cur = _Cursor(buf, self.path)
        magic = bytes(buf[:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (bad magic {magic!r}, expected b'GGUF')")
        cur.pos = 4
        self.version = cur.scalar("<I")
        if self.version not in (2, 3):
            raise GGUFError(f"{self.path}: unsupported GGUF version {self.version} (supported: 2, 3)")
        n_tensors = cur.scalar("<Q")
        n_kv = cur.scalar("<Q")
        # Sanity bounds keep a corrupt header from turning into a multi-GB allocation loop.
        if n_tensors > 1_000_000 or n_kv > 1_000_000:
            raise GGUFError(f"{self.path}: corrupt GGUF header ({n_tensors} tensors, {n_kv} keys)")
        self.metadata: dict[str, Any] = {}
        # (value type, array element type or None): what a writer needs to copy a key faithfully.
        self.metadata_types: dict[str, tuple[int, int | None]] = {}
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.scalar("<I")
            etype = None
            if vtype == _TYPE_ARRAY:
                etype = struct.unpack_from("<I", cur.buf, cur.pos)[0] if cur.pos + 4 <= len(cur.buf) else None
            self.metadata[key] = cur.value(vtype)
            self.metadata_types[key] = (vtype, etype)
        infos: list[tuple[str, tuple[int, ...], int, int]] = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.scalar("<I")
            if n_dims > 8:
                raise GGUFError(f"{self.path}: tensor {name!r} has {n_dims} dimensions")
            dims = tuple(cur.scalar("<Q") for _ in range(n_dims))
            ggml_type = cur.scalar("<I")
            offset = cur.scalar("<Q")
            infos.append((name, dims, ggml_type, offset))
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(f"{self.path}: invalid general.alignment {alignment}")
        self.data_offset = (cur.pos + alignment - 1) // alignment * alignment
        self.tensors: dict[str, TensorInfo] = {}
        file_size = len(buf)
        for name, dims, ggml_type, offset in infos:
            nbytes = tensor_nbytes(ggml_type, dims)
            start = self.data_offset + offset
            if start + nbytes > file_size:
                raise GGUFError(f"{self.path}: tensor {name!r} extends past the end of the file (truncated download?)")
            self.tensors[name] = TensorInfo(name, dims, ggml_type, start, nbytes)

    # -- metadata helpers -------------------------------------------------------------------
    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise GGUFError(f"{self.path}: GGUF has no general.architecture")
        return arch

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        """``{arch}.{suffix}``, e.g. ``arch_key('context_length')``."""
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    @property
    def parameter_count(self) -> int:
        return sum(t.n_elements for t in self.tensors.values())

    @property
    def file_type(self) -> str:
        """Ollama's quantization label: from ``general.file_type``, else guessed from tensor types."""
        ft = self.metadata.get("general.file_type")
        if ft is not None and int(ft) in FILE_TYPES:
            return FILE_TYPES[int(ft)]
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            if len(t.dims) >= 2:
                counts[t.type_name] = counts.get(t.type_name, 0) + t.n_elements
        return max(counts, key=counts.get) if counts else "unknown"

    def tensor_data(self, name: str) -> np.ndarray:
        """The raw bytes of one tensor as a read-only uint8 view into the mmap (no copy)."""
        info = self.tensors[name]
        return np.frombuffer(self._mmap, dtype=np.uint8, count=info.n_bytes, offset=info.offset)

    def release_pages(self) -> None:
        """Drop this process's resident pages of the mapping (they stay in the page cache).

        Loading reads every tensor once to build the compute weights; afterwards only the
        embedding rows a request asks for are read again, and those fault back in on demand.
        Without this the whole file stays counted in the process's resident memory next to the
        converted weights (RSS ~2.2 GB instead of ~1.3 GB for the 1.5B Q4_K_M)."""
        mm = getattr(self, "_mmap", None)
        if mm is not None and hasattr(mmap, "MADV_DONTNEED"):
            try:
                mm.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):  # not supported here: only memory accounting is lost
                pass

    def close(self) -> None:
        mm = getattr(self, "_mmap", None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                # A caller still holds a view; the mapping is released when it is collected.
                pass
            self._mmap = None
        fd = getattr(self, "_fd", None)
        if fd is not None:
            fd.close()
            self._fd = None

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metadata(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    """Metadata and tensor directory of a GGUF, closing the file afterwards."""
    with GGUFFile(path) as f:
        return dict(f.metadata), dict(f.tensors)


def format_parameter_count(n: int) -> str:
    """Ollama's `model_type` / parameter_size string (Go format.HumanNumber): 135M, 1.5B, 494.03M."""
    if n >= 1_000_000_000:
        v = n / 1e9
        return f"{v:.0f}B" if v == int(v) else f"{v:.1f}B"
    if n >= 1_000_000:
        v = n / 1e6
        return f"{v:.0f}M" if v == int(v) else f"{v:.2f}M"
    if n >= 1_000:
        return f"{n / 1e3:.0f}K"
    return str(n)
