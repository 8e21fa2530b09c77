"""qwen3 (Qwen3 dense models, 0.6B to 32B).

Deviations from the shared block: per-head RMSNorm of q and k before RoPE (``attn_{q,k}_norm``, the
shared ``qk_norm`` path), no biases, NEOX RoPE (llama.cpp's converter stores q/k unpermuted), tied or
untied output. The head size is ``attention.key_length`` and is independent of n_embd / n_head
(Qwen3-0.6B: 16 heads of 128 over 1024 dims), which ``base_config`` already reads. The query scale is
1/sqrt(head_dim), as both transformers and llama.cpp use.

qk_norm is required rather than detected: a qwen3 GGUF without the q/k norms is not a qwen3 model, and
running it without them would give wrong logits silently.
"""

from __future__ import annotations

from engine.contract.gguf import GGUFFile
from engine.models.config import ModelConfig, UnsupportedModelError, WeightLayout, base_config


def read_config(f: GGUFFile, layout: WeightLayout) -> ModelConfig:
    if not layout.qk_norm:
        raise UnsupportedModelError(f"{f.path}: a {f.architecture} GGUF must have attn_q_norm/attn_k_norm tensors")
    return base_config(f, layout, rope_style="neox", activation="silu")
