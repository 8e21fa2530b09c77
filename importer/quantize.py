"""Requantizing an F32/F16/BF16 GGUF at create time (`quantize` / `draft_quantize`).

Tensors are converted one at a time and streamed to the output, so memory stays at one tensor's
f32 copy however large the model is. Types here are the ones the `gguf` package can write; the
K-quants need our own quantizer (a later issue) and are refused with a clear error until then.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import gguf
import numpy as np

from engine.gguf import FILE_TYPE_IDS, GGML_TYPE_IDS, GGUFFile

from .request import CreateError

# quantize name (as users type it, case-insensitive) -> (GGML tensor type, llama_ftype id)
QUANT_TYPES: dict[str, str] = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0", "q5_1": "Q5_1",
                               "f16": "F16", "bf16": "BF16", "f32": "F32"}
K_QUANTS = {"q4_k_m", "q4_k_s", "q5_k_m", "q5_k_s", "q6_k", "q3_k_m", "q3_k_s", "q3_k_l", "q2_k"}
SOURCE_TYPES = {"F32", "F16", "BF16"}


@dataclass(frozen=True)
class QuantizePlan:
    target: str  # GGML type name, e.g. Q4_0

    @property
    def file_type_id(self) -> int:
        return FILE_TYPE_IDS[self.target]


def parse_quant_type(name: str) -> QuantizePlan:
    key = name.strip().lower()
    if key in QUANT_TYPES:
        return QuantizePlan(QUANT_TYPES[key])
    if key in K_QUANTS:
        raise CreateError(
            f"quantization type {name} is not supported yet (K-quants arrive with tandem's own quantizer); "
            f"supported: {', '.join(sorted(QUANT_TYPES))}"
        )
    raise CreateError(f"unsupported quantization type {name}")


def _tensor_target(name: str, shape: tuple[int, ...], target: str) -> str | None:
    """The type a tensor gets, or None to copy it unchanged.

    As llama.cpp's quantizer does: only 2-D weight matrices are quantized (norms and biases stay f32),
    rows must hold whole blocks, and the output head keeps at least 8 bits because it is the tensor
    most sensitive to rounding.
    """
    if len(shape) != 2 or not name.endswith(".weight"):
        return None
    if target in ("F32", "F16", "BF16"):
        return target
    if shape[-1] % 32:
        return "F16"
    if name == "output.weight" and target != "Q8_0":
        return "Q8_0"
    return target


def quantize_gguf(src: str | os.PathLike, dst: str | os.PathLike, plan: QuantizePlan,
                  progress: Callable[[int, int], None] | None = None) -> None:
    """Write ``src`` requantized to ``plan`` at ``dst``; ``progress(done_bytes, total_bytes)`` per tensor."""
    with GGUFFile(src) as f:
        source_types = {t.type_name for t in f.tensors.values() if len(t.dims) >= 2}
        if not source_types <= SOURCE_TYPES:
            raise CreateError(
                f"quantization is only supported for F16, BF16 and F32 models (this one has {', '.join(sorted(source_types))})"
            )
        writer = gguf.GGUFWriter(os.fspath(dst), f.architecture, use_temp_file=False)
        # GGUFWriter adds general.architecture itself; copy every other key with its original type.
        for key, value in f.metadata.items():
            if key in ("general.architecture", "general.alignment"):
                continue
            vtype, etype = f.metadata_types[key]
            if key == "general.file_type":
                value = plan.file_type_id
            if isinstance(value, np.ndarray):
                value = value.tolist()
            writer.add_key_value(key, value, gguf.GGUFValueType(vtype),
                                 sub_type=gguf.GGUFValueType(etype) if etype is not None else None)
        if "general.file_type" not in f.metadata:
            writer.add_file_type(plan.file_type_id)

        jobs = []
        for info in f.tensors.values():
            target = _tensor_target(info.name, info.shape, plan.target)
            out_type = target or info.type_name
            qtype = gguf.GGMLQuantizationType(GGML_TYPE_IDS[out_type])
            elems = info.n_elements
            block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
            nbytes = elems // block * block_bytes
            raw_shape = gguf.quant_shape_to_byte_shape(info.shape, qtype) if block > 1 else info.shape
            writer.add_tensor_info(info.name, raw_shape, np.dtype(np.uint8) if block > 1 else _np_dtype(out_type),
                                   nbytes, raw_dtype=qtype)
            jobs.append((info, target, qtype))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()

        total = sum(info.n_bytes for info, _, _ in jobs)
        done = 0
        for info, target, qtype in jobs:
            raw = f.tensor_data(info.name)
            if target is None or target == info.type_name:
                out = np.array(raw)  # unchanged: copy the bytes as they are
            else:
                src_type = gguf.GGMLQuantizationType(info.ggml_type)
                values = gguf.quants.dequantize(raw, src_type).reshape(info.shape).astype(np.float32)
                out = gguf.quants.quantize(values, qtype)
            writer.write_tensor_data(out)
            done += info.n_bytes
            if progress:
                progress(done, total)
        writer.close()


def _np_dtype(type_name: str) -> np.dtype:
    return {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16)}.get(type_name, np.dtype(np.uint8))
