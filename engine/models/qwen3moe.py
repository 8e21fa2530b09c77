"""qwen3moe (Qwen3 MoE models: Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B).

The qwen3 attention block (per-head q/k RMSNorm before NEOX RoPE, no biases, head size from
``attention.key_length``) with a sparse MoE FFN in every layer (``engine.models.moe``): ``expert_count``
SwiGLU experts of width ``expert_feed_forward_length``, ``expert_used_count`` of them per token, chosen by a
softmax router whose top-k weights are renormalised to sum 1; no shared expert. llama.cpp renormalises
for every qwen3moe file (its graph passes norm_w = true), so that is the default here; a file that says
``expert_weights_norm = false`` is honoured. ``feed_forward_length`` is the dense width the checkpoint
declares and is not used by any layer.
"""

from __future__ import annotations

from dataclasses import replace

from engine.contract.gguf import GGUFFile
from engine.models import qwen3
from engine.models.config import ModelConfig, WeightLayout, moe_config


def read_config(f: GGUFFile, layout: WeightLayout) -> ModelConfig:
    return replace(qwen3.read_config(f, layout), moe=moe_config(f, normalize_weights=True))
