"""Requantizing an F32/F16/BF16 GGUF at create time (`quantize` / `draft_quantize`).

Two kinds of target:

* single types the `gguf` package can write (q8_0, q4_0, q4_1, q5_0, q5_1, f16, bf16, f32): every
  quantizable weight gets that type, except the output head, which keeps at least 8 bits;
* K-quant mixtures (q4_K_S, q4_K_M, q5_K_S, q5_K_M, q6_K), quantized by tandem's own
  `importer.kquant` (a port of llama.cpp's reference quantizer). Which tensor gets which type follows
  Ollama's server/quantization.go (`newType` / `getTensorNewType`, itself "ported from
  llama_tensor_get_type" in llama.cpp's src/llama-quant.cpp); see `k_tensor_types`.

Tensors are converted in chunks of rows and streamed to the output, so memory stays at one quantized
tensor plus a few chunks of f32 however large the model is. Chunks are spread over a thread pool
(numpy releases the GIL in its array loops).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np

from engine.contract.gguf import FILE_TYPE_IDS, GGML_TYPE_IDS, GGML_TYPES, GGUFFile, TensorInfo

from . import kquant
from .request import CreateError

# quantize name (as users type it, case-insensitive) -> GGML tensor type
QUANT_TYPES: dict[str, str] = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0", "q5_1": "Q5_1",
                               "f16": "F16", "bf16": "BF16", "f32": "F32"}
# K-quant mixtures: name -> (llama_ftype name, default tensor type). The ftype ids written to
# general.file_type are llama.cpp's enum llama_ftype (engine.contract.gguf.FILE_TYPES: 14..18).
K_MIXTURES: dict[str, tuple[str, str]] = {
    "q4_k_s": ("Q4_K_S", "Q4_K"), "q4_k_m": ("Q4_K_M", "Q4_K"),
    "q5_k_s": ("Q5_K_S", "Q5_K"), "q5_k_m": ("Q5_K_M", "Q5_K"),
    "q6_k": ("Q6_K", "Q6_K"),
}
UNSUPPORTED_K_QUANTS = {"q3_k_m", "q3_k_s", "q3_k_l", "q2_k", "q2_k_s"}
SOURCE_TYPES = {"F32", "F16", "BF16"}

# Values per unit of work (a chunk of whole rows): 256K values = 1 MiB of f32.
CHUNK_VALUES = 1 << 18


@dataclass(frozen=True)
class QuantizePlan:
    target: str  # what the user asked for, canonical: a GGML type (Q4_0) or a K mixture (Q4_K_M)
    tensor_type: str = ""  # the default tensor type (Q4_K for Q4_K_M); "" means the same as target

    @property
    def default_type(self) -> str:
        return self.tensor_type or self.target

    @property
    def is_k_mixture(self) -> bool:
        return self.target in {ftype for ftype, _ in K_MIXTURES.values()}

    @property
    def file_type_id(self) -> int:
        return FILE_TYPE_IDS[self.target]


def parse_quant_type(name: str) -> QuantizePlan:
    key = name.strip().lower()
    if key in QUANT_TYPES:
        return QuantizePlan(QUANT_TYPES[key])
    if key in K_MIXTURES:
        ftype, tensor_type = K_MIXTURES[key]
        return QuantizePlan(ftype, tensor_type)
    if key in UNSUPPORTED_K_QUANTS:
        raise CreateError(
            f"quantization type {name} is not supported yet; "
            f"supported: {', '.join(sorted(QUANT_TYPES) + [ft for ft, _ in K_MIXTURES.values()])}"
        )
    raise CreateError(f"unsupported quantization type {name}")


# Never requantized by a single-type target: the MoE router, qwen35's shared-expert gate (a [1, n_embd] router of
# its own) and the DeltaNet's short conv kernel (llama.cpp keeps all three F32 whatever the file type).
_KEPT_AS_IS = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight")


def _tensor_target(name: str, shape: tuple[int, ...], target: str) -> str | None:
    """The type a tensor gets under a single-type target, or None to copy it unchanged.

    As llama.cpp's quantizer does: only weight matrices are quantized, 2-D or stacked MoE experts (3-D),
    row by row (norms and biases stay f32; so does a MoE router, ``ffn_gate_inp``, which decides which
    weights run at all), rows must hold whole blocks, and the output head keeps at least 8 bits because
    it is the tensor most sensitive to rounding.
    """
    if len(shape) < 2 or not name.endswith(".weight") or name.endswith(_KEPT_AS_IS):
        return None
    if target in ("F32", "F16", "BF16"):
        return target
    if shape[-1] % 32:
        return "F16"
    if name == "output.weight" and target != "Q8_0":
        return "Q8_0"
    return target


# --------------------------------------------------------------------------------------------
# K-quant mixtures: which tensor gets which type (Ollama server/quantization.go)

# Ollama newType: names that are never quantized (besides 1-D tensors and non-weights).
_NEVER_QUANTIZED_SUBSTRINGS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight",
    "shortconv.conv.weight", "time_mix_first.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
    "attn_rel_b.weight", "per_layer_token_embd.weight", "mm.",
)
_NEVER_QUANTIZED_NAMES = ("position_embd.weight", "token_types.weight")

# Ollama qwen3LinearAttnQuantType: fixed types for qwen3next / qwen35 / qwen35moe under Q4_K_S/M.
_QWEN3_LINEAR_ATTN = (
    (".attn_q.weight", "Q4_K"), (".attn_k.weight", "Q4_K"), (".attn_v.weight", "Q6_K"),
    (".attn_output.weight", "Q4_K"), (".attn_qkv.weight", "Q4_K"), (".attn_gate.weight", "Q4_K"),
    (".ssm_ba.weight", "Q4_K"), (".ssm_beta.weight", "Q4_K"), (".ssm_alpha.weight", "Q4_K"),
    (".ssm_out.weight", "Q4_K"), (".ffn_down_exps.weight", "Q6_K"), (".ffn_down_shexp.weight", "Q6_K"),
    (".ffn_gate_exps.weight", "Q4_K"), (".ffn_gate_shexp.weight", "Q4_K"), (".ffn_up_exps.weight", "Q4_K"),
    (".ffn_up_shexp.weight", "Q4_K"),
)


def _block_size(type_name: str) -> int:
    return GGML_TYPES[GGML_TYPE_IDS[type_name]][1]


def _is_quantized(type_name: str) -> bool:
    return type_name not in ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64")


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp / Ollama ``use_more_bits``: the first and last eighth of the layers, and every third
    layer in between, get the higher-precision type under the _M mixtures."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def _quantizable(info: TensorInfo) -> bool:
    """Ollama ``newType``: weights only, 2-D and up, no vision tower (``v.``), and not the small or
    sensitive tensors it lists (norms, expert gates, positional embeddings, conv kernels, ...)."""
    name = info.name
    return (name.endswith("weight") and not name.startswith("v.") and len(info.dims) >= 2
            and not any(s in name for s in _NEVER_QUANTIZED_SUBSTRINGS) and name not in _NEVER_QUANTIZED_NAMES)


def k_tensor_types(tensors: list[TensorInfo], metadata: dict[str, Any], plan: QuantizePlan) -> dict[str, str | None]:
    """The type of every tensor under a K mixture (None: copy unchanged), in file order.

    Ollama server/quantization.go ``quantize`` / ``newType`` / ``getTensorNewType`` (which are
    "ported from llama_tensor_get_type", llama.cpp src/llama-quant.cpp):

    * output.weight, and token_embd.weight when there is no output.weight (tied embeddings): Q6_K,
      or Q8_0 if a row is not a multiple of the K block (256) or the mixture's type is Q8_0.
    * attn_v.weight: Q6_K on ``use_more_bits`` layers for Q4_K_M (and Q5_K_M, llama.cpp); Q5_K for
      the first 4 for Q4_K_S; Q8_0 for 8-expert models. Layers are counted over attn_v tensors, with
      n = the number of attn_v / attn_qkv / attn_kv_b tensors.
    * ffn_down: Q6_K on ``use_more_bits`` layers for Q4_K_M (and Q5_K_M, llama.cpp); Q5_K for the
      first eighth for Q4_K_S; n = the number of ``blk.N`` layers.
    * attn_k.weight: Q8_0 for 8-expert models; MLA projections (attn_k_b, attn_v_b, attn_kv_a_mqa,
      attn_q_a, attn_q_b): Q8_0; attn_output: Q5_K for 8-expert models under Q4_K_S/M.
    * attn_qkv.weight: Q5_K for Q4_K_M (Q6_K for Q5_K_M, llama.cpp).
    * then, if a row is not a multiple of the type's block: Q4_K -> Q5_0, Q5_K -> Q5_1,
      Q6_K -> Q8_0, and F16 if even that block does not fit (llama.cpp ``tensor_type_fallback``).

    The layer counters advance in file order, as Ollama's (it walks ``Tensors().Items()``). Current
    llama.cpp walks tensors sorted by layer number (``weight_name_comparer``) instead; the two agree
    on files written in layer order (what convert_hf_to_gguf writes), and differ on files whose
    tensors are sorted by name (blk.10 before blk.2), where older llama.cpp builds agree with Ollama.
    """
    ftype = plan.target
    default = plan.default_type
    arch = metadata.get("general.architecture", "")
    n_experts = max(1, int(metadata.get(f"{arch}.expert_count", 0) or 0))
    has_output = any(t.name == "output.weight" for t in tensors)
    n_attn_v = sum(1 for t in tensors if any(s in t.name for s in ("attn_v.weight", "attn_qkv.weight", "attn_kv_b.weight")))
    n_ffn_down = len({m.group(1) for t in tensors if (m := re.match(r"(blk\.\d+)\.", t.name))})
    i_attn_v = i_ffn_down = 0
    more_bits_mixtures = ("Q4_K_M", "Q5_K_M")

    out: dict[str, str | None] = {}
    for t in tensors:
        name = t.name
        if not _quantizable(t):
            out[name] = None
            continue
        if arch in ("qwen3next", "qwen35", "qwen35moe") and ftype in ("Q4_K_M", "Q4_K_S"):
            fixed = next((ty for suffix, ty in _QWEN3_LINEAR_ATTN if name.endswith(suffix)), None)
            if fixed is not None:
                out[name] = _fallback(fixed, t.dims[0])
                continue
        new = default
        nx = t.dims[0]
        if name == "output.weight" or (not has_output and name == "token_embd.weight"):
            if nx % _block_size(new):
                new = "Q8_0"
            elif new != "Q8_0":
                new = "Q6_K"
        elif "attn_v.weight" in name:
            if ftype in more_bits_mixtures and use_more_bits(i_attn_v, n_attn_v):
                new = "Q6_K"
            elif ftype == "Q4_K_S" and i_attn_v < 4:
                new = "Q5_K"
            if n_experts == 8:
                new = "Q8_0"
            i_attn_v += 1
        elif "attn_k.weight" in name:
            if n_experts == 8:
                new = "Q8_0"
        elif any(s in name for s in ("attn_k_b.weight", "attn_v_b.weight", "attn_kv_a_mqa.weight",
                                     "attn_q_a.weight", "attn_q_b.weight")):
            new = "Q8_0"
        elif "ffn_down" in name:
            if ftype in more_bits_mixtures:
                if use_more_bits(i_ffn_down, n_ffn_down):
                    new = "Q6_K"
            elif ftype == "Q4_K_S" and i_ffn_down < n_ffn_down // 8:
                new = "Q5_K"
            i_ffn_down += 1
        elif "attn_output.weight" in name:
            if n_experts == 8 and ftype in ("Q4_K_S", "Q4_K_M"):
                new = "Q5_K"
        elif "attn_qkv.weight" in name:
            if ftype == "Q4_K_M":
                new = "Q5_K"
            elif ftype == "Q5_K_M":
                new = "Q6_K"
        out[name] = _fallback(new, nx)
    return out


def _fallback(new: str, nx: int) -> str:
    """llama.cpp's ``tensor_type_fallback``: a K type whose block does not divide a row's ``nx`` values becomes
    the legacy type of about the same bits, and F16 if even that block does not fit."""
    if _is_quantized(new) and nx % _block_size(new):
        new = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}.get(new, new)
        if nx % _block_size(new):
            new = "F16"
    return new


# --------------------------------------------------------------------------------------------
# conversion


def _quantize_values(values: np.ndarray, type_name: str) -> np.ndarray:
    """float32 [rows, n] -> the GGUF bytes of those rows as ``type_name`` (uint8 [rows, row_bytes])."""
    if type_name in kquant.K_TYPES:
        return kquant.quantize_blocks(values, type_name).reshape(values.shape[0], -1)
    out = gguf.quants.quantize(values, gguf.GGMLQuantizationType(GGML_TYPE_IDS[type_name]))
    return out.reshape(values.shape[0], -1).view(np.uint8)


def _convert(raw: np.ndarray, info: TensorInfo, out_type: str, pool: ThreadPoolExecutor,
             on_chunk: Callable[[int], None]) -> np.ndarray:
    """Convert one tensor chunk by chunk; ``on_chunk(source_bytes)`` after each chunk, in order."""
    n = info.dims[0]
    rows = info.n_elements // n
    src_row_bytes = info.n_bytes // rows
    src_type = gguf.GGMLQuantizationType(info.ggml_type)
    _, block, block_bytes = GGML_TYPES[GGML_TYPE_IDS[out_type]]
    out = np.empty((rows, n // block * block_bytes), dtype=np.uint8)
    src = raw.reshape(rows, src_row_bytes)
    step = max(1, CHUNK_VALUES // n)

    def job(r0: int) -> int:
        r1 = min(rows, r0 + step)
        values = gguf.quants.dequantize(src[r0:r1], src_type).reshape(r1 - r0, n).astype(np.float32, copy=False)
        out[r0:r1] = _quantize_values(values, out_type)
        return (r1 - r0) * src_row_bytes

    for nbytes in pool.map(job, range(0, rows, step)):
        on_chunk(nbytes)
    return out.reshape(-1)


def _default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def copy_metadata(f: GGUFFile, writer: gguf.GGUFWriter, file_type: int) -> None:
    """Every metadata key of ``f`` into ``writer`` with its original type, ``general.file_type`` set to
    ``file_type``. GGUFWriter adds general.architecture (and the alignment) itself."""
    for key, value in f.metadata.items():
        if key in ("general.architecture", "general.alignment"):
            continue
        vtype, etype = f.metadata_types[key]
        if key == "general.file_type":
            value = file_type
        if isinstance(value, np.ndarray):
            value = value.tolist()
        writer.add_key_value(key, value, gguf.GGUFValueType(vtype),
                             sub_type=gguf.GGUFValueType(etype) if etype is not None else None)


def quantize_gguf(src: str | os.PathLike, dst: str | os.PathLike, plan: QuantizePlan,
                  progress: Callable[[int, int], None] | None = None, threads: int | None = None) -> None:
    """Write ``src`` requantized to ``plan`` at ``dst``.

    ``progress(done_bytes, total_bytes)`` (source bytes) is called while tensors are converted: after
    each chunk of rows when at least 1/200 of the total has been done since the last call, and after
    every tensor. ``threads``: worker threads for the chunks (default: the CPUs this process may use).
    """
    with GGUFFile(src) as f:
        source_types = {t.type_name for t in f.tensors.values() if len(t.dims) >= 2}
        if not source_types <= SOURCE_TYPES:
            raise CreateError(
                f"quantization is only supported for F16, BF16 and F32 models (this one has {', '.join(sorted(source_types))})"
            )
        infos = list(f.tensors.values())
        if plan.is_k_mixture:
            targets = k_tensor_types(infos, f.metadata, plan)
        else:
            targets = {t.name: _tensor_target(t.name, t.shape, plan.target) for t in infos}

        writer = gguf.GGUFWriter(os.fspath(dst), f.architecture, use_temp_file=False)
        copy_metadata(f, writer, plan.file_type_id)
        if "general.file_type" not in f.metadata:
            writer.add_file_type(plan.file_type_id)

        jobs = []
        for info in infos:
            target = targets[info.name]
            out_type = target or info.type_name
            qtype = gguf.GGMLQuantizationType(GGML_TYPE_IDS[out_type])
            block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
            nbytes = info.n_elements // block * block_bytes
            raw_shape = gguf.quant_shape_to_byte_shape(info.shape, qtype) if block > 1 else info.shape
            writer.add_tensor_info(info.name, raw_shape, np.dtype(np.uint8) if block > 1 else _np_dtype(out_type),
                                   nbytes, raw_dtype=qtype)
            jobs.append((info, target))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()

        total = sum(info.n_bytes for info, _ in jobs)
        done = reported = 0

        def advance(nbytes: int, force: bool = False) -> None:
            nonlocal done, reported
            done += nbytes
            if progress and (force or done - reported >= total / 200):
                reported = done
                progress(done, total)

        with ThreadPoolExecutor(max_workers=threads or _default_threads(), thread_name_prefix="quantize") as pool:
            for info, target in jobs:
                raw = f.tensor_data(info.name)
                if target is None or target == info.type_name:
                    out = np.array(raw)  # unchanged: copy the bytes as they are
                    advance(info.n_bytes, force=True)
                else:
                    out = _convert(raw, info, target, pool, advance)
                    advance(0, force=True)
                writer.write_tensor_data(out)
                del out
        writer.close()


def _np_dtype(type_name: str) -> np.dtype:
    return {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16)}.get(type_name, np.dtype(np.uint8))
