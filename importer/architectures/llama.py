"""Llama (``LlamaForCausalLM``): the plain decoder, with llama.cpp's two llama-only conversions.

* q/k rows permuted so RoPE pairs are adjacent (the engine rotates llama's pairs that way);
* Llama 3.x RoPE scaling (``rope_type: llama3``) as a ``rope_freqs`` tensor of per-frequency factors.
"""

from __future__ import annotations

import math

import gguf
import numpy as np

from ..hf.params import ModelParams
from .spec import ArchitectureSpec

BLOCK_TENSORS = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                 "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")


def rope_factors(p: ModelParams) -> dict[str, np.ndarray]:
    """llama.cpp's rope_freqs for Llama 3.x scaling: each frequency's divisor (1, the factor, or between)."""
    s = p.rope_scaling
    if s is None or s.kind != "llama3":
        return {}
    freqs = 1.0 / (p.rope_base ** (np.arange(0, p.head_dim, 2, dtype=np.float64) / p.head_dim))
    low_wavelen = s.original_context / s.low_freq_factor
    high_wavelen = s.original_context / s.high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(s.factor)
        else:
            smooth = (s.original_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
            out.append(1.0 / ((1 - smooth) / s.factor + smooth))
    return {"rope_freqs.weight": np.asarray(out, dtype=np.float32)}


LLAMA = ArchitectureSpec(
    arch="llama", hf_classes=("LlamaForCausalLM",), model_types={"llama": "LlamaForCausalLM"},
    rope_kinds=("linear", "llama3"),
    name_map=gguf.MODEL_ARCH.LLAMA, block_tensors=BLOCK_TENSORS, permute_qk=True, generated=rope_factors,
)
SPECS = (LLAMA,)
