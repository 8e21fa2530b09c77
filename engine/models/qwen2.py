"""qwen2 (Qwen2 / Qwen2.5, incl. Coder).

Deviations: biases on q/k/v (detected from the tensors), NEOX RoPE (rotate halves; no permutation in
the GGUF), tied or untied output (``output.weight`` present or not).
"""

from __future__ import annotations

from engine.contract.gguf import GGUFFile
from engine.models.config import ModelConfig, WeightLayout, base_config


def read_config(f: GGUFFile, layout: WeightLayout) -> ModelConfig:
    return base_config(f, layout, rope_style="neox", activation="silu")
