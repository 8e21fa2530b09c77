"""llama (also SmolLM2, Mistral-style GGUFs with general.architecture = llama).

Deviations from the shared block: none in the math. llama.cpp's converter permutes the q/k rows so that
RoPE pairs are adjacent; we keep that layout and rotate adjacent pairs ('normal' RoPE, as llama.cpp
does) instead of un-permuting at load. Llama 3.x frequency factors (``rope_freqs.weight``) are applied
by the model when the tensor is present.
"""

from __future__ import annotations

from engine.contract.gguf import GGUFFile
from engine.models.config import ModelConfig, WeightLayout, base_config


def read_config(f: GGUFFile, layout: WeightLayout) -> ModelConfig:
    return base_config(f, layout, rope_style="normal", activation="silu")
