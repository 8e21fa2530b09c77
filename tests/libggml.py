"""llama.cpp's own quantization code, called with ctypes: the reference the quantizer and dequantizer tests compare
against byte for byte.

The library is libggml-base (ggml.c, ggml-quants.c). ``scripts/install.sh`` builds it from llama-cpp-python's
source (pinned) into ``.venv/ggml/``, and ``scripts/test.sh`` points ``TANDEM_LIBGGML_BASE`` at it, so CI always
compares against libggml itself. Set ``TANDEM_LIBGGML_BASE`` to another build, or to "none" to run without it
(tests that need it then skip); a path that does not exist is an error, not a skip, so a broken build cannot
quietly turn the comparisons off.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from functools import lru_cache
from pathlib import Path

import numpy as np


def find() -> Path | None:
    env = os.environ.get("TANDEM_LIBGGML_BASE")
    if env == "none":
        return None
    if env:
        if not Path(env).is_file():
            raise FileNotFoundError(f"TANDEM_LIBGGML_BASE names {env}, which does not exist "
                                    "(scripts/install.sh builds it; 'none' runs without it)")
        return Path(env)
    candidates = []
    spec = importlib.util.find_spec("llama_cpp")  # located, never imported
    if spec and spec.submodule_search_locations:
        candidates += [Path(p) / "lib" / "libggml-base.so" for p in spec.submodule_search_locations]
    candidates.append(Path(__file__).resolve().parents[1] / ".venv" / "ggml" / "libggml-base.so")
    return next((p for p in candidates if p.is_file()), None)


class _TypeTraits(ctypes.Structure):
    # ggml.h's struct ggml_type_traits (ggml 0.25)
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    path = find()
    if path is None:
        return None
    lib = ctypes.CDLL(str(path))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    lib.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    return lib


def quantize(x: np.ndarray, type_id: int, row_bytes: int) -> np.ndarray:
    """ggml_quantize_chunk(type, x, dst, 0, rows, n_per_row, imatrix): the rows of ``x`` as the type's blocks. Types
    that require an importance matrix (the 1- and 2-bit IQ types) get one of ones."""
    lib = library()
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, n = x.shape
    out = np.zeros((rows, row_bytes), dtype=np.uint8)
    imatrix = np.ones(n, dtype=np.float32) if lib.ggml_quantize_requires_imatrix(type_id) else None
    written = lib.ggml_quantize_chunk(type_id, x.ctypes.data, out.ctypes.data, 0, rows, n,
                                      imatrix.ctypes.data if imatrix is not None else None)
    assert written == out.nbytes
    return out


def dequantize(raw: np.ndarray, type_id: int, n: int) -> np.ndarray:
    """The type's to_float over ``n`` values of blocks ``raw``, as f32."""
    traits = library().ggml_get_type_traits(type_id).contents
    out = np.zeros(n, dtype=np.float32)
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    _TO_FLOAT(traits.to_float)(raw.ctypes.data, out.ctypes.data, n)
    return out
