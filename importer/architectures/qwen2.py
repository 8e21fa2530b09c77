"""Qwen2 / Qwen2.5 (``Qwen2ForCausalLM``): the plain decoder with q/k/v biases; no sliding-window attention."""

from __future__ import annotations

from typing import Any, Mapping

import gguf

from ..hf.errors import fail
from .llama import BLOCK_TENSORS
from .spec import ArchitectureSpec


def refuse_sliding_window(arch: str):
    def refuse(cfg: Mapping[str, Any], role: str) -> None:
        if cfg.get("use_sliding_window"):
            raise fail(role, f"{arch} with use_sliding_window is not supported")
    return refuse


QWEN2 = ArchitectureSpec(
    arch="qwen2", hf_classes=("Qwen2ForCausalLM",), model_types={"qwen2": "Qwen2ForCausalLM"},
    refuse=refuse_sliding_window("qwen2"),
    name_map=gguf.MODEL_ARCH.QWEN2, block_tensors=BLOCK_TENSORS + ("attn_q.bias", "attn_k.bias", "attn_v.bias"),
)
SPECS = (QWEN2,)
